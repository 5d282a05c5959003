//! The scheduler as tables of (state, health, time) -> the commands one
//! pass proposes, through one `check` helper that runs a pass as the
//! driver does: observe, plan, then walk the plan, each command applied to
//! a copy of the state for its reply (a quorum that accepts everything).

use std::time::{Duration, Instant};

use stele_proto::pb;

use super::*;
use crate::autosplit::SplitPolicy;
use crate::health::ReportUpdate;
use crate::state::{CellConfig, NodeRec, Reply};

const TERM: u64 = 7;

fn policy() -> Policy {
    Policy {
        lease: Duration::from_secs(10),
        repair_grace: Duration::from_secs(60),
        max_intents: 16,
        intent_timeout: Duration::from_secs(120),
        leader_balance_every: Duration::ZERO,
        split: SplitPolicy {
            bytes: 0,
            writes_per_s: 0,
            reads_per_s: 0,
            window: Duration::from_secs(10),
            cooldown: Duration::ZERO,
            merge_below_percent: 0,
        },
    }
}

/// One pass as the driver runs it, `batch` proposals at a time; the
/// commands it proposed, and the health view as the pass left it.
fn run_batched(fx: &Fx, now: Instant, p: &Policy, batch: usize) -> (Vec<Command>, HealthView) {
    let (s, mut h) = (&fx.s, fx.h.clone());
    // Every node heartbeats right up to the pass unless the case silenced
    // it (its reports stay as the case made them).
    for n in s
        .nodes
        .values()
        .filter(|n| !n.dead && !fx.silent.contains(&n.id))
    {
        h.seen.insert(n.id, now);
    }
    h.observe(s, TERM, now, p.lease);
    let plan = plan(s, &h, now, p);
    let mut quorum = s.clone();
    let proposed = walk(plan, batch, |cmd| quorum.apply(cmd), |n| h.note(n));
    (proposed, h)
}

/// Walks `plan` as the driver does, `batch` proposals at a time, with
/// `reply` as the quorum; the commands proposed.
fn walk(
    mut plan: super::Plan,
    batch: usize,
    mut reply: impl FnMut(Command) -> Reply,
    mut note: impl FnMut(Note),
) -> Vec<Command> {
    let mut proposed = Vec::new();
    loop {
        let actions = plan.batch(batch);
        if actions.is_empty() {
            return proposed;
        }
        let mut replies = Vec::new();
        for a in actions {
            match a {
                Action::Propose(cmd) => {
                    // The quorum applies a batch in order, as one append.
                    replies.push(reply(cmd.clone()));
                    proposed.push(cmd);
                }
                Action::Note(n) => note(n),
                Action::Log(_) => {}
            }
        }
        for a in plan.replied(replies) {
            match a {
                Action::Note(n) => note(n),
                Action::Log(_) => {}
                Action::Propose(_) => panic!("a reply proposed"),
            }
        }
    }
}

/// One pass, one proposal at a time (as the old loop ran it) and in
/// batches: the two propose the same.
fn run(fx: &Fx, now: Instant, p: &Policy) -> (Vec<Command>, HealthView) {
    let (one_by_one, _) = run_batched(fx, now, p, 1);
    let (batched, h) = run_batched(fx, now, p, 256);
    assert_eq!(batched, one_by_one, "batches change what a pass proposes");
    (batched, h)
}

/// The one assertion of these tables.
fn check(case: &str, fx: &Fx, now: Instant, p: &Policy, want: &[Command]) {
    let (got, _) = run(fx, now, p);
    assert_eq!(got, want, "case {case:?}");
}

/// A cell and its leader's health view: nodes `1..=n`, each in its own
/// zone, replication 3, tablets placed on the given nodes (the first
/// leads), every group started, every node heartbeating at `t0`, this
/// controller leading since `t0`.
#[derive(Clone)]
struct Fx {
    s: CellState,
    h: HealthView,
    t0: Instant,
    /// Nodes that stopped heartbeating.
    silent: BTreeSet<u64>,
}

fn node(id: u64) -> NodeRec {
    crate::state::test_node(id)
}

impl Fx {
    fn new(nodes: u64, placement: &[&[u64]]) -> Fx {
        let mut s = CellState::new();
        s.apply(Command::Init(CellConfig {
            cell_id: "c".into(),
            replication: 3,
            tablets: placement.len().max(1) as u32,
        }));
        for id in 1..=nodes {
            s.apply(Command::Register(node(id)));
        }
        if !placement.is_empty() {
            let list = placement
                .iter()
                .enumerate()
                .map(|(i, n)| (i as u64 + 1, n.to_vec()))
                .collect();
            assert_eq!(s.apply(Command::Place(list)), Reply::Ok);
            for t in 1..=placement.len() as u64 {
                s.apply(Command::Started { tablet: t });
            }
        }
        let t0 = Instant::now();
        let h = HealthView {
            leading: Some((TERM, t0)),
            last_leader_balance: Some(t0),
            ..Default::default()
        };
        let mut fx = Fx {
            s,
            h,
            t0,
            silent: BTreeSet::new(),
        };
        fx.beat_all(0);
        fx
    }

