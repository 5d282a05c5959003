//! Sealing: turning a frozen memtable into a published segment.
//!
//! ```text
//! rows of frozen[0] ─► segment::write (temp, fsync, rename, fsync dir)
//!                  ─► catalog.publish(record + checkpoint, receipts) (one txn)
//!                  ─► frozen[0] replaced by the segment in memory
//! failure anywhere ─► rows go back (into the next frozen memtable, or the
//!                     active one); the checkpoint does not move
//! ```
//!
//! Segments of a tablet publish in seal order: one worker per node takes
//! seals first in, first out.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::receipts::{self, ReceiptKey};
use super::{Tablet, TabletData};
use crate::catalog::{ReceiptRow, SegmentRef, TabletRecord};
use crate::error::{Error, Result};
use crate::raft::{LogId, StoredMembership, encode};
use crate::segment::{self, Row, SegmentReader};

/// What to publish for the oldest frozen memtable of a tablet.
struct Plan {
    seal_index: u64,
    rows: Vec<Row>,
    header: segment::SegmentHeader,
    add_receipts: Vec<ReceiptRow>,
    drop_receipts: Vec<ReceiptKey>,
    seal_log_id: LogId,
    membership: StoredMembership,
    after: super::RangeState,
    split: Option<super::SplitChild>,
    merge: Option<super::MergeIn>,
    /// The published segments a `Compact` rewrites, resolved after every
    /// earlier seal (so alike on every replica): `None` when it does not
    /// apply (an input missing, or of another origin).
    compact: Option<Vec<(SegmentRef, Arc<SegmentReader>)>>,
    /// How the seal's segments are written: the entry's format version.
    write: segment::WriteOptions,
}

/// What a published seal did.
#[derive(Debug)]
pub struct SealDone {
    /// The new checkpoint.
    pub checkpoint: u64,
    /// The split child this seal created on this node, to be opened.
    pub child: Option<TabletRecord>,
    /// The merge this seal published: (absorbed tablet, its replica here),
    /// whose catalog rows are gone, to be closed and its files deleted.
    pub absorbed: Option<(u64, u64)>,
}

fn plan(tablet: &Tablet, data: &TabletData, seal_index: u64) -> Option<Plan> {
    let frozen = data.frozen.first()?;
    if frozen.seal_index != seal_index {
        return None;
    }
    let rows = frozen.memtable.rows();
    let log_first = frozen.memtable.first_index().unwrap_or(seal_index);
    let cutoff = data
        .clock_us
        .saturating_sub(tablet.options.receipt_window_us);
    let drop_receipts = data.receipts.expired(cutoff, seal_index);
    let add_receipts = data
        .receipts
        .applied_between(data.checkpoint, seal_index)
        .into_iter()
        .filter(|(_, r)| r.at_us >= cutoff)
        .map(|(k, r)| ReceiptRow {
            key: receipts::encode_key(&k),
            value: encode(&r),
        })
        .collect();
    Some(Plan {
        seal_index,
        header: segment::SegmentHeader {
            tablet: tablet.id,
            vshard_lo: frozen.rows_range.lo,
            vshard_hi: frozen.rows_range.hi,
            log_first,
            log_last: seal_index,
        },
        rows,
        add_receipts,
        drop_receipts,
        seal_log_id: frozen.seal_log_id,
        membership: frozen.membership.clone(),
        after: frozen.after,
        split: frozen.split.clone(),
        merge: frozen.merge.clone(),
        compact: frozen
            .compact
            .as_ref()
            .and_then(|inputs| compaction_inputs(tablet, data, inputs)),
        write: segment::WriteOptions {
            format: frozen.format,
            ..segment::WriteOptions::default()
        },
    })
}

/// The inputs of a compaction, if it applies: every one published, all of
/// one origin (the tablet whose log positions their rows carry). One input
/// is a trim: the segment rewritten without the rows the tablet does not
/// read.
fn compaction_inputs(
    tablet: &Tablet,
    data: &TabletData,
    inputs: &[String],
) -> Option<Vec<(SegmentRef, Arc<SegmentReader>)>> {
    let found: Vec<(SegmentRef, Arc<SegmentReader>)> = inputs
        .iter()
        .filter_map(|id| data.segments.iter().find(|(s, _)| s.id == *id).cloned())
        .collect();
    let origin = found.first().map(|(_, r)| r.header().tablet)?;
    let ok = found.len() == inputs.len() && found.iter().all(|(_, r)| r.header().tablet == origin);
    if !ok {
        tracing::info!(
            tablet = tablet.id,
            inputs = inputs.len(),
            "compaction does not apply (an input is gone or of another origin)"
        );
    }
    ok.then_some(found)
}

