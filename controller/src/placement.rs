//! Placement: which nodes hold a tablet's voters, and which voter leads.
//!
//! ```text
//!     snapshot: nodes (zone, rack, state, capacity) + tablets (voters, leader, busy)
//!                                      │
//!                                  Cluster
//!    ┌────────────┬─────────────┬──────┴───────┬─────────────┬─────────────┐
//!  place_new   repair_plan   balance_plan   leader_plan   check_move   check_drain
//!  voter sets  Moves off     Moves toward   Transfers     operator     operator
//!  for new     Dead/Decomm./ the weighted   toward the    move         drain
//!  tablets     Draining      mean           mean          validation   validation
//! ```
//!
//! Everything here is a pure function of the snapshot: no I/O, no clock, no
//! randomness. Ties are broken by a fixed hash of zone, rack or node and its
//! load (see `scatter`: this is what keeps replica sets from clumping), then
//! by name or position in `nodes`, so one snapshot always gives one plan. The
//! scheduler executes a plan and asks again; a plan touches each tablet at
//! most once, so a tablet that needs two steps (two dead voters, say) gets
//! the second one from the next plan, computed from the state the first one
//! left.
//!
//! # The domain rule
//!
//! The cell's *members* are its nodes that are not `Decommissioned`: a `Dead`
//! node may come back and a `Draining` node still holds data, so both still
//! shape the cell. The *domain level* is the coarsest of zone, rack and node
//! at which the members span at least `replication` distinct domains (a rack
//! is named within its zone, so `("z1", "r1")` and `("z2", "r1")` are two
//! racks). In a normal cell that is the zone; racks and then single nodes are
//! used only when there are fewer zones than `replication`, as in a one-zone
//! dev cell.
//!
//! Every voter a planner chooses is in a domain, at that level, that no other
//! voter of the tablet occupies. Below the level voters are still spread as
//! widely as they can be: at rack level a tablet spans as many zones as it
//! can, at node level as many zones and then racks.
//!
//! The level comes from the members, not from the `Up` nodes, so losing every
//! `Up` node of a zone does not quietly relax the rule. Repair then leaves the
//! affected voters where they are (reporting the tablets in
//! [`RepairPlan::unplaceable`]) rather than stacking two voters in one zone,
//! which would only have to be undone when the zone returns.
//!
//! # Load
//!
//! A node's load is the number of voters it holds (of every tablet, busy ones
//! included) divided by its `capacity`. Only `Up` nodes receive replicas and
//! leaders. New replicas go to the least-loaded zone that the rule allows,
//! then the least-loaded rack in it, then the least-loaded node in that rack,
//! each compared by load after one more replica. Balance is judged against a
//! node's capacity-weighted share of the total, within a tolerance widened to
//! the whole numbers on either side of the share when the tolerance is
//! narrower than one replica (see [`band`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;

pub type NodeId = u64;
pub type TabletId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeState {
    /// Healthy: the only state that receives replicas and leaders.
    Up,
    /// Missed its lease; keeps its voters (it may come back) but receives nothing new.
    Suspect,
    /// Declared dead: repair replaces its voters.
    Dead,
    /// Being emptied by an operator: repair moves its voters off, `leader_plan` its leaders.
    Draining,
    /// Gone for good: no longer a member of the cell.
    Decommissioned,
}

impl NodeState {
    /// As operators see it (`stele node list`).
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Suspect => "suspect",
            NodeState::Dead => "dead",
            NodeState::Draining => "draining",
            NodeState::Decommissioned => "decommissioned",
        }
    }
}

impl NodeState {
    /// Whether the node still shapes the cell's failure domains.
    pub fn is_member(self) -> bool {
        self != NodeState::Decommissioned
    }

    /// Whether repair moves voters off a node in this state.
    pub fn is_evicted(self) -> bool {
        matches!(
            self,
            NodeState::Dead | NodeState::Decommissioned | NodeState::Draining
        )
    }
}

fn default_capacity() -> u32 {
    1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub zone: String,
    pub rack: String,
    pub state: NodeState,
    /// Relative capacity weight, default 1; 0 is treated as 1.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
}

impl NodeInfo {
    /// An `Up` node of capacity 1.
    pub fn new(id: NodeId, zone: impl Into<String>, rack: impl Into<String>) -> Self {
        NodeInfo {
            id,
            zone: zone.into(),
            rack: rack.into(),
            state: NodeState::Up,
            capacity: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TabletInfo {
    pub id: TabletId,
    pub voters: Vec<NodeId>,
    pub leader: Option<NodeId>,
    /// True while a move, split or merge is in progress: planners must not touch it.
    #[serde(default)]
    pub busy: bool,
}

impl TabletInfo {
    /// A tablet with no known leader that no operation is touching.
    pub fn new(id: TabletId, voters: Vec<NodeId>) -> Self {
        TabletInfo {
            id,
            voters,
            leader: None,
            busy: false,
        }
    }
}

/// Replace voter `from` of `tablet` by a new voter on `to`; `from: None` adds a voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub tablet: TabletId,
    pub from: Option<NodeId>,
    pub to: NodeId,
}

/// Hand the leadership of `tablet` from voter `from` to voter `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub tablet: TabletId,
    pub from: NodeId,
    pub to: NodeId,
}

/// The granularity at which a cell keeps a tablet's voters apart (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DomainLevel {
    Zone,
    Rack,
    Node,
}

impl fmt::Display for DomainLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DomainLevel::Zone => "zone",
            DomainLevel::Rack => "rack",
            DomainLevel::Node => "node",
        })
    }
}

