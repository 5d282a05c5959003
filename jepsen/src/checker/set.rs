//! The set checker: unique values inserted during the run, one read of the
//! whole set after healing. Valid when every acknowledged insert is in the
//! final read exactly once, nothing is there that was never inserted or
//! whose insert was refused, and nothing is there twice. An insert with an
//! unknown outcome may be present (once) or absent.

use std::collections::HashMap;

use serde::Serialize;

use crate::history::{Completed, Kind, Op};

#[derive(Debug, Clone, Default, Serialize)]
pub struct SetReport {
    pub inserts_acknowledged: usize,
    pub inserts_unknown: usize,
    pub inserts_failed: usize,
    pub final_size: usize,
    /// Acknowledged, not in the final read.
    pub lost: Vec<u64>,
    /// In the final read more than once.
    pub duplicated: Vec<u64>,
    /// In the final read, never inserted.
    pub unexpected: Vec<u64>,
    /// In the final read, though its insert was refused.
    pub refused_but_present: Vec<u64>,
    /// Unknown outcomes that turned out applied.
    pub unknown_present: usize,
}

impl SetReport {
    pub fn valid(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.refused_but_present.is_empty()
    }
}

/// Checks the inserts in `ops` (appends; reads are ignored) against the
/// final read `final_values` (in any order).
pub fn check(ops: &[Completed], final_values: &[u64]) -> SetReport {
    let mut report = SetReport {
        final_size: final_values.len(),
        ..Default::default()
    };
    let mut outcome: HashMap<u64, Kind> = HashMap::new();
    for c in ops {
        if let Op::Append { value, .. } = &c.op {
            match c.outcome {
                Kind::Ok => report.inserts_acknowledged += 1,
                Kind::Fail => report.inserts_failed += 1,
                _ => report.inserts_unknown += 1,
            }
            outcome.insert(*value, c.outcome);
        }
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for v in final_values {
        *seen.entry(*v).or_default() += 1;
    }
    for (v, n) in &seen {
        if *n > 1 {
            report.duplicated.push(*v);
        }
        match outcome.get(v) {
            None => report.unexpected.push(*v),
            Some(Kind::Fail) => report.refused_but_present.push(*v),
            Some(Kind::Ok) => {}
            Some(_) => report.unknown_present += 1,
        }
    }
    for (v, k) in &outcome {
        if *k == Kind::Ok && !seen.contains_key(v) {
            report.lost.push(*v);
        }
    }
    for list in [
        &mut report.lost,
        &mut report.duplicated,
        &mut report.unexpected,
        &mut report.refused_but_present,
    ] {
        list.sort_unstable();
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(process: u64, value: u64, outcome: Kind) -> Completed {
        Completed {
            process,
            outcome,
            op: Op::Append {
                key: "set".into(),
                value,
            },
            invoked_ns: value,
            completed_ns: value + 1,
        }
    }

    #[test]
    fn a_clean_set_passes_with_unknowns_either_way() {
        let ops = [
            insert(0, 1, Kind::Ok),
            insert(0, 2, Kind::Info),
            insert(1, 3, Kind::Info),
            insert(1, 4, Kind::Fail),
        ];
        let r = check(&ops, &[3, 1]);
        assert!(r.valid(), "{r:?}");
        assert_eq!(
            (r.inserts_acknowledged, r.inserts_unknown, r.inserts_failed),
            (1, 2, 1)
        );
        assert_eq!(r.unknown_present, 1);
    }

    #[test]
    fn lost_duplicated_unexpected_and_refused_are_caught() {
        let ops = [
            insert(0, 1, Kind::Ok),
            insert(0, 2, Kind::Ok),
            insert(1, 3, Kind::Fail),
        ];
        let r = check(&ops, &[2, 2, 3, 9]);
        assert!(!r.valid());
        assert_eq!(r.lost, [1]);
        assert_eq!(r.duplicated, [2]);
        assert_eq!(r.unexpected, [9]);
        assert_eq!(r.refused_but_present, [3]);
    }
}
