//! The controller's metrics, through the `metrics` facade (the binary
//! exports them; docs/OPERATIONS.md "Metrics" lists each). Heartbeat
//! handling and plan durations are recorded where they happen; the cell's
//! gauges are set from the replicated state and the leader's health view
//! when a scrape asks ([`observe`]).
//!
//! What only the leader knows (node liveness, under-replication, intent
//! ages) reads 0 on a follower, so `sum` over the controllers gives the
//! leader's view; what every member applies (tablets, intents, route
//! generation) is the same on each: take `max`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};

use crate::placement::majority_lost;
use crate::server::Controller;
use crate::state::{CellState, IntentKind, IntentState};

/// Node states as the gauge names them.
pub const NODE_STATES: [&str; 5] = ["up", "suspect", "dead", "draining", "decommissioned"];
const INTENT_KINDS: [&str; 4] = ["move", "transfer_leader", "split", "merge"];
const INTENT_STATES: [&str; 3] = ["pending", "done", "failed"];

/// One heartbeat handled (answered, or refused).
/// Open `WatchRoutes` streams on this controller, up or down by `by`.
pub(crate) fn route_watchers(by: f64) {
    gauge!("stele_controller_route_watchers").increment(by);
}

/// One route-change message sent to a watch, naming `routes` tablets.
pub(crate) fn route_delta_sent(routes: usize) {
    counter!("stele_controller_route_deltas_total").increment(1);
    counter!("stele_controller_route_delta_routes_total").increment(routes as u64);
}

pub(crate) fn record_heartbeat(elapsed: Duration, ok: bool) {
    // Literal labels: a static key, nothing allocated per heartbeat.
    if ok {
        histogram!("stele_controller_heartbeat_seconds", "result" => "ok").record(elapsed);
    } else {
        histogram!("stele_controller_heartbeat_seconds", "result" => "error").record(elapsed);
    }
}

/// A delta heartbeat refused: its base was not the reports this leader
/// holds (the node sends its full reports at once).
pub(crate) fn record_heartbeat_resync() {
    counter!("stele_controller_heartbeat_resyncs_total").increment(1);
}

/// A heartbeat answered with only what changed for its node (`delta`),
/// or with everything.
pub(crate) fn record_heartbeat_answer(delta: bool) {
    if delta {
        counter!("stele_controller_heartbeat_answers_total", "kind" => "delta").increment(1);
    } else {
        counter!("stele_controller_heartbeat_answers_total", "kind" => "full").increment(1);
    }
}

/// One scheduler plan made (the pure part of a pass).
pub(crate) fn record_plan(elapsed: Duration) {
    histogram!("stele_controller_plan_seconds").record(elapsed);
}

fn kind_name(k: &IntentKind) -> &'static str {
    match k {
        IntentKind::Move { .. } => "move",
        IntentKind::TransferLeader { .. } => "transfer_leader",
        IntentKind::Split { .. } => "split",
        IntentKind::Merge { .. } => "merge",
    }
}

fn state_name(s: &IntentState) -> &'static str {
    match s {
        IntentState::Pending => "pending",
        IntentState::Done { .. } => "done",
        IntentState::Failed { .. } => "failed",
    }
}

/// Sets the cell's gauges from `c`'s state and (on the leader) its health
/// view; run by the binary before each render.
pub fn observe(c: &Controller) {
    let leading = c.quorum.is_leader();
    gauge!("stele_controller_leader").set(if leading { 1.0 } else { 0.0 });
    for r in ["ok", "error"] {
        let _ = histogram!("stele_controller_heartbeat_seconds", "result" => r);
    }
    let _ = histogram!("stele_controller_plan_seconds");
    let _ = counter!("stele_controller_heartbeat_resyncs_total");
    let _ = gauge!("stele_controller_route_watchers");
    let _ = counter!("stele_controller_route_deltas_total");
    let _ = counter!("stele_controller_route_delta_routes_total");
    for k in ["delta", "full"] {
        let _ = counter!("stele_controller_heartbeat_answers_total", "kind" => k);
    }
    let s = c.quorum.state();
    gauge!("stele_controller_route_generation").set(s.route_generation as f64);
    gauge!("stele_controller_tablets").set(s.tablets.len() as f64);
    let unplaced = s.tablets.values().filter(|t| t.voters.is_empty()).count();
    gauge!("stele_controller_tablets_unplaced").set(unplaced as f64);
    let mut intents: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for i in s.intents.values() {
        *intents
            .entry((kind_name(&i.kind), state_name(&i.state)))
            .or_default() += 1;
    }
    for k in INTENT_KINDS {
        for st in INTENT_STATES {
            let n = intents.get(&(k, st)).copied().unwrap_or(0);
            gauge!("stele_controller_intents", "kind" => k, "state" => st).set(n as f64);
        }
    }
    observe_health(c, &s, leading);
}

/// The leader-only gauges: node states, under-replicated tablets and
/// those that lost their majority (counted once, as the latter), the
/// oldest pending intent of each kind. Zero on a follower.
fn observe_health(c: &Controller, s: &CellState, leading: bool) {
    let now = Instant::now();
    let mut states: BTreeMap<&str, u64> = BTreeMap::new();
    let mut up = BTreeSet::new();
    // Nodes neither dead nor decommissioned.
    let mut alive = BTreeSet::new();
    let mut oldest: BTreeMap<&str, f64> = BTreeMap::new();
    if leading {
        let h = c.health();
        let lease = c.opts.lease;
        for n in s.nodes.values() {
            let state = h.status(n, now, lease);
            if state == "up" {
                up.insert(n.id);
            }
            if state != "dead" && state != "decommissioned" {
                alive.insert(n.id);
            }
            *states.entry(state).or_default() += 1;
        }
        for i in s.intents.values() {
            if i.state == IntentState::Pending {
                let age = h.intent_age(i.id, now).as_secs_f64();
                let e = oldest.entry(kind_name(&i.kind)).or_default();
                *e = e.max(age);
            }
        }
    }
    for st in NODE_STATES {
        let n = states.get(st).copied().unwrap_or(0);
        gauge!("stele_controller_nodes", "state" => st).set(n as f64);
    }
    for k in INTENT_KINDS {
        let age = oldest.get(k).copied().unwrap_or(0.0);
        gauge!("stele_controller_intent_oldest_seconds", "kind" => k).set(age);
    }
    let replication = s.cell.as_ref().map_or(0, |c| c.replication) as usize;
    let (mut under, mut lost) = (0, 0);
    if leading {
        for t in s.tablets.values().filter(|t| !t.voters.is_empty()) {
            let voter_nodes: Vec<u64> = t.voters.iter().map(|r| r.node).collect();
            if majority_lost(&voter_nodes, |n| !alive.contains(&n)) {
                lost += 1;
            } else if voter_nodes.iter().filter(|n| up.contains(n)).count() < replication {
                under += 1;
            }
        }
    }
    gauge!("stele_controller_tablets_under_replicated").set(under as f64);
    gauge!("stele_controller_tablets_lost_majority").set(lost as f64);
}