/// Why a placement request was refused. Each variant names the ids involved.
///
/// This is `PlacementError` beside the logic rather than `error::Error`: the
/// name is the one the scheduler is being written against, and placement
/// refusals are a vocabulary of their own that the crate's eventual `Error`
/// can wrap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("replication must be at least 1, got {replication}")]
    InvalidReplication { replication: usize },
    #[error("node {node} is not in the cell")]
    UnknownNode { node: NodeId },
    #[error("node {node} is {state:?}, not Up: it cannot receive a replica")]
    NodeNotUp { node: NodeId, state: NodeState },
    #[error("tablet {tablet} already has a voter on node {node}")]
    AlreadyHolds { tablet: TabletId, node: NodeId },
    #[error("node {node} is not a voter of tablet {tablet}")]
    NotAVoter { tablet: TabletId, node: NodeId },
    #[error("tablet {tablet} is not in the cell")]
    UnknownTablet { tablet: TabletId },
    #[error("tablet {tablet} has a move, split or merge in progress; retry when it completes")]
    TabletBusy { tablet: TabletId },
    #[error("replication {need} needs {need} Up nodes, the cell has {have}")]
    NotEnoughUpNodes { need: usize, have: usize },
    #[error(
        "replication {need} needs Up nodes in {need} distinct failure domains (zones, or racks or nodes when the cell has fewer zones), the cell would have {have}"
    )]
    NotEnoughDomains { need: usize, have: usize },
    #[error("tablet {tablet}: {reason}")]
    WouldBreakPlacement { tablet: TabletId, reason: String },
}

/// What [`Cluster::repair`] found: the moves to make now, and the tablets that
/// need one but have nowhere to go without breaking the domain rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairPlan {
    pub moves: Vec<Move>,
    /// One `WouldBreakPlacement` per tablet that could not be repaired.
    pub unplaceable: Vec<PlacementError>,
    /// Tablets that need a move but lost most of their voters to gone
    /// nodes ([`majority_lost`]): their group cannot commit the change, so
    /// repair leaves them to the nodes' return or an operator.
    pub lost_majority: Vec<TabletId>,
}

/// Whether a group whose voters are on `voter_nodes` has lost its majority:
/// at least half of them are on nodes for which `gone` holds, so the rest
/// can neither elect a leader nor commit a change of voters. False for no
/// voters.
pub fn majority_lost(voter_nodes: &[NodeId], gone: impl Fn(NodeId) -> bool) -> bool {
    let lost = voter_nodes.iter().filter(|&&n| gone(n)).count();
    !voter_nodes.is_empty() && lost * 2 >= voter_nodes.len()
}

/// A snapshot of the cell to plan against.
///
/// Node ids are expected to be unique (the first entry of a repeated id wins).
/// A voter id that names no node is treated as a node that is gone for good.
pub struct Cluster<'a> {
    pub nodes: &'a [NodeInfo],
    pub tablets: &'a [TabletInfo],
    pub replication: usize,
}