/// Rewrites a compaction's inputs as one segment: the rows the tablet
/// reads of each (rows of a split sibling's range, or outside a merged
/// input's `keep`, are dropped), under the inputs' origin, spanning their
/// log range. `None` when no row is left.
fn build_compaction(
    tablet: &Tablet,
    plan: &Plan,
) -> Result<Option<(SegmentRef, Arc<SegmentReader>)>> {
    let Some(inputs) = &plan.compact else {
        return Ok(None);
    };
    let range = (plan.after.lo, plan.after.hi);
    let mut rows = Vec::new();
    // The output's header spans what its rows can be: the hull of what the
    // tablet read of each input.
    let mut hull: Option<(u32, u64)> = None;
    for (s, reader) in inputs {
        let h = reader.header();
        let reads = s.reads((h.vshard_lo, h.vshard_hi), range);
        if let (Some(first), Some(last)) = (reads.first(), reads.last()) {
            hull = Some(hull.map_or((first.0, last.1), |(lo, hi)| {
                (lo.min(first.0), hi.max(last.1))
            }));
        }
        rows.extend(
            reader
                .rows()?
                .into_iter()
                .filter(|r| crate::catalog::in_ranges(&reads, r.vshard)),
        );
    }
    let Some((lo, hi)) = hull.filter(|_| !rows.is_empty()) else {
        return Ok(None);
    };
    rows.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    let header = segment::SegmentHeader {
        tablet: inputs[0].1.header().tablet,
        vshard_lo: lo,
        vshard_hi: hi,
        log_first: inputs.iter().map(|(s, _)| s.log_first).min().unwrap_or(0),
        log_last: inputs.iter().map(|(s, _)| s.log_last).max().unwrap_or(0),
    };
    let info = segment::write(&tablet.segment_dir, &header, &rows, &plan.write)?;
    written(tablet, info).map(Some)
}

/// The reference and reader of a segment this tablet just wrote (its own:
/// unshared, every row read).
fn written(
    tablet: &Tablet,
    info: segment::SegmentInfo,
) -> Result<(SegmentRef, Arc<SegmentReader>)> {
    let path = tablet.segment_dir.join(segment::file_name(&info.id));
    let reader = SegmentReader::open_with_id(&path, &info.id)?;
    Ok((
        SegmentRef {
            id: info.id,
            bytes: info.bytes,
            rows: info.rows,
            log_first: info.log_first,
            log_last: info.log_last,
            ts_min: info.ts_min,
            ts_max: info.ts_max,
            cold: None,
            origin: 0,
            shared: false,
            keep: None,
        },
        Arc::new(reader),
    ))
}

/// The segment list once a compaction's inputs are replaced by `output`
/// (at the place of the last input), or an error if an input is no longer
/// published (the state changed under the seal: it is retried).
fn compacted(
    data: &mut TabletData,
    inputs: &[(SegmentRef, Arc<SegmentReader>)],
    output: Option<(SegmentRef, Arc<SegmentReader>)>,
) -> Result<Vec<(SegmentRef, Arc<SegmentReader>)>> {
    let last = inputs.last().map(|(s, _)| s.id.clone()).unwrap_or_default();
    for (s, _) in inputs {
        if !data.segments.iter().any(|(p, _)| p.id == s.id) {
            return Err(Error::Config(format!(
                "compaction input {} is no longer published",
                s.id
            )));
        }
    }
    let mut out = Vec::with_capacity(data.segments.len());
    let mut output = output.map(|(mut r, reader)| {
        if let Some(cold) = data.cold_early.remove(&r.id) {
            r.cold = Some(cold);
        }
        (r, reader)
    });
    for (s, reader) in &data.segments {
        if inputs.iter().any(|(i, _)| i.id == s.id) {
            if s.id == last
                && let Some(o) = output.take()
            {
                out.push(o);
            }
            continue;
        }
        out.push((s.clone(), reader.clone()));
    }
    Ok(out)
}