    fn at(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }

    fn apply(&mut self, cmd: Command) -> Reply {
        self.s.apply(cmd)
    }

    /// Applies a command that opens an intent; its id.
    fn open(&mut self, cmd: Command) -> u64 {
        match self.apply(cmd) {
            Reply::Intent(id) => id,
            r => panic!("no intent: {r:?}"),
        }
    }

    /// Every node not declared dead heartbeats at `secs`.
    fn beat_all(&mut self, secs: u64) {
        let live: Vec<u64> = self
            .s
            .nodes
            .values()
            .filter(|n| !n.dead)
            .map(|n| n.id)
            .collect();
        for n in live {
            self.beat(n, secs);
        }
    }

    fn beat(&mut self, node: u64, secs: u64) {
        let reports = self.reports_of(node);
        let now = self.at(secs);
        self.h.heartbeat(
            node,
            ReportUpdate::full(reports),
            now,
            Duration::from_secs(10),
        );
    }

    /// What `node` reports: each replica it holds; a tablet's first voter
    /// leads; a group mid-move still has its old voter (the new one is not
    /// in the group yet).
    fn reports_of(&self, node: u64) -> Vec<pb::ReplicaReport> {
        let s = &self.s;
        s.tablets
            .values()
            .filter_map(|t| {
                let r = s.replica_on(t, node)?;
                let mut voters: Vec<u64> = t.voters.iter().map(|v| v.replica_id).collect();
                if let Some(old) = t.leaving {
                    let new = s.intents.get(&t.intent).map(|i| match i.kind {
                        IntentKind::Move { new_replica, .. } => new_replica,
                        IntentKind::Merge { moving, .. } => moving,
                        _ => 0,
                    });
                    voters.retain(|v| Some(*v) != new);
                    voters.push(old.replica_id);
                }
                Some(pb::ReplicaReport {
                    tablet: t.id,
                    replica_id: r.replica_id,
                    leader: t.voters.first() == Some(&r),
                    term: 1,
                    voters,
                    range_generation: t.range_generation,
                    ..Default::default()
                })
            })
            .collect()
    }

    /// Changes what the replicas of `tablet` on `node` report.
    fn report(&mut self, node: u64, tablet: u64, f: impl Fn(&mut pb::ReplicaReport)) {
        for r in self
            .h
            .reports
            .get_mut(&node)
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            if r.tablet == tablet {
                f(r);
            }
        }
    }

    /// The replica of `tablet` on `node`.
    fn replica(&self, tablet: u64, node: u64) -> u64 {
        self.s
            .replica_on(&self.s.tablets[&tablet], node)
            .expect("a replica there")
            .replica_id
    }

    /// The group of `tablet` reports the desired voters (its change is
    /// done).
    fn group_done(&mut self, tablet: u64) {
        let desired: Vec<u64> = self.s.tablets[&tablet]
            .voters
            .iter()
            .map(|r| r.replica_id)
            .collect();
        let leader = self.s.tablets[&tablet].voters[0].node;
        self.report(leader, tablet, |r| r.voters = desired.clone());
    }
}

fn start_move(tablet: u64, from: u64, to: u64, reason: &str) -> Command {
    Command::StartMove {
        tablet,
        from,
        to,
        reason: reason.into(),
        expect_generation: 0,
    }
}

fn fail(intent: u64, reason: &str) -> Command {
    Command::FailIntent {
        intent,
        reason: reason.into(),
    }
}