impl Cluster<'_> {
    /// The level at which this cell keeps voters apart (see the module docs).
    pub fn domain_level(&self) -> DomainLevel {
        Topology::new(self.nodes, self.replication).level
    }

    /// Voter sets for `count` new tablets: each set has `replication` `Up`
    /// nodes in distinct domains (zones, unless the cell has fewer zones than
    /// `replication`; see the module docs), chosen to even out load across
    /// nodes, counting the existing tablets and the sets chosen before it.
    pub fn place_new(&self, count: usize) -> Result<Vec<Vec<NodeId>>, PlacementError> {
        let need = self.replication;
        if need == 0 {
            return Err(PlacementError::InvalidReplication { replication: 0 });
        }
        let topo = Topology::new(self.nodes, need);
        let up = (0..self.nodes.len()).filter(|&n| topo.is_up(n)).count();
        if up < need {
            return Err(PlacementError::NotEnoughUpNodes { need, have: up });
        }
        let have = topo.up_domains();
        if have < need {
            return Err(PlacementError::NotEnoughDomains { need, have });
        }
        let mut loads = Loads::new(&topo, self.tablets);
        let mut sets = Vec::with_capacity(count);
        let mut chosen = Vec::with_capacity(need);
        for _ in 0..count {
            chosen.clear();
            for _ in 0..need {
                // The checks above leave a free domain for every pick; the
                // error is there so that a bug is a refusal, not a panic.
                let n = loads
                    .pick(&chosen)
                    .ok_or(PlacementError::NotEnoughDomains { need, have })?;
                loads.add(n);
                chosen.push(n);
            }
            sets.push(chosen.iter().map(|&n| self.nodes[n].id).collect());
        }
        Ok(sets)
    }

    /// One move for every tablet that needs one (see [`Cluster::repair`]).
    pub fn repair_plan(&self) -> Vec<Move> {
        self.repair().moves
    }

    /// For every tablet that is not busy, at most one move:
    /// - fewer distinct voters than `replication`: add one (`from: None`);
    /// - else a voter on a `Dead` or `Decommissioned` node, or on a node
    ///   missing from the snapshot: replace it;
    /// - else a voter on a `Draining` node: replace it.
    ///
    /// Targets are `Up` nodes chosen as in [`Cluster::place_new`]. A tablet
    /// with more voters than `replication` still gets its bad voters
    /// replaced, but never loses one: a `Move` cannot express a removal.
    /// A tablet with most of its voters on `Dead` or `Decommissioned` (or
    /// missing) nodes gets no move: it goes to `lost_majority`.
    pub fn repair(&self) -> RepairPlan {
        let topo = Topology::new(self.nodes, self.replication);
        let mut loads = Loads::new(&topo, self.tablets);
        let mut plan = RepairPlan::default();
        let gone = |v: NodeId| {
            matches!(
                topo.node(v).map(|n| topo.states[n]),
                None | Some(NodeState::Dead | NodeState::Decommissioned)
            )
        };
        for tablet in self.tablets.iter().filter(|t| !t.busy) {
            let Some(from) = self.repair_source(&topo, tablet) else {
                continue;
            };
            if majority_lost(&tablet.voters, gone) {
                plan.lost_majority.push(tablet.id);
                continue;
            }
            match replacement(&topo, &loads, tablet, from) {
                Ok(to) => {
                    loads.add(to);
                    if let Some(f) = from.and_then(|f| topo.node(f)) {
                        loads.remove(f);
                    }
                    plan.moves.push(Move {
                        tablet: tablet.id,
                        from,
                        to: self.nodes[to].id,
                    });
                }
                Err(e) => plan.unplaceable.push(e),
            }
        }
        plan
    }

    /// Which voter repair replaces (`Some(None)`: add one), if any.
    fn repair_source(&self, topo: &Topology, tablet: &TabletInfo) -> Option<Option<NodeId>> {
        if distinct_len(&tablet.voters) < self.replication {
            return Some(None);
        }
        let state = |v: NodeId| topo.node(v).map(|n| topo.states[n]);
        let gone = tablet.voters.iter().find(|&&v| {
            matches!(
                state(v),
                None | Some(NodeState::Dead | NodeState::Decommissioned)
            )
        });
        let draining = || {
            tablet
                .voters
                .iter()
                .find(|&&v| state(v) == Some(NodeState::Draining))
        };
        gone.or_else(draining).map(|&v| Some(v))
    }

    /// Moves that bring every `Up` node's voter count into its band around
    /// its capacity-weighted share (see [`band`]), at most `max_moves` of
    /// them and at most one per tablet. Only tablets that are not busy and
    /// have exactly `replication` voters, all on `Up` nodes, are moved; a move
    /// never breaks the domain rule nor narrows the tablet's spread, and
    /// always lowers the spread of load (so repeated plans converge).
    pub fn balance_plan(&self, tolerance: f64, max_moves: usize) -> Vec<Move> {
        let topo = Topology::new(self.nodes, self.replication);
        let mut balancer = ReplicaBalancer::new(self, &topo);
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| topo.is_up(n)).collect();
        if up.len() < 2 || max_moves == 0 {
            return Vec::new();
        }
        let total: u64 = up.iter().map(|&n| balancer.loads.count[n]).sum();
        let cap_total: u64 = up.iter().map(|&n| balancer.loads.cap[n]).sum();
        // Indexed by node; only `Up` entries are read.
        let bands: Vec<(u64, u64)> = (0..self.nodes.len())
            .map(|n| band(total, cap_total, balancer.loads.cap[n], tolerance))
            .collect();
        let mut stuck = vec![false; self.nodes.len()];
        while balancer.moves.len() < max_moves {
            let count = &balancer.loads.count;
            let cap = &balancer.loads.cap;
            let free = up.iter().copied().filter(|&n| !stuck[n]);
            let over = free
                .clone()
                .filter(|&n| count[n] > bands[n].1)
                .max_by(|&a, &b| cmp_ratio(count[a], cap[a], count[b], cap[b]).then(b.cmp(&a)));
            if let Some(s) = over {
                if !balancer.shed(s, &up) {
                    stuck[s] = true;
                }
                continue;
            }
            let under = free
                .filter(|&n| count[n] < bands[n].0)
                .min_by(|&a, &b| cmp_ratio(count[a], cap[a], count[b], cap[b]).then(a.cmp(&b)));
            if let Some(d) = under {
                if !balancer.gain(d, &up) {
                    stuck[d] = true;
                }
                continue;
            }
            break;
        }
        balancer.moves
    }

    /// Leader transfers, each between two voters of one tablet and only to an
    /// `Up` node, at most one per tablet. Leaders on `Draining` nodes are moved
    /// first, to the voter with the fewest leaders; then leaders are evened
    /// out until every `Up` node's count is in its band around its
    /// capacity-weighted share (see [`band`]). Busy tablets, tablets with no
    /// leader and tablets whose leader is not one of their voters are skipped.
    pub fn leader_plan(&self, tolerance: f64) -> Vec<Transfer> {
        let topo = Topology::new(self.nodes, self.replication);
        let mut balancer = LeaderBalancer::new(self, &topo);
        for n in 0..self.nodes.len() {
            if topo.states[n] == NodeState::Draining {
                for i in 0..balancer.led[n].len() {
                    let t = balancer.led[n][i];
                    if let Some(d) = balancer.best_target(t, n) {
                        balancer.transfer(t, n, d);
                    }
                }
            }
        }
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| topo.is_up(n)).collect();
        if up.is_empty() {
            return balancer.plan;
        }
        let total: u64 = up.iter().map(|&n| balancer.count[n]).sum();
        let cap_total: u64 = up.iter().map(|&n| balancer.cap[n]).sum();
        // Indexed by node; only `Up` entries are read.
        let bands: Vec<(u64, u64)> = (0..self.nodes.len())
            .map(|n| band(total, cap_total, balancer.cap[n], tolerance))
            .collect();
        let mut stuck = vec![false; self.nodes.len()];
        loop {
            let count = &balancer.count;
            let cap = &balancer.cap;
            let free = up.iter().copied().filter(|&n| !stuck[n]);
            let over = free
                .clone()
                .filter(|&n| count[n] > bands[n].1)
                .max_by(|&a, &b| cmp_ratio(count[a], cap[a], count[b], cap[b]).then(b.cmp(&a)));
            if let Some(s) = over {
                if !balancer.shed(s) {
                    stuck[s] = true;
                }
                continue;
            }
            let under = free
                .filter(|&n| count[n] < bands[n].0)
                .min_by(|&a, &b| cmp_ratio(count[a], cap[a], count[b], cap[b]).then(a.cmp(&b)));
            if let Some(d) = under {
                if !balancer.gain(d) {
                    stuck[d] = true;
                }
                continue;
            }
            break;
        }
        balancer.plan
    }

    /// Validates an operator's request to move `tablet`'s voter on `from` to
    /// `to`. Checks, in order: the tablet and `to` exist, `from` is a voter,
    /// `to` is not, the tablet is not busy, `to` is `Up`, and `to` shares no
    /// domain (at the cell's level) with the voters that stay.
    pub fn check_move(
        &self,
        tablet: TabletId,
        from: NodeId,
        to: NodeId,
    ) -> Result<(), PlacementError> {
        let t = self
            .tablets
            .iter()
            .find(|t| t.id == tablet)
            .ok_or(PlacementError::UnknownTablet { tablet })?;
        let topo = Topology::new(self.nodes, self.replication);
        let target = topo
            .node(to)
            .ok_or(PlacementError::UnknownNode { node: to })?;
        if !t.voters.contains(&from) {
            return Err(PlacementError::NotAVoter { tablet, node: from });
        }
        if t.voters.contains(&to) {
            return Err(PlacementError::AlreadyHolds { tablet, node: to });
        }
        if t.busy {
            return Err(PlacementError::TabletBusy { tablet });
        }
        let state = topo.states[target];
        if state != NodeState::Up {
            return Err(PlacementError::NodeNotUp { node: to, state });
        }
        let others = topo.others(&t.voters, Some(from));
        if let Some(&clash) = others
            .iter()
            .find(|&&o| topo.domain(o) == topo.domain(target))
        {
            return Err(PlacementError::WouldBreakPlacement {
                tablet,
                reason: format!(
                    "node {to} and voter {} are both in {}",
                    self.nodes[clash].id,
                    topo.domain_name(target)
                ),
            });
        }
        Ok(())
    }

    /// Validates draining `node` and returns the moves the drain implies: one
    /// per tablet with a voter on it, from it, to where repair would put it
    /// (busy tablets are checked but get their move from a later repair plan).
    ///
    /// Refuses when `node` is unknown, when the drain would leave fewer
    /// domains with an `Up` node than `replication` (so new tablets could not
    /// be placed either), or when some tablet on it has nowhere to go.
    pub fn check_drain(&self, node: NodeId) -> Result<Vec<Move>, PlacementError> {
        let mut topo = Topology::new(self.nodes, self.replication);
        let n = topo
            .node(node)
            .ok_or(PlacementError::UnknownNode { node })?;
        let before = topo.up_domains();
        if !topo.states[n].is_evicted() {
            topo.states[n] = NodeState::Draining;
        }
        let after = topo.up_domains();
        if after < self.replication && after < before {
            return Err(PlacementError::NotEnoughDomains {
                need: self.replication,
                have: after,
            });
        }
        let mut loads = Loads::new(&topo, self.tablets);
        let mut moves = Vec::new();
        for tablet in self.tablets.iter().filter(|t| t.voters.contains(&node)) {
            let to = replacement(&topo, &loads, tablet, Some(node)).map_err(|e| match e {
                PlacementError::WouldBreakPlacement { tablet, reason } => {
                    PlacementError::WouldBreakPlacement {
                        tablet,
                        reason: format!("draining node {node} would strand its voter: {reason}"),
                    }
                }
                other => other,
            })?;
            if tablet.busy {
                continue;
            }
            loads.add(to);
            loads.remove(n);
            moves.push(Move {
                tablet: tablet.id,
                from: Some(node),
                to: self.nodes[to].id,
            });
        }
        Ok(moves)
    }
}

