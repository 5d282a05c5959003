//! The scheduler's decisions: what the leading controller proposes in one
//! pass, as a pure function of the replicated state, the leader's health
//! view and the time.
//!
//! ```text
//!   driver (each tick)          scheduler (pure)
//!   ------------------          ----------------
//!   clock, state, health  --->  plan(state, health, now) -> Plan
//!   propose / note / log  <---  Plan::batch(n)            (what needs no reply)
//!   replies               --->  Plan::replied(replies)    (what they change)
//! ```
//!
//! One pass, in order: leases (nodes whose lease ran out are declared dead);
//! groups that elected a leader lose their initializer; new tablets are
//! placed; open intents finish, step or are given up (moves, splits, merges,
//! leader transfers); given-up splits that were applied after all complete;
//! automatic splits and merges open; retired replicas no node reports are
//! forgotten; dead, draining and decommissioned nodes' voters move away;
//! leaders are balanced while nothing else moves.
//!
//! Every decision is taken against the snapshot the pass started from, as
//! before this module existed. Where a decision depends on how an earlier
//! proposal of the same pass went, the plan says so instead of guessing:
//! the intents an automatic split, merge or repair opens count against
//! `max_intents` only if the reply says one opened, and leader transfers
//! wait for a pass with nothing open. The driver proposes each batch's
//! commands as one append, feeds the replies back through
//! [`Plan::replied`] and stops the pass at the first proposal that fails
//! (not the leader any more, no quorum). A later proposal of the batch may
//! then be in the log too, but a log commits in order: it can never commit
//! without the earlier ones.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use stele_proto::pb;

use crate::autosplit::{SplitPolicy, should_merge, should_split};
use crate::health::{HealthView, Note, tablet_infos};
use crate::placement::Cluster;
use crate::state::{
    Admin, CellState, Command, IntentKind, IntentRec, IntentState, MergePhase, MergeStep, Reply,
    TabletRec, node_of,
};

/// The scheduler's knobs (from the controller's options).
#[derive(Debug, Clone)]
pub struct Policy {
    /// A node missing heartbeats this long is declared dead.
    pub lease: Duration,
    /// A dead node's replicas are moved away after this much more.
    pub repair_grace: Duration,
    /// Most intents open at once.
    pub max_intents: usize,
    /// A change that has not started after this long is given up (a leader
    /// transfer after a tenth of it).
    pub intent_timeout: Duration,
    /// How often leaders are rebalanced (zero: never).
    pub leader_balance_every: Duration,
    /// When tablets split and merge by themselves.
    pub split: SplitPolicy,
}

/// A log line the driver writes when it reaches the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    pub level: Level,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

impl Log {
    fn new(level: Level, text: impl Into<String>) -> Log {
        Log {
            level,
            text: text.into(),
        }
    }

    pub fn emit(&self) {
        match self.level {
            Level::Debug => tracing::debug!("{}", self.text),
            Level::Info => tracing::info!("{}", self.text),
            Level::Warn => tracing::warn!("{}", self.text),
        }
    }
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Propose this command and pass its reply to [`Plan::replied`]; stop
    /// the pass if the proposal fails.
    Propose(Command),
    /// Record this in the leader's health view.
    Note(Note),
    Log(Log),
}

/// A command that opens an intent, proposed only while fewer than
/// `max_intents` are open.
#[derive(Debug, Clone)]
struct Open {
    log: Option<Log>,
    cmd: Command,
    /// Logged with the intent's id when one opened.
    opened: Option<String>,
    /// Logged (debug) with the reason when refused.
    refused: Option<String>,
    /// Recorded once the proposal went through, whatever the reply.
    then: Option<Note>,
}

#[derive(Debug, Clone)]
enum Step {
    Act(Action),
    Open(Open),
    /// An `Open` past its cap check: propose it and wait for its reply.
    Send(Open),
    /// Proposed only while no intent is open.
    WhenIdle(Log, Command),
}

