//! The list-append checker.
//!
//! Each key's list is what `ScanKey` returns in position order. Given the
//! paired history and each key's final list (read after healing), a run is
//! valid when, for every key:
//!
//! - every acknowledged append is in the final list exactly once, and no
//!   value is there twice;
//! - nothing is there that was never appended, or whose append failed
//!   (a `Fail` is a promise that nothing was written);
//! - every acknowledged read is a prefix of the final list;
//! - real-time order holds: an append acknowledged before another was
//!   invoked comes first; a read that finished before an append was invoked
//!   does not contain it; and, for linearizable reads, a read contains every
//!   append acknowledged before the read was invoked.
//!
//! An append whose outcome is unknown (`Info`) may or may not be present,
//! and, if present, may have taken effect at any time after its invocation.
//!
//! Apart from the history, every replica's own copy of each key, read at
//! its node once the cell is quiet ([`diverged`]), must be a prefix of the
//! final list: a replica that is behind is fine, one that holds other rows
//! at the same positions has diverged, whichever leader reads went to.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{Completed, Kind, Op};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Anomaly {
    /// An acknowledged append is missing from the final list.
    Lost { key: String, value: u64 },
    /// A value appears more than once.
    Duplicate {
        key: String,
        value: u64,
        count: usize,
    },
    /// A value no process ever appended.
    Phantom { key: String, value: u64 },
    /// A value whose append was refused (`Fail`) is present.
    FailedButPresent { key: String, value: u64 },
    /// An acknowledged read is not a prefix of the final list.
    NotPrefix {
        key: String,
        process: u64,
        read: Vec<u64>,
    },
    /// `first` was acknowledged before `second` was invoked, yet comes after
    /// it in the list.
    Order {
        key: String,
        first: u64,
        second: u64,
    },
    /// A read that finished before `value`'s append was invoked contains it.
    FutureRead {
        key: String,
        process: u64,
        value: u64,
    },
    /// A linearizable read misses `value`, acknowledged before the read
    /// was invoked.
    StaleRead {
        key: String,
        process: u64,
        value: u64,
    },
    /// A replica's own copy of the key, read at its node after the run,
    /// is not a prefix of the final list: the replicas diverged.
    Diverged {
        key: String,
        node: usize,
        read: Vec<u64>,
    },
}

