//! Namespace retention by whole segments: a segment whose rows all belong
//! to one namespace with a retention period, and whose newest row (by ts) is
//! older than that period, is dropped by a replicated `DropSegment`; no
//! data is rewritten. Segments mixing namespaces are kept (a later
//! compaction could split them; none exists yet).
//!
//! ```text
//! leader: plan (pure) ─► propose DropSegment{id} ─► every replica: apply
//!         (tablet::apply) drops it, the driver writes the catalog without
//!         it and deletes the local file (raft::state_machine)
//!         next manifest (without it) published ─► object deleted
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

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
