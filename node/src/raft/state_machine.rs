//! The openraft state machine of a tablet: feeds committed entries to the
//! tablet's deterministic apply (`tablet::apply`), runs the effects apply
//! returns (seal jobs, catalog writes), and builds and installs snapshots.
//!
//! ```text
//! openraft ──entries──► StateMachine::apply ──► tablet::apply (pure) ──► Effect
//!                                  │                                    │
//!                                  ├─ Seal ──► seal worker queue ◄──────┤
//!                                  └─ RecordCold / DropFiles ──► catalog, files
//! ```

use std::io::{self, Cursor};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use stele_proto::command::{TabletCommand, TabletResponse};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::log_store::AppliedMark;
use super::{
    LogId, SnapshotData, SnapshotMeta, StoredMembership, TabletConfig, decode, encode, io_err,
};
use crate::catalog::SegmentRef;
use crate::segment::Row;
use crate::tablet::apply::{self, Adoptable, Effect};
use crate::tablet::memtable::Memtable;
use crate::tablet::receipts::{self, Receipt};
use crate::tablet::{Frozen, Tablet, TabletData};

type Snapshot = openraft::alias::SnapshotOf<TabletConfig, SnapshotData>;

/// A published seal for the seal worker to build: (tablet, seal index).
pub type SealQueue = mpsc::UnboundedSender<(Arc<Tablet>, u64)>;

/// Snapshot payload: the segments by name and the receipts, as of the
/// checkpoint. Segment files are not inside: an installing replica must
/// have (or fetch) them by id. `rows` (unsealed rows, sealed locally by the
/// installer) is empty once the tablet has a checkpoint; see
/// [`SnapshotBuilder::build_snapshot`].
#[derive(Serialize, Deserialize)]
pub(crate) struct TabletSnapshot {
    v: u16,
    checkpoint: u64,
    segments: Vec<SegmentRef>,
    receipts: Vec<(Vec<u8>, Receipt)>,
    rows: Vec<Row>,
    /// The range `(lo, hi, generation)` as of the checkpoint. Absent in
    /// snapshots from before splits existed: the installer keeps its own.
    #[serde(default)]
    range: Option<(u32, u64, u64)>,
    /// Frozen for a merge as of the checkpoint (absent: not frozen).
    #[serde(default)]
    frozen: bool,
}

const SNAPSHOT_V: u16 = 1;

#[cfg(feature = "fuzz")]
impl TabletSnapshot {
    /// A small valid snapshot, a seed for the fuzz target (`fuzz_api`).
    pub(crate) fn seed() -> Self {
        TabletSnapshot {
            v: SNAPSHOT_V,
            checkpoint: 0,
            segments: Vec::new(),
            receipts: Vec::new(),
            rows: vec![crate::segment::Row {
                namespace: "ns".into(),
                key: b"k".to_vec(),
                ts: 1,
                index: 2,
                slot: 0,
                value: b"v".to_vec(),
                vshard: 7,
                tablet: 1,
            }],
            range: Some((0, 1 << 32, 1)),
            frozen: false,
        }
    }
}

/// The segments a snapshot names (a replica must have them to install it).
pub fn snapshot_segments(data: &[u8]) -> crate::Result<Vec<SegmentRef>> {
    let snap: TabletSnapshot = decode("tablet snapshot", data)?;
    Ok(snap.segments)
}

/// The last snapshot built or installed, shared with the builder.
type Current = Arc<std::sync::Mutex<Option<(SnapshotMeta, Vec<u8>)>>>;

/// Records a segment's cold copy in the last snapshot built, if it names
/// the segment without one: a replica that installs that snapshot then
/// reads the segment from the bucket, not from a peer. (The snapshot is
/// built when a seal publishes, usually before the segment's upload.)
fn note_cold_in_snapshot(current: &Current, segment: &str, cold: crate::catalog::ColdCopy) {
    let mut current = current.lock().expect("lock poisoned");
    let Some((_, bytes)) = current.as_mut() else {
        return;
    };
    let Ok(mut snap) = decode::<TabletSnapshot>("tablet snapshot", bytes) else {
        return;
    };
    let Some(seg) = snap
        .segments
        .iter_mut()
        .find(|s| s.id == segment && s.cold.is_none())
    else {
        return;
    };
    seg.cold = Some(cold);
    *bytes = encode(&snap);
}

