//! What the leading controller knows of its nodes: heartbeats, health
//! leases, the replicas each node reports, and tablet load samples.
//!
//! This is the leader's soft state, never replicated: a new leader gives
//! every node a full lease from the moment it took over before declaring
//! anything dead. Everything here is pure: the clock is an argument, so
//! the scheduler's tests build a view by hand.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use stele_proto::pb;

use crate::autosplit::{LoadSample, TabletLoad};
use crate::load::LoadRing;
use crate::placement::{NodeInfo, NodeState, TabletInfo};
use crate::state::{Admin, CellState, MergePhase, NodeRec, node_of};

#[derive(Debug, Clone, Default)]
pub struct HealthView {
    /// The term this controller leads in, and since when.
    pub leading: Option<(u64, Instant)>,
    /// Each node's last heartbeat.
    pub seen: HashMap<u64, Instant>,
    /// The replicas each node reports, by tablet, as of its last
    /// heartbeat (a delta heartbeat changes some of them).
    pub reports: HashMap<u64, Reports>,
    /// The heartbeat of each node whose reports `reports` holds (delta
    /// heartbeats; 0 for a full one from an earlier node).
    pub report_seqs: HashMap<u64, u64>,
    /// When each dead node was last declared (or found) dead.
    pub dead_since: HashMap<u64, Instant>,
    /// When this leader first saw each open intent.
    pub intent_seen: HashMap<u64, Instant>,
    /// When this leader first saw each open merge in its current phase.
    pub merge_phase_seen: HashMap<u64, (MergePhase, Instant)>,
    pub last_leader_balance: Option<Instant>,
    /// Load samples of each tablet from its leader's heartbeats, with the
    /// range they were taken under, for automatic splits.
    pub loads: HashMap<u64, ((u32, u64), TabletLoad)>,
    /// The zero of the load samples' clock.
    pub epoch: Option<Instant>,
    /// Nodes being restarted (`RestartSafe`): leader balancing gives them
    /// no leadership until the instant.
    pub leader_holds: HashMap<u64, Instant>,
    /// Each node's binary version and the newest version of each gated
    /// format it reads and writes, from its latest heartbeat.
    pub builds: HashMap<u64, Build>,
    /// Each node's recent load (the console's charts), bounded per node
    /// ([`crate::load`]) and kept only for nodes the state names.
    pub node_loads: HashMap<u64, LoadRing>,
    /// The tablets the last repair pass found with most of their voters on
    /// dead nodes (so a pass warns only of newly lost ones).
    pub lost_majority: BTreeSet<u64>,
}

/// One node's replica reports, by tablet (a node holds at most one
/// replica of a tablet).
pub type Reports = BTreeMap<u64, pb::ReplicaReport>;

/// What a heartbeat reports of a node's replicas.
#[derive(Debug, Clone, Default)]
pub struct ReportUpdate {
    /// The heartbeat's number (0 from a node before delta heartbeats).
    pub seq: u64,
    /// 0: `replicas` is every replica the node holds; otherwise they are
    /// the reports changed since heartbeat `base`, and `gone` the tablets
    /// no longer held.
    pub base: u64,
    pub replicas: Vec<pb::ReplicaReport>,
    pub gone: Vec<u64>,
}

impl ReportUpdate {
    /// A full report (what nodes before delta heartbeats send).
    pub fn full(replicas: Vec<pb::ReplicaReport>) -> ReportUpdate {
        ReportUpdate {
            replicas,
            ..Default::default()
        }
    }
}

/// What a member runs: its binary version and the newest version of each
/// gated format it reads and writes (empty from binaries before the gate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Build {
    pub version: String,
    pub formats: Vec<pb::FormatVersion>,
}