/// The `Up` node that should replace `from` among `tablet`'s voters (or join
/// them, for `None`).
fn replacement(
    topo: &Topology,
    loads: &Loads,
    tablet: &TabletInfo,
    from: Option<NodeId>,
) -> Result<usize, PlacementError> {
    let others = topo.others(&tablet.voters, from);
    loads.pick(&others).ok_or_else(|| {
        let ids: Vec<NodeId> = others.iter().map(|&o| topo.nodes[o].id).collect();
        let what = match from {
            Some(f) => format!("no Up node can replace voter {f}"),
            None => "no Up node can take a new voter".to_owned(),
        };
        let reason = match topo.level {
            DomainLevel::Node => format!("{what}: every Up node already holds one"),
            level => format!("{what} in a {level} that voters {ids:?} do not already use"),
        };
        PlacementError::WouldBreakPlacement {
            tablet: tablet.id,
            reason,
        }
    })
}

/// The whole-number range `[lo, hi]` a node's count should fall in: within
/// `tolerance` (a fraction, e.g. 0.05) of its capacity-weighted share of
/// `total`, widened to the whole numbers on either side of the share when the
/// tolerance is narrower than that (a share of 2.5 gives at least `[2, 3]`),
/// because counts are whole and must add up to `total`.
///
/// `total` and `cap_total` are summed over the `Up` nodes; the planners use
/// this for replica and leader counts, and a status page can use it to say
/// which nodes are out of balance.
pub fn band(total: u64, cap_total: u64, cap: u64, tolerance: f64) -> (u64, u64) {
    // Absorbs float error at exact boundaries (150 * 1.05 is 157.50000000000003).
    const SLACK: f64 = 1e-9;
    let tolerance = if tolerance.is_finite() && tolerance > 0.0 {
        tolerance
    } else {
        0.0
    };
    let share = total as f64 * cap as f64 / cap_total.max(1) as f64;
    let lo = (share * (1.0 - tolerance) - SLACK)
        .ceil()
        .min(share.floor())
        .max(0.0);
    let hi = (share * (1.0 + tolerance) + SLACK)
        .floor()
        .max(share.ceil());
    (lo as u64, hi as u64)
}