/// One pass's steps, walked by [`Plan::batch`] and [`Plan::replied`].
#[derive(Debug, Clone)]
pub struct Plan {
    steps: VecDeque<Step>,
    /// Intents open once the pass's finishing steps went through, plus the
    /// ones it opened so far.
    open: usize,
    max_intents: usize,
    /// One slot per proposal of the batch out: the `Open` whose reply
    /// counts, or `None` for a proposal whose reply changes nothing.
    in_flight: Vec<Option<Open>>,
}

impl Plan {
    fn new(max_intents: usize) -> Plan {
        Plan {
            steps: VecDeque::new(),
            open: 0,
            max_intents,
            in_flight: Vec::new(),
        }
    }

    fn act(&mut self, a: Action) {
        self.steps.push_back(Step::Act(a));
    }

    fn propose(&mut self, cmd: Command) {
        self.act(Action::Propose(cmd));
    }

    fn log(&mut self, level: Level, text: impl Into<String>) {
        self.act(Action::Log(Log::new(level, text)));
    }

    fn note(&mut self, note: Note) {
        self.act(Action::Note(note));
    }

    /// The next actions, in order, holding at most `max_proposals`
    /// proposals: as many as can be decided without the replies to the
    /// proposals among them. The driver proposes those together (one
    /// append, in this order), does the rest in order, and hands the
    /// replies to [`Plan::replied`] before asking again. Empty when the
    /// pass is over.
    ///
    /// Walked one proposal at a time, this is the pass as the old loop
    /// ran it. A batch stops where a decision would depend on a reply
    /// still out: an `Open` that fits under `max_intents` only if an
    /// intent out is refused, or a `WhenIdle` step while intents are out
    /// and none is open yet. Every other decision is the same whatever
    /// the replies say, since the count of open intents only grows within
    /// a pass.
    pub fn batch(&mut self, max_proposals: usize) -> Vec<Action> {
        assert!(
            self.in_flight.is_empty(),
            "a batch's replies go to Plan::replied first"
        );
        let mut out = Vec::new();
        while self.in_flight.len() < max_proposals.max(1) {
            let Some(step) = self.steps.pop_front() else {
                break;
            };
            let sending = self.in_flight.iter().filter(|o| o.is_some()).count();
            match step {
                Step::Act(a) => {
                    if matches!(a, Action::Propose(_)) {
                        self.in_flight.push(None);
                    }
                    out.push(a);
                }
                Step::Open(mut o) => {
                    if self.open + sending >= self.max_intents {
                        if sending > 0 {
                            // Fits only if one of those is refused.
                            self.steps.push_front(Step::Open(o));
                            break;
                        }
                        // Its log and note go with it: the old pass broke
                        // off here, and the count never falls within a pass.
                        continue;
                    }
                    let log = o.log.take();
                    self.steps.push_front(Step::Send(o));
                    out.extend(log.map(Action::Log));
                }
                Step::Send(o) => {
                    out.push(Action::Propose(o.cmd.clone()));
                    self.in_flight.push(Some(o));
                }
                Step::WhenIdle(log, cmd) => {
                    if self.open > 0 {
                        continue;
                    }
                    if sending > 0 {
                        self.steps.push_front(Step::WhenIdle(log, cmd));
                        break;
                    }
                    self.steps.push_front(Step::Act(Action::Propose(cmd)));
                    out.push(Action::Log(log));
                }
            }
        }
        out
    }

    /// The replies to the last batch's proposals, in order (fewer when a
    /// proposal failed: the pass stops there); what to log and note
    /// because of them, in order.
    pub fn replied(&mut self, replies: impl IntoIterator<Item = Reply>) -> Vec<Action> {
        let mut follow = Vec::new();
        for (slot, reply) in std::mem::take(&mut self.in_flight).into_iter().zip(replies) {
            let Some(o) = slot else { continue };
            match reply {
                Reply::Intent(id) => {
                    self.open += 1;
                    if let Some(text) = o.opened {
                        follow.push(Action::Log(Log::new(
                            Level::Info,
                            format!("{text} (intent {id})"),
                        )));
                    }
                }
                Reply::Refused(why) => {
                    if let Some(text) = o.refused {
                        follow.push(Action::Log(Log::new(
                            Level::Debug,
                            format!("{text}: {why}"),
                        )));
                    }
                }
                Reply::Ok => {}
            }
            follow.extend(o.then.map(Action::Note));
        }
        follow
    }
}

