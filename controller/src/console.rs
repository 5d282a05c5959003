//! The console's view of the cell (`/api/console` on the controller's HTTP
//! status listener; the page at `/` draws it): nodes with state, zone and
//! load, tablets with voters, leader, range and size, open and recent
//! intents with their progress.
//!
//! ```text
//! CellState (replicated) ─┐
//! HealthView (leader) ────┼─▶ view(..., now) ─▶ CellView ─▶ JSON
//! lease, who leads ───────┘
//! ```
//!
//! A pure function of its inputs, clock included, so its tests build
//! states by hand. Read-only: the console changes nothing. Node states,
//! leaders, sizes and charts are the leader's soft state; a follower's
//! view says it does not lead and leaves them unknown.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::health::HealthView;
use crate::placement::majority_lost;
use crate::server::Controller;
use crate::state::{CellState, IntentKind, IntentRec, IntentState, MergePhase, node_of};

/// Finished intents shown besides the open ones (the newest).
pub const FINISHED_SHOWN: usize = 20;

/// Who answers: this controller, whether it leads, and who does.
#[derive(Debug, Clone, Default)]
pub struct Answerer {
    pub controller_id: u64,
    pub leading: bool,
    /// The leader's id and gRPC endpoint, if known.
    pub leader: Option<(u64, String)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellView {
    /// `controller` (the directory's view says `directory`).
    pub role: &'static str,
    pub controller_id: u64,
    pub leading: bool,
    pub leader_id: u64,
    pub leader_endpoint: String,
    pub initialized: bool,
    pub cell_id: String,
    pub replication: u32,
    pub lease_ms: u64,
    pub route_generation: u64,
    /// Seconds one chart point sums.
    pub chart_slot_s: u64,
    pub summary: Summary,
    pub nodes: Vec<NodeView>,
    pub tablets: Vec<TabletView>,
    pub intents: Vec<IntentView>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    pub nodes_up: usize,
    pub nodes_total: usize,
    pub tablets: usize,
    pub under_replicated: usize,
    pub lost_majority: usize,
    pub unplaced: usize,
    pub intents_open: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeView {
    pub id: u64,
    /// up, suspect, dead, draining, decommissioned; `unknown` on a
    /// controller that does not lead.
    pub state: &'static str,
    pub zone: String,
    pub rack: String,
    pub client_endpoint: String,
    pub version: String,
    pub replicas: usize,
    pub leaders: usize,
    /// Since its last heartbeat (none: not seen by this leader).
    pub heartbeat_age_ms: Option<u64>,
    /// Oldest first; empty before its first heartbeat with a load.
    pub load: Vec<LoadPoint>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadPoint {
    /// How long ago the point's slot started.
    pub age_s: f64,
    pub appends_per_s: f64,
    pub records_per_s: f64,
    pub reads_per_s: f64,
    pub append_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TabletView {
    pub id: u64,
    pub lo: u32,
    pub hi: u64,
    pub generation: u64,
    /// Nodes of the desired voters.
    pub voters: Vec<u64>,
    /// A voter on its way out (a move), if any.
    pub leaving: Option<u64>,
    pub leader: Option<u64>,
    /// Published segment bytes and records applied, from the leader's
    /// latest report (0 when no leader reported).
    pub segment_bytes: u64,
    pub records_applied: u64,
    /// ok, under-replicated (fewer voters on `up` nodes than the
    /// replication factor), lost-majority (at least half of its voters on
    /// dead or decommissioned nodes: it can neither elect nor be
    /// repaired), unplaced (no voters); `unknown` when only the leader
    /// could tell.
    pub health: &'static str,
    /// The open intent on it (0: none).
    pub intent: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IntentView {
    pub id: u64,
    /// split, merge, move, transfer-leader.
    pub kind: &'static str,
    pub tablet: u64,
    /// operator, repair, drain, balance, auto...
    pub reason: String,
    /// pending, colocating, freezing, merging, done, failed.
    pub state: &'static str,
    pub open: bool,
    /// What it does, in words (`split at 0x8000 into tablet 17`).
    pub what: String,
    /// Where it stands, in words, from the leader's latest reports.
    pub progress: String,
    /// How long this leader has seen it open (none once finished).
    pub age_s: Option<f64>,
}

/// The view of controller `c` at `now`: a copy of the state (the apply
/// loop is not held up while the view is built), then the health view
/// (held while it is built, as a scheduler pass holds it).
pub fn current(c: &Controller, now: Instant) -> CellView {
    let s = c.snapshot();
    let who = Answerer {
        controller_id: c.opts.id,
        leading: c.quorum.is_leader(),
        leader: c.quorum.leader(),
    };
    view(&s, &c.health(), &who, c.opts.lease, now)
}

/// The console's view of the cell at `now`.
pub fn view(
    s: &CellState,
    h: &HealthView,
    who: &Answerer,
    lease: Duration,
    now: Instant,
) -> CellView {
    let leading = who.leading;
    let leaders = if leading {
        h.leaders()
    } else {
        Default::default()
    };
    let replication = s.cell.as_ref().map_or(0, |c| c.replication);
    let nodes: Vec<NodeView> = s
        .nodes
        .values()
        .map(|n| NodeView {
            id: n.id,
            state: if leading {
                h.status(n, now, lease)
            } else {
                "unknown"
            },
            zone: n.zone.clone(),
            rack: n.rack.clone(),
            client_endpoint: n.client_endpoint.clone(),
            version: h
                .builds
                .get(&n.id)
                .map(|b| b.version.clone())
                .unwrap_or_default(),
            replicas: s
                .tablets
                .values()
                .filter(|t| s.replica_on(t, n.id).is_some())
                .count(),
            leaders: leaders
                .values()
                .filter(|r| node_of(r.replica_id) == n.id)
                .count(),
            heartbeat_age_ms: h
                .seen
                .get(&n.id)
                .map(|t| now.saturating_duration_since(*t).as_millis() as u64),
            load: h
                .node_loads
                .get(&n.id)
                .map(|ring| {
                    ring.slots()
                        .map(|slot| LoadPoint {
                            age_s: now.saturating_duration_since(slot.start).as_secs_f64(),
                            appends_per_s: slot.appends_per_s(),
                            records_per_s: slot.records_per_s(),
                            reads_per_s: slot.reads_per_s(),
                            append_p99_ms: slot.append_p99_us as f64 / 1000.0,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let up: BTreeSet<u64> = nodes
        .iter()
        .filter(|n| n.state == "up")
        .map(|n| n.id)
        .collect();
    let gone: BTreeSet<u64> = nodes
        .iter()
        .filter(|n| n.state == "dead" || n.state == "decommissioned")
        .map(|n| n.id)
        .collect();
    let tablets: Vec<TabletView> = s
        .tablets
        .values()
        .map(|t| {
            let leader_report = leaders.get(&t.id);
            let voter_nodes: Vec<u64> = t.voters.iter().map(|r| r.node).collect();
            let health = if t.voters.is_empty() {
                "unplaced"
            } else if !leading {
                "unknown"
            } else if majority_lost(&voter_nodes, |n| {
                gone.contains(&n) || !s.nodes.contains_key(&n)
            }) {
                "lost-majority"
            } else if t.voters.iter().filter(|r| up.contains(&r.node)).count()
                < replication as usize
            {
                "under-replicated"
            } else {
                "ok"
            };
            TabletView {
                id: t.id,
                lo: t.lo,
                hi: t.hi,
                generation: t.generation,
                voters: voter_nodes,
                leaving: t.leaving.map(|r| r.node),
                leader: leader_report.map(|r| node_of(r.replica_id)),
                segment_bytes: leader_report.map_or(0, |r| r.segment_bytes),
                records_applied: leader_report.map_or(0, |r| r.records_applied),
                health,
                intent: t.intent,
            }
        })
        .collect();
    let mut intents: Vec<IntentView> = s
        .intents
        .values()
        .filter(|i| i.state == IntentState::Pending)
        .map(|i| intent_view(h, i, leading, now))
        .collect();
    intents.sort_by_key(|i| std::cmp::Reverse(i.id));
    let finished = s
        .intents
        .values()
        .rev()
        .filter(|i| i.state != IntentState::Pending)
        .take(FINISHED_SHOWN)
        .map(|i| intent_view(h, i, leading, now));
    intents.extend(finished);
    let summary = Summary {
        nodes_up: up.len(),
        nodes_total: nodes.iter().filter(|n| n.state != "decommissioned").count(),
        tablets: tablets.len(),
        under_replicated: tablets
            .iter()
            .filter(|t| t.health == "under-replicated")
            .count(),
        lost_majority: tablets
            .iter()
            .filter(|t| t.health == "lost-majority")
            .count(),
        unplaced: tablets.iter().filter(|t| t.health == "unplaced").count(),
        intents_open: intents.iter().filter(|i| i.open).count(),
    };
    let (leader_id, leader_endpoint) = who.leader.clone().unwrap_or_default();
    CellView {
        role: "controller",
        controller_id: who.controller_id,
        leading,
        leader_id,
        leader_endpoint,
        initialized: s.cell.is_some(),
        cell_id: s
            .cell
            .as_ref()
            .map(|c| c.cell_id.clone())
            .unwrap_or_default(),
        replication,
        lease_ms: lease.as_millis() as u64,
        route_generation: s.route_generation,
        chart_slot_s: crate::load::SLOT.as_secs(),
        summary,
        nodes,
        tablets,
        intents,
    }
}

fn intent_view(h: &HealthView, i: &IntentRec, leading: bool, now: Instant) -> IntentView {
    let (kind, what) = match &i.kind {
        IntentKind::Split { at, child, .. } => (
            "split",
            format!(
                "split tablet {} at {at:#010x} into tablet {child}",
                i.tablet
            ),
        ),
        IntentKind::Merge { absorbed, .. } => (
            "merge",
            format!("tablet {} absorbs tablet {absorbed}", i.tablet),
        ),
        IntentKind::Move { from, to, .. } => (
            "move",
            format!("move tablet {} from node {from} to node {to}", i.tablet),
        ),
        IntentKind::TransferLeader { to } => (
            "transfer-leader",
            format!("leadership of tablet {} to node {to}", i.tablet),
        ),
    };
    let (state, open) = match (&i.state, &i.kind) {
        (IntentState::Pending, IntentKind::Merge { phase, .. }) => (
            match phase {
                MergePhase::Colocate => "colocating",
                MergePhase::Freeze => "freezing",
                MergePhase::Merge => "merging",
            },
            true,
        ),
        (IntentState::Pending, _) => ("pending", true),
        (IntentState::Done { .. }, _) => ("done", false),
        (IntentState::Failed { .. }, _) => ("failed", false),
    };
    let progress = match &i.state {
        IntentState::Done { generation } => format!("done at generation {generation}"),
        IntentState::Failed { reason } => format!("failed: {reason}"),
        IntentState::Pending if !leading => "unknown (this controller does not lead)".into(),
        IntentState::Pending => pending_progress(h, i),
    };
    IntentView {
        id: i.id,
        kind,
        tablet: i.tablet,
        reason: i.reason.clone(),
        state,
        open,
        what,
        progress,
        age_s: (open && leading).then(|| h.intent_age(i.id, now).as_secs_f64()),
    }
}

/// Where an open intent stands, from the leader's latest reports.
fn pending_progress(h: &HealthView, i: &IntentRec) -> String {
    match &i.kind {
        IntentKind::Split {
            child, generation, ..
        } => match h.split_progress(i.tablet, *child, *generation) {
            (true, _) => format!("step 3/3: tablet {child} is on its nodes; publishing the routes"),
            (false, true) => "step 2/3: a replica applied the split".into(),
            (false, false) => "step 1/3: ordered; waiting for the leader to propose it".into(),
        },
        IntentKind::Merge { phase, moving, .. } => match phase {
            MergePhase::Colocate if *moving != 0 => {
                "step 1/3: moving a voter next to the survivor's".into()
            }
            MergePhase::Colocate => "step 1/3: co-locating the voters".into(),
            MergePhase::Freeze => "step 2/3: freezing and sealing the absorbed tablet".into(),
            MergePhase::Merge => "step 3/3: merging (no way back)".into(),
        },
        IntentKind::Move { new_replica, .. } => match h.replica_report(i.tablet, *new_replica) {
            None => "step 1/3: adding the new replica as a learner".into(),
            Some(r) if r.voters.contains(new_replica) => {
                "step 3/3: a voter; removing the old replica".into()
            }
            Some(r) => {
                let leader_applied = h.leaders().get(&i.tablet).map_or(0, |l| l.applied_index);
                format!(
                    "step 2/3: learner catching up (applied {} of {leader_applied})",
                    r.applied_index
                )
            }
        },
        IntentKind::TransferLeader { to } => {
            let now_on = h.leaders().get(&i.tablet).map(|r| node_of(r.replica_id));
            match now_on {
                Some(n) if n == *to => "the new leader is elected".into(),
                Some(n) => format!("leader still on node {n}"),
                None => "no leader reported".into(),
            }
        }
    }
}

#[cfg(test)]
#[path = "console_tests.rs"]
mod tests;