/// Something the scheduler learnt during a pass, for the leader's soft
/// state. A pass records these in order as it reaches them, so a pass that
/// stops early (a proposal failed) records only what it got to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The open intents: their ages start now for those not seen before;
    /// closed ones are forgotten.
    IntentsSeen { pending: Vec<u64>, now: Instant },
    /// A merge was seen in `phase`: its phase age starts now if the phase
    /// is new.
    MergePhase {
        intent: u64,
        phase: MergePhase,
        now: Instant,
    },
    /// The tablets and their ranges: loads of removed tablets are dropped,
    /// and a tablet whose range changed (or that is new) starts its
    /// cooldown now.
    LoadsTracked {
        ranges: BTreeMap<u64, (u32, u64)>,
        now: Instant,
    },
    /// An automatic split or merge was proposed for these tablets: their
    /// samples start afresh, whatever came of it.
    LoadsReset { tablets: Vec<u64>, now: Instant },
    /// Leaders were considered for balancing.
    LeaderBalance { now: Instant },
    /// The tablets repair last found without a majority of live voters.
    LostMajority(BTreeSet<u64>),
}

impl HealthView {
    /// Keeps leader balancing from giving `node` leadership until `until`.
    pub fn hold_leaders(&mut self, node: u64, until: Instant) {
        self.leader_holds.insert(node, until);
    }

    /// True while `node` is held from taking leadership.
    pub fn holds_leaders(&self, node: u64, now: Instant) -> bool {
        self.leader_holds.get(&node).is_some_and(|&t| now < t)
    }

    /// Records a heartbeat of `node` at `now`: its lease renews, its
    /// report replaces the last one (or, a delta, changes it), and its
    /// leaders' load samples are kept for `window`.
    ///
    /// A delta against reports this view does not hold (another base, or
    /// none) is refused whole, lease and all: false, and the node is to
    /// send its full report.
    pub fn heartbeat(
        &mut self,
        node: u64,
        update: ReportUpdate,
        now: Instant,
        window: Duration,
    ) -> bool {
        let ReportUpdate {
            seq,
            base,
            replicas,
            gone,
        } = update;
        if base != 0 {
            if self.report_seqs.get(&node) != Some(&base) || !self.reports.contains_key(&node) {
                return false;
            }
            let held = self.reports.entry(node).or_default();
            for t in gone {
                held.remove(&t);
            }
            for r in replicas {
                held.insert(r.tablet, r);
            }
        } else {
            self.reports
                .insert(node, replicas.into_iter().map(|r| (r.tablet, r)).collect());
        }
        self.report_seqs.insert(node, seq);
        self.seen.insert(node, now);
        let at = self.load_clock(now, true);
        let held = self.reports.get(&node).into_iter().flat_map(|r| r.values());
        for r in held.filter(|r| r.leader) {
            let sample = LoadSample {
                at,
                segment_bytes: r.segment_bytes,
                records_applied: r.records_applied,
                reads_served: r.reads_served,
            };
            if let Some((_, load)) = self.loads.get_mut(&r.tablet) {
                load.push(sample, window);
            }
        }
        self.dead_since.remove(&node);
        true
    }

    /// Records the load a heartbeat of `node` reported at `now`.
    pub fn record_load(&mut self, node: u64, load: &pb::NodeLoad, now: Instant) {
        self.node_loads.entry(node).or_default().push(load, now);
    }

