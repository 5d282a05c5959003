//! Namespace retention by whole segments: a segment whose rows all belong
//! to one namespace with a retention period, and whose newest row (by ts) is
//! older than that period, is dropped by a replicated `DropSegment`; no
//! data is rewritten. Segments mixing namespaces are kept (a later
//! compaction could split them; none exists yet).
//!
//! ```text
//! leader: plan (pure) ─► propose DropSegment{id} ─► every replica: catalog
//!         without it, local file deleted
//!         next manifest (without it) published ─► object deleted
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::tablet::{Tablet, TabletData};

/// A segment as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seg {
    pub id: String,
    pub namespace: Option<String>,
    pub ts_max: u64,
}

/// The segments past retention at `now_us` (row ts are microseconds).
pub fn plan(segments: &[Seg], retention: &BTreeMap<String, Duration>, now_us: u64) -> Vec<String> {
    segments
        .iter()
        .filter(|s| {
            let Some(ns) = &s.namespace else {
                return false;
            };
            let Some(period) = retention.get(ns) else {
                return false;
            };
            let cutoff = now_us.saturating_sub(period.as_micros() as u64);
            s.ts_max < cutoff
        })
        .map(|s| s.id.clone())
        .collect()
}

/// Applies `DropSegment`: the segment leaves the tablet's state and
/// catalog, then its local file is deleted. Deterministic: every replica
/// drops the same segment at the same log index. Unknown ids (already
/// dropped, or a replayed entry) are ignored.
pub(crate) fn drop_segment(tablet: &Tablet, data: &mut TabletData, segment: &str) {
    let Some(at) = data.segments.iter().position(|(s, _)| s.id == segment) else {
        // Not published here yet (a follower's seal can lag its apply).
        if data.frozen.iter().any(|f| !f.memtable.is_empty()) {
            data.dropped_early.insert(segment.to_string());
        }
        return;
    };
    data.segments.remove(at);
    let applied_state =
        crate::raft::encode(&(data.checkpoint_log_id, data.checkpoint_membership.clone()));
    let record = tablet.record(data, applied_state);
    if let Err(e) = tablet.catalog.put_tablet(&record) {
        // The file stays; the entry replays after a restart (the log after
        // the checkpoint is kept) and drops it then.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_namespace_segments_past_their_period_are_dropped() {
        let seg = |id: &str, ns: Option<&str>, ts_max: u64| Seg {
            id: id.into(),
            namespace: ns.map(Into::into),
            ts_max,
        };
        let retention = BTreeMap::from([("logs/a".to_string(), Duration::from_secs(10))]);
        let now = 100_000_000; // 100 s
        let segs = [
            seg("old", Some("logs/a"), 50_000_000),
            seg("edge", Some("logs/a"), 90_000_000), // exactly at the cutoff: kept
            seg("new", Some("logs/a"), 95_000_000),
            seg("other", Some("logs/b"), 1),
            seg("mixed", None, 1),
        ];
        assert_eq!(plan(&segs, &retention, now), vec!["old".to_string()]);
        assert!(plan(&segs, &BTreeMap::new(), now).is_empty());
    }
}