/// A published segment as the compaction policy sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: String,
    pub bytes: u64,
    /// The tablet whose log positions its rows carry (its header's).
    pub origin: u64,
    /// Whether this tablet may rewrite it ([`may_rewrite`]).
    pub movable: bool,
    /// Whether it holds rows the tablet does not read (a split sibling's,
    /// or outside its `keep` since a merge).
    pub holds_unread: bool,
}

/// Whether a tablet may rewrite segment `s`: any but one shared since a
/// split while a cold tier is on. Such a segment has one object, under the
/// tablet that sealed it, which every tablet naming it reads; that tablet
/// cannot delete it while another may still name it, so a rewrite by any
/// of them would only store the rows twice in the bucket. It goes by
/// retention. Without a cold tier each side rewrites its own link.
pub fn may_rewrite(s: &SegmentRef, cold_tier: bool) -> bool {
    !(s.shared && cold_tier)
}

/// The next compaction of a tablet's segment list (oldest first), if one
/// is due. First a trim: the oldest movable segment that holds rows the
/// tablet does not read, rewritten alone. Else the oldest run of at least
/// `min_inputs` adjacent movable segments, each smaller than a quarter of
/// `target` bytes, all of one origin, as long as their sum stays within
/// `target`. Either bounds one pass's work (one segment, or `target`).
/// `target` 0 turns both off.
pub fn compaction_plan(
    segments: &[Candidate],
    target: u64,
    min_inputs: usize,
) -> Option<Vec<String>> {
    if target == 0 {
        return None;
    }
    if let Some(s) = segments.iter().find(|s| s.movable && s.holds_unread) {
        return Some(vec![s.id.clone()]);
    }
    if min_inputs < 2 {
        return None;
    }
    let small = |s: &Candidate| s.movable && s.bytes < target / 4;
    let mut i = 0;
    while i < segments.len() {
        let first = &segments[i];
        if !small(first) {
            i += 1;
            continue;
        }
        let mut run = vec![first.id.clone()];
        let mut bytes = first.bytes;
        let mut j = i + 1;
        while let Some(s) = segments.get(j) {
            if !small(s) || s.origin != first.origin || bytes + s.bytes > target {
                break;
            }
            bytes += s.bytes;
            run.push(s.id.clone());
            j += 1;
        }
        if run.len() >= min_inputs {
            return Some(run);
        }
        i = j.max(i + 1);
    }
    None
}

/// Seal builds still to fail ([`fail_next_seals`]).
static FAIL_SEALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Fault injection for tests of a node in-process: the next `n` seal
/// builds of this process fail as a refused disk write would (rows go
/// back, the checkpoint stays). 0 disarms.
pub fn fail_next_seals(n: u64) {
    FAIL_SEALS.store(n, Ordering::SeqCst);
}

/// What [`commit`] created or retired besides the segment.
struct Published {
    child: Option<TabletRecord>,
    absorbed: Option<(u64, u64)>,
}

fn build(tablet: &Tablet, plan: &Plan) -> Result<Option<(SegmentRef, Arc<SegmentReader>)>> {
    if FAIL_SEALS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(Error::io(
            format!("seal of tablet {} (injected)", tablet.id),
            std::io::Error::other("injected seal failure"),
        ));
    }
    if plan.rows.is_empty() {
        return Ok(None);
    }
    let info = segment::write(&tablet.segment_dir, &plan.header, &plan.rows, &plan.write)?;
    written(tablet, info).map(Some)
}