/// `a_num / a_cap` against `b_num / b_cap`, exactly.
fn cmp_ratio(a_num: u64, a_cap: u64, b_num: u64, b_cap: u64) -> Ordering {
    (u128::from(a_num) * u128::from(b_cap)).cmp(&(u128::from(b_num) * u128::from(a_cap)))
}

/// Whether moving one unit (a replica or a leadership) from a node holding
/// `from` of capacity `from_cap` to one holding `to` of capacity `to_cap`
/// lowers the sum of `count² / capacity` over nodes. Every planned move
/// lowers it, which is why planning and re-planning terminate.
fn improves(from: u64, from_cap: u64, to: u64, to_cap: u64) -> bool {
    from > 0 && cmp_ratio(2 * to + 1, to_cap, 2 * from - 1, from_cap) == Ordering::Less
}

fn distinct_len(ids: &[NodeId]) -> usize {
    ids.iter()
        .enumerate()
        .filter(|&(i, id)| !ids[..i].contains(id))
        .count()
}

/// Node, rack and zone indices of a snapshot, and its domain level. Zones and
/// racks are numbered in name order; nodes by position in the snapshot.
struct Topology<'a> {
    nodes: &'a [NodeInfo],
    /// Node states; `check_drain` overrides the drained node's.
    states: Vec<NodeState>,
    index: HashMap<NodeId, usize>,
    zone_of: Vec<usize>,
    rack_of: Vec<usize>,
    zone_racks: Vec<Vec<usize>>,
    level: DomainLevel,
}

impl<'a> Topology<'a> {
    fn new(nodes: &'a [NodeInfo], replication: usize) -> Self {
        let zones: BTreeMap<&str, usize> = nodes
            .iter()
            .map(|n| n.zone.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .enumerate()
            .map(|(i, z)| (z, i))
            .collect();
        let racks: BTreeMap<(&str, &str), usize> = nodes
            .iter()
            .map(|n| (n.zone.as_str(), n.rack.as_str()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r, i))
            .collect();
        let mut zone_racks = vec![Vec::new(); zones.len()];
        for (&(zone, _), &rack) in &racks {
            zone_racks[zones[zone]].push(rack);
        }
        let zone_of: Vec<usize> = nodes.iter().map(|n| zones[n.zone.as_str()]).collect();
        let rack_of: Vec<usize> = nodes
            .iter()
            .map(|n| racks[&(n.zone.as_str(), n.rack.as_str())])
            .collect();
        let mut index = HashMap::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            index.entry(n.id).or_insert(i);
        }

        let members: Vec<usize> = (0..nodes.len())
            .filter(|&n| nodes[n].state.is_member())
            .collect();
        let member_zones: BTreeSet<usize> = members.iter().map(|&n| zone_of[n]).collect();
        let member_racks: BTreeSet<usize> = members.iter().map(|&n| rack_of[n]).collect();
        let level = if member_zones.len() >= replication {
            DomainLevel::Zone
        } else if member_racks.len() >= replication {
            DomainLevel::Rack
        } else {
            DomainLevel::Node
        };
        Topology {
            nodes,
            states: nodes.iter().map(|n| n.state).collect(),
            index,
            zone_of,
            rack_of,
            zone_racks,
            level,
        }
    }

    fn node(&self, id: NodeId) -> Option<usize> {
        self.index.get(&id).copied()
    }

    fn is_up(&self, n: usize) -> bool {
        self.states[n] == NodeState::Up
    }

    /// The domain of node `n` at the cell's level, as an index unique within that level.
    fn domain(&self, n: usize) -> usize {
        match self.level {
            DomainLevel::Zone => self.zone_of[n],
            DomainLevel::Rack => self.rack_of[n],
            DomainLevel::Node => n,
        }
    }

    fn domain_name(&self, n: usize) -> String {
        let node = &self.nodes[n];
        match self.level {
            DomainLevel::Zone => format!("zone {:?}", node.zone),
            DomainLevel::Rack => format!("rack {:?} of zone {:?}", node.rack, node.zone),
            DomainLevel::Node => format!("node {}", node.id),
        }
    }

    /// How many domains (at the cell's level) have an `Up` node.
    fn up_domains(&self) -> usize {
        (0..self.nodes.len())
            .filter(|&n| self.is_up(n))
            .map(|n| self.domain(n))
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The node indices of `voters` other than `except`, without repeats.
    /// Voters on nodes missing from the snapshot constrain nothing.
    fn others(&self, voters: &[NodeId], except: Option<NodeId>) -> Vec<usize> {
        let mut out = Vec::with_capacity(voters.len());
        for &v in voters {
            if Some(v) == except {
                continue;
            }
            if let Some(n) = self.node(v)
                && !out.contains(&n)
            {
                out.push(n);
            }
        }
        out
    }

    /// How many of `others` share node `n`'s zone, and its rack: lower is
    /// better spread. Compared lexicographically.
    fn spread(&self, n: usize, others: &[usize]) -> (usize, usize) {
        let zone = others
            .iter()
            .filter(|&&o| self.zone_of[o] == self.zone_of[n])
            .count();
        let rack = others
            .iter()
            .filter(|&&o| self.rack_of[o] == self.rack_of[n])
            .count();
        (zone, rack)
    }
}

/// A node ranked by `num / cap`, ties broken by `salt` and then index.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    num: u64,
    cap: u64,
    salt: u64,
    idx: usize,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_ratio(self.num, self.cap, other.num, other.cap)
            .then(self.salt.cmp(&other.salt))
            .then(self.idx.cmp(&other.idx))
    }
}

