//! `RestartSafe`: making a node safe to restart (`stele node restart-safe N`).
//!
//! ```text
//! plan(state, nodes, reports, leaders, N)         pure
//!   unknown N, or a tablet whose quorum needs N  ─▶ Err(refusal): nothing changes
//!   else: per tablet N leads, the caught-up healthy voter elsewhere ─▶ transfers
//! restart_safe(controller, request)              I/O
//!   hold leader balancing off N, propose each transfer (reuses the
//!   TransferLeader intent the balancer and operators use), report what N
//!   still leads; the caller calls again until that is nothing
//! ```
//!
//! A restart is safe for tablet T when every voter but N that a majority
//! needs is healthy: with `v` voters, at least `v / 2 + 1` of them other
//! than N must be on up nodes. A sole voter is never safe to restart.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_quorum::refuse;
use tonic::Status;

use crate::api::intent_pb;
use crate::health::Reports;
use crate::placement::{NodeInfo, NodeState};
use crate::server::Controller;
use crate::state::{CellState, Command, Reply, node_of};

/// How long leader balancing leaves a restarting node without leaders
/// unless the request says otherwise.
pub const HOLD_DEFAULT: Duration = Duration::from_secs(60);

/// What making a node safe to restart takes now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestartPlan {
    /// Tablets the node leads, by the latest reports.
    pub leading: Vec<u64>,
    /// (tablet, to): the leadership transfers to start.
    pub transfers: Vec<(u64, u64)>,
    /// Tablets the node leads whose transfer cannot start now, and why.
    pub waiting: Vec<String>,
}

/// The plan to make `node` safe to restart, or why restarting it would
/// cost some tablet its quorum. `nodes` are the nodes as placement sees
/// them now, `reports` each node's latest replica reports, `leaders` each
/// tablet's leading replica by those reports, `held` the other nodes being
/// restarted (taken as targets only when no other voter will do).
pub fn plan(
    s: &CellState,
    nodes: &[NodeInfo],
    reports: &HashMap<u64, Reports>,
    leaders: &HashMap<u64, pb::ReplicaReport>,
    held: &BTreeSet<u64>,
    node: u64,
) -> Result<RestartPlan, String> {
    if !s.nodes.contains_key(&node) {
        return Err(format!("unknown node {node}"));
    }
    let up: BTreeSet<u64> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .map(|n| n.id)
        .collect();
    for t in s.tablets.values() {
        if !t.voters.iter().any(|r| r.node == node) {
            continue;
        }
        let voters = t.voters.len();
        if voters == 1 {
            return Err(format!(
                "node {node} is the only voter of tablet {}: restarting it stops the tablet",
                t.id
            ));
        }
        let healthy = t
            .voters
            .iter()
            .filter(|r| r.node != node && up.contains(&r.node))
            .count();
        let majority = voters / 2 + 1;
        if healthy < majority {
            let down: Vec<String> = t
                .voters
                .iter()
                .filter(|r| r.node != node && !up.contains(&r.node))
                .map(|r| r.node.to_string())
                .collect();
            let down = if down.is_empty() {
                String::new()
            } else {
                format!("; not up: node {}", down.join(", "))
            };
            return Err(format!(
                "restarting node {node} would leave tablet {} with {healthy} of its {voters} voters healthy, fewer than a majority ({majority}){down}",
                t.id
            ));
        }
    }
    let mut out = RestartPlan::default();
    for t in s.tablets.values() {
        let Some(leader) = leaders.get(&t.id).filter(|r| node_of(r.replica_id) == node) else {
            continue;
        };
        out.leading.push(t.id);
        if t.intent != 0 {
            out.waiting
                .push(format!("tablet {}: busy with intent {}", t.id, t.intent));
            continue;
        }
        // The healthy voter elsewhere that has applied the most, as the
        // reports show it, preferring nodes not being restarted themselves;
        // ties go to the lower node id.
        let best = t
            .voters
            .iter()
            .filter(|r| r.node != node && up.contains(&r.node))
            .filter_map(|r| {
                reports
                    .get(&r.node)?
                    .get(&t.id)
                    .filter(|x| x.replica_id == r.replica_id)
                    .map(|x| {
                        let free = !held.contains(&r.node);
                        (free, x.applied_index, std::cmp::Reverse(r.node))
                    })
            })
            .max();
        match best {
            Some((_, _, std::cmp::Reverse(to))) => out.transfers.push((t.id, to)),
            None => out.waiting.push(format!(
                "tablet {}: no healthy voter elsewhere has reported it (leader at index {})",
                t.id, leader.applied_index
            )),
        }
    }
    Ok(out)
}

/// Serves `RestartSafe`: refuses with nothing changed, or holds leader
/// balancing off the node and starts the transfers of [`plan`].
pub(crate) async fn restart_safe(
    c: &Controller,
    req: pb::RestartSafeRequest,
) -> Result<pb::RestartSafeResponse, Status> {
    c.require_leader()?;
    let s = c.snapshot();
    let now = Instant::now();
    let nodes = c.placement_nodes(&s, now);
    let (reports, leaders, held) = {
        let h = c.health();
        let held: BTreeSet<u64> = s
            .nodes
            .keys()
            .copied()
            .filter(|&n| n != req.node && h.holds_leaders(n, now))
            .collect();
        (h.reports.clone(), h.leaders(), held)
    };
    let plan =
        plan(&s, &nodes, &reports, &leaders, &held, req.node).map_err(|e| refuse("node", e))?;
    let hold = match req.hold_ms {
        0 => HOLD_DEFAULT,
        ms => Duration::from_millis(ms),
    };
    c.health().hold_leaders(req.node, now + hold);
    let mut transfers = Vec::new();
    let mut waiting = plan.waiting;
    for (tablet, to) in plan.transfers {
        let reply = c
            .propose(Command::TransferLeader {
                tablet,
                to,
                reason: format!("restart-safe node {}", req.node),
            })
            .await?;
        match reply {
            Reply::Intent(id) => {
                if let Some(i) = c.quorum.state().intents.get(&id) {
                    transfers.push(intent_pb(i));
                }
            }
            Reply::Refused(why) => waiting.push(format!("tablet {tablet}: {why}")),
            Reply::Ok => {}
        }
    }
    Ok(pb::RestartSafeResponse {
        leading: plan.leading,
        transfers,
        waiting,
    })
}

#[cfg(test)]
mod tests;