fn commit(
    tablet: &Tablet,
    data: &mut TabletData,
    plan: Plan,
    mut seg: Option<(SegmentRef, Arc<SegmentReader>)>,
    output: Option<(SegmentRef, Arc<SegmentReader>)>,
    extra_drops: &[Vec<u8>],
) -> Result<Published> {
    if let Some((r, _)) = &mut seg
        && let Some(cold) = data.cold_early.remove(&r.id)
    {
        r.cold = Some(cold);
    }
    // Retention dropped this segment (on the leader) before it published
    // here: the checkpoint moves past its rows, the segment is not kept.
    if let Some((r, _)) = &seg
        && data.dropped_early.remove(&r.id)
    {
        let path = tablet.segment_dir.join(segment::file_name(&r.id));
        let _ = std::fs::remove_file(&path);
        seg = None;
    }
    // A compaction's output takes its inputs' place in the list (a
    // retention drop of the output that applied first drops it).
    let compacted = match &plan.compact {
        Some(inputs) => {
            let output = match output {
                Some((r, _)) if data.dropped_early.remove(&r.id) => {
                    let _ =
                        std::fs::remove_file(tablet.segment_dir.join(segment::file_name(&r.id)));
                    None
                }
                o => o,
            };
            Some(compacted(data, inputs, output)?)
        }
        None => None,
    };
    let applied_state = encode(&(Some(plan.seal_log_id), plan.membership.clone()));
    let mut record = tablet.record(data, applied_state);
    if let Some(list) = &compacted {
        record.segments = list.iter().map(|(r, _)| r.clone()).collect();
    }
    // A merge's seal publishes the absorbed tablet's segments, linked into
    // this tablet's directory, before its own.
    if let Some(m) = &plan.merge {
        adopt_files(tablet, data, m)?;
        record
            .segments
            .extend(data.adopted.iter().map(|(r, _)| r.clone()));
    }
    if let Some((r, _)) = &mut seg {
        record.segments.push(r.clone());
        if plan.split.is_some() {
            r.shared = true;
        }
    }
    // A split shares every segment the parent has with the child.
    if plan.split.is_some() {
        for s in &mut record.segments {
            s.shared = true;
        }
    }
    record.checkpoint = plan.seal_index;
    record.vshard_lo = plan.after.lo;
    record.vshard_hi = plan.after.hi;
    record.generation = plan.after.generation;
    record.frozen = plan.after.frozen;
    let mut drops: Vec<Vec<u8>> = plan
        .drop_receipts
        .iter()
        .map(receipts::encode_key)
        .collect();
    drops.extend_from_slice(extra_drops);
    let child = match &plan.split {
        Some(split) => split_child(tablet, data, &record, split, plan.seal_index)?,
        None => None,
    };
    let purged = child
        .as_ref()
        .map(|(c, _, _)| crate::raft::split_child_state(&c.init_voters).1)
        .unwrap_or_default();
    let created = tablet.catalog.publish_split(
        &record,
        &plan.add_receipts,
        &drops,
        child
            .as_ref()
            .map(|(r, rows, _)| (r, rows.as_slice(), purged.as_slice())),
        plan.merge
            .as_ref()
            .map(|m| (m.absorbed, m.absorbed_replica)),
    )?;
    let child = match child {
        Some((_, _, links)) if !created => {
            // The child appeared here meanwhile (from an assignment): the
            // links this split made are not its files; files it had are
            // untouched.
            for link in links {
                let _ = std::fs::remove_file(link);
            }
            None
        }
        Some((child, _, _)) => Some(child),
        None => None,
    };
    data.published = plan.after;
    if plan.split.is_some() {
        for (s, _) in &mut data.segments {
            s.shared = true;
        }
    }
    if let (Some(list), Some(inputs)) = (compacted, &plan.compact) {
        data.segments = list;
        for (s, _) in inputs {
            // Its file (this tablet's link) goes now: readers keep their
            // handle. Its object stays: a replica that was down across
            // this compaction may still name the segment, with its local
            // file evicted, and must open it to start and to replay the
            // compaction (deleting it stopped such a node from starting;
            // ARCHITECTURE, "Compaction").
            let _ = std::fs::remove_file(tablet.segment_dir.join(segment::file_name(&s.id)));
            crate::tier::stub::remove(&tablet.segment_dir, &s.id);
        }
        tablet.stats.compactions.fetch_add(1, Ordering::Relaxed);
    }
    if plan.merge.is_some() {
        let adopted = std::mem::take(&mut data.adopted);
        data.segments.extend(adopted);
    }
    if let Some(seg) = seg {
        data.segments.push(seg);
    }
    data.frozen.remove(0);
    data.checkpoint = plan.seal_index;
    data.checkpoint_log_id = Some(plan.seal_log_id);
    data.checkpoint_membership = plan.membership;
    for k in &plan.drop_receipts {
        data.receipts.expire_key(k);
    }
    tablet.stats.seals_published.fetch_add(1, Ordering::Relaxed);
    Ok(Published {
        child,
        absorbed: plan.merge.map(|m| (m.absorbed, m.absorbed_replica)),
    })
}