/// The other tablets open on this node, as a `Merge`'s apply needs them:
/// the absorbed tablet's replica here, and the node's shutdown, which ends
/// the wait for it. The node's replica set provides it.
pub trait Neighbours: Send + Sync {
    /// The tablet `id` open on this node (its group running or starting).
    fn tablet(&self, id: u64) -> Option<Arc<Tablet>>;
    /// Cancelled when the node shuts down.
    fn shutdown(&self) -> CancellationToken;
}

/// No other tablets (a state machine tested alone).
pub struct NoNeighbours(pub CancellationToken);

impl Neighbours for NoNeighbours {
    fn tablet(&self, _id: u64) -> Option<Arc<Tablet>> {
        None
    }

    fn shutdown(&self) -> CancellationToken {
        self.0.clone()
    }
}

pub struct StateMachine {
    tablet: Arc<Tablet>,
    seals: SealQueue,
    current: Current,
    neighbours: Arc<dyn Neighbours>,
    applied: AppliedMark,
}

impl StateMachine {
    pub fn new(
        tablet: Arc<Tablet>,
        seals: SealQueue,
        neighbours: Arc<dyn Neighbours>,
    ) -> StateMachine {
        StateMachine {
            tablet,
            seals,
            current: Current::default(),
            neighbours,
            applied: AppliedMark::default(),
        }
    }

    /// Raises `mark` as it applies: the replica's log holds each entry in
    /// memory until then (`LogStore::applied_mark`).
    pub fn marking(mut self, mark: AppliedMark) -> StateMachine {
        self.applied = mark;
        self
    }
}

/// Waits until the replica of `absorbed` on this node is frozen with every
/// row published, over range `[lo, hi)`, and takes what a merge adopts
/// ([`apply::adoptable`]). The controller orders `Merge` only once every
/// voter of the absorbed tablet reported that state, and the voters of both
/// tablets are on the same nodes, so the wait is short; it ends with an
/// error only when the node shuts down.
async fn wait_adoptable(
    me: &Tablet,
    neighbours: &dyn Neighbours,
    absorbed: u64,
    lo: u32,
    hi: u64,
) -> io::Result<Adoptable> {
    let started = std::time::Instant::now();
    let shutdown = neighbours.shutdown();
    let mut warned = 0u64;
    loop {
        if let Some(t) = neighbours.tablet(absorbed)
            && let Some(from) = apply::adoptable(me, &t, lo, hi)
        {
            return Ok(from);
        }
        let waited = started.elapsed().as_secs();
        if waited >= 10 * (warned + 1) {
            warned += 1;
            tracing::warn!(
                tablet = me.id,
                absorbed,
                waited_s = waited,
                "merge: waiting for the absorbed tablet's replica here to be frozen and sealed"
            );
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                return Err(io_err(format!("tablet {}: shutting down during a merge", me.id)));
            }
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
        }
    }
}

/// Writes the record of a tablet whose published segment gained its cold
/// copy ([`Effect::RecordCold`]).
///
/// Why here and why a failure is only logged: the record is written at the
/// tablet's checkpoint, under the same write lock as the apply, so it can
/// never overwrite a newer publish. If the write fails, nothing is lost:
/// the `Uploaded` entry stays in the log (it is past the checkpoint, which
/// is never purged beyond), so a restart replays it, and the next seal's
/// publish writes the whole record, cold copy included. Failing the apply
/// instead would stop the group over a field that is rebuilt anyway.
fn persist_cold(tablet: &Tablet, data: &TabletData) {
    if let Err(e) = tablet.catalog.put_tablet(&tablet.checkpoint_record(data)) {
        tracing::warn!(tablet = tablet.id, error = %e, "catalog update for Uploaded failed; the next seal's publish writes it");
    }
}

