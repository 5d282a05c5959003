//! The register checker: every key is a register (its latest record's
//! value), read with `Get`, written unconditionally, or compare-and-set by a
//! conditional append on the version a process read. Each key's history is
//! checked for linearizability with the Wing & Gong checker of
//! `todc-utils`.
//!
//! An operation with an unknown outcome (`Info`) is modelled as Jepsen
//! does: its call stays where it was, its response moves to the end of the
//! history, under a process id of its own, so it may take effect at any
//! point after it was invoked, or (linearized last) not visibly at all. A
//! failed read, or a write refused with a typed error, did nothing and is
//! left out. A compare-and-set that failed its condition is kept: it
//! says the register did not hold `from` at some point while it ran.
//!
//! A key whose check does not finish within the time limit is reported
//! `unknown`, and unknown fails the run.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use serde::Serialize;
use todc_utils::linearizability::WGLChecker;
use todc_utils::{Action, History, Specification};

use crate::history::{Completed, Kind, Op};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CasOutcome {
    Ok,
    Failed,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegOp {
    Read(Option<u64>),
    Write(u64),
    Cas {
        from: Option<u64>,
        to: u64,
        outcome: CasOutcome,
    },
}

/// A register holding an optional value (none until the first write).
pub struct RegisterSpec;

impl Specification for RegisterSpec {
    type State = Option<u64>;
    type Operation = RegOp;

    fn init() -> Self::State {
        None
    }

    fn apply(op: &RegOp, state: &Option<u64>) -> (bool, Option<u64>) {
        match *op {
            RegOp::Read(v) => (v == *state, *state),
            RegOp::Write(v) => (true, Some(v)),
            RegOp::Cas {
                from,
                to,
                outcome: CasOutcome::Ok,
            } => (from == *state, Some(to)),
            RegOp::Cas {
                from,
                outcome: CasOutcome::Failed,
                ..
            } => (from != *state, *state),
            // Took effect if it could; otherwise it was a failed CAS.
            RegOp::Cas {
                from,
                to,
                outcome: CasOutcome::Unknown,
            } => {
                if from == *state {
                    (true, Some(to))
                } else {
                    (true, *state)
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RegisterReport {
    pub keys: usize,
    pub reads_acknowledged: usize,
    pub writes_acknowledged: usize,
    pub cas_acknowledged: usize,
    pub cas_failed: usize,
    pub unknown_outcomes: usize,
    /// Keys whose history is not linearizable.
    pub not_linearizable: Vec<String>,
    /// Keys whose check did not finish in time (these fail the run).
    pub unknown: Vec<String>,
}

impl RegisterReport {
    pub fn valid(&self) -> bool {
        self.not_linearizable.is_empty() && self.unknown.is_empty()
    }
}

/// One key's operations as todc actions, in time order.
fn actions(ops: &[&Completed]) -> Vec<(usize, Action<RegOp>)> {
    // (time, tie-break, process, action)
    let mut timed: Vec<(u64, u8, usize, Action<RegOp>)> = Vec::new();
    let mut next_virtual = 1_000_000usize;
    for c in ops {
        let op = match (&c.op, c.outcome) {
            (Op::RegRead { value: Some(v), .. }, Kind::Ok) => RegOp::Read(*v),
            (Op::RegWrite { value, .. }, Kind::Ok | Kind::Info | Kind::Invoke) => {
                RegOp::Write(*value)
            }
            (Op::RegCas { from, to, .. }, k) => RegOp::Cas {
                from: *from,
                to: *to,
                outcome: match k {
                    Kind::Ok => CasOutcome::Ok,
                    Kind::Fail => CasOutcome::Failed,
                    _ => CasOutcome::Unknown,
                },
            },
            _ => continue,
        };
        let known = c.outcome == Kind::Ok || c.outcome == Kind::Fail;
        let process = if known {
            c.process as usize
        } else {
            next_virtual += 1;
            next_virtual
        };
        timed.push((c.invoked_ns, 0, process, Action::Call(op)));
        let end = if known { c.completed_ns } else { u64::MAX };
        timed.push((end, 1, process, Action::Response(op)));
    }
    timed.sort_by_key(|(t, tie, p, _)| (*t, *tie, *p));
    timed.into_iter().map(|(_, _, p, a)| (p, a)).collect()
}

/// Whether one key's history is linearizable; `None` if the check did not
/// finish within `limit`.
pub fn linearizable(ops: &[&Completed], limit: Duration) -> Option<bool> {
    let actions = actions(ops);
    if actions.is_empty() {
        return Some(true);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let history = History::from_actions(actions);
        let _ = tx.send(WGLChecker::<RegisterSpec>::is_linearizable(history));
    });
    rx.recv_timeout(limit).ok()
}

/// Checks every key of the register workload in `ops`.
pub fn check(ops: &[Completed], per_key_limit: Duration) -> RegisterReport {
    let mut report = RegisterReport::default();
    let mut by_key: BTreeMap<&str, Vec<&Completed>> = BTreeMap::new();
    for c in ops {
        let counted = match (&c.op, c.outcome) {
            (Op::RegRead { .. }, Kind::Ok) => {
                report.reads_acknowledged += 1;
                true
            }
            (Op::RegRead { .. }, _) => true,
            (Op::RegWrite { .. }, Kind::Ok) => {
                report.writes_acknowledged += 1;
                true
            }
            (Op::RegCas { .. }, Kind::Ok) => {
                report.cas_acknowledged += 1;
                true
            }
            (Op::RegCas { .. }, Kind::Fail) => {
                report.cas_failed += 1;
                true
            }
            (Op::RegWrite { .. } | Op::RegCas { .. }, Kind::Info | Kind::Invoke) => {
                report.unknown_outcomes += 1;
                true
            }
            (Op::RegWrite { .. }, Kind::Fail) => true,
            _ => false,
        };
        if counted {
            by_key.entry(c.op.key()).or_default().push(c);
        }
    }
    report.keys = by_key.len();
    for (key, ops) in by_key {
        match linearizable(&ops, per_key_limit) {
            Some(true) => {}
            Some(false) => report.not_linearizable.push(key.to_string()),
            None => report.unknown.push(key.to_string()),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(process: u64, op: Op, outcome: Kind, t0: u64, t1: u64) -> Completed {
        Completed {
            process,
            outcome,
            op,
            invoked_ns: t0,
            completed_ns: t1,
        }
    }

    fn read(v: Option<u64>) -> Op {
        Op::RegRead {
            key: "k".into(),
            value: Some(v),
        }
    }

    fn write(v: u64) -> Op {
        Op::RegWrite {
            key: "k".into(),
            value: v,
        }
    }

    fn cas(from: Option<u64>, to: u64) -> Op {
        Op::RegCas {
            key: "k".into(),
            from,
            to,
        }
    }

    fn check_ops(ops: &[Completed]) -> RegisterReport {
        check(ops, Duration::from_secs(10))
    }

    #[test]
    fn linearizable_histories_pass() {
        // Sequential: write 1, read 1, cas 1->2, read 2, failed cas 1->3.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(1, read(Some(1)), Kind::Ok, 2, 3),
            op(0, cas(Some(1), 2), Kind::Ok, 4, 5),
            op(1, read(Some(2)), Kind::Ok, 6, 7),
            op(0, cas(Some(1), 3), Kind::Fail, 8, 9),
        ];
        assert!(check_ops(&ops).valid());
        // Concurrent write and read: the read may see either value.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(0, write(2), Kind::Ok, 2, 10),
            op(1, read(Some(1)), Kind::Ok, 3, 4),
            op(1, read(Some(2)), Kind::Ok, 5, 6),
        ];
        assert!(check_ops(&ops).valid());
        // An unknown write that took effect, and one that never did.
        let ops = [
            op(0, write(1), Kind::Info, 0, u64::MAX),
            op(1, read(Some(1)), Kind::Ok, 5, 6),
            op(1, write(2), Kind::Info, 7, u64::MAX),
            op(1, read(Some(1)), Kind::Ok, 8, 9),
        ];
        assert!(check_ops(&ops).valid(), "{:?}", check_ops(&ops));
        // An unknown CAS that took effect.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(0, cas(Some(1), 2), Kind::Info, 2, u64::MAX),
            op(1, read(Some(2)), Kind::Ok, 5, 6),
        ];
        assert!(check_ops(&ops).valid());
    }

    #[test]
    fn violations_are_caught() {
        // A stale read: 2 was acknowledged before the read began.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(0, write(2), Kind::Ok, 2, 3),
            op(1, read(Some(1)), Kind::Ok, 4, 5),
        ];
        assert_eq!(check_ops(&ops).not_linearizable, ["k"]);
        // A CAS that succeeded although the register held something else.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(0, cas(Some(7), 2), Kind::Ok, 2, 3),
        ];
        assert!(!check_ops(&ops).valid());
        // A CAS that failed although the register held `from` throughout.
        let ops = [
            op(0, write(1), Kind::Ok, 0, 1),
            op(0, cas(Some(1), 2), Kind::Fail, 2, 3),
        ];
        assert!(!check_ops(&ops).valid());
        // A read of a value never written.
        let ops = [op(1, read(Some(9)), Kind::Ok, 0, 1)];
        assert!(!check_ops(&ops).valid());
        // A read that saw a write before it was invoked... from the future.
        let ops = [
            op(1, read(Some(1)), Kind::Ok, 0, 1),
            op(0, write(1), Kind::Ok, 2, 3),
        ];
        assert!(!check_ops(&ops).valid());
    }

    /// The same register, as a `stateright` sequential specification.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
    struct CasRegister(Option<u64>);

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum SOp {
        Read,
        Write(u64),
        Cas(Option<u64>, u64),
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum SRet {
        Read(Option<u64>),
        WriteOk,
        CasOk,
        CasFailed,
    }

    impl stateright::semantics::SequentialSpec for CasRegister {
        type Op = SOp;
        type Ret = SRet;
        fn invoke(&mut self, op: &SOp) -> SRet {
            match *op {
                SOp::Read => SRet::Read(self.0),
                SOp::Write(v) => {
                    self.0 = Some(v);
                    SRet::WriteOk
                }
                SOp::Cas(from, to) if from == self.0 => {
                    self.0 = Some(to);
                    SRet::CasOk
                }
                SOp::Cas(..) => SRet::CasFailed,
            }
        }
    }

    /// `stateright`'s verdict on a history: operations fed in time order,
    /// one with an unknown outcome invoked and never returned (in flight:
    /// it may take effect at any point after its call, or never).
    fn stateright_verdict(ops: &[Completed]) -> bool {
        use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
        enum Ev {
            Call(SOp),
            Ret(SRet),
        }
        let mut events: Vec<(u64, u64, Ev)> = Vec::new();
        for c in ops {
            let (call, ret) = match (&c.op, c.outcome) {
                (Op::RegRead { value: Some(v), .. }, Kind::Ok) => (SOp::Read, SRet::Read(*v)),
                (Op::RegWrite { value, .. }, _) => (SOp::Write(*value), SRet::WriteOk),
                (Op::RegCas { from, to, .. }, k) => (
                    SOp::Cas(*from, *to),
                    if k == Kind::Fail {
                        SRet::CasFailed
                    } else {
                        SRet::CasOk
                    },
                ),
                _ => continue,
            };
            events.push((c.invoked_ns, c.process, Ev::Call(call)));
            if c.outcome == Kind::Ok || c.outcome == Kind::Fail {
                events.push((c.completed_ns, c.process, Ev::Ret(ret)));
            }
        }
        events.sort_by_key(|(t, _, _)| *t);
        let mut tester = LinearizabilityTester::new(CasRegister::default());
        for (_, thread, ev) in events {
            match ev {
                Ev::Call(op) => tester.on_invoke(thread, op).expect("one op per thread"),
                Ev::Ret(ret) => tester
                    .on_return(thread, ret)
                    .expect("returns what it called"),
            };
        }
        tester.is_consistent()
    }

    /// A random small history of `threads` processes, each a few
    /// operations one after another, every time distinct. It is produced
    /// honestly: each operation takes effect at a random point of its
    /// interval, and reads and CAS outcomes follow from that order. Then,
    /// half the time, one read or CAS result is changed, which usually
    /// (not always: values repeat) makes it not linearizable. An
    /// operation with an unknown outcome took effect or not, at random,
    /// and its process stops there (as a jepsen process is retired).
    fn random_history(rng: &mut rand::rngs::StdRng, threads: u64) -> Vec<Completed> {
        use rand::Rng;
        // (process, kind 0 read / 1 write / 2 cas, value or cas target,
        // cas source, start, end, point, unknown)
        struct Plan {
            process: u64,
            kind: u8,
            value: u64,
            from: Option<u64>,
            start: u64,
            end: u64,
            point: u64,
            unknown: bool,
            took_effect: bool,
        }
        let pick = |rng: &mut rand::rngs::StdRng| {
            if rng.random_bool(0.2) {
                None
            } else {
                Some(rng.random_range(1..=4u64))
            }
        };
        let mut plans = Vec::new();
        for p in 0..threads {
            let mut t = rng.random_range(0..20u64);
            for _ in 0..rng.random_range(2..=4) {
                let start = t * 8 + p;
                t += rng.random_range(1..12u64);
                let end = t * 8 + p;
                t += rng.random_range(1..4u64);
                let kind = [0, 0, 0, 1, 1, 2, 2][rng.random_range(0..7)];
                let unknown = kind != 0 && rng.random_bool(0.15);
                plans.push(Plan {
                    process: p,
                    kind,
                    value: rng.random_range(1..=4u64),
                    from: pick(rng),
                    start,
                    end,
                    point: rng.random_range(start + 1..end),
                    unknown,
                    took_effect: rng.random_bool(0.5),
                });
                if unknown {
                    break;
                }
            }
        }
        plans.sort_by_key(|p| p.point);
        let mut register: Option<u64> = None;
        let mut ops = Vec::new();
        for p in &plans {
            if p.unknown && !p.took_effect {
                let o = if p.kind == 1 {
                    write(p.value)
                } else {
                    cas(p.from, p.value)
                };
                ops.push(op_at(p.process, o, Kind::Info, p.start, u64::MAX));
                continue;
            }
            let (o, outcome) = match p.kind {
                0 => (read(register), Kind::Ok),
                1 => {
                    register = Some(p.value);
                    (write(p.value), Kind::Ok)
                }
                _ if p.from == register => {
                    register = Some(p.value);
                    (cas(p.from, p.value), Kind::Ok)
                }
                _ => (cas(p.from, p.value), Kind::Fail),
            };
            let (outcome, end) = if p.unknown {
                (Kind::Info, u64::MAX)
            } else {
                (outcome, p.end)
            };
            ops.push(op_at(p.process, o, outcome, p.start, end));
        }
        if rng.random_bool(0.5) {
            let known: Vec<usize> = (0..ops.len())
                .filter(|&i| {
                    ops[i].outcome != Kind::Info && !matches!(ops[i].op, Op::RegWrite { .. })
                })
                .collect();
            if !known.is_empty() {
                let i = known[rng.random_range(0..known.len())];
                let changed = match &ops[i].op {
                    Op::RegRead { value: Some(v), .. } => {
                        let mut w = pick(rng);
                        while w == *v {
                            w = pick(rng);
                        }
                        Some(read(w))
                    }
                    _ => None,
                };
                match changed {
                    Some(o) => ops[i].op = o,
                    None => {
                        ops[i].outcome = if ops[i].outcome == Kind::Ok {
                            Kind::Fail
                        } else {
                            Kind::Ok
                        }
                    }
                }
            }
        }
        ops
    }

    fn op_at(process: u64, o: Op, outcome: Kind, t0: u64, t1: u64) -> Completed {
        op(process, o, outcome, t0, t1)
    }

    /// The adapter (todc-utils' Wing & Gong checker with our register
    /// specification and unknown-outcome modelling) and stateright's
    /// linearizability tester agree on 300 random small histories, both
    /// ways (values repeat across writes, so a read can be explained by
    /// more than one write, as happens in the hard cases).
    #[test]
    fn the_adapter_agrees_with_stateright_on_small_histories() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let (mut yes, mut no) = (0, 0);
        for i in 0..300 {
            let ops = random_history(&mut rng, 2 + i % 3);
            let refs: Vec<&Completed> = ops.iter().collect();
            let ours = linearizable(&refs, Duration::from_secs(10)).expect("finished");
            let theirs = stateright_verdict(&ops);
            assert_eq!(ours, theirs, "history {i} disagrees: {ops:#?}");
            if ours {
                yes += 1;
            } else {
                no += 1;
            }
        }
        // Both verdicts are well represented, or agreement proves little.
        assert!(yes > 75 && no > 75, "{yes} linearizable, {no} not");
    }
}
