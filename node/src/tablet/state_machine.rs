//! openraft state machine of a tablet: applies batches to the memtable,
//! checks conditions and receipts, freezes the memtable on `Seal`.
//!
//! Apply is deterministic: it reads only the log entry and the tablet's
//! applied state, never the wall clock, so every replica reaches the same
//! rows, positions, receipts and seal boundaries.

use std::io::{self, Cursor};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use stele_proto::command::{AppendBatch, Pos, TabletCommand, TabletResponse};
use tokio::sync::mpsc;

use super::memtable::Memtable;
use super::receipts::{self, Receipt, ReceiptPart};
use super::{Frozen, Tablet, TabletData};
use crate::catalog::SegmentRef;
use crate::raft::{LogId, SnapshotMeta, StoredMembership, TabletConfig, decode, encode, io_err};
use crate::segment::Row;

pub type SnapshotData = Cursor<Vec<u8>>;
type Snapshot = openraft::alias::SnapshotOf<TabletConfig, SnapshotData>;

/// A published seal for the seal worker to build: (tablet, seal index).
pub type SealQueue = mpsc::UnboundedSender<(Arc<Tablet>, u64)>;

/// Snapshot payload: the segments by name and the receipts, as of the
/// checkpoint. Segment files are not inside: an installing replica must
/// have (or fetch) them by id. `rows` (unsealed rows, sealed locally by the
/// installer) is empty once the tablet has a checkpoint; see
/// [`SnapshotBuilder::build_snapshot`].
#[derive(Serialize, Deserialize)]
struct TabletSnapshot {
    v: u16,
    checkpoint: u64,
    segments: Vec<SegmentRef>,
    receipts: Vec<(Vec<u8>, Receipt)>,
    rows: Vec<Row>,
    /// The range `(lo, hi, generation)` as of the checkpoint. Absent in
    /// snapshots from before splits existed: the installer keeps its own.
    #[serde(default)]
    range: Option<(u32, u64, u64)>,
}

const SNAPSHOT_V: u16 = 1;

/// The segments a snapshot names (a replica must have them to install it).
pub fn snapshot_segments(data: &[u8]) -> crate::Result<Vec<SegmentRef>> {
    let snap: TabletSnapshot = decode("tablet snapshot", data)?;
    Ok(snap.segments)
}

/// The last snapshot built or installed, shared with the builder.
type Current = Arc<std::sync::Mutex<Option<(SnapshotMeta, Vec<u8>)>>>;

pub struct StateMachine {
    tablet: Arc<Tablet>,
    seals: SealQueue,
    current: Current,
}

impl StateMachine {
    pub fn new(tablet: Arc<Tablet>, seals: SealQueue) -> StateMachine {
        StateMachine {
            tablet,
            seals,
            current: Current::default(),
        }
    }
}

/// Applies one batch. Atomic: either every record is applied or none.
pub(crate) fn apply_batch(
    tablet: &Tablet,
    data: &mut TabletData,
    index: u64,
    batch: &AppendBatch,
) -> TabletResponse {
    data.clock_us = data.clock_us.max(batch.proposed_at_us);
    let key = (batch.namespace.clone(), batch.batch_id);
    // Receipts first: a retry of an applied batch returns its positions.
    if let Some(receipt) = data.receipts.get(&key) {
        let covered: Vec<Option<Pos>> = batch
            .records
            .iter()
            .enumerate()
            .map(|(n, r)| receipt.covers(n as u32, r.vshard))
            .collect();
        if covered.iter().all(Option::is_some) {
            return TabletResponse::Appended {
                positions: covered.into_iter().flatten().collect(),
                duplicate: true,
            };
        }
        // Partly covered batches arise only across splits and merges, which
        // route uncovered records elsewhere; refuse rather than double-apply.
        return TabletResponse::Rejected {
            reason: "batch partly applied under another tablet range".into(),
        };
    }
    let (lo, hi) = tablet.range();
    if let Some(r) = batch.records.iter().find(|r| !tablet.contains(r.vshard)) {
        return TabletResponse::Rejected {
            reason: format!(
                "vshard {} outside tablet {} range [{lo}, {hi})",
                r.vshard, tablet.id
            ),
        };
    }
    if let Some(expect) = &batch.expect {
        let actual = match data.latest((lo, hi), &batch.namespace, &expect.key) {
            Ok(row) => row.map(|r| super::pos_of(tablet.id, &r)),
            Err(e) => {
                // A segment that cannot be read makes the condition
                // undecidable; refusing is deterministic only if every
                // replica fails alike, so this is logged loudly.
                tracing::error!(tablet = tablet.id, error = %e, "condition check could not read a segment");
                return TabletResponse::Rejected {
                    reason: format!("condition check failed to read: {e}"),
                };
            }
        };
        if actual != expect.version {
            return TabletResponse::ConditionFailed { actual };
        }
    }
    let mut positions = Vec::with_capacity(batch.records.len());
    for (slot, r) in batch.records.iter().enumerate() {
        let slot = slot as u32;
        data.memtable.insert(
            Row {
                namespace: batch.namespace.clone(),
                key: r.key.clone(),
                ts: r.ts,
                index,
                slot,
                value: r.value.clone(),
                vshard: r.vshard,
                tablet: 0,
            },
            batch.proposed_at_us,
        );
        positions.push(Pos {
            tablet: tablet.id,
            index,
            slot,
        });
    }
    data.receipts.insert(
        key,
        Receipt {
            v: 1,
            parts: vec![ReceiptPart {
                vshard_lo: lo,
                vshard_hi: hi,
                positions: positions
                    .iter()
                    .enumerate()
                    .map(|(n, p)| (n as u32, *p))
                    .collect(),
            }],
            at_us: batch.proposed_at_us,
            index,
        },
    );
    tablet
        .stats
        .records_applied
        .fetch_add(positions.len() as u64, std::sync::atomic::Ordering::Relaxed);
    TabletResponse::Appended {
        positions,
        duplicate: false,
    }
}

