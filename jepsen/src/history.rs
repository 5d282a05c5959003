//! A history: what every client process asked, and what came back.
//!
//! Each operation is recorded twice, as Jepsen does: an `Invoke` when the
//! process sends it, then exactly one completion: `Ok` (acknowledged),
//! `Fail` (definitely not applied: a typed refusal that writes nothing) or
//! `Info` (outcome unknown: a timeout, a lost connection). Times are
//! monotonic nanoseconds since the run started, so real-time order between
//! operations of different processes can be checked.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// The operation of the list-append workload: append one unique value to a
/// key's list, or read a key's whole list (`ScanKey` in position order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "f")]
pub enum Op {
    Append {
        key: String,
        value: u64,
    },
    /// `values` is `None` on the invocation and on a failed read.
    Read {
        key: String,
        values: Option<Vec<u64>>,
    },
    /// Register workload: the key's latest value (`Get`); `value` is
    /// `None` on the invocation and on a failed read, `Some(None)` for a
    /// key with no record yet.
    RegRead {
        key: String,
        value: Option<Option<u64>>,
    },
    /// Register workload: an unconditional write.
    RegWrite {
        key: String,
        value: u64,
    },
    /// Register workload: write `to` if the key's latest value is still
    /// `from` (a conditional append on the version the process read).
    RegCas {
        key: String,
        from: Option<u64>,
        to: u64,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Append { key, .. }
            | Op::Read { key, .. }
            | Op::RegRead { key, .. }
            | Op::RegWrite { key, .. }
            | Op::RegCas { key, .. } => key,
        }
    }
}

/// One line of `history.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub process: u64,
    pub kind: Kind,
    pub op: Op,
    /// The node the process sent it to.
    pub node: u64,
    pub time_ns: u64,
}

/// An operation with its invocation and completion paired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub process: u64,
    /// `Ok`, `Fail` or `Info`; an invocation with no completion by the end
    /// of the history counts as `Info`.
    pub outcome: Kind,
    /// The completion's op (a read's values are there), or the
    /// invocation's when there was no completion.
    pub op: Op,
    pub invoked_ns: u64,
    /// `u64::MAX` when the outcome never came.
    pub completed_ns: u64,
}

/// A history that cannot be paired: a process completing what it never
/// invoked, or invoking twice without a completion in between.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error("process {process} completes at {time_ns} ns with nothing invoked")]
    Orphan { process: u64, time_ns: u64 },
    #[error("process {process} invokes at {time_ns} ns while its previous op is open")]
    Overlap { process: u64, time_ns: u64 },
    #[error("process {process} completes a different op than it invoked at {time_ns} ns")]
    Mismatch { process: u64, time_ns: u64 },
}

/// Pairs every invocation with its completion. A process runs one op at a
/// time (Jepsen's rule); events must be in time order.
pub fn pair(events: &[Event]) -> Result<Vec<Completed>, PairError> {
    use std::collections::HashMap;
    let mut open: HashMap<u64, &Event> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        match e.kind {
            Kind::Invoke => {
                if open.insert(e.process, e).is_some() {
                    return Err(PairError::Overlap {
                        process: e.process,
                        time_ns: e.time_ns,
                    });
                }
            }
            outcome => {
                let Some(inv) = open.remove(&e.process) else {
                    return Err(PairError::Orphan {
                        process: e.process,
                        time_ns: e.time_ns,
                    });
                };
                let same = match (&inv.op, &e.op) {
                    (Op::Append { key: a, value: x }, Op::Append { key: b, value: y }) => {
                        a == b && x == y
                    }
                    (Op::Read { key: a, .. }, Op::Read { key: b, .. }) => a == b,
                    (Op::RegRead { key: a, .. }, Op::RegRead { key: b, .. }) => a == b,
                    (Op::RegWrite { .. }, Op::RegWrite { .. })
                    | (Op::RegCas { .. }, Op::RegCas { .. }) => inv.op == e.op,
                    _ => false,
                };
                if !same {
                    return Err(PairError::Mismatch {
                        process: e.process,
                        time_ns: e.time_ns,
                    });
                }
                out.push(Completed {
                    process: e.process,
                    outcome,
                    op: e.op.clone(),
                    invoked_ns: inv.time_ns,
                    completed_ns: e.time_ns,
                });
            }
        }
    }
    let mut rest: Vec<&Event> = open.into_values().collect();
    rest.sort_by_key(|e| (e.time_ns, e.process));
    out.extend(rest.into_iter().map(|inv| Completed {
        process: inv.process,
        outcome: Kind::Info,
        op: inv.op.clone(),
        invoked_ns: inv.time_ns,
        completed_ns: u64::MAX,
    }));
    Ok(out)
}