/// Hard-links the files of the segments a merge adopted from the absorbed
/// replica's directory into this tablet's (a file already evicted to the
/// cold tier is read from its object, under its owner's key).
fn adopt_files(tablet: &Tablet, data: &TabletData, m: &super::MergeIn) -> Result<()> {
    for (s, _) in &data.adopted {
        let from = m.absorbed_dir.join(segment::file_name(&s.id));
        let to = tablet.segment_dir.join(segment::file_name(&s.id));
        if to.exists() {
            continue;
        }
        if from.exists() {
            std::fs::hard_link(&from, &to).map_err(|e| {
                Error::io(format!("link {} to {}", from.display(), to.display()), e)
            })?;
        } else if s.cold.is_none() {
            return Err(Error::io(
                format!(
                    "merge of tablet {}: segment {} has no file in {} and no cold copy",
                    m.absorbed,
                    s.id,
                    m.absorbed_dir.display()
                ),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
    }
    crate::fsutil::fsync_dir(&tablet.segment_dir)
        .map_err(|e| Error::io(format!("fsync {}", tablet.segment_dir.display()), e))
}

/// The catalog record and receipts of the child a split creates on this
/// node, with its segment files hard-linked into its own directory: every
/// segment the parent has published (the split's own seal included), as a
/// shared reference, and every receipt applied up to the split that
/// touches the child's range; and the links it made. `None` when this node
/// holds no replica of the child, or holds one already (an assignment made
/// it while this replica lagged behind the split).
#[allow(clippy::type_complexity)]
fn split_child(
    tablet: &Tablet,
    data: &TabletData,
    parent: &TabletRecord,
    split: &super::SplitChild,
    split_index: u64,
) -> Result<Option<(TabletRecord, Vec<ReceiptRow>, Vec<std::path::PathBuf>)>> {
    if tablet.catalog.tablet(split.child)?.is_some() {
        return Ok(None);
    }
    let node = crate::raft::router::node_of(tablet.replica_id);
    let Some(replica_id) = split
        .replicas
        .iter()
        .copied()
        .find(|r| crate::raft::router::node_of(*r) == node)
    else {
        tracing::warn!(
            tablet = tablet.id,
            child = split.child,
            "split names no replica of the child on this node"
        );
        return Ok(None);
    };
    let dir = tablet
        .segment_dir
        .parent()
        .map(|p| p.join(split.child.to_string()))
        .ok_or_else(|| Error::Config("segment directory has no parent".into()))?;
    crate::fsutil::create_dir_durable(&dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut segments = Vec::with_capacity(parent.segments.len());
    let mut links = Vec::new();
    for s in &parent.segments {
        let from = tablet.segment_dir.join(segment::file_name(&s.id));
        let to = dir.join(segment::file_name(&s.id));
        // An evicted segment has no file, but may have a stub: the child
        // opens it from the stub, without the bucket.
        let stub_from = crate::tier::stub::path(&tablet.segment_dir, &s.id);
        let stub_to = crate::tier::stub::path(&dir, &s.id);
        for (from, to) in [(from, to), (stub_from, stub_to)] {
            if from.exists() && !to.exists() {
                std::fs::hard_link(&from, &to).map_err(|e| {
                    Error::io(format!("link {} to {}", from.display(), to.display()), e)
                })?;
                links.push(to);
            }
        }
        segments.push(SegmentRef {
            origin: s.owner(tablet.id),
            shared: true,
            ..s.clone()
        });
    }
    crate::fsutil::fsync_dir(&dir).map_err(|e| Error::io(format!("fsync {}", dir.display()), e))?;
    let cutoff = data
        .clock_us
        .saturating_sub(tablet.options.receipt_window_us);
    let mut receipts: Vec<ReceiptRow> = data
        .receipts
        .iter()
        .filter(|(_, r)| r.index <= split_index && r.at_us >= cutoff)
        .filter(|(_, r)| {
            r.parts
                .iter()
                .any(|p| u64::from(p.vshard_lo) < split.hi && p.vshard_hi > u64::from(split.at))
        })
        .map(|(k, r)| {
            // Index 0: applied before anything of the child's own log.
            let r = receipts::Receipt {
                index: 0,
                ..r.clone()
            };
            ReceiptRow {
                key: receipts::encode_key(k),
                value: encode(&r),
            }
        })
        .collect();
    receipts.sort_by(|a, b| a.key.cmp(&b.key));
    let record = TabletRecord {
        v: 1,
        id: split.child,
        vshard_lo: split.at,
        vshard_hi: split.hi,
        generation: split.generation,
        checkpoint: 0,
        applied_state: crate::raft::split_child_state(&split.replicas).0,
        segments,
        replica_id,
        init_voters: split.replicas.clone(),
        frozen: false,
    };
    Ok(Some((record, receipts, links)))
}

/// Puts the rows of the oldest frozen memtable back: into the next frozen
/// memtable when there is one (its checkpoint must cover them), else into
/// the active memtable.
/// A split on the failed seal moves with its rows: to the next frozen
/// memtable, or on to the next seal.
fn put_back(data: &mut TabletData) {
    let failed = data.frozen.remove(0);
    match data.frozen.first_mut() {
        Some(next) => {
            next.memtable.absorb(failed.memtable);
            next.rows_range.hi = next.rows_range.hi.max(failed.rows_range.hi);
            if next.split.is_none() {
                next.split = failed.split;
            }
            if next.merge.is_none() {
                next.merge = failed.merge;
            }
            if next.compact.is_none() {
                next.compact = failed.compact;
            }
        }
        None => {
            data.memtable.absorb(failed.memtable);
            if failed.split.is_some() {
                data.pending_split = failed.split;
            }
            if failed.merge.is_some() {
                data.pending_merge = failed.merge;
            }
            if failed.compact.is_some() {
                data.pending_compact = failed.compact;
            }
        }
    }
}

/// Seals the oldest frozen memtable of `tablet` if it is the one frozen at
/// `seal_index`, without holding the tablet lock while writing the segment.
/// Returns the new checkpoint on success, `None` if there was nothing to do.
pub fn run_seal(tablet: &Tablet, seal_index: u64) -> Result<Option<SealDone>> {
    let Some(plan) = plan(tablet, &tablet.read(), seal_index) else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let built = build(tablet, &plan).and_then(|seg| {
        let sealed = started.elapsed();
        if let Some((s, _)) = &seg {
            crate::metrics::record_seal(sealed, s.bytes);
        }
        let output = build_compaction(tablet, &plan)?;
        if let Some((s, _)) = &output {
            crate::metrics::record_compaction(started.elapsed() - sealed, s.bytes);
        }
        Ok((seg, output))
    });
    let mut data = tablet.write();
    let result = built.and_then(|(seg, output)| commit(tablet, &mut data, plan, seg, output, &[]));
    match result {
        Ok(Published { child, absorbed }) => Ok(Some(SealDone {
            checkpoint: seal_index,
            child,
            absorbed,
        })),
        Err(e) => {
            tablet.stats.seal_failures.fetch_add(1, Ordering::Relaxed);
            put_back(&mut data);
            Err(e)
        }
    }
}

/// Seals the oldest frozen memtable with the tablet lock held (snapshot
/// install: rare, and nothing may read a half-installed state).
pub(crate) fn publish_front(
    tablet: &Tablet,
    data: &mut TabletData,
    extra_drops: &[Vec<u8>],
) -> Result<()> {
    let seal_index = data
        .frozen
        .first()
        .map(|f| f.seal_index)
        .unwrap_or_default();
    let Some(plan) = plan(tablet, data, seal_index) else {
        return Ok(());
    };
    let result = build(tablet, &plan).and_then(|seg| {
        let output = build_compaction(tablet, &plan)?;
        commit(tablet, data, plan, seg, output, extra_drops)
    });
    if result.is_err() {
        tablet.stats.seal_failures.fetch_add(1, Ordering::Relaxed);
        put_back(data);
    }
    result.map(|_| ())
}

/// Removes segment files and stubs the catalog does not name (a crash between the
/// segment write and its publish), leftover temp files, and part files of
/// segment fetches a crash interrupted. The rows are still in the journal
/// and the seal replays; a snapshot install fetches its segments again.
pub fn remove_orphans(dir: &Path, published: &[SegmentRef]) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    let mut removed = false;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let keep = published.iter().any(|s| {
            name == segment::file_name(&s.id) || name == crate::tier::stub::file_name(&s.id)
        });
        let leftover = name.ends_with(".seg")
            || name.ends_with(".stub")
            || name.ends_with(".tmp")
            || name.ends_with(segment::PART_SUFFIX);
        if !keep && leftover {
            std::fs::remove_file(entry.path())
                .map_err(|e| Error::io(format!("remove orphan {}", entry.path().display()), e))?;
            removed = true;
        }
    }
    if removed {
        crate::fsutil::fsync_dir(dir)
            .map_err(|e| Error::io(format!("fsync {}", dir.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, bytes: u64, movable: bool, origin: u64) -> Candidate {
        Candidate {
            id: id.into(),
            bytes,
            origin,
            movable,
            holds_unread: false,
        }
    }

    #[test]
    fn compaction_takes_the_oldest_run_of_small_movable_segments_of_one_origin() {
        let list = |v: &[(&str, u64, bool, u64)]| -> Vec<Candidate> {
            v.iter().map(|(id, b, m, o)| cand(id, *b, *m, *o)).collect()
        };
        // Unmovable ones (shared, with a cold tier) and big ones break
        // runs; too short a run waits.
        let l = list(&[
            ("a", 10, false, 1),
            ("b", 10, true, 1),
            ("c", 10, true, 1),
            ("d", 500, true, 1),
            ("e", 10, true, 2),
            ("f", 10, true, 2),
            ("g", 10, true, 2),
            ("h", 10, true, 2),
            ("i", 10, true, 2),
        ]);
        assert_eq!(
            compaction_plan(&l, 1000, 4),
            Some(vec![
                "e".into(),
                "f".into(),
                "g".into(),
                "h".into(),
                "i".into()
            ])
        );
        assert_eq!(compaction_plan(&l, 1000, 6), None);
        // Another origin ends a run; the sum stays within the target.
        let l = list(&[
            ("a", 200, true, 1),
            ("b", 200, true, 1),
            ("c", 200, true, 1),
            ("d", 200, true, 1),
            ("e", 200, true, 1),
            ("f", 200, true, 1),
        ]);
        assert_eq!(
            compaction_plan(&l, 1000, 4),
            Some(vec![
                "a".into(),
                "b".into(),
                "c".into(),
                "d".into(),
                "e".into()
            ])
        );
        assert_eq!(compaction_plan(&l, 0, 4), None, "off");
    }

    #[test]
    fn a_segment_holding_unread_rows_is_trimmed_first_and_alone() {
        let mut l: Vec<Candidate> = (0..6)
            .map(|i| cand(&format!("s{i}"), 10, true, 1))
            .collect();
        l[3].holds_unread = true;
        l[4].holds_unread = true;
        assert_eq!(compaction_plan(&l, 1000, 4), Some(vec!["s3".into()]));
        // Big or not, movable only: a shared segment under a cold tier
        // stays for retention.
        l[3].movable = false;
        l[4].bytes = 10_000;
        assert_eq!(compaction_plan(&l, 1000, 4), Some(vec!["s4".into()]));
        assert_eq!(compaction_plan(&l, 0, 4), None, "off");
        let shared = |origin| SegmentRef {
            origin,
            shared: true,
            ..published("x")
        };
        assert!(
            !may_rewrite(&shared(0), true),
            "the owner's, with a cold tier"
        );
        assert!(
            !may_rewrite(&shared(7), true),
            "another's, with a cold tier"
        );
        assert!(may_rewrite(&shared(0), false));
        assert!(may_rewrite(&shared(7), false));
        assert!(may_rewrite(&published("y"), true));
    }

    fn published(id: &str) -> SegmentRef {
        SegmentRef {
            id: id.into(),
            bytes: 1,
            rows: 1,
            log_first: 1,
            log_last: 1,
            ts_min: 0,
            ts_max: 0,
            cold: None,
            origin: 0,
            shared: false,
            keep: None,
        }
    }

    #[test]
    fn orphans_temps_and_fetch_parts_are_removed_published_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let published_id = "0123456789abcdef0123456789abcdef";
        let published = published(published_id);
        let orphan = "fedcba9876543210fedcba9876543210";
        for name in [
            format!("{published_id}.seg"),
            format!("{orphan}.seg"),
            format!("{orphan}.seg.tmp"),
            format!("{orphan}.seg.7.part"),
            "README".to_string(),
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        remove_orphans(dir.path(), &[published]).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec![format!("{published_id}.seg"), "README".into()]);
    }
}