/// Freezes the memtable at `log_id` for the seal worker (`Seal`, and the
/// seal of a `Split`, which also moves the live range to `[lo, at)`). A
/// split whose earlier seal failed to publish rides on this one.
fn freeze(tablet: &Tablet, data: &mut TabletData, log_id: LogId, split: Option<super::SplitChild>) {
    let live = tablet.range_state();
    let (split, carried) = match split {
        Some(s) => (Some(s), false),
        None => (data.pending_split.take(), true),
    };
    // A carried split's rows came back from its failed seal: they span the
    // range before it.
    let rows_range = match (&split, carried) {
        (Some(s), true) => super::RangeState { hi: s.hi, ..live },
        _ => live,
    };
    let after = match &split {
        Some(s) if s.at > rows_range.lo && u64::from(s.at) < rows_range.hi => super::RangeState {
            lo: rows_range.lo,
            hi: u64::from(s.at),
            generation: s.generation,
        },
        _ => live,
    };
    if after != live {
        tablet.set_range(after);
    }
    let memtable = std::mem::take(&mut data.memtable);
    let membership = data.membership.clone();
    data.frozen.push(Frozen {
        seal_index: log_id.index(),
        seal_log_id: log_id,
        membership,
        memtable,
        rows_range,
        after,
        split,
    });
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
            let index = log_id.index();
            let mut seal = None;
            let response = {
                let mut data = self.tablet.write();
                let response = match &entry.payload {
                    EntryPayload::Blank => TabletResponse::None,
                    EntryPayload::Normal(TabletCommand::Append(batch)) => {
                        apply_batch(&self.tablet, &mut data, index, batch)
                    }
                    EntryPayload::Normal(TabletCommand::Uploaded {
                        segment,
                        bytes,
                        file_xxh3,
                    }) => {
                        let cold = crate::catalog::ColdCopy {
                            bytes: *bytes,
                            file_xxh3: *file_xxh3,
                        };
                        crate::tier::worker::record_uploaded(
                            &self.tablet,
                            &mut data,
                            segment,
                            cold,
                        );
                        TabletResponse::None
                    }
                    EntryPayload::Normal(TabletCommand::DropSegment { segment }) => {
                        crate::tier::retention::drop_segment(&self.tablet, &mut data, segment);
                        TabletResponse::None
                    }
                    EntryPayload::Normal(TabletCommand::Seal { .. }) => {
                        freeze(&self.tablet, &mut data, log_id, None);
                        seal = Some(index);
                        TabletResponse::Sealed
                    }
                    EntryPayload::Normal(TabletCommand::Split {
                        at,
                        child,
                        child_replicas,
                        generation,
                    }) => {
                        let (lo, hi) = self.tablet.range();
                        let inside = lo < *at && u64::from(*at) < hi;
                        if !inside || *child == self.tablet.id || child_replicas.is_empty() {
                            // Already applied (a retried proposal) or stale.
                            TabletResponse::Rejected {
                                reason: format!(
                                    "split at {at} outside the open range ({lo}, {hi}) of tablet {}",
                                    self.tablet.id
                                ),
                            }
                        } else {
                            let split = super::SplitChild {
                                child: *child,
                                at: *at,
                                hi,
                                generation: (*generation).max(self.tablet.generation()),
                                replicas: child_replicas.clone(),
                            };
                            freeze(&self.tablet, &mut data, log_id, Some(split));
                            seal = Some(index);
                            TabletResponse::Sealed
                        }
                    }
                    EntryPayload::Membership(m) => {
                        data.membership = StoredMembership::new(Some(log_id), m.clone());
                        TabletResponse::None
                    }
                };
                data.applied = Some(log_id);
                response
            };
            if let Some(index) = seal {
                // The worker owns the rest; if it is gone the node is
                // shutting down and the seal replays after restart.
                let _ = self.seals.send((self.tablet.clone(), index));
            }
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
            // the bucket (the snapshot names it; see Node::handle_raft).
            let reader =
                super::open_segment(&tablet.segment_dir, tablet.id, seg, tablet.tier.as_ref())
                    .map_err(io_err)?;
            segments.push((seg.clone(), reader));
        }
        let mut receipts_mem = super::receipts::Receipts::default();
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
            Some((lo, hi, generation)) => super::RangeState { lo, hi, generation },
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
            });
            super::seal::publish_front(tablet, &mut data, &old_receipts).map_err(io_err)?;
        } else {
            let record = tablet.record(&data, encode(&(applied, data.membership.clone())));
            tablet
                .catalog
                .publish(&record, &receipt_rows, &old_receipts)
                .map_err(io_err)?;
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