/// Whether the group `r` reports has the voters `desired`, out of joint
/// consensus, with no learner left over.
fn membership_matches(r: &pb::ReplicaReport, desired: &BTreeSet<u64>) -> bool {
    let voters: BTreeSet<u64> = r.voters.iter().copied().collect();
    voters == *desired && !r.joint && r.learners.iter().all(|l| desired.contains(l))
}

/// Decides one pass. `h` is the health view after [`HealthView::observe`]
/// for this pass; nothing here reads a clock or does I/O.
pub fn plan(s: &CellState, h: &HealthView, now: Instant, p: &Policy) -> Plan {
    let mut plan = Plan::new(p.max_intents);
    let Some(cell) = s.cell.as_ref() else {
        return plan;
    };
    // Leases.
    for n in s
        .nodes
        .values()
        .filter(|n| h.lease_expired(n, now, p.lease))
    {
        plan.log(
            Level::Warn,
            format!("node {}: health lease expired; node declared dead", n.id),
        );
        plan.propose(Command::MarkDead { node: n.id });
    }
    let leaders = h.leaders();
    // Groups that elected a leader no longer need their initializer: in
    // one entry where every controller decodes that, else one each.
    let started: Vec<u64> = s
        .tablets
        .values()
        .filter(|t| t.initializer.is_some() && leaders.contains_key(&t.id))
        .map(|t| t.id)
        .collect();
    if s.format(stele_proto::formats::HEARTBEAT) >= 2 && started.len() > 1 {
        plan.propose(Command::StartedMany { tablets: started });
    } else {
        for tablet in started {
            plan.propose(Command::Started { tablet });
        }
    }
    let nodes = h.placement_nodes(s, now, p.lease, p.repair_grace);
    let replication = cell.replication as usize;
    // New tablets.
    let unplaced: Vec<u64> = s
        .tablets
        .values()
        .filter(|t| t.voters.is_empty())
        .map(|t| t.id)
        .collect();
    if !unplaced.is_empty() {
        let tablets = tablet_infos(s, &leaders);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        match cluster.place_new(unplaced.len()) {
            Ok(sets) => plan.propose(Command::Place(unplaced.into_iter().zip(sets).collect())),
            Err(e) => plan.log(Level::Debug, format!("tablets wait for nodes: {e}")),
        }
    }
    // Open intents: finish what the groups report done, give up what
    // cannot finish.
    let pending: Vec<&IntentRec> = s
        .intents
        .values()
        .filter(|i| i.state == IntentState::Pending)
        .collect();
    plan.note(Note::IntentsSeen {
        pending: pending.iter().map(|i| i.id).collect(),
        now,
    });
    let mut open = pending.len();
    for i in &pending {
        if intent_steps(&mut plan, s, h, &leaders, i, now, p) {
            open -= 1;
        }
    }
    // A split given up (timeout, abort) whose group applied it after all:
    // its child exists, so the split completes.
    for i in s.intents.values() {
        if let (
            IntentState::Failed { .. },
            IntentKind::Split {
                child, generation, ..
            },
        ) = (&i.state, &i.kind)
            && !s.tablets.contains_key(child)
            && h.split_progress(i.tablet, *child, *generation).0
        {
            plan.log(
                Level::Warn,
                format!(
                    "intent {}: a given-up split was applied (child {child}); completing it",
                    i.id
                ),
            );
            plan.propose(Command::FinishSplit { intent: i.id });
        }
    }
    plan.open = open;
    auto_steps(&mut plan, s, h, now, p);
    // Retired replicas a live node no longer reports are gone.
    for (node, set) in &s.retired {
        let Some(reps) = h.reports.get(node) else {
            continue;
        };
        for r in set {
            if !reps.values().any(|x| x.replica_id == r.replica_id) {
                plan.propose(Command::Retired {
                    node: *node,
                    replica: *r,
                });
            }
        }
    }
    // Repair and drain: replace voters on dead (past the grace), draining
    // and decommissioned nodes. The open count only grows from here on, so
    // a pass that starts full opens nothing and need not plan.
    if open < p.max_intents {
        let tablets = tablet_infos(s, &leaders);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        let repair = cluster.repair();
        let lost: BTreeSet<u64> = repair.lost_majority.iter().copied().collect();
        if lost != h.lost_majority {
            let newly: Vec<u64> = lost.difference(&h.lost_majority).copied().collect();
            if !newly.is_empty() {
                let shown: Vec<String> = newly.iter().take(10).map(u64::to_string).collect();
                plan.log(
                    Level::Warn,
                    format!(
                        "tablets that lost most of their voters to dead nodes: {} new, \
                         {} in all; repair cannot move them: bring the nodes back or \
                         restore them (tablets {}{})",
                        newly.len(),
                        lost.len(),
                        shown.join(", "),
                        if newly.len() > shown.len() {
                            ", ..."
                        } else {
                            ""
                        }
                    ),
                );
            }
            plan.note(Note::LostMajority(lost));
        }
        for m in repair.moves {
            let Some(from) = m.from else { continue };
            let reason = match s.nodes.get(&from) {
                Some(n) if n.dead => "repair",
                Some(n) if n.admin == Admin::Draining => "drain",
                _ => "decommission",
            };
            plan.steps.push_back(Step::Open(Open {
                log: None,
                cmd: Command::StartMove {
                    tablet: m.tablet,
                    from,
                    to: m.to,
                    reason: reason.into(),
                    expect_generation: 0,
                },
                opened: Some(format!(
                    "tablet {}: move {from} -> {} started ({reason})",
                    m.tablet, m.to
                )),
                refused: None,
                then: None,
            }));
        }
    }
    // Leader balance: a few transfers at a time, every so often, and only
    // while nothing else is moving.
    let due = !p.leader_balance_every.is_zero()
        && h.last_leader_balance
            .is_none_or(|t| now.duration_since(t) >= p.leader_balance_every);
    if due {
        plan.note(Note::LeaderBalance { now });
        if open == 0 {
            let tablets = tablet_infos(s, &leaders);
            let cluster = Cluster {
                nodes: &nodes,
                tablets: &tablets,
                replication,
            };
            // A node being restarted (`RestartSafe`) gets no leadership.
            for tr in cluster
                .leader_plan(0.10)
                .into_iter()
                .filter(|tr| !h.holds_leaders(tr.to, now))
                .take(4)
            {
                plan.steps.push_back(Step::WhenIdle(
                    Log::new(
                        Level::Info,
                        format!(
                            "tablet {}: leader balance {} -> {}",
                            tr.tablet, tr.from, tr.to
                        ),
                    ),
                    Command::TransferLeader {
                        tablet: tr.tablet,
                        to: tr.to,
                        reason: "balance".into(),
                    },
                ));
            }
        }
    }
    plan
}

