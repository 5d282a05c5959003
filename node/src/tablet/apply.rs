//! Deterministic apply of a tablet's commands: batches go to the memtable
//! (after conditions and receipts), `Seal`, `Split`, `Freeze`, `Merge` and
//! `Compact` freeze the memtable for the seal worker, `Uploaded` and
//! `DropSegment` change the segment list.
//!
//! Apply reads only the command, its log position and the tablet's applied
//! state, never the wall clock, so every replica reaches the same rows,
//! positions, receipts and seal boundaries. It does no I/O either: what
//! must reach the disk is returned as an [`Effect`] for the replica's driver
//! (`raft::state_machine`), which runs it and handles its failure. The
//! openraft side (entries, snapshots) lives in `raft::state_machine`.

use std::sync::Arc;

use stele_proto::command::{AppendBatch, Pos, TabletCommand, TabletResponse};

use super::receipts::{self, Receipt, ReceiptPart};
use super::{Frozen, Tablet, TabletData};
use crate::catalog::{ColdCopy, SegmentRef};
use crate::raft::LogId;

/// What an applied command asks of the replica's driver besides its
/// response. Apply itself never writes: these are the writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The memtable was frozen at this log index: hand it to the seal
    /// worker.
    Seal(u64),
    /// A published segment gained its cold copy: write the tablet's catalog
    /// record (at its checkpoint) so a restart knows the copy.
    RecordCold { segment: String, cold: ColdCopy },
    /// A published segment was dropped (namespace retention): write the
    /// catalog record without it, then remove its file and stub.
    DropFiles { segment: String },
}

/// The result of applying one command.
#[derive(Debug)]
pub struct Applied {
    pub response: TabletResponse,
    pub effect: Option<Effect>,
}

impl Applied {
    fn only(response: TabletResponse) -> Applied {
        Applied {
            response,
            effect: None,
        }
    }

    fn sealed(index: u64) -> Applied {
        Applied {
            response: TabletResponse::Sealed,
            effect: Some(Effect::Seal(index)),
        }
    }
}

/// Whether a `Merge` of `absorbed` over `[lo, hi)` applies here: another
/// tablet, a range adjacent to this one's, and this one not frozen.
pub fn merge_fits(tablet: &Tablet, absorbed: u64, lo: u32, hi: u64) -> bool {
    let (mlo, mhi) = tablet.range();
    absorbed != tablet.id
        && u64::from(lo) < hi
        && (mhi == u64::from(lo) || u64::from(mlo) == hi)
        && !tablet.is_frozen()
}

/// Takes what a merge adopts from the absorbed replica on this node, if
/// that replica is frozen with every row published over `[lo, hi)` and
/// `me` has no compaction in flight (they resolve against the segments'
/// reads as of their place in the log, and the merge changes them). `None`:
/// not yet; the driver waits and asks again.
pub fn adoptable(me: &Tablet, absorbed: &Tablet, lo: u32, hi: u64) -> Option<Adoptable> {
    if me.read().frozen.iter().any(|f| f.compact.is_some()) {
        return None;
    }
    let d = absorbed.read();
    if !(d.published.frozen && d.frozen.is_empty() && absorbed.range() == (lo, hi)) {
        return None;
    }
    Some(Adoptable {
        segments: d.segments.clone(),
        receipts: d
            .receipts
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect(),
        clock_us: d.clock_us,
        replica_id: absorbed.replica_id,
        dir: absorbed.segment_dir.clone(),
    })
}