#[test]
fn leases_expire_into_dead_nodes() {
    let p = policy();
    let base = Fx::new(4, &[&[1, 2, 3]]);
    let mut silent4 = base.clone();
    silent4.silent.insert(4);
    let mut new_term = silent4.clone();
    new_term.h.leading = Some((TERM - 1, new_term.t0));
    let mut decommissioned = silent4.clone();
    decommissioned.apply(Command::SetAdmin {
        node: 4,
        admin: Admin::Decommissioned,
    });
    let mut dead = silent4.clone();
    dead.apply(Command::MarkDead { node: 4 });
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("everyone heartbeats", &base, 5, vec![]),
        ("silent for exactly the lease", &silent4, 10, vec![]),
        (
            "silent past the lease",
            &silent4,
            11,
            vec![Command::MarkDead { node: 4 }],
        ),
        (
            "a new term starts every lease afresh",
            &new_term,
            11,
            vec![],
        ),
        (
            "a decommissioned node never dies",
            &decommissioned,
            11,
            vec![],
        ),
        ("a dead node is not declared again", &dead, 11, vec![]),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn a_lease_expiry_drops_the_reports_and_starts_the_grace() {
    let p = policy();
    let mut fx = Fx::new(4, &[&[1, 2, 3]]);
    fx.silent.insert(3);
    let (proposed, h) = run(&fx, fx.at(11), &p);
    assert_eq!(proposed, vec![Command::MarkDead { node: 3 }]);
    assert!(!h.reports.contains_key(&3));
    assert_eq!(h.dead_since.get(&3), Some(&fx.at(11)));
}

#[test]
fn dead_nodes_are_repaired_after_the_grace() {
    let p = policy();
    // Node 3 died at 0; 4 is the only node that can take its voter.
    let mut dead3 = Fx::new(4, &[&[1, 2, 3]]);
    dead3.apply(Command::MarkDead { node: 3 });
    dead3.h.dead_since.insert(3, dead3.t0);
    let mut within = dead3.clone();
    within.beat_all(30);
    let mut past = dead3.clone();
    past.beat_all(61);
    let mut nowhere = Fx::new(3, &[&[1, 2, 3]]);
    nowhere.apply(Command::MarkDead { node: 3 });
    nowhere.h.dead_since.insert(3, nowhere.t0);
    nowhere.beat_all(61);
    // Replica counts: node 4 holds two replicas already, node 5 none, so
    // the replacement goes to 5.
    let mut loaded = Fx::new(5, &[&[1, 2, 3], &[1, 2, 4], &[4, 1, 2]]);
    loaded.apply(Command::MarkDead { node: 3 });
    loaded.h.dead_since.insert(3, loaded.t0);
    loaded.beat_all(61);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("within the grace", &within, 30, vec![]),
        (
            "past the grace",
            &past,
            61,
            vec![start_move(1, 3, 4, "repair")],
        ),
        ("no node to move to", &nowhere, 61, vec![]),
        (
            "to the node with the fewest replicas",
            &loaded,
            61,
            vec![start_move(1, 3, 5, "repair")],
        ),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

/// The warnings a pass logs, its proposals applied to a copy of the
/// state; `h` as the pass finds it (observed).
fn warnings(fx: &Fx, h: &HealthView, now: Instant, p: &Policy) -> Vec<String> {
    let mut pass = plan(&fx.s, h, now, p);
    let mut quorum = fx.s.clone();
    let mut warns = Vec::new();
    loop {
        let actions = pass.batch(256);
        if actions.is_empty() {
            return warns;
        }
        let mut replies = Vec::new();
        for a in actions {
            match a {
                Action::Propose(cmd) => replies.push(quorum.apply(cmd)),
                Action::Log(l) if l.level == Level::Warn => warns.push(l.text),
                _ => {}
            }
        }
        for a in pass.replied(replies) {
            if let Action::Log(l) = a
                && l.level == Level::Warn
            {
                warns.push(l.text);
            }
        }
    }
}

#[test]
fn tablets_that_lost_their_majority_get_no_move_and_one_warning() {
    let p = policy();
    // Nodes 2 and 3 died at 0: tablet 1 kept one voter of three, tablet 2
    // two of three.
    let mut fx = Fx::new(6, &[&[1, 2, 3], &[1, 4, 3]]);
    for n in [2, 3] {
        fx.apply(Command::MarkDead { node: n });
        fx.h.dead_since.insert(n, fx.t0);
    }
    fx.beat_all(61);
    let now = fx.at(61);
    let (proposed, h) = run(&fx, now, &p);
    assert!(
        matches!(
            proposed.as_slice(),
            [Command::StartMove {
                tablet: 2,
                from: 3,
                ..
            }]
        ),
        "{proposed:?}"
    );
    assert_eq!(h.lost_majority, BTreeSet::from([1]));
    let mut first = fx.h.clone();
    first.observe(&fx.s, TERM, now, p.lease);
    let warned = warnings(&fx, &first, now, &p);
    assert_eq!(
        warned,
        vec![
            "tablets that lost most of their voters to dead nodes: 1 new, 1 in all; repair \
             cannot move them: bring the nodes back or restore them (tablets 1)"
        ]
    );
    // The next pass knows them: no second warning, still no move.
    assert_eq!(warnings(&fx, &h, now, &p), Vec::<String>::new());
    // Node 2 comes back: tablet 1 has its majority again and is repaired.
    let mut back = fx.clone();
    back.apply(Command::Register(node(2)));
    back.beat_all(62);
    let (proposed, h) = run(&back, back.at(62), &p);
    assert!(
        proposed.iter().any(|c| matches!(
            c,
            Command::StartMove {
                tablet: 1,
                from: 3,
                ..
            }
        )),
        "{proposed:?}"
    );
    assert!(h.lost_majority.is_empty());
}

#[test]
fn drains_and_decommissions_move_voters_away() {
    let p = policy();
    let mut draining = Fx::new(4, &[&[1, 2, 3]]);
    draining.apply(Command::SetAdmin {
        node: 3,
        admin: Admin::Draining,
    });
    let mut decommissioned = Fx::new(4, &[&[1, 2, 3]]);
    decommissioned.apply(Command::SetAdmin {
        node: 3,
        admin: Admin::Decommissioned,
    });
    // A dead voter goes before a draining one: one move per tablet.
    let mut both = Fx::new(4, &[&[1, 2, 3]]);
    both.apply(Command::SetAdmin {
        node: 3,
        admin: Admin::Draining,
    });
    both.apply(Command::MarkDead { node: 2 });
    both.h.dead_since.insert(2, both.t0);
    both.beat_all(61);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("draining", &draining, 1, vec![start_move(1, 3, 4, "drain")]),
        (
            "decommissioned",
            &decommissioned,
            1,
            vec![start_move(1, 3, 4, "decommission")],
        ),
        (
            "dead before draining",
            &both,
            61,
            vec![start_move(1, 2, 4, "repair")],
        ),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn moves_finish_when_the_group_changed_or_are_given_up_before() {
    let p = policy();
    let mut base = Fx::new(4, &[&[1, 2, 3]]);
    let id = base.open(start_move(1, 3, 4, "operator"));
    base.h.intent_seen.insert(id, base.t0);
    base.beat_all(1);
    let new = base.replica(1, 4);
    let old = base.replica(1, 3);
    let mut done = base.clone();
    done.group_done(1);
    let mut learner_left = done.clone();
    learner_left.report(1, 1, |r| r.learners = vec![old]);
    let mut joint = base.clone();
    joint.report(1, 1, |r| r.joint = true);
    let mut took_voter = base.clone();
    took_voter.report(1, 1, |r| r.voters.push(new));
    let mut target_dead = base.clone();
    target_dead.apply(Command::MarkDead { node: 4 });
    let mut leaderless = base.clone();
    leaderless.h.reports.remove(&1);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("group unchanged, young", &base, 5, vec![]),
        (
            "group has the desired voters",
            &done,
            5,
            vec![Command::FinishMove { intent: id }],
        ),
        ("a learner left over", &learner_left, 5, vec![]),
        (
            "unchanged past the timeout",
            &base,
            121,
            vec![fail(id, "the group did not take its new voter within 120s")],
        ),
        ("joint: only forward", &joint, 121, vec![]),
        ("new voter in: only forward", &took_voter, 121, vec![]),
        (
            "target died before the change",
            &target_dead,
            5,
            vec![fail(id, "target node 4 died before the change")],
        ),
        ("no leader reports", &leaderless, 121, vec![]),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn splits_finish_when_the_child_is_reported_or_are_given_up() {
    let p = policy();
    let mut base = Fx::new(4, &[&[1, 2, 3]]);
    let id = base.open(Command::StartSplit {
        tablet: 1,
        at: 0,
        reason: "operator".into(),
        expect_generation: 0,
    });
    base.h.intent_seen.insert(id, base.t0);
    let IntentKind::Split {
        child, generation, ..
    } = base.s.intents[&id].kind.clone()
    else {
        panic!("not a split")
    };
    let child_report = pb::ReplicaReport {
        tablet: child,
        replica_id: 99 << 16 | 2,
        ..Default::default()
    };
    let mut child_seen = base.clone();
    child_seen
        .h
        .reports
        .get_mut(&2)
        .unwrap()
        .insert(child_report.tablet, child_report.clone());
    let mut applied = base.clone();
    applied.report(3, 1, |r| r.range_generation = generation);
    let mut given_up = base.clone();
    given_up.apply(fail(id, "aborted by the operator"));
    let mut given_up_applied = given_up.clone();
    given_up_applied
        .h
        .reports
        .get_mut(&2)
        .unwrap()
        .insert(child_report.tablet, child_report);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("nothing reported yet", &base, 5, vec![]),
        (
            "child reported",
            &child_seen,
            5,
            vec![Command::FinishSplit { intent: id }],
        ),
        (
            "not applied past the timeout",
            &base,
            121,
            vec![fail(id, "the group did not apply the split within 120s")],
        ),
        ("applied: only forward", &applied, 121, vec![]),
        ("given up", &given_up, 5, vec![]),
        (
            "given up, then applied after all",
            &given_up_applied,
            5,
            vec![Command::FinishSplit { intent: id }],
        ),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

/// Tablets 1 on {1, 2, 3} and 2 on {1, 2, 4} (adjacent), merging: 2
/// absorbs 1, whose voter on 3 must move to 4 first.
fn merging() -> (Fx, u64) {
    let mut fx = Fx::new(4, &[&[1, 2, 3], &[1, 2, 4]]);
    let id = fx.open(Command::StartMerge {
        a: 1,
        b: 2,
        reason: "operator".into(),
        expect_generation_a: 0,
        expect_generation_b: 0,
    });
    (fx, id)
}

#[test]
fn merges_colocate_freeze_merge_and_finish() {
    let p = policy();
    let step = |intent, to| Command::MergeStep { intent, to };
    let (colocate, id) = merging();
    let mut in_flight = colocate.clone();
    in_flight.apply(step(id, MergeStep::Move));
    in_flight.beat_all(1);
    let mut moved = in_flight.clone();
    moved.group_done(1);
    let mut target_dead = in_flight.clone();
    target_dead.apply(Command::MarkDead { node: 4 });
    let mut colocate_old = in_flight.clone();
    colocate_old
        .h
        .merge_phase_seen
        .insert(id, (MergePhase::Colocate, colocate_old.t0));
    // Node 3 still reports its retired replica of tablet 1 (it deletes it
    // later), so no `Retired` joins these plans.
    let mut colocated = moved.clone();
    colocated.apply(step(id, MergeStep::Moved));
    let mut freezing = colocated.clone();
    freezing.apply(step(id, MergeStep::Freeze));
    let mut some_frozen = freezing.clone();
    some_frozen.report(1, 1, |r| r.frozen = true);
    let mut all_frozen = some_frozen.clone();
    all_frozen.report(2, 1, |r| r.frozen = true);
    all_frozen.report(4, 1, |r| r.frozen = true);
    let mut freeze_old = some_frozen.clone();
    freeze_old
        .h
        .merge_phase_seen
        .insert(id, (MergePhase::Freeze, freeze_old.t0));
    let mut merging_phase = all_frozen.clone();
    merging_phase.apply(step(id, MergeStep::Merge));
    let IntentKind::Merge { generation, .. } = merging_phase.s.intents[&id].kind else {
        panic!("not a merge")
    };
    let mut published = merging_phase.clone();
    published.report(1, 2, |r| r.published_generation = generation);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        (
            "colocate: start a move",
            &colocate,
            5,
            vec![step(id, MergeStep::Move)],
        ),
        ("colocate: move in flight", &in_flight, 5, vec![]),
        (
            "colocate: the group took the move",
            &moved,
            5,
            vec![step(id, MergeStep::Moved)],
        ),
        (
            "colocate: target died before the change",
            &target_dead,
            5,
            vec![fail(
                id,
                "merge: tablet 1 did not take its new voter on node 4",
            )],
        ),
        (
            "colocate: no change past the timeout",
            &colocate_old,
            121,
            vec![fail(
                id,
                "merge: tablet 1 did not take its new voter on node 4",
            )],
        ),
        (
            "co-located: freeze",
            &colocated,
            5,
            vec![step(id, MergeStep::Freeze)],
        ),
        ("freeze: not every voter frozen", &some_frozen, 5, vec![]),
        (
            "freeze: every voter frozen",
            &all_frozen,
            5,
            vec![step(id, MergeStep::Merge)],
        ),
        (
            "freeze: not frozen past the timeout",
            &freeze_old,
            121,
            vec![fail(
                id,
                "tablet 1 did not freeze on every voter within 120s",
            )],
        ),
        (
            "merge: not published yet, never given up",
            &merging_phase,
            1000,
            vec![],
        ),
        (
            "merge: published",
            &published,
            5,
            vec![Command::FinishMerge { intent: id }],
        ),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn a_merge_phase_ages_from_when_the_leader_first_saw_it() {
    let p = policy();
    let (fx, id) = merging();
    let mut fx = fx;
    fx.apply(Command::MergeStep {
        intent: id,
        to: MergeStep::Move,
    });
    fx.beat_all(1);
    // First seen at 100: not given up at 200, given up at 221.
    let (_, h) = run(&fx, fx.at(100), &p);
    assert_eq!(
        h.merge_phase_seen.get(&id),
        Some(&(MergePhase::Colocate, fx.at(100)))
    );
    let later = Fx { h, ..fx.clone() };
    check("120 s in the phase", &later, fx.at(220), &p, &[]);
    check(
        "past 120 s in the phase",
        &later,
        fx.at(221),
        &p,
        &[fail(
            id,
            "merge: tablet 1 did not take its new voter on node 4",
        )],
    );
}

#[test]
fn leader_transfers_finish_or_time_out_at_a_tenth() {
    let p = policy();
    let mut base = Fx::new(4, &[&[1, 2, 3]]);
    let id = base.open(Command::TransferLeader {
        tablet: 1,
        to: 2,
        reason: "operator".into(),
    });
    base.h.intent_seen.insert(id, base.t0);
    let mut led = base.clone();
    led.report(1, 1, |r| r.leader = false);
    led.report(2, 1, |r| r.leader = true);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("young", &base, 5, vec![]),
        (
            "the new leader reports",
            &led,
            5,
            vec![Command::FinishTransfer { intent: id }],
        ),
        ("a tenth of the timeout", &base, 12, vec![]),
        (
            "past a tenth of the timeout",
            &base,
            13,
            vec![fail(id, "node 2 did not take the leadership")],
        ),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn intents_age_from_when_this_leader_first_saw_them() {
    let p = policy();
    let mut fx = Fx::new(4, &[&[1, 2, 3]]);
    let id = fx.open(start_move(1, 3, 4, "operator"));
    let (_, h) = run(&fx, fx.at(50), &p);
    assert_eq!(h.intent_seen.get(&id), Some(&fx.at(50)));
    let later = Fx { h, ..fx.clone() };
    check("120 s after first seen", &later, fx.at(170), &p, &[]);
    check(
        "past 120 s after first seen",
        &later,
        fx.at(171),
        &p,
        &[fail(id, "the group did not take its new voter within 120s")],
    );
    // Closed intents are forgotten.
    let mut closed = later.clone();
    closed.apply(fail(id, "aborted by the operator"));
    let (_, h) = run(&closed, fx.at(60), &p);
    assert!(h.intent_seen.is_empty());
}

#[test]
fn many_groups_start_in_one_entry_once_every_controller_decodes_it() {
    let p = policy();
    let mut fx = Fx::new(3, &[&[1, 2, 3], &[1, 2, 3]]);
    for t in [1, 2] {
        let first = fx.s.tablets[&t].voters[0].replica_id;
        fx.s.tablets.get_mut(&t).unwrap().initializer = Some(first);
    }
    check(
        "heartbeat format 1: one entry each",
        &fx,
        fx.at(1),
        &p,
        &[
            Command::Started { tablet: 1 },
            Command::Started { tablet: 2 },
        ],
    );
    fx.apply(Command::EnableFormat {
        name: stele_proto::formats::HEARTBEAT.into(),
        version: 2,
    });
    check(
        "heartbeat format 2: one entry",
        &fx,
        fx.at(1),
        &p,
        &[Command::StartedMany {
            tablets: vec![1, 2],
        }],
    );
}

#[test]
fn new_tablets_are_placed_and_started() {
    let p = policy();
    let unplaced = Fx::new(4, &[]);
    let too_few = Fx::new(2, &[]);
    let mut not_started = Fx::new(3, &[]);
    not_started.apply(Command::Place(vec![(1, vec![1, 2, 3])]));
    not_started.beat_all(0);
    let mut no_cell = Fx::new(3, &[]);
    no_cell.s.cell = None;
    no_cell.s.tablets.clear();
    // Where placement puts it (placement's own tests say why there).
    let nodes = unplaced
        .h
        .placement_nodes(&unplaced.s, unplaced.at(1), p.lease, p.repair_grace);
    let tablets = tablet_infos(&unplaced.s, &HashMap::new());
    let sets = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .place_new(1)
    .unwrap();
    assert_eq!(sets[0].iter().collect::<BTreeSet<_>>().len(), 3);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        (
            "placed where placement says",
            &unplaced,
            1,
            vec![Command::Place(vec![(1, sets[0].clone())])],
        ),
        ("too few nodes for three voters", &too_few, 1, vec![]),
        (
            "the group elected a leader",
            &not_started,
            1,
            vec![Command::Started { tablet: 1 }],
        ),
        ("no cell", &no_cell, 100, vec![]),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn retired_replicas_are_forgotten_once_their_node_stops_reporting_them() {
    let p = policy();
    let mut fx = Fx::new(4, &[&[1, 2, 3]]);
    let old = fx.s.replica_on(&fx.s.tablets[&1], 3).unwrap();
    let id = fx.open(start_move(1, 3, 4, "operator"));
    fx.apply(Command::FinishMove { intent: id });
    fx.beat_all(1);
    fx.h.reports.get_mut(&3).unwrap().insert(
        1,
        pb::ReplicaReport {
            tablet: 1,
            replica_id: old.replica_id,
            ..Default::default()
        },
    );
    let mut gone = fx.clone();
    gone.h.reports.insert(3, Default::default());
    let mut silent = fx.clone();
    silent.h.reports.remove(&3);
    let cases: Vec<(&str, &Fx, u64, Vec<Command>)> = vec![
        ("still reported", &fx, 2, vec![]),
        (
            "no longer reported",
            &gone,
            2,
            vec![Command::Retired {
                node: 3,
                replica: old,
            }],
        ),
        ("no report from the node", &silent, 2, vec![]),
    ];
    for (case, fx, secs, want) in cases {
        check(case, fx, fx.at(secs), &p, &want);
    }
}

#[test]
fn at_most_max_intents_open_and_refused_opens_do_not_count() {
    let mut p = policy();
    // Node 3 dead past the grace holds voters of both tablets; 4 and 5
    // can take them.
    let mut fx = Fx::new(5, &[&[1, 2, 3], &[1, 2, 3]]);
    fx.apply(Command::MarkDead { node: 3 });
    fx.h.dead_since.insert(3, fx.t0);
    fx.beat_all(61);
    let both = run(&fx, fx.at(61), &p).0;
    assert_eq!(both.len(), 2, "{both:?}");
    p.max_intents = 1;
    check("a cap of one", &fx, fx.at(61), &p, &both[..1]);
    // A finished intent frees its slot in the same pass.
    let mut finishing = fx.clone();
    let id = finishing.open(Command::TransferLeader {
        tablet: 1,
        to: 2,
        reason: "operator".into(),
    });
    finishing.report(1, 1, |r| r.leader = false);
    finishing.report(2, 1, |r| r.leader = true);
    // Tablet 1 was busy when the pass began, so tablet 2 moves.
    let want = [
        Command::FinishTransfer { intent: id },
        start_move(2, 3, 4, "repair"),
    ];
    check("a slot freed in the pass", &finishing, fx.at(61), &p, &want);
    // Opened elsewhere after the snapshot: the first move is refused (its
    // tablet is busy in the quorum's state), so the second still goes.
    p.max_intents = 2;
    let mut h = fx.h.clone();
    h.observe(&fx.s, TERM, fx.at(61), p.lease);
    for batch in [1, 256] {
        let mut first = true;
        let pass = plan(&fx.s, &h, fx.at(61), &p);
        let mut n = 0;
        let proposed = walk(
            pass,
            batch,
            |_| {
                n += 1;
                if std::mem::take(&mut first) {
                    Reply::Refused("tablet 1 is busy".into())
                } else {
                    Reply::Intent(100 + n)
                }
            },
            |_| {},
        );
        assert_eq!(proposed, both, "batches of {batch}");
    }
    p.max_intents = 1;
    for batch in [1, 256] {
        let pass = super::plan(&fx.s, &h, fx.at(61), &p);
        let proposed = walk(pass, batch, |_| Reply::Refused("busy".into()), |_| {});
        assert_eq!(proposed, both, "refused moves leave the cap free");
    }
}

/// Three tablets on {1, 2, 3}, all led from node 1.
fn lopsided() -> Fx {
    Fx::new(3, &[&[1, 2, 3], &[1, 2, 3], &[1, 2, 3]])
}

#[test]
fn leaders_are_balanced_every_so_often_while_nothing_moves() {
    let mut p = policy();
    p.leader_balance_every = Duration::from_secs(10);
    let fx = lopsided();
    let transfers = run(&fx, fx.at(10), &p).0;
    // One leader per node: two of node 1's three leaderships move, one to
    // each other node.
    let mut to: Vec<u64> = transfers
        .iter()
        .map(|c| match c {
            Command::TransferLeader { to, reason, .. } if reason == "balance" => *to,
            c => panic!("not a balance transfer: {c:?}"),
        })
        .collect();
    to.sort();
    assert_eq!(to, vec![2, 3]);
    let mut balanced = fx.clone();
    balanced.report(1, 2, |r| r.leader = false);
    balanced.report(2, 2, |r| r.leader = true);
    balanced.report(1, 3, |r| r.leader = false);
    balanced.report(3, 3, |r| r.leader = true);
    let busy = {
        let mut b = lopsided();
        b.open(Command::StartSplit {
            tablet: 1,
            at: 0,
            reason: "operator".into(),
            expect_generation: 0,
        });
        b
    };
    let mut new_term = fx.clone();
    new_term.h.leading = Some((TERM - 1, fx.t0));
    // Nothing open when the pass began, but node 3 drains: the moves it
    // opens keep the leaders where they are.
    let mut draining = Fx::new(4, &[&[1, 2, 3], &[1, 2, 3], &[1, 2, 3]]);
    draining.apply(Command::SetAdmin {
        node: 3,
        admin: Admin::Draining,
    });
    let drained: Vec<Command> = (1..=3).map(|t| start_move(t, 3, 4, "drain")).collect();
    let mut never = p.clone();
    never.leader_balance_every = Duration::ZERO;
    // Node 3 is being restarted (`RestartSafe`): it gets no leadership
    // until its hold ends.
    let mut held = fx.clone();
    held.h.hold_leaders(3, fx.at(30));
    let to_2: Vec<Command> = transfers
        .iter()
        .filter(|c| matches!(c, Command::TransferLeader { to: 2, .. }))
        .cloned()
        .collect();
    let cases: Vec<(&str, &Fx, u64, &Policy, Vec<Command>)> = vec![
        ("due", &fx, 10, &p, transfers.clone()),
        ("a held node takes none", &held, 10, &p, to_2),
        ("a hold ends", &held, 30, &p, transfers.clone()),
        ("not due yet", &fx, 9, &p, vec![]),
        ("balanced", &balanced, 10, &p, vec![]),
        ("an intent is open", &busy, 10, &p, vec![]),
        ("the pass opened intents", &draining, 10, &p, drained),
        ("a new leader waits a period", &new_term, 15, &p, vec![]),
        ("balancing off", &fx, 100, &never, vec![]),
    ];
    for (case, fx, secs, p, want) in cases {
        check(case, fx, fx.at(secs), p, &want);
    }
    // Considered at 10 even though an intent was open: the next look is
    // at 20.
    let (_, h) = run(&busy, busy.at(10), &p);
    assert_eq!(h.last_leader_balance, Some(busy.at(10)));
}

/// Heartbeats every second from `from` to `to` with each leader reporting
/// `bytes` of segments for every tablet.
fn load(fx: &mut Fx, bytes: u64, from: u64, to: u64) {
    for secs in from..=to {
        for n in 1..=fx.s.nodes.len() as u64 {
            let mut reports = fx.reports_of(n);
            for r in &mut reports {
                r.segment_bytes = bytes;
            }
            let now = fx.at(secs);
            fx.h.heartbeat(n, ReportUpdate::full(reports), now, Duration::from_secs(10));
        }
    }
}

#[test]
fn tablets_split_and_merge_by_themselves() {
    let mut p = policy();
    p.split.bytes = 100;
    let mut fx = Fx::new(3, &[&[1, 2, 3], &[1, 2, 3]]);
    // The first pass starts tracking both tablets.
    fx.h = run(&fx, fx.at(0), &p).1;
    let mut big = fx.clone();
    load(&mut big, 200, 0, 10);
    let mut short = fx.clone();
    load(&mut short, 200, 0, 9);
    let mut busy = big.clone();
    busy.open(Command::TransferLeader {
        tablet: 1,
        to: 2,
        reason: "operator".into(),
    });
    let split = |tablet| Command::StartSplit {
        tablet,
        at: 0,
        reason: "auto: 200 bytes of segments >= 100 for 10s".into(),
        expect_generation: 0,
    };
    let mut small = fx.clone();
    load(&mut small, 10, 0, 10);
    let mut merge_on = p.clone();
    merge_on.split.merge_below_percent = 50;
    let cases: Vec<(&str, &Fx, u64, &Policy, Vec<Command>)> = vec![
        (
            "over the mark for a window",
            &big,
            10,
            &p,
            vec![split(1), split(2)],
        ),
        ("not a whole window yet", &short, 9, &p, vec![]),
        ("busy with an intent", &busy, 10, &p, vec![split(2)]),
        ("small, merges off", &small, 10, &p, vec![]),
        (
            "small and adjacent, merges on",
            &small,
            10,
            &merge_on,
            vec![Command::StartMerge {
                a: 1,
                b: 2,
                reason: "auto: merged load 20 bytes < 50 over 10s".into(),
                expect_generation_a: 0,
                expect_generation_b: 0,
            }],
        ),
    ];
    for (case, fx, secs, p, want) in cases {
        check(case, fx, fx.at(secs), p, &want);
    }
    // A split proposal restarts the tablet's samples, whatever came of it.
    let (_, h) = run(&big, big.at(10), &p);
    check(
        "sampled afresh",
        &Fx { h, ..big.clone() },
        big.at(10),
        &p,
        &[],
    );
}

/// Passes every half second, as the driver runs them, while every leader
/// reports 30 more records applied per second: a tablet over a 20 writes/s
/// mark splits once its 4 s cooldown and a 3 s window have passed, and not
/// before.
#[test]
fn a_hot_tablet_splits_once_its_cooldown_and_window_passed() {
    let mut p = policy();
    p.split.writes_per_s = 20;
    p.split.window = Duration::from_secs(3);
    p.split.cooldown = Duration::from_secs(4);
    let mut fx = Fx::new(3, &[&[1, 2, 3]]);
    let mut first = None;
    for half in 0..40u64 {
        let now = fx.t0 + Duration::from_millis(500 * half);
        for n in 1..=3 {
            let mut reports = fx.reports_of(n);
            for r in &mut reports {
                r.records_applied = 15 * half;
            }
            fx.h.heartbeat(n, ReportUpdate::full(reports), now, p.split.window);
        }
        let (proposed, h) = run(&fx, now, &p);
        fx.h = h;
        if proposed
            .iter()
            .any(|c| matches!(c, Command::StartSplit { tablet: 1, .. }))
        {
            first = Some(half);
            break;
        }
    }
    assert_eq!(first, Some(8), "split at 4 s, the first pass past both");
}