/// A fixed pseudo-random order among equally loaded nodes that changes each
/// time a node's count does (splitmix64's finalizer over id and count).
///
/// Breaking ties by position instead makes every rack hand out its nodes in
/// the same order, so the k-th node of one rack keeps landing in tablets with
/// the k-th node of the others: few distinct replica sets, and losing one
/// such node per zone takes the majority of hundreds of tablets at once.
fn scatter(id: NodeId, count: u64) -> u64 {
    let mut x = id
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(count.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

/// Voter counts per node, rack and zone (racks and zones count only their
/// `Up` nodes), and each rack's `Up` nodes ordered by load after one more
/// replica, so a pick costs a scan of the zones and of one zone's racks.
struct Loads<'t> {
    topo: &'t Topology<'t>,
    count: Vec<u64>,
    cap: Vec<u64>,
    zone_count: Vec<u64>,
    zone_cap: Vec<u64>,
    rack_count: Vec<u64>,
    rack_cap: Vec<u64>,
    rack_up: Vec<usize>,
    rack_nodes: Vec<BTreeSet<Ranked>>,
}

impl<'t> Loads<'t> {
    fn new(topo: &'t Topology<'t>, tablets: &[TabletInfo]) -> Self {
        let nodes = topo.nodes.len();
        let racks = topo.zone_racks.iter().map(Vec::len).sum();
        let zones = topo.zone_racks.len();
        let mut count = vec![0u64; nodes];
        for t in tablets {
            for n in topo.others(&t.voters, None) {
                count[n] += 1;
            }
        }
        let mut loads = Loads {
            topo,
            cap: topo
                .nodes
                .iter()
                .map(|n| u64::from(n.capacity.max(1)))
                .collect(),
            count,
            zone_count: vec![0; zones],
            zone_cap: vec![0; zones],
            rack_count: vec![0; racks],
            rack_cap: vec![0; racks],
            rack_up: vec![0; racks],
            rack_nodes: vec![BTreeSet::new(); racks],
        };
        for n in (0..nodes).filter(|&n| topo.is_up(n)) {
            let (zone, rack) = (topo.zone_of[n], topo.rack_of[n]);
            loads.zone_count[zone] += loads.count[n];
            loads.zone_cap[zone] += loads.cap[n];
            loads.rack_count[rack] += loads.count[n];
            loads.rack_cap[rack] += loads.cap[n];
            loads.rack_up[rack] += 1;
            let ranked = loads.ranked(n);
            loads.rack_nodes[rack].insert(ranked);
        }
        loads
    }

    /// Node `n` ranked by its load after one more replica.
    fn ranked(&self, n: usize) -> Ranked {
        Ranked {
            num: self.count[n] + 1,
            cap: self.cap[n],
            salt: scatter(self.topo.nodes[n].id, self.count[n]),
            idx: n,
        }
    }

    /// Tie-breaks among equally loaded zones and racks, for the same reason
    /// as among nodes (see [`scatter`]): in index order, every zone would
    /// hand out its racks in step with the others, pairing rack k of one
    /// zone with rack k of the next. The seeds keep zone, rack and node
    /// sequences apart.
    fn zone_salt(&self, zone: usize) -> u64 {
        scatter(!(zone as u64), self.zone_count[zone])
    }

    fn rack_salt(&self, rack: usize) -> u64 {
        scatter(!(rack as u64) ^ 0x5bd1_e995, self.rack_count[rack])
    }

    fn add(&mut self, n: usize) {
        self.adjust(n, true);
    }

    fn remove(&mut self, n: usize) {
        self.adjust(n, false);
    }

    fn adjust(&mut self, n: usize, add: bool) {
        let step = |c: &mut u64| {
            *c = if add { *c + 1 } else { c.saturating_sub(1) };
        };
        if !self.topo.is_up(n) {
            step(&mut self.count[n]);
            return;
        }
        let (zone, rack) = (self.topo.zone_of[n], self.topo.rack_of[n]);
        let old = self.ranked(n);
        self.rack_nodes[rack].remove(&old);
        step(&mut self.count[n]);
        step(&mut self.rack_count[rack]);
        step(&mut self.zone_count[zone]);
        let new = self.ranked(n);
        self.rack_nodes[rack].insert(new);
    }

    /// The best `Up` node for a new voter beside `others`: in a domain none of
    /// them occupies, then in the zone fewest of them share, then the
    /// least-loaded zone, the same again for racks within it, then the
    /// least-loaded node of the rack. `None` when no node keeps the rule.
    fn pick(&self, others: &[usize]) -> Option<usize> {
        let topo = self.topo;
        // A zone is passed over when the rule leaves none of its racks usable.
        let mut passed: Vec<usize> = Vec::new();
        loop {
            let mut best: Option<(usize, usize)> = None;
            for zone in 0..self.zone_cap.len() {
                if self.zone_cap[zone] == 0 || passed.contains(&zone) {
                    continue;
                }
                let shared = others.iter().filter(|&&o| topo.zone_of[o] == zone).count();
                if topo.level == DomainLevel::Zone && shared > 0 {
                    continue;
                }
                let better = best.is_none_or(|(best_shared, b)| {
                    shared
                        .cmp(&best_shared)
                        .then_with(|| {
                            cmp_ratio(
                                self.zone_count[zone] + 1,
                                self.zone_cap[zone],
                                self.zone_count[b] + 1,
                                self.zone_cap[b],
                            )
                        })
                        .then_with(|| self.zone_salt(zone).cmp(&self.zone_salt(b)))
                        == Ordering::Less
                });
                if better {
                    best = Some((shared, zone));
                }
            }
            let (_, zone) = best?;
            if let Some(n) = self.pick_in_zone(zone, others) {
                return Some(n);
            }
            passed.push(zone);
        }
    }

    fn pick_in_zone(&self, zone: usize, others: &[usize]) -> Option<usize> {
        let topo = self.topo;
        let mut best: Option<(usize, usize)> = None;
        for &rack in &topo.zone_racks[zone] {
            let shared = others.iter().filter(|&&o| topo.rack_of[o] == rack).count();
            let taken = others
                .iter()
                .filter(|&&o| topo.rack_of[o] == rack && topo.is_up(o))
                .count();
            if self.rack_up[rack] <= taken || (topo.level == DomainLevel::Rack && shared > 0) {
                continue;
            }
            let better = best.is_none_or(|(best_shared, b)| {
                shared
                    .cmp(&best_shared)
                    .then_with(|| {
                        cmp_ratio(
                            self.rack_count[rack] + 1,
                            self.rack_cap[rack],
                            self.rack_count[b] + 1,
                            self.rack_cap[b],
                        )
                    })
                    .then_with(|| self.rack_salt(rack).cmp(&self.rack_salt(b)))
                    == Ordering::Less
            });
            if better {
                best = Some((shared, rack));
            }
        }
        let (_, rack) = best?;
        self.rack_nodes[rack]
            .iter()
            .find(|r| !others.contains(&r.idx))
            .map(|r| r.idx)
    }
}

/// State of one `balance_plan`: loads as moves are planned, and which tablets
/// each node could shed.
struct ReplicaBalancer<'c, 't> {
    tablets: &'c [TabletInfo],
    nodes: &'c [NodeInfo],
    loads: Loads<'t>,
    /// Per tablet, its voters' node indices (only for movable tablets).
    voters: Vec<Vec<usize>>,
    /// Per node, the movable tablets it holds, those it leads last so that a
    /// move rarely needs a leader transfer first.
    holds: Vec<Vec<usize>>,
    touched: Vec<bool>,
    moves: Vec<Move>,
}

impl<'c, 't> ReplicaBalancer<'c, 't> {
    fn new(cluster: &Cluster<'c>, topo: &'t Topology<'t>) -> Self {
        let loads = Loads::new(topo, cluster.tablets);
        let mut voters = vec![Vec::new(); cluster.tablets.len()];
        let mut holds = vec![Vec::new(); cluster.nodes.len()];
        for (i, t) in cluster.tablets.iter().enumerate() {
            let vs = topo.others(&t.voters, None);
            let healthy = !t.busy
                && vs.len() == cluster.replication
                && vs.len() == t.voters.len()
                && vs.iter().all(|&n| topo.is_up(n));
            if healthy {
                voters[i] = vs;
            }
        }
        for leaders_last in [false, true] {
            for (i, t) in cluster.tablets.iter().enumerate() {
                for &n in &voters[i] {
                    if (t.leader == Some(cluster.nodes[n].id)) == leaders_last {
                        holds[n].push(i);
                    }
                }
            }
        }
        ReplicaBalancer {
            tablets: cluster.tablets,
            nodes: cluster.nodes,
            loads,
            voters,
            holds,
            touched: vec![false; cluster.tablets.len()],
            moves: Vec::new(),
        }
    }

    fn improves(&self, s: usize, d: usize) -> bool {
        let (count, cap) = (&self.loads.count, &self.loads.cap);
        improves(count[s], cap[s], count[d], cap[d])
    }

    /// Whether tablet `t`'s voter on `s` may move to `d`.
    fn movable(&self, t: usize, s: usize, d: usize) -> bool {
        let topo = self.loads.topo;
        let voters = &self.voters[t];
        if self.touched[t] || voters.contains(&d) {
            return false;
        }
        let others: Vec<usize> = voters.iter().copied().filter(|&v| v != s).collect();
        others.iter().all(|&o| topo.domain(o) != topo.domain(d))
            && topo.spread(d, &others) <= topo.spread(s, &others)
    }

    /// Moves one voter off overfull node `s`, to the least-loaded node that
    /// can take one of its tablets.
    fn shed(&mut self, s: usize, up: &[usize]) -> bool {
        let (count, cap) = (&self.loads.count, &self.loads.cap);
        let mut targets: Vec<usize> = up.iter().copied().filter(|&d| d != s).collect();
        targets.sort_by(|&a, &b| {
            cmp_ratio(count[a] + 1, cap[a], count[b] + 1, cap[b]).then(a.cmp(&b))
        });
        for d in targets {
            if !self.improves(s, d) {
                break;
            }
            if let Some(&t) = self.holds[s].iter().find(|&&t| self.movable(t, s, d)) {
                self.apply(t, s, d);
                return true;
            }
        }
        false
    }

    /// Moves one voter onto underfull node `d`, from the most-loaded node
    /// that has a tablet it can take.
    fn gain(&mut self, d: usize, up: &[usize]) -> bool {
        let (count, cap) = (&self.loads.count, &self.loads.cap);
        let mut sources: Vec<usize> = up.iter().copied().filter(|&s| s != d).collect();
        sources.sort_by(|&a, &b| cmp_ratio(count[b], cap[b], count[a], cap[a]).then(a.cmp(&b)));
        for s in sources {
            if !self.improves(s, d) {
                break;
            }
            if let Some(&t) = self.holds[s].iter().find(|&&t| self.movable(t, s, d)) {
                self.apply(t, s, d);
                return true;
            }
        }
        false
    }

    fn apply(&mut self, t: usize, s: usize, d: usize) {
        self.touched[t] = true;
        self.loads.remove(s);
        self.loads.add(d);
        self.moves.push(Move {
            tablet: self.tablets[t].id,
            from: Some(self.nodes[s].id),
            to: self.nodes[d].id,
        });
    }
}

/// State of one `leader_plan`.
struct LeaderBalancer<'c> {
    tablets: &'c [TabletInfo],
    nodes: &'c [NodeInfo],
    up: Vec<bool>,
    /// Leaders per node, counting every tablet whose leader is a voter.
    count: Vec<u64>,
    cap: Vec<u64>,
    /// Per tablet, its voters' node indices (only for tablets a transfer may touch).
    voters: Vec<Vec<usize>>,
    /// Per tablet, its leader's node index (only for tablets a transfer may touch).
    leader: Vec<Option<usize>>,
    /// Per node, the tablets it leads that a transfer may touch.
    led: Vec<Vec<usize>>,
    /// Per node, the tablets it is a voter of that a transfer may touch.
    voter_in: Vec<Vec<usize>>,
    touched: Vec<bool>,
    plan: Vec<Transfer>,
}