impl Anomaly {
    /// The anomaly's name, as in the serialized report (`lost`, `diverged`).
    pub fn kind(&self) -> &'static str {
        match self {
            Anomaly::Lost { .. } => "lost",
            Anomaly::Duplicate { .. } => "duplicate",
            Anomaly::Phantom { .. } => "phantom",
            Anomaly::FailedButPresent { .. } => "failed-but-present",
            Anomaly::NotPrefix { .. } => "not-prefix",
            Anomaly::Order { .. } => "order",
            Anomaly::FutureRead { .. } => "future-read",
            Anomaly::StaleRead { .. } => "stale-read",
            Anomaly::Diverged { .. } => "diverged",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub keys: usize,
    pub appends_acknowledged: usize,
    pub appends_unknown: usize,
    pub appends_failed: usize,
    pub reads_acknowledged: usize,
    /// Replica copies of keys compared with the final lists ([`diverged`]).
    pub replica_copies_checked: usize,
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    pub fn valid(&self) -> bool {
        self.anomalies.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Reads were linearizable (leader reads), so stale reads are anomalies.
    pub linearizable_reads: bool,
}

struct AppendInfo {
    outcome: Kind,
    invoked_ns: u64,
    /// When it is known to have taken effect by: its acknowledgement, or
    /// never known (`u64::MAX`) for unknown outcomes.
    acked_ns: u64,
}

/// Checks `ops` against `finals`, each key's final list.
pub fn check(ops: &[Completed], finals: &BTreeMap<String, Vec<u64>>, opts: Options) -> Report {
    let mut report = Report::default();
    let mut appends: HashMap<&str, HashMap<u64, AppendInfo>> = HashMap::new();
    let mut reads: HashMap<&str, Vec<&Completed>> = HashMap::new();
    for c in ops {
        match &c.op {
            Op::Append { key, value } => {
                match c.outcome {
                    Kind::Ok => report.appends_acknowledged += 1,
                    Kind::Fail => report.appends_failed += 1,
                    _ => report.appends_unknown += 1,
                }
                appends.entry(key).or_default().insert(
                    *value,
                    AppendInfo {
                        outcome: c.outcome,
                        invoked_ns: c.invoked_ns,
                        acked_ns: if c.outcome == Kind::Ok {
                            c.completed_ns
                        } else {
                            u64::MAX
                        },
                    },
                );
            }
            Op::Read { key, values } => {
                if c.outcome == Kind::Ok && values.is_some() {
                    report.reads_acknowledged += 1;
                    reads.entry(key).or_default().push(c);
                }
            }
            // Another workload's operations.
            Op::RegRead { .. } | Op::RegWrite { .. } | Op::RegCas { .. } => {}
        }
    }
    let empty = Vec::new();
    let mut keys: Vec<&str> = appends.keys().copied().collect();
    keys.extend(finals.keys().map(String::as_str));
    keys.extend(reads.keys().copied());
    keys.sort_unstable();
    keys.dedup();
    report.keys = keys.len();
    let no_appends = HashMap::new();
    for key in keys {
        let list = finals.get(key).unwrap_or(&empty);
        let appended = appends.get(key).unwrap_or(&no_appends);
        check_key(
            key,
            list,
            appended,
            reads.get(key).map_or(&[][..], Vec::as_slice),
            opts,
            &mut report.anomalies,
        );
    }
    report
}

/// Each replica copy `(node, key, list)` that is not a prefix of the key's
/// final list. A copy of a key with no final list counts against the empty
/// list.
pub fn diverged(
    finals: &BTreeMap<String, Vec<u64>>,
    copies: &[(usize, String, Vec<u64>)],
) -> Vec<Anomaly> {
    let empty = Vec::new();
    copies
        .iter()
        .filter(|(_, key, list)| !finals.get(key).unwrap_or(&empty).starts_with(list))
        .map(|(node, key, list)| Anomaly::Diverged {
            key: key.clone(),
            node: *node,
            read: list.clone(),
        })
        .collect()
}

fn check_key(
    key: &str,
    list: &[u64],
    appended: &HashMap<u64, AppendInfo>,
    reads: &[&Completed],
    opts: Options,
    out: &mut Vec<Anomaly>,
) {
    let k = || key.to_string();
    let mut position: HashMap<u64, usize> = HashMap::new();
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, v) in list.iter().enumerate() {
        position.entry(*v).or_insert(i);
        *counts.entry(*v).or_default() += 1;
    }
    for (value, count) in &counts {
        if *count > 1 {
            out.push(Anomaly::Duplicate {
                key: k(),
                value: *value,
                count: *count,
            });
        }
        match appended.get(value) {
            None => out.push(Anomaly::Phantom {
                key: k(),
                value: *value,
            }),
            Some(a) if a.outcome == Kind::Fail => out.push(Anomaly::FailedButPresent {
                key: k(),
                value: *value,
            }),
            Some(_) => {}
        }
    }
    let mut acked: Vec<(u64, &AppendInfo)> = appended
        .iter()
        .filter(|(_, a)| a.outcome == Kind::Ok)
        .map(|(v, a)| (*v, a))
        .collect();
    acked.sort_unstable_by_key(|(v, _)| *v);
    for (value, _) in &acked {
        if !position.contains_key(value) {
            out.push(Anomaly::Lost {
                key: k(),
                value: *value,
            });
        }
    }
    // Real-time order of appends, over the values present once: walking
    // the list backwards, keep the earliest acknowledgement seen after the
    // current position; if it precedes this value's invocation, that later
    // value should have come first.
    let mut earliest_after: Option<(u64, u64)> = None; // (acked_ns, value)
    for v in list.iter().rev() {
        let Some(a) = appended.get(v) else { continue };
        if let Some((acked_ns, later)) = earliest_after
            && acked_ns < a.invoked_ns
        {
            out.push(Anomaly::Order {
                key: k(),
                first: later,
                second: *v,
            });
        }
        if earliest_after.is_none_or(|(t, _)| a.acked_ns < t) {
            earliest_after = Some((a.acked_ns, *v));
        }
    }
    for r in reads {
        let Op::Read {
            values: Some(read), ..
        } = &r.op
        else {
            continue;
        };
        if read.len() > list.len() || list[..read.len()] != read[..] {
            out.push(Anomaly::NotPrefix {
                key: k(),
                process: r.process,
                read: read.clone(),
            });
        }
        for v in read {
            if let Some(a) = appended.get(v)
                && r.completed_ns < a.invoked_ns
            {
                out.push(Anomaly::FutureRead {
                    key: k(),
                    process: r.process,
                    value: *v,
                });
            }
        }
        if opts.linearizable_reads {
            for (value, a) in &acked {
                if a.acked_ns < r.invoked_ns && !read.contains(value) {
                    out.push(Anomaly::StaleRead {
                        key: k(),
                        process: r.process,
                        value: *value,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, pair};

    /// A history written as (process, kind, op, time) rows.
    struct H(Vec<Event>);

    impl H {
        fn new() -> H {
            H(Vec::new())
        }
        fn ev(mut self, process: u64, kind: Kind, op: Op, t: u64) -> H {
            self.0.push(Event {
                process,
                kind,
                op,
                node: 1,
                time_ns: t,
            });
            self
        }
        /// An append by `p` of `v` to "k", invoked at `t0` and completed at `t1`.
        fn append(self, p: u64, v: u64, t0: u64, t1: u64, outcome: Kind) -> H {
            let op = Op::Append {
                key: "k".into(),
                value: v,
            };
            self.ev(p, Kind::Invoke, op.clone(), t0)
                .ev(p, outcome, op, t1)
        }
        fn read(self, p: u64, values: &[u64], t0: u64, t1: u64) -> H {
            self.ev(
                p,
                Kind::Invoke,
                Op::Read {
                    key: "k".into(),
                    values: None,
                },
                t0,
            )
            .ev(
                p,
                Kind::Ok,
                Op::Read {
                    key: "k".into(),
                    values: Some(values.to_vec()),
                },
                t1,
            )
        }
        fn check(mut self, last: &[u64]) -> Report {
            self.0.sort_by_key(|e| e.time_ns);
            let ops = pair(&self.0).unwrap();
            let finals = BTreeMap::from([("k".to_string(), last.to_vec())]);
            check(
                &ops,
                &finals,
                Options {
                    linearizable_reads: true,
                },
            )
        }
    }

    fn kinds(r: &Report) -> Vec<&'static str> {
        r.anomalies.iter().map(Anomaly::kind).collect()
    }

    #[test]
    fn every_kind_is_its_serialized_type() {
        let (key, value) = ("k".to_string(), 1);
        let all = [
            Anomaly::Lost {
                key: key.clone(),
                value,
            },
            Anomaly::Duplicate {
                key: key.clone(),
                value,
                count: 2,
            },
            Anomaly::Phantom {
                key: key.clone(),
                value,
            },
            Anomaly::FailedButPresent {
                key: key.clone(),
                value,
            },
            Anomaly::NotPrefix {
                key: key.clone(),
                process: 1,
                read: vec![],
            },
            Anomaly::Order {
                key: key.clone(),
                first: 1,
                second: 2,
            },
            Anomaly::FutureRead {
                key: key.clone(),
                process: 1,
                value,
            },
            Anomaly::StaleRead {
                key: key.clone(),
                process: 1,
                value,
            },
            Anomaly::Diverged {
                key,
                node: 1,
                read: vec![],
            },
        ];
        for a in all {
            let v = serde_json::to_value(&a).unwrap();
            assert_eq!(v["type"], a.kind(), "{a:?}");
        }
    }

    fn base() -> H {
        H::new()
            .append(1, 10, 0, 5, Kind::Ok)
            .append(2, 20, 6, 9, Kind::Ok)
            .append(1, 30, 10, 12, Kind::Info)
            .append(2, 40, 13, 14, Kind::Fail)
            .read(3, &[10], 5, 6)
            .read(3, &[10, 20], 10, 11)
    }

    #[test]
    fn a_valid_history_passes_with_or_without_an_unknown_append() {
        let r = base().check(&[10, 20, 30]);
        assert!(r.valid(), "{:?}", r.anomalies);
        assert_eq!(r.appends_acknowledged, 2);
        assert_eq!(r.appends_unknown, 1);
        assert_eq!(r.appends_failed, 1);
        assert_eq!(r.reads_acknowledged, 2);
        assert!(base().check(&[10, 20]).valid());
    }

    #[test]
    fn a_lost_acknowledged_append_is_caught() {
        // The read that saw 20 is no longer a prefix either.
        assert_eq!(kinds(&base().check(&[10, 30])), ["lost", "not-prefix"]);
    }

    #[test]
    fn a_duplicate_is_caught() {
        assert_eq!(kinds(&base().check(&[10, 20, 20])), ["duplicate"]);
    }

    #[test]
    fn a_phantom_and_a_refused_append_that_landed_are_caught() {
        assert_eq!(kinds(&base().check(&[10, 20, 99])), ["phantom"]);
        assert_eq!(kinds(&base().check(&[10, 20, 40])), ["failed-but-present"]);
    }

    #[test]
    fn real_time_order_of_appends_is_enforced() {
        // 10 was acknowledged (t=5) before 20 was invoked (t=6).
        let r = H::new()
            .append(1, 10, 0, 5, Kind::Ok)
            .append(2, 20, 6, 9, Kind::Ok)
            .check(&[20, 10]);
        assert_eq!(kinds(&r), ["order"]);
        // Concurrent appends may land in either order.
        let r = H::new()
            .append(1, 10, 0, 7, Kind::Ok)
            .append(2, 20, 6, 9, Kind::Ok)
            .check(&[20, 10]);
        assert!(r.valid(), "{:?}", r.anomalies);
    }

    #[test]
    fn reads_must_be_prefixes_and_neither_stale_nor_from_the_future() {
        // Not a prefix of the final list.
        let r = H::new()
            .append(1, 10, 0, 5, Kind::Ok)
            .append(2, 20, 0, 5, Kind::Ok)
            .read(3, &[20], 6, 7)
            .check(&[10, 20]);
        assert_eq!(kinds(&r), ["not-prefix", "stale-read"]);
        // Contains a value whose append began after the read finished.
        let r = H::new()
            .append(1, 10, 0, 2, Kind::Ok)
            .read(3, &[10, 20], 3, 4)
            .append(2, 20, 5, 6, Kind::Ok)
            .check(&[10, 20]);
        assert_eq!(kinds(&r), ["future-read"]);
        // Misses an append acknowledged before the read began.
        let r = H::new()
            .append(1, 10, 0, 2, Kind::Ok)
            .read(3, &[], 3, 4)
            .check(&[10]);
        assert_eq!(kinds(&r), ["stale-read"]);
    }

    #[test]
    fn an_unpaired_history_is_refused() {
        let op = Op::Append {
            key: "k".into(),
            value: 1,
        };
        let e = |kind, t| Event {
            process: 1,
            kind,
            op: op.clone(),
            node: 1,
            time_ns: t,
        };
        assert!(matches!(
            pair(&[e(Kind::Ok, 1)]),
            Err(crate::history::PairError::Orphan { .. })
        ));
        assert!(matches!(
            pair(&[e(Kind::Invoke, 1), e(Kind::Invoke, 2)]),
            Err(crate::history::PairError::Overlap { .. })
        ));
        // An invocation never completed counts as unknown.
        let ops = pair(&[e(Kind::Invoke, 1)]).unwrap();
        assert_eq!(ops[0].outcome, Kind::Info);
    }

    #[test]
    fn a_replica_behind_is_fine_and_one_with_other_rows_diverged() {
        let finals = BTreeMap::from([("k".to_string(), vec![1, 2, 3])]);
        let copy = |node, list: &[u64]| (node, "k".to_string(), list.to_vec());
        let found = diverged(
            &finals,
            &[
                copy(1, &[1, 2, 3]),
                copy(2, &[1, 2]),
                copy(3, &[]),
                // Another row at position 2, as a replica keeps after a
                // leader resumed its term over a lost tail.
                copy(2, &[1, 4]),
                copy(3, &[1, 2, 3, 5]),
            ],
        );
        assert_eq!(
            found,
            [
                Anomaly::Diverged {
                    key: "k".into(),
                    node: 2,
                    read: vec![1, 4]
                },
                Anomaly::Diverged {
                    key: "k".into(),
                    node: 3,
                    read: vec![1, 2, 3, 5]
                },
            ]
        );
        // A key the final reads never saw: only an empty copy is a prefix.
        assert_eq!(diverged(&finals, &[(1, "j".into(), vec![])]), []);
        assert_eq!(diverged(&finals, &[(1, "j".into(), vec![9])]).len(), 1);
    }

    #[test]
    fn history_lines_round_trip_as_json() {
        let e = Event {
            process: 7,
            kind: Kind::Ok,
            op: Op::Read {
                key: "k".into(),
                values: Some(vec![1, 2]),
            },
            node: 2,
            time_ns: 42,
        };
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
    }
}