/// Applies one command at `log_id`. `adopt` is what a `Merge` takes from
/// the absorbed replica here ([`adoptable`]), `None` when the merge does
/// not fit ([`merge_fits`]).
pub fn apply(
    tablet: &Tablet,
    data: &mut TabletData,
    log_id: LogId,
    cmd: &TabletCommand,
    adopt: Option<Adoptable>,
) -> Applied {
    let index = log_id.index();
    match cmd {
        TabletCommand::Append(batch) => Applied::only(apply_batch(tablet, data, index, 0, batch)),
        TabletCommand::AppendMany(batches) => {
            // Each batch on its own, in order; slots go on across batches
            // whether a batch applied or not, so a batch's positions
            // depend only on the entry, never on what was applied before.
            let mut first_slot = 0u32;
            let mut responses = Vec::with_capacity(batches.len());
            for batch in batches {
                responses.push(apply_batch(tablet, data, index, first_slot, batch));
                first_slot = first_slot.saturating_add(batch.records.len() as u32);
            }
            Applied::only(TabletResponse::Many(responses))
        }
        TabletCommand::Uploaded {
            segment,
            bytes,
            file_xxh3,
        } => {
            let cold = ColdCopy {
                bytes: *bytes,
                file_xxh3: *file_xxh3,
            };
            Applied {
                response: TabletResponse::None,
                effect: record_uploaded(data, segment, cold),
            }
        }
        TabletCommand::DropSegment { segment } => {
            // A frozen tablet's segments are what its merge adopts: they
            // stay as they are until then. So do the inputs of a
            // compaction not yet published: replicas that published it
            // already cannot drop them.
            let effect = if !tablet.is_frozen() && !data.compacting(segment) {
                drop_segment(data, segment)
            } else {
                None
            };
            Applied {
                response: TabletResponse::None,
                effect,
            }
        }
        TabletCommand::Compact { inputs, format } => {
            freeze(
                tablet,
                data,
                log_id,
                Change::Compact(inputs.clone()),
                *format,
            );
            Applied::sealed(index)
        }
        TabletCommand::Freeze { generation } => {
            let live = tablet.range_state();
            if live.frozen {
                Applied::only(TabletResponse::None)
            } else {
                let after = super::RangeState {
                    frozen: true,
                    generation: (*generation).max(live.generation),
                    ..live
                };
                freeze(tablet, data, log_id, Change::Freeze(after), 0);
                Applied::sealed(index)
            }
        }
        TabletCommand::Unfreeze => {
            let live = tablet.range_state();
            if live.frozen {
                tablet.set_range(super::RangeState {
                    frozen: false,
                    ..live
                });
            }
            Applied::only(TabletResponse::None)
        }
        TabletCommand::Merge {
            absorbed,
            lo,
            hi,
            generation,
        } => match adopt {
            Some(from) => {
                merge(
                    tablet,
                    data,
                    log_id,
                    *absorbed,
                    (*lo, *hi, *generation),
                    from,
                );
                Applied::sealed(index)
            }
            None => {
                let (mlo, mhi) = tablet.range();
                Applied::only(TabletResponse::Rejected {
                    reason: format!(
                        "merge of tablet {absorbed} [{lo}, {hi}) into tablet {} [{mlo}, {mhi}): not adjacent (already merged, or stale)",
                        tablet.id
                    ),
                })
            }
        },
        TabletCommand::Seal { format, .. } => {
            freeze(tablet, data, log_id, Change::None, *format);
            Applied::sealed(index)
        }
        TabletCommand::Split {
            at,
            child,
            child_replicas,
            generation,
        } => {
            let (lo, hi) = tablet.range();
            let inside = lo < *at && u64::from(*at) < hi;
            if !inside || *child == tablet.id || child_replicas.is_empty() {
                // Already applied (a retried proposal) or stale.
                Applied::only(TabletResponse::Rejected {
                    reason: format!(
                        "split at {at} outside the open range ({lo}, {hi}) of tablet {}",
                        tablet.id
                    ),
                })
            } else {
                let split = super::SplitChild {
                    child: *child,
                    at: *at,
                    hi,
                    generation: (*generation).max(tablet.generation()),
                    replicas: child_replicas.clone(),
                };
                freeze(tablet, data, log_id, Change::Split(split), 0);
                Applied::sealed(index)
            }
        }
    }
}

/// Records an applied `Uploaded` on the segment's entry when the segment
/// is published here (the driver then persists the record), else until the
/// local seal publishes it.
fn record_uploaded(data: &mut TabletData, segment: &str, cold: ColdCopy) -> Option<Effect> {
    let Some(entry) = data.segments.iter_mut().find(|(s, _)| s.id == segment) else {
        // A follower may apply Uploaded before its own seal worker has
        // published the segment: the seal picks it up (seal.rs).
        data.cold_early.insert(segment.to_string(), cold);
        return None;
    };
    if entry.0.cold.is_some() {
        return None;
    }
    entry.0.cold = Some(cold.clone());
    Some(Effect::RecordCold {
        segment: segment.to_string(),
        cold,
    })
}

/// Drops a published segment from the tablet's state (the driver persists
/// the record and removes the files); one not published here yet is
/// dropped by the seal that publishes it.
fn drop_segment(data: &mut TabletData, segment: &str) -> Option<Effect> {
    let Some(at) = data.segments.iter().position(|(s, _)| s.id == segment) else {
        // Not published here yet (a follower's seal can lag its apply).
        if data.frozen.iter().any(|f| !f.memtable.is_empty()) {
            data.dropped_early.insert(segment.to_string());
        }
        return None;
    };
    data.segments.remove(at);
    Some(Effect::DropFiles {
        segment: segment.to_string(),
    })
}

/// What a `Merge` takes from the absorbed replica on this node.
pub struct Adoptable {
    segments: Vec<(SegmentRef, Arc<crate::segment::SegmentReader>)>,
    receipts: Vec<(receipts::ReceiptKey, Receipt)>,
    clock_us: u64,
    replica_id: u64,
    dir: std::path::PathBuf,
}