impl<'c> LeaderBalancer<'c> {
    fn new(cluster: &Cluster<'c>, topo: &Topology) -> Self {
        let nodes = cluster.nodes.len();
        let tablets = cluster.tablets.len();
        let mut b = LeaderBalancer {
            tablets: cluster.tablets,
            nodes: cluster.nodes,
            up: (0..nodes).map(|n| topo.is_up(n)).collect(),
            count: vec![0; nodes],
            cap: cluster
                .nodes
                .iter()
                .map(|n| u64::from(n.capacity.max(1)))
                .collect(),
            voters: vec![Vec::new(); tablets],
            leader: vec![None; tablets],
            led: vec![Vec::new(); nodes],
            voter_in: vec![Vec::new(); nodes],
            touched: vec![false; tablets],
            plan: Vec::new(),
        };
        for (i, t) in cluster.tablets.iter().enumerate() {
            let Some(l) = t.leader.filter(|l| t.voters.contains(l)) else {
                continue;
            };
            let Some(l) = topo.node(l) else {
                continue;
            };
            b.count[l] += 1;
            if t.busy {
                continue;
            }
            let voters = topo.others(&t.voters, None);
            for &v in &voters {
                b.voter_in[v].push(i);
            }
            b.voters[i] = voters;
            b.leader[i] = Some(l);
            b.led[l].push(i);
        }
        b
    }