/// Writes the record of a tablet that dropped a published segment, then
/// removes the segment's file and stub ([`Effect::DropFiles`]). A failed
/// write keeps the file: the entry replays after a restart (the log after
/// the checkpoint is kept) and drops it then.
fn persist_drop(tablet: &Tablet, data: &TabletData, segment: &str) {
    if let Err(e) = tablet.catalog.put_tablet(&tablet.checkpoint_record(data)) {
        tracing::warn!(tablet = tablet.id, error = %e, "catalog update for DropSegment failed");
        return;
    }
    crate::tier::stub::remove(&tablet.segment_dir, segment);
    let path = tablet.segment_dir.join(crate::segment::file_name(segment));
    match std::fs::remove_file(&path) {
        Ok(()) => {
            let _ = crate::fsutil::fsync_dir(&tablet.segment_dir);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "dropped segment file not deleted")
        }
    }
}

impl RaftStateMachine<TabletConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let data = self.tablet.read();
        Ok((data.applied, data.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TabletConfig>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id();
            // A merge waits (without the tablet lock) for the absorbed
            // replica on this node; a stale or repeated one does not.
            let adopt = match &entry.payload {
                EntryPayload::Normal(TabletCommand::Merge {
                    absorbed, lo, hi, ..
                }) if apply::merge_fits(&self.tablet, *absorbed, *lo, *hi) => Some(
                    wait_adoptable(&self.tablet, self.neighbours.as_ref(), *absorbed, *lo, *hi)
                        .await?,
                ),
                _ => None,
            };
            let span = tracing::debug_span!(
                "apply",
                tablet = self.tablet.id,
                replica = self.tablet.replica_id,
                index = log_id.index(),
                command = tracing::field::Empty,
                batch = tracing::field::Empty,
            );
            if let EntryPayload::Normal(cmd) = &entry.payload
                && !span.is_disabled()
            {
                span.record("command", crate::trace::command_name(cmd));
                match cmd {
                    TabletCommand::Append(b) => {
                        span.record(
                            "batch",
                            tracing::field::display(crate::trace::Batch::of_halves(b.batch_id)),
                        );
                    }
                    TabletCommand::AppendMany(batches) => {
                        let ids: Vec<String> = batches
                            .iter()
                            .map(|b| crate::trace::Batch::of_halves(b.batch_id).to_string())
                            .collect();
                        span.record("batch", ids.join(","));
                    }
                    _ => {}
                }
            }
            let (response, seal) = span.in_scope(|| {
                let mut data = self.tablet.write();
                let applied = match &entry.payload {
                    EntryPayload::Blank => None,
                    EntryPayload::Normal(cmd) => {
                        Some(apply::apply(&self.tablet, &mut data, log_id, cmd, adopt))
                    }
                    EntryPayload::Membership(m) => {
                        data.membership = StoredMembership::new(Some(log_id), m.clone());
                        None
                    }
                };
                data.applied = Some(log_id);
                let (response, effect) = match applied {
                    Some(a) => (a.response, a.effect),
                    None => (TabletResponse::None, None),
                };
                // Effects that write run here, still under the tablet's
                // write lock as the apply that caused them: a seal's
                // publish (which takes the same lock) can then never be
                // overwritten by an older record.
                let seal = match effect {
                    Some(Effect::Seal(index)) => Some(index),
                    Some(Effect::RecordCold { segment, cold }) => {
                        persist_cold(&self.tablet, &data);
                        note_cold_in_snapshot(&self.current, &segment, cold);
                        None
                    }
                    Some(Effect::DropFiles { segment }) => {
                        persist_drop(&self.tablet, &data, &segment);
                        None
                    }
                    None => None,
                };
                (response, seal)
            });
            if let Some(index) = seal {
                // The worker owns the rest; if it is gone the node is
                // shutting down and the seal replays after restart.
                let _ = self.seals.send((self.tablet.clone(), index));
            }
            self.applied.set(log_id.index());
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<SnapshotBuilder> {
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            tablet: self.tablet.clone(),
            current: self.current.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let bytes = snapshot.into_inner();
        let snap: TabletSnapshot = decode("tablet snapshot", &bytes).map_err(io_err)?;
        if snap.v != SNAPSHOT_V {
            return Err(io_err(format!(
                "tablet snapshot version {} unknown",
                snap.v
            )));
        }
        let tablet = &self.tablet;
        let mut segments = Vec::new();
        for seg in &snap.segments {
            // With a cold tier, a segment not fetched locally is read from
            // the bucket (the snapshot names it; see raft::inbound).
            let reader = crate::tablet::open_segment(
                &tablet.segment_dir,
                tablet.id,
                seg,
                tablet.tier.as_ref(),
            )
            .map_err(io_err)?;
            segments.push((seg.clone(), reader));
        }
        let mut receipts_mem = receipts::Receipts::default();
        let mut clock_us = 0;
        let mut receipt_rows = Vec::new();
        for (k, r) in snap.receipts {
            let key =
                receipts::decode_key(&k).ok_or_else(|| io_err("bad receipt key in snapshot"))?;
            clock_us = clock_us.max(r.at_us);
            receipt_rows.push(crate::catalog::ReceiptRow {
                key: k,
                value: encode(&r),
            });
            receipts_mem.insert(key, r);
        }
        let mut memtable = Memtable::default();
        for row in snap.rows {
            memtable.insert(row, clock_us);
        }
        let applied = meta.last_log_id;
        let membership = meta.last_membership.clone();
        let mut data = tablet.write();
        let published = match snap.range {
            Some((lo, hi, generation)) => crate::tablet::RangeState {
                lo,
                hi,
                generation,
                frozen: snap.frozen,
            },
            None => data.published,
        };
        // The log after the snapshot replays from here: the live range is
        // the snapshot's.
        tablet.set_range(published);
        let old_receipts: Vec<Vec<u8>> = data
            .receipts
            .iter()
            .map(|(k, _)| receipts::encode_key(k))
            .collect();
        let old_segments: Vec<String> = data
            .segments
            .iter()
            .chain(data.adopted.iter())
            .map(|(s, _)| s.id.clone())
            .collect();
        *data = TabletData {
            memtable: Memtable::default(),
            frozen: Vec::new(),
            segments,
            receipts: receipts_mem,
            applied,
            membership: membership.clone(),
            checkpoint: snap.checkpoint,
            // Exact for a snapshot at its checkpoint (no rows); otherwise
            // the local seal below moves the checkpoint to `applied`.
            checkpoint_log_id: applied,
            checkpoint_membership: membership.clone(),
            clock_us,
            cold_early: Default::default(),
            dropped_early: Default::default(),
            published,
            pending_split: None,
            adopted: Vec::new(),
            pending_merge: None,
            pending_compact: None,
        };
        // The unsealed rows of the snapshot exist nowhere durable on this
        // replica once openraft purges the log up to the snapshot: seal them
        // here, at the snapshot's index, before reporting success.
        let seal_at = applied.filter(|l| !memtable.is_empty() || l.index() > data.checkpoint);
        if let Some(seal_log_id) = seal_at {
            data.frozen.push(Frozen {
                seal_index: seal_log_id.index(),
                seal_log_id,
                membership,
                memtable,
                rows_range: published,
                after: published,
                split: None,
                merge: None,
                compact: None,
                // Only this replica seals here: the format every binary reads.
                format: crate::segment::format::FORMAT_VERSION_MIN,
            });
            crate::tablet::seal::publish_front(tablet, &mut data, &old_receipts).map_err(io_err)?;
        } else {
            let record = tablet.record(&data, encode(&(applied, data.membership.clone())));
            tablet
                .catalog
                .publish(&record, &receipt_rows, &old_receipts)
                .map_err(io_err)?;
        }
        // Segments the replaced state named and the snapshot's does not
        // (compacted or dropped meanwhile on the leader) are no one's now:
        // their files go, as the local compaction or drop would have
        // removed them. Before this, they stayed until the next restart.
        // A later snapshot that names one again (a merge adopting a segment
        // the sibling still names) finds no file and fetches it.
        for id in old_segments {
            if !data.segments.iter().any(|(s, _)| s.id == id) {
                let _ =
                    std::fs::remove_file(tablet.segment_dir.join(crate::segment::file_name(&id)));
                crate::tier::stub::remove(&tablet.segment_dir, &id);
            }
        }
        *self.current.lock().expect("lock poisoned") = Some((meta.clone(), bytes));
        tablet
            .stats
            .snapshots_installed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let current = self.current.lock().expect("lock poisoned");
        Ok(current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Cursor::new(bytes.clone()),
        }))
    }
}