fn merge(
    tablet: &Tablet,
    data: &mut TabletData,
    log_id: LogId,
    absorbed: u64,
    (lo, hi, generation): (u32, u64, u64),
    from: Adoptable,
) {
    let index = log_id.index();
    let live = tablet.range_state();
    let merged = super::RangeState {
        lo: live.lo.min(lo),
        hi: live.hi.max(hi),
        generation: generation.max(live.generation),
        frozen: false,
    };
    // Each side goes on reading of its segments only what it read so far:
    // a segment shared since a split may hold rows of both, and one side
    // may have rewritten its copy without the other's rows. A segment both
    // name is read once, for what either read.
    let header = |reader: &crate::segment::SegmentReader| {
        let h = reader.header();
        (h.vshard_lo, h.vshard_hi)
    };
    for (s, reader) in data.segments.iter_mut().chain(data.adopted.iter_mut()) {
        *s = s.clone().narrowed(header(reader), (live.lo, live.hi));
    }
    for (seg, reader) in from.segments {
        let seg = SegmentRef {
            origin: seg.owner(absorbed),
            ..seg.narrowed(header(&reader), (lo, hi))
        };
        let h = header(&reader);
        match data
            .segments
            .iter_mut()
            .chain(data.adopted.iter_mut())
            .find(|(s, _)| s.id == seg.id)
        {
            Some((mine, _)) => mine.widen(h, &seg.reads(h, (lo, hi))),
            None => data.adopted.push((seg, reader)),
        }
    }
    // The union of the receipts, each republished with this seal (index
    // `index`): a batch both tablets applied parts of keeps both parts.
    for (key, theirs) in from.receipts {
        let receipt = match data.receipts.get(&key) {
            Some(mine) => {
                let mut parts = mine.parts.clone();
                for p in theirs.parts {
                    if !parts.contains(&p) {
                        parts.push(p);
                    }
                }
                Receipt {
                    v: mine.v,
                    parts,
                    at_us: mine.at_us.max(theirs.at_us),
                    index,
                }
            }
            None => Receipt { index, ..theirs },
        };
        data.receipts.insert(key, receipt);
    }
    data.clock_us = data.clock_us.max(from.clock_us);
    let m = super::MergeIn {
        absorbed,
        absorbed_replica: from.replica_id,
        absorbed_dir: from.dir,
    };
    freeze(tablet, data, log_id, Change::Merge(m, merged), 0);
}

/// Applies one batch of an entry at `index`, its records taking slots
/// from `first_slot` on (0 for an `Append`; an `AppendMany` numbers its
/// batches' records in one run).
pub(crate) fn apply_batch(
    tablet: &Tablet,
    data: &mut TabletData,
    index: u64,
    first_slot: u32,
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
    if tablet.is_frozen() {
        return TabletResponse::Rejected {
            reason: format!("tablet {} is frozen for a merge", tablet.id),
        };
    }
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
    for (n, r) in batch.records.iter().enumerate() {
        let slot = first_slot + n as u32;
        data.memtable.insert_in(
            &batch.namespace,
            r.key.clone(),
            (r.ts, index, slot),
            r.vshard,
            r.value.clone(),
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

/// What a seal carries besides its rows.
enum Change {
    None,
    /// The live range becomes `[lo, at)`; the child is created with the
    /// seal's publish.
    Split(super::SplitChild),
    /// The live range becomes the given (frozen) state.
    Freeze(super::RangeState),
    /// The live range becomes the merged one; the absorbed replica is
    /// adopted with the seal's publish.
    Merge(super::MergeIn, super::RangeState),
    /// The seal's publish also rewrites these segments as one.
    Compact(Vec<String>),
}

/// Freezes the memtable at `log_id` for the seal worker (`Seal`, and the
/// seals of `Split`, `Freeze` and `Merge`, which also move the live range).
/// A split or merge whose earlier seal failed to publish rides on this one.
/// Freezes the memtable for a seal at `log_id`, to be written in segment
/// format `format` (from the entry; 0 is version 1). Seals of `Split`,
/// `Freeze` and `Merge` entries write version 1: their entries carry no
/// format.
fn freeze(tablet: &Tablet, data: &mut TabletData, log_id: LogId, change: Change, format: u32) {
    let live = tablet.range_state();
    let (split, carried) = match &change {
        Change::Split(s) => (Some(s.clone()), false),
        _ => (data.pending_split.take(), true),
    };
    let merge = match &change {
        Change::Merge(m, _) => Some(m.clone()),
        _ => data.pending_merge.take(),
    };
    let compact = match &change {
        Change::Compact(inputs) => Some(inputs.clone()),
        _ => data.pending_compact.take(),
    };
    // A carried split's rows came back from its failed seal: they span the
    // range before it.
    let rows_range = match (&split, carried) {
        (Some(s), true) => super::RangeState { hi: s.hi, ..live },
        _ => live,
    };
    let after = match (&change, &split) {
        (Change::Freeze(r) | Change::Merge(_, r), _) => *r,
        (_, Some(s)) if s.at > rows_range.lo && u64::from(s.at) < rows_range.hi => {
            super::RangeState {
                lo: rows_range.lo,
                hi: u64::from(s.at),
                generation: s.generation,
                frozen: live.frozen,
            }
        }
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
        merge,
        compact,
        format: format.max(crate::segment::format::FORMAT_VERSION_MIN),
    });
}