    fn improves(&self, s: usize, d: usize) -> bool {
        improves(self.count[s], self.cap[s], self.count[d], self.cap[d])
    }

    /// The `Up` voter of tablet `t` other than `s` with the fewest leaders
    /// (by capacity), if `t` may still be touched.
    fn best_target(&self, t: usize, s: usize) -> Option<usize> {
        if self.touched[t] {
            return None;
        }
        self.voters[t]
            .iter()
            .copied()
            .filter(|&v| v != s && self.up[v])
            .min_by(|&a, &b| {
                cmp_ratio(
                    self.count[a] + 1,
                    self.cap[a],
                    self.count[b] + 1,
                    self.cap[b],
                )
                .then(a.cmp(&b))
            })
    }

    /// Hands one leadership from overfull `s` to the least-led voter among all
    /// its tablets.
    fn shed(&mut self, s: usize) -> bool {
        let mut best: Option<(usize, usize)> = None;
        for &t in &self.led[s] {
            let Some(d) = self.best_target(t, s) else {
                continue;
            };
            let better = best.is_none_or(|(_, b)| {
                cmp_ratio(
                    self.count[d] + 1,
                    self.cap[d],
                    self.count[b] + 1,
                    self.cap[b],
                ) == Ordering::Less
            });
            if better {
                best = Some((t, d));
            }
        }
        match best {
            Some((t, d)) if self.improves(s, d) => {
                self.transfer(t, s, d);
                true
            }
            _ => false,
        }
    }

    /// Takes one leadership onto underfull `d` from the most-led leader among
    /// the tablets it is a voter of.
    fn gain(&mut self, d: usize) -> bool {
        let mut best: Option<(usize, usize)> = None;
        for &t in &self.voter_in[d] {
            let Some(s) = self.leader[t] else {
                continue;
            };
            if self.touched[t] || s == d || !self.up[s] {
                continue;
            }
            let better = best.is_none_or(|(_, b)| {
                cmp_ratio(self.count[s], self.cap[s], self.count[b], self.cap[b])
                    == Ordering::Greater
            });
            if better {
                best = Some((t, s));
            }
        }
        match best {
            Some((t, s)) if self.improves(s, d) => {
                self.transfer(t, s, d);
                true
            }
            _ => false,
        }
    }

    fn transfer(&mut self, t: usize, s: usize, d: usize) {
        self.touched[t] = true;
        self.count[s] -= 1;
        self.count[d] += 1;
        self.plan.push(Transfer {
            tablet: self.tablets[t].id,
            from: self.nodes[s].id,
            to: self.nodes[d].id,
        });
    }
}