/// The steps for one open intent; true if they close it.
fn intent_steps(
    plan: &mut Plan,
    s: &CellState,
    h: &HealthView,
    leaders: &HashMap<u64, pb::ReplicaReport>,
    i: &IntentRec,
    now: Instant,
    p: &Policy,
) -> bool {
    let age = h.intent_age(i.id, now);
    let Some(t) = s.tablets.get(&i.tablet) else {
        return false;
    };
    let report = leaders.get(&t.id);
    let fail = |plan: &mut Plan, what: &str, reason: String| {
        plan.log(
            Level::Warn,
            format!(
                "intent {} (tablet {}): {what} given up: {reason}",
                i.id, t.id
            ),
        );
        plan.propose(Command::FailIntent {
            intent: i.id,
            reason,
        });
    };
    match &i.kind {
        IntentKind::Move {
            to, new_replica, ..
        } => {
            let desired: BTreeSet<u64> = t.voters.iter().map(|r| r.replica_id).collect();
            let Some(r) = report else { return false };
            if membership_matches(r, &desired) {
                plan.propose(Command::FinishMove { intent: i.id });
                return true;
            }
            // Once the group's voters changed, the move only goes forward:
            // it is never rolled back.
            let started = r.voters.contains(new_replica) || r.joint;
            let reason = if s.nodes.get(to).is_none_or(|n| n.dead) {
                Some(format!("target node {to} died before the change"))
            } else if age > p.intent_timeout {
                Some(format!(
                    "the group did not take its new voter within {:?}",
                    p.intent_timeout
                ))
            } else {
                None
            };
            match (reason, started) {
                (Some(reason), false) => {
                    fail(plan, "move", reason);
                    true
                }
                _ => false,
            }
        }
        IntentKind::Split {
            child, generation, ..
        } => {
            let (child_seen, applied) = h.split_progress(t.id, *child, *generation);
            if child_seen {
                plan.log(
                    Level::Info,
                    format!(
                        "intent {} (tablet {}): split: child {child} reported; publishing routes",
                        i.id, t.id
                    ),
                );
                plan.propose(Command::FinishSplit { intent: i.id });
                true
            } else if !applied && age > p.intent_timeout {
                let reason = format!(
                    "the group did not apply the split within {:?}",
                    p.intent_timeout
                );
                fail(plan, "split", reason);
                true
            } else {
                false
            }
        }
        IntentKind::Merge {
            absorbed,
            generation,
            phase,
            moving,
            ..
        } => {
            let Some(a) = s.tablets.get(absorbed) else {
                return false;
            };
            plan.note(Note::MergePhase {
                intent: i.id,
                phase: *phase,
                now,
            });
            let in_phase = h.merge_phase_age(i.id, *phase, now);
            let step = |to| Command::MergeStep { intent: i.id, to };
            let info = |plan: &mut Plan, what: &str| {
                plan.log(
                    Level::Info,
                    format!(
                        "intent {} (tablet {}, absorbing {absorbed}): merge: {what}",
                        i.id, t.id
                    ),
                );
            };
            match phase {
                MergePhase::Colocate => match a.leaving {
                    Some(_) => {
                        let Some(r) = leaders.get(absorbed) else {
                            return false;
                        };
                        let desired: BTreeSet<u64> =
                            a.voters.iter().map(|r| r.replica_id).collect();
                        let started = r.voters.contains(moving) || r.joint;
                        let target_dead = s.nodes.get(&node_of(*moving)).is_none_or(|n| n.dead);
                        if membership_matches(r, &desired) {
                            plan.propose(step(MergeStep::Moved));
                            false
                        } else if !started && (target_dead || in_phase > p.intent_timeout) {
                            let reason = format!(
                                "merge: tablet {absorbed} did not take its new voter on node {}",
                                node_of(*moving)
                            );
                            fail(plan, "merge", reason);
                            true
                        } else {
                            false
                        }
                    }
                    None if s.colocating_move(t.id, *absorbed).is_some() => {
                        info(plan, "moving a replica to co-locate");
                        plan.propose(step(MergeStep::Move));
                        false
                    }
                    None => {
                        info(plan, "co-located; freezing");
                        plan.propose(step(MergeStep::Freeze));
                        false
                    }
                },
                MergePhase::Freeze => {
                    let frozen = a.voters.iter().all(|v| {
                        h.replica_report(*absorbed, v.replica_id)
                            .is_some_and(|r| r.frozen)
                    });
                    if frozen {
                        info(plan, "frozen everywhere; merging");
                        plan.propose(step(MergeStep::Merge));
                        false
                    } else if in_phase > p.intent_timeout {
                        let reason = format!(
                            "tablet {absorbed} did not freeze on every voter within {:?}",
                            p.intent_timeout
                        );
                        fail(plan, "merge", reason);
                        true
                    } else {
                        false
                    }
                }
                MergePhase::Merge => {
                    if report.is_some_and(|r| r.published_generation >= *generation) {
                        info(plan, "published; publishing routes");
                        plan.propose(Command::FinishMerge { intent: i.id });
                        true
                    } else {
                        false
                    }
                }
            }
        }
        IntentKind::TransferLeader { to } => {
            if report.is_some_and(|r| r.replica_id == t.leader_replica) {
                plan.propose(Command::FinishTransfer { intent: i.id });
                true
            } else if age > p.intent_timeout / 10 {
                plan.propose(Command::FailIntent {
                    intent: i.id,
                    reason: format!("node {to} did not take the leadership"),
                });
                true
            } else {
                false
            }
        }
    }
}