    /// A node's state as operators see it at `now`: `decommissioned`,
    /// `dead` (declared, or silent past its lease), `draining`, `suspect`
    /// (silent for more than half the lease), `up`. The metrics' gauge and
    /// the console name states this way.
    pub fn status(&self, n: &NodeRec, now: Instant, lease: Duration) -> &'static str {
        let silent = self.seen.get(&n.id).map(|t| now.duration_since(*t));
        match (n.admin, n.dead) {
            (Admin::Decommissioned, _) => "decommissioned",
            (_, true) => "dead",
            _ if self.lease_expired(n, now, lease) || self.dead_since.contains_key(&n.id) => "dead",
            (Admin::Draining, _) => "draining",
            _ if silent.is_none_or(|d| d > lease / 2) => "suspect",
            _ => "up",
        }
    }

    /// `now` on the load samples' clock; `start` sets its zero if unset.
    fn load_clock(&mut self, now: Instant, start: bool) -> Duration {
        if start {
            self.epoch.get_or_insert(now);
        }
        self.epoch.map_or(Duration::ZERO, |e| now.duration_since(e))
    }

    /// Whether `n`'s lease has run out at `now`: a live, not decommissioned
    /// node silent for longer than `lease`.
    pub fn lease_expired(&self, n: &NodeRec, now: Instant, lease: Duration) -> bool {
        if n.dead || n.admin == Admin::Decommissioned {
            return false;
        }
        let seen = self.seen.get(&n.id).copied().unwrap_or(now);
        now.duration_since(seen) > lease
    }

    /// The start of a scheduler pass in `term` at `now`: a new term starts
    /// every node's lease afresh (and delays leader balancing until the
    /// leaders settle); a node whose lease ran out is dead from now on and
    /// its reports are dropped. Runs before the pass decides anything, so
    /// the pass sees its effect.
    pub fn observe(&mut self, s: &CellState, term: u64, now: Instant, lease: Duration) {
        // An uninitialized cell has nothing to schedule, and no leases run.
        if s.cell.is_none() {
            return;
        }
        if self.leading.map(|(t, _)| t) != Some(term) {
            self.leading = Some((term, now));
            self.last_leader_balance = Some(now);
            for id in s.nodes.keys() {
                self.seen.insert(*id, now);
            }
            self.dead_since.clear();
            for n in s.nodes.values().filter(|n| n.dead) {
                self.dead_since.insert(n.id, now);
            }
        }
        self.node_loads.retain(|id, _| s.nodes.contains_key(id));
        for n in s.nodes.values() {
            if self.lease_expired(n, now, lease) {
                self.dead_since.insert(n.id, now);
                self.reports.remove(&n.id);
                self.report_seqs.remove(&n.id);
            }
        }
    }

    /// Records what a scheduler pass learnt.
    pub fn note(&mut self, note: Note) {
        match note {
            Note::IntentsSeen { pending, now } => {
                self.intent_seen.retain(|id, _| pending.contains(id));
                for id in pending {
                    self.intent_seen.entry(id).or_insert(now);
                }
            }
            Note::MergePhase { intent, phase, now } => {
                let e = self.merge_phase_seen.entry(intent).or_insert((phase, now));
                if e.0 != phase {
                    *e = (phase, now);
                }
            }
            Note::LoadsTracked { ranges, now } => {
                let at = self.load_clock(now, true);
                self.loads.retain(|id, _| ranges.contains_key(id));
                for (id, range) in ranges {
                    let entry = self
                        .loads
                        .entry(id)
                        .or_insert_with(|| (range, Default::default()));
                    if entry.0 != range {
                        // Split (or first seen): the cooldown starts now.
                        *entry = (range, Default::default());
                    }
                    if entry.1.changed_at.is_none() {
                        entry.1.reset(at);
                    }
                }
            }
            Note::LoadsReset { tablets, now } => {
                let at = self.load_clock(now, true);
                for t in tablets {
                    if let Some((_, load)) = self.loads.get_mut(&t) {
                        load.reset(at);
                    }
                }
            }
            Note::LeaderBalance { now } => self.last_leader_balance = Some(now),
            Note::LostMajority(tablets) => self.lost_majority = tablets,
        }
    }

    /// How long this leader has seen `intent` open (zero if not yet).
    pub fn intent_age(&self, intent: u64, now: Instant) -> Duration {
        self.intent_seen
            .get(&intent)
            .map_or(Duration::ZERO, |t| now.duration_since(*t))
    }

    /// How long this leader has seen merge `intent` in `phase` (zero if
    /// not yet, or if it last saw another phase).
    pub fn merge_phase_age(&self, intent: u64, phase: MergePhase, now: Instant) -> Duration {
        match self.merge_phase_seen.get(&intent) {
            Some((p, t)) if *p == phase => now.duration_since(*t),
            _ => Duration::ZERO,
        }
    }

    /// `now` on the load samples' clock, without starting it.
    pub fn load_time(&self, now: Instant) -> Duration {
        self.epoch.map_or(Duration::ZERO, |e| now.duration_since(e))
    }

    /// The samples of `tablet` over `range` as [`Note::LoadsTracked`] leaves
    /// them, if it keeps any: a tablet first seen, or whose range changed,
    /// starts afresh with none.
    pub fn load(&self, tablet: u64, range: (u32, u64)) -> Option<&TabletLoad> {
        self.loads
            .get(&tablet)
            .filter(|(r, l)| *r == range && l.changed_at.is_some())
            .map(|(_, l)| l)
    }

    /// The node's state as placement sees it, with the leader-local
    /// `Suspect` (silent for half the lease) and `Dead` only after the grace.
    pub fn placement_nodes(
        &self,
        s: &CellState,
        now: Instant,
        lease: Duration,
        repair_grace: Duration,
    ) -> Vec<NodeInfo> {
        s.nodes
            .values()
            .map(|n| {
                let mut state = n.placement_state();
                if state == NodeState::Dead
                    && self
                        .dead_since
                        .get(&n.id)
                        .is_none_or(|t| now.duration_since(*t) < repair_grace)
                {
                    state = NodeState::Suspect;
                }
                if state == NodeState::Up
                    && self
                        .seen
                        .get(&n.id)
                        .is_none_or(|t| now.duration_since(*t) > lease / 2)
                {
                    state = NodeState::Suspect;
                }
                NodeInfo {
                    id: n.id,
                    zone: n.zone.clone(),
                    rack: n.rack.clone(),
                    state,
                    capacity: n.capacity.max(1),
                }
            })
            .collect()
    }

    /// Where a split stands in the latest reports: whether some node holds
    /// the child, and whether some replica of the parent applied it.
    pub fn split_progress(&self, tablet: u64, child: u64, generation: u64) -> (bool, bool) {
        let all = || self.reports.values().flat_map(|r| r.values());
        let child_seen = all().any(|r| r.tablet == child);
        let applied =
            child_seen || all().any(|r| r.tablet == tablet && r.range_generation >= generation);
        (child_seen, applied)
    }

    /// The latest report of `tablet`'s replica `replica_id`, from its node.
    pub fn replica_report(&self, tablet: u64, replica_id: u64) -> Option<&pb::ReplicaReport> {
        self.reports
            .get(&node_of(replica_id))?
            .get(&tablet)
            .filter(|r| r.replica_id == replica_id)
    }

    /// The replica of each tablet that leads, from the latest reports (the
    /// highest term wins).
    pub fn leaders(&self) -> HashMap<u64, pb::ReplicaReport> {
        let mut out: HashMap<u64, pb::ReplicaReport> = HashMap::new();
        for reports in self.reports.values() {
            for r in reports.values().filter(|r| r.leader) {
                match out.get(&r.tablet) {
                    Some(o) if o.term >= r.term => {}
                    _ => {
                        out.insert(r.tablet, r.clone());
                    }
                }
            }
        }
        out
    }
}

/// The tablets as placement sees them, with their reported leaders.
pub fn tablet_infos(s: &CellState, leaders: &HashMap<u64, pb::ReplicaReport>) -> Vec<TabletInfo> {
    s.tablets
        .values()
        .map(|t| TabletInfo {
            id: t.id,
            voters: t.voters.iter().map(|r| r.node).collect(),
            leader: leaders
                .get(&t.id)
                .map(|r| node_of(r.replica_id))
                .filter(|n| t.voters.iter().any(|v| v.node == *n)),
            busy: t.intent != 0,
        })
        .collect()
}