pub struct SnapshotBuilder {
    tablet: Arc<Tablet>,
    current: Current,
}

impl RaftSnapshotBuilder<TabletConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    /// A snapshot of the state at the checkpoint, not at `applied`: the
    /// published segments, the receipts applied up to the checkpoint, and
    /// no rows. The log after the checkpoint is never purged, so a replica
    /// installing it replays those entries and seals them exactly where the
    /// leader did, keeping segment bytes a function of the log on every
    /// replica (a snapshot at `applied` would make the installer seal the
    /// unsealed rows at another boundary, into a segment no other replica
    /// has).
    ///
    /// This is narrower than openraft's contract ("a snapshot has to contain
    /// state of all applied logs") and safe because of how Stele drives it:
    /// openraft builds a snapshot only when the tablet triggers one after a
    /// seal (`SnapshotPolicy::Never`) or at start-up when the log was purged,
    /// and the log is purged only up to a checkpoint, so the snapshot always
    /// covers the purge point and the log after it is still there.
    ///
    /// Before the first seal there is no checkpoint; then the snapshot is of
    /// the applied state, rows included (installing it seals them). Stele
    /// never purges before a seal, so only openraft's conformance suite,
    /// which purges without sealing, reaches that case.
    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let data = self.tablet.read();
        let at_checkpoint = data.checkpoint_log_id.is_some();
        let upto = if at_checkpoint {
            data.checkpoint
        } else {
            u64::MAX
        };
        let mut receipts: Vec<(Vec<u8>, Receipt)> = data
            .receipts
            .iter()
            .filter(|(_, r)| r.index <= upto)
            .map(|(k, r)| (receipts::encode_key(k), r.clone()))
            .collect();
        receipts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rows = Vec::new();
        if !at_checkpoint {
            for f in &data.frozen {
                rows.extend(f.memtable.rows());
            }
            rows.extend(data.memtable.rows());
        }
        let snap = TabletSnapshot {
            v: SNAPSHOT_V,
            checkpoint: data.checkpoint,
            segments: data.segments.iter().map(|(r, _)| r.clone()).collect(),
            receipts,
            rows,
            frozen: if at_checkpoint {
                data.published.frozen
            } else {
                self.tablet.is_frozen()
            },
            range: Some(if at_checkpoint {
                (
                    data.published.lo,
                    data.published.hi,
                    data.published.generation,
                )
            } else {
                let live = self.tablet.range_state();
                (live.lo, live.hi, live.generation)
            }),
        };
        let meta = if at_checkpoint {
            SnapshotMeta {
                last_log_id: data.checkpoint_log_id,
                last_membership: data.checkpoint_membership.clone(),
            }
        } else {
            SnapshotMeta {
                last_log_id: data.applied,
                last_membership: data.membership.clone(),
            }
        };
        drop(data);
        let bytes = encode(&snap);
        *self.current.lock().expect("lock poisoned") = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(bytes),
        })
    }
}