/// Automatic splits (a tablet over a mark for a whole window, past its
/// cooldown, with nothing else open on it) and merges (adjacent idle
/// tablets whose load together stays under the low marks for a whole
/// window, both past their cooldowns).
fn auto_steps(plan: &mut Plan, s: &CellState, h: &HealthView, now: Instant, p: &Policy) {
    plan.note(Note::LoadsTracked {
        ranges: s.tablets.values().map(|t| (t.id, (t.lo, t.hi))).collect(),
        now,
    });
    // The loads as that note leaves them: the clock starts if it had not.
    let at = h.load_time(now);
    let idle = |t: &TabletRec| t.intent == 0 && t.leaving.is_none() && !t.voters.is_empty();
    for t in s.tablets.values().filter(|t| idle(t)) {
        let Some(load) = h.load(t.id, (t.lo, t.hi)) else {
            continue;
        };
        if let Some(reason) = should_split(load, &p.split, at) {
            plan.steps.push_back(Step::Open(Open {
                log: Some(Log::new(
                    Level::Info,
                    format!("tablet {}: automatic split ({reason})", t.id),
                )),
                cmd: Command::StartSplit {
                    tablet: t.id,
                    at: 0,
                    reason,
                    expect_generation: 0,
                },
                opened: None,
                refused: Some(format!("tablet {}: automatic split refused", t.id)),
                then: Some(Note::LoadsReset {
                    tablets: vec![t.id],
                    now,
                }),
            }));
        }
    }
    if p.split.merge_below_percent == 0 {
        return;
    }
    // A tablet a split above just reset cannot be a candidate here anyway:
    // it was over a high mark, and a merge needs the pair's sum under half
    // of every mark.
    let mut ordered: Vec<&TabletRec> = s.tablets.values().collect();
    ordered.sort_by_key(|t| t.lo);
    let mut taken = BTreeSet::new();
    for w in ordered.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.hi != u64::from(b.lo) || !idle(a) || !idle(b) || taken.contains(&a.id) {
            continue;
        }
        let (Some(la), Some(lb)) = (h.load(a.id, (a.lo, a.hi)), h.load(b.id, (b.lo, b.hi))) else {
            continue;
        };
        if let Some(reason) = should_merge(la, lb, &p.split, at) {
            taken.insert(a.id);
            taken.insert(b.id);
            plan.steps.push_back(Step::Open(Open {
                log: Some(Log::new(
                    Level::Info,
                    format!("tablets {} and {}: automatic merge ({reason})", a.id, b.id),
                )),
                cmd: Command::StartMerge {
                    a: a.id,
                    b: b.id,
                    reason,
                    expect_generation_a: 0,
                    expect_generation_b: 0,
                },
                opened: None,
                refused: Some(format!(
                    "tablets {} and {}: automatic merge refused",
                    a.id, b.id
                )),
                then: Some(Note::LoadsReset {
                    tablets: vec![a.id, b.id],
                    now,
                }),
            }));
        }
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
