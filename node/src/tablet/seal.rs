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
use crate::catalog::{ReceiptRow, SegmentRef};
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
            vshard_lo: tablet.vshard_lo,
            vshard_hi: tablet.vshard_hi,
            log_first,
            log_last: seal_index,
        },
        rows,
        add_receipts,
        drop_receipts,
        seal_log_id: frozen.seal_log_id,
        membership: frozen.membership.clone(),
    })
}

fn build(tablet: &Tablet, plan: &Plan) -> Result<Option<(SegmentRef, Arc<SegmentReader>)>> {
    if plan.rows.is_empty() {
        return Ok(None);
    }
    let info = segment::write(
        &tablet.segment_dir,
        &plan.header,
        &plan.rows,
        &segment::WriteOptions::default(),
    )?;
    let path = tablet.segment_dir.join(format!("{}.seg", info.id));
    let reader = SegmentReader::open_with_id(&path, &info.id)?;
    Ok(Some((
        SegmentRef {
            id: info.id,
            bytes: info.bytes,
            rows: info.rows,
            log_first: info.log_first,
            log_last: info.log_last,
            ts_min: info.ts_min,
            ts_max: info.ts_max,
            cold: None,
        },
        Arc::new(reader),
    )))
}

fn commit(
    tablet: &Tablet,
    data: &mut TabletData,
    plan: Plan,
    mut seg: Option<(SegmentRef, Arc<SegmentReader>)>,
    extra_drops: &[Vec<u8>],
) -> Result<()> {
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
    let applied_state = encode(&(Some(plan.seal_log_id), plan.membership.clone()));
    let mut record = tablet.record(data, applied_state);
    if let Some((r, _)) = &seg {
        record.segments.push(r.clone());
    }
    record.checkpoint = plan.seal_index;
    let mut drops: Vec<Vec<u8>> = plan
        .drop_receipts
        .iter()
        .map(receipts::encode_key)
        .collect();
    drops.extend_from_slice(extra_drops);
    tablet
        .catalog
        .publish(&record, &plan.add_receipts, &drops)?;
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
    Ok(())
}

/// Puts the rows of the oldest frozen memtable back: into the next frozen
/// memtable when there is one (its checkpoint must cover them), else into
/// the active memtable.
fn put_back(data: &mut TabletData) {
    let failed = data.frozen.remove(0);
    match data.frozen.first_mut() {
        Some(next) => next.memtable.absorb(failed.memtable),
        None => data.memtable.absorb(failed.memtable),
    }
}

/// Seals the oldest frozen memtable of `tablet` if it is the one frozen at
/// `seal_index`, without holding the tablet lock while writing the segment.
/// Returns the new checkpoint on success, `None` if there was nothing to do.
pub fn run_seal(tablet: &Tablet, seal_index: u64) -> Result<Option<u64>> {
    let Some(plan) = plan(tablet, &tablet.read(), seal_index) else {
        return Ok(None);
    };
    let built = build(tablet, &plan);
    let mut data = tablet.write();
    let result = built.and_then(|seg| commit(tablet, &mut data, plan, seg, &[]));
    match result {
        Ok(()) => Ok(Some(seal_index)),
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
    let result = build(tablet, &plan).and_then(|seg| commit(tablet, data, plan, seg, extra_drops));
    if result.is_err() {
        tablet.stats.seal_failures.fetch_add(1, Ordering::Relaxed);
        put_back(data);
    }
    result
}

/// Removes segment files the catalog does not name (a crash between the
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
        let keep = published.iter().any(|s| name == format!("{}.seg", s.id));
        let leftover = name.ends_with(".seg")
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

    #[test]
    fn orphans_temps_and_fetch_parts_are_removed_published_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let published_id = "0123456789abcdef0123456789abcdef";
        let published = SegmentRef {
            id: published_id.into(),
            bytes: 1,
            rows: 1,
            log_first: 1,
            log_last: 1,
            ts_min: 0,
            ts_max: 0,
            cold: None,
        };
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
