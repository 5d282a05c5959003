//! A controller process: one member of the cell's controller quorum, its
//! gRPC services, and (while it leads) the health leases and the scheduler
//! that places, repairs and finishes intents.
//!
//! Health is the leader's soft state: a new leader gives every node a full
//! lease from the moment it took over before declaring anything dead.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_quorum::{Error as QuorumError, Quorum, QuorumService, QuorumTiming, refuse};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::placement::{Cluster, NodeInfo, NodeState, PlacementError, TabletInfo};
use crate::state::{
    Admin, CellConfig, CellState, Command, IntentKind, IntentRec, IntentState, MergePhase,
    MergeStep, NodeRec, Reply, TabletRec, from_cbor, node_of, to_cbor,
};

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub id: u64,
    pub data_dir: PathBuf,
    /// This controller's gRPC endpoint as peers and nodes reach it.
    pub advertise: String,
    /// A node missing heartbeats this long is declared dead.
    pub lease: Duration,
    /// A dead node's replicas are moved away after this much more.
    pub repair_grace: Duration,
    /// Scheduler period.
    pub tick: Duration,
    /// Most intents open at once (moves in flight).
    pub max_intents: usize,
    /// A move that has not changed the group's voters after this long is
    /// given up (rolled back); a leader transfer after a tenth of it.
    pub intent_timeout: Duration,
    /// How often leaders are rebalanced across nodes (zero: never).
    pub leader_balance_every: Duration,
    /// When tablets split by themselves.
    pub split: crate::autosplit::SplitPolicy,
    pub timing: QuorumTiming,
}

impl ControllerOptions {
    pub fn new(id: u64, data_dir: PathBuf, advertise: String) -> ControllerOptions {
        ControllerOptions {
            id,
            data_dir,
            advertise,
            lease: Duration::from_secs(10),
            repair_grace: Duration::from_secs(60),
            tick: Duration::from_millis(500),
            max_intents: 16,
            intent_timeout: Duration::from_secs(120),
            leader_balance_every: Duration::from_secs(10),
            split: crate::autosplit::SplitPolicy::default(),
            timing: QuorumTiming::default(),
        }
    }
}

#[derive(Default)]
struct Health {
    /// The term this controller leads in, and since when.
    leading: Option<(u64, Instant)>,
    seen: HashMap<u64, Instant>,
    reports: HashMap<u64, Vec<pb::ReplicaReport>>,
    dead_since: HashMap<u64, Instant>,
    /// When this leader first saw each open intent.
    intent_seen: HashMap<u64, Instant>,
    /// When this leader first saw each open merge in its current phase.
    merge_phase_seen: HashMap<u64, (crate::state::MergePhase, Instant)>,
    last_leader_balance: Option<Instant>,
    /// Load samples of each tablet from its leader's heartbeats, with the
    /// range they were taken under, for automatic splits.
    loads: HashMap<u64, ((u32, u64), crate::autosplit::TabletLoad)>,
    /// The zero of the load samples' clock.
    epoch: Option<Instant>,
}

pub struct Controller {
    pub opts: ControllerOptions,
    pub quorum: Arc<Quorum<CellState>>,
    health: Mutex<Health>,
    cancel: CancellationToken,
}

fn quorum_status(e: QuorumError) -> Status {
    e.into()
}

fn node_state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Up => "up",
        NodeState::Suspect => "suspect",
        NodeState::Dead => "dead",
        NodeState::Draining => "draining",
        NodeState::Decommissioned => "decommissioned",
    }
}

impl Controller {
    pub async fn start(opts: ControllerOptions) -> Result<Arc<Controller>, stele_quorum::Error> {
        let quorum = Quorum::open(
            &opts.data_dir.join("controller"),
            opts.id,
            CellState::new(),
            &opts.timing,
        )
        .await?;
        let c = Arc::new(Controller {
            opts,
            quorum: Arc::new(quorum),
            health: Default::default(),
            cancel: CancellationToken::new(),
        });
        tokio::spawn(scheduler(c.clone()));
        Ok(c)
    }

    /// The gRPC services to mount: the controller API and quorum peering.
    pub fn services(
        self: &Arc<Self>,
    ) -> (
        pb::controller_server::ControllerServer<Api>,
        pb::quorum_server::QuorumServer<QuorumService<CellState>>,
    ) {
        (
            pb::controller_server::ControllerServer::new(Api(self.clone())),
            pb::quorum_server::QuorumServer::new(QuorumService(self.quorum.clone()))
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
        )
    }

    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.quorum.shutdown().await;
    }

    fn not_leader(&self) -> Status {
        let (leader, endpoint) = match self.quorum.leader() {
            Some((id, ep)) => (Some(id), Some(ep)),
            None => (None, None),
        };
        quorum_status(QuorumError::NotLeader { leader, endpoint })
    }

    fn require_leader(&self) -> Result<(), Status> {
        if self.quorum.is_leader() {
            Ok(())
        } else {
            Err(self.not_leader())
        }
    }

    pub async fn propose(&self, cmd: Command) -> Result<Reply, Status> {
        let bytes = self
            .quorum
            .propose(to_cbor(&cmd))
            .await
            .map_err(quorum_status)?;
        from_cbor(&bytes).map_err(|e| Status::internal(format!("controller reply: {e}")))
    }

    fn snapshot(&self) -> CellState {
        self.quorum.state().clone()
    }

    /// The node's state as placement sees it, with the leader-local
    /// `Suspect` (silent for half the lease) and `Dead` only after the grace.
    fn placement_nodes(&self, s: &CellState, now: Instant) -> Vec<NodeInfo> {
        let h = self.health.lock().expect("lock poisoned");
        s.nodes
            .values()
            .map(|n| {
                let mut state = n.placement_state();
                if state == NodeState::Dead
                    && h.dead_since
                        .get(&n.id)
                        .is_none_or(|t| now.duration_since(*t) < self.opts.repair_grace)
                {
                    state = NodeState::Suspect;
                }
                if state == NodeState::Up
                    && h.seen
                        .get(&n.id)
                        .is_none_or(|t| now.duration_since(*t) > self.opts.lease / 2)
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
    fn split_progress(&self, tablet: u64, child: u64, generation: u64) -> (bool, bool) {
        let h = self.health.lock().expect("lock poisoned");
        let all = || h.reports.values().flat_map(|r| r.iter());
        let child_seen = all().any(|r| r.tablet == child);
        let applied =
            child_seen || all().any(|r| r.tablet == tablet && r.range_generation >= generation);
        (child_seen, applied)
    }

    /// The latest report of `tablet`'s replica `replica_id`, from its node.
    fn replica_report(&self, tablet: u64, replica_id: u64) -> Option<pb::ReplicaReport> {
        let h = self.health.lock().expect("lock poisoned");
        h.reports
            .get(&node_of(replica_id))?
            .iter()
            .find(|r| r.tablet == tablet && r.replica_id == replica_id)
            .cloned()
    }

    /// How long an open merge has been in `phase` (as this leader saw it).
    fn merge_phase_age(&self, intent: u64, phase: crate::state::MergePhase) -> Duration {
        let mut h = self.health.lock().expect("lock poisoned");
        let now = Instant::now();
        let e = h.merge_phase_seen.entry(intent).or_insert((phase, now));
        if e.0 != phase {
            *e = (phase, now);
        }
        now.duration_since(e.1)
    }

    /// The replica of each tablet that leads, from the latest reports (the
    /// highest term wins).
    fn leaders(&self) -> HashMap<u64, pb::ReplicaReport> {
        let h = self.health.lock().expect("lock poisoned");
        let mut out: HashMap<u64, pb::ReplicaReport> = HashMap::new();
        for reports in h.reports.values() {
            for r in reports.iter().filter(|r| r.leader) {
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

    /// Nodes and tablets as placement sees them now, with the cell's
    /// replication factor.
    fn cluster_view(&self, s: &CellState) -> (Vec<NodeInfo>, Vec<TabletInfo>, usize) {
        let nodes = self.placement_nodes(s, Instant::now());
        let tablets = Controller::tablet_infos(s, &self.leaders());
        let replication = s.cell.as_ref().map_or(3, |c| c.replication as usize);
        (nodes, tablets, replication)
    }

    fn tablet_infos(s: &CellState, leaders: &HashMap<u64, pb::ReplicaReport>) -> Vec<TabletInfo> {
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

    fn descriptor(
        s: &CellState,
        t: &TabletRec,
        leaders: &HashMap<u64, pb::ReplicaReport>,
    ) -> pb::TabletDescriptor {
        let leader_node = leaders.get(&t.id).map_or(0, |r| node_of(r.replica_id));
        pb::TabletDescriptor {
            id: t.id,
            vshard_lo: t.lo,
            vshard_hi: t.hi,
            generation: t.generation,
            leader_node,
            leader_endpoint: s
                .nodes
                .get(&leader_node)
                .map(|n| n.client_endpoint.clone())
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

fn intent_pb(i: &IntentRec) -> pb::Intent {
    let (kind, from, to) = match &i.kind {
        IntentKind::Move { from, to, .. } => ("move", *from, *to),
        IntentKind::TransferLeader { to } => ("transfer-leader", 0, *to),
        IntentKind::Split { .. } => ("split", 0, 0),
        IntentKind::Merge { .. } => ("merge", 0, 0),
    };
    let (at, child, vshard_lo, vshard_hi, absorbed) = match &i.kind {
        IntentKind::Split {
            at, child, lo, hi, ..
        } => (*at, *child, *lo, *hi, 0),
        IntentKind::Merge {
            absorbed, lo, hi, ..
        } => (0, 0, *lo, *hi, *absorbed),
        _ => (0, 0, 0, 0, 0),
    };
    let pending = match &i.kind {
        IntentKind::Merge { phase, .. } => match phase {
            MergePhase::Colocate => "colocating",
            MergePhase::Freeze => "freezing",
            MergePhase::Merge => "merging",
        },
        _ => "pending",
    };
    let (state, detail, done, generation) = match &i.state {
        IntentState::Pending => (pending, String::new(), false, 0),
        IntentState::Done { generation } => ("done", String::new(), true, *generation),
        IntentState::Failed { reason } => ("failed", reason.clone(), true, 0),
    };
    pb::Intent {
        id: i.id,
        kind: format!("{kind} ({})", i.reason),
        tablet: i.tablet,
        from,
        to,
        state: state.into(),
        detail,
        done,
        generation,
        at,
        child,
        vshard_lo,
        vshard_hi,
        reason: i.reason.clone(),
        absorbed,
    }
}

// ---------------------------------------------------------------- scheduler

async fn scheduler(c: Arc<Controller>) {
    let mut tick = tokio::time::interval(c.opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = c.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !c.quorum.is_leader() {
            c.health.lock().expect("lock poisoned").leading = None;
            continue;
        }
        // Applied everything committed before acting on it.
        if c.quorum.linearizable().await.is_err() {
            continue;
        }
        if let Err(e) = schedule_once(&c).await {
            tracing::debug!(error = %e.message(), "scheduler pass stopped");
        }
    }
}

async fn schedule_once(c: &Controller) -> Result<(), Status> {
    let now = Instant::now();
    let term = c.quorum.term();
    let s = c.snapshot();
    let Some(cell) = s.cell.clone() else {
        return Ok(());
    };
    // Leases: a new term starts every node's lease afresh.
    let mut to_mark = Vec::new();
    {
        let mut h = c.health.lock().expect("lock poisoned");
        if h.leading.map(|(t, _)| t) != Some(term) {
            h.leading = Some((term, now));
            // Leaders settle after a failover before any is rebalanced.
            h.last_leader_balance = Some(now);
            for id in s.nodes.keys() {
                h.seen.insert(*id, now);
            }
            h.dead_since.clear();
            for n in s.nodes.values().filter(|n| n.dead) {
                h.dead_since.insert(n.id, now);
            }
        }
        for n in s.nodes.values() {
            if n.dead || n.admin == Admin::Decommissioned {
                continue;
            }
            let seen = h.seen.get(&n.id).copied().unwrap_or(now);
            if now.duration_since(seen) > c.opts.lease {
                to_mark.push(n.id);
                h.dead_since.insert(n.id, now);
                h.reports.remove(&n.id);
            }
        }
    }
    for node in to_mark {
        tracing::warn!(node, "health lease expired; node declared dead");
        c.propose(Command::MarkDead { node }).await?;
    }
    let leaders = c.leaders();
    // Groups that elected a leader no longer need their initializer.
    for t in s.tablets.values().filter(|t| t.initializer.is_some()) {
        if leaders.contains_key(&t.id) {
            c.propose(Command::Started { tablet: t.id }).await?;
        }
    }
    let nodes = c.placement_nodes(&s, now);
    let replication = cell.replication as usize;
    // New tablets.
    let unplaced: Vec<u64> = s
        .tablets
        .values()
        .filter(|t| t.voters.is_empty())
        .map(|t| t.id)
        .collect();
    if !unplaced.is_empty() {
        let tablets = Controller::tablet_infos(&s, &leaders);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        match cluster.place_new(unplaced.len()) {
            Ok(sets) => {
                let list = unplaced.into_iter().zip(sets).collect();
                c.propose(Command::Place(list)).await?;
            }
            Err(e) => tracing::debug!(error = %e, "tablets wait for nodes"),
        }
    }
    // Open intents: finish what the groups report done, give up what
    // cannot finish.
    let pending: Vec<&IntentRec> = s
        .intents
        .values()
        .filter(|i| i.state == IntentState::Pending)
        .collect();
    let mut open = pending.len();
    let ages: HashMap<u64, Duration> = {
        let mut h = c.health.lock().expect("lock poisoned");
        h.intent_seen
            .retain(|id, _| pending.iter().any(|i| i.id == *id));
        pending
            .iter()
            .map(|i| {
                (
                    i.id,
                    now.duration_since(*h.intent_seen.entry(i.id).or_insert(now)),
                )
            })
            .collect()
    };
    for i in &pending {
        let age = ages.get(&i.id).copied().unwrap_or_default();
        let Some(t) = s.tablets.get(&i.tablet) else {
            continue;
        };
        let report = leaders.get(&t.id);
        match &i.kind {
            IntentKind::Move {
                to, new_replica, ..
            } => {
                let desired: BTreeSet<u64> = t.voters.iter().map(|r| r.replica_id).collect();
                let Some(r) = report else { continue };
                let voters: BTreeSet<u64> = r.voters.iter().copied().collect();
                let learners_ok = r.learners.iter().all(|l| desired.contains(l));
                if voters == desired && !r.joint && learners_ok {
                    c.propose(Command::FinishMove { intent: i.id }).await?;
                    open -= 1;
                    continue;
                }
                // Once the group's voters changed, the move only goes
                // forward: it is never rolled back.
                let started = voters.contains(new_replica) || r.joint;
                let reason = if s.nodes.get(to).is_none_or(|n| n.dead) {
                    Some(format!("target node {to} died before the change"))
                } else if age > c.opts.intent_timeout {
                    Some(format!(
                        "the group did not take its new voter within {:?}",
                        c.opts.intent_timeout
                    ))
                } else {
                    None
                };
                if let (Some(reason), false) = (reason, started) {
                    tracing::warn!(intent = i.id, tablet = t.id, %reason, "move given up");
                    c.propose(Command::FailIntent {
                        intent: i.id,
                        reason,
                    })
                    .await?;
                    open -= 1;
                }
            }
            IntentKind::Split {
                child, generation, ..
            } => {
                let (child_seen, applied) = c.split_progress(t.id, *child, *generation);
                if child_seen {
                    tracing::info!(
                        intent = i.id,
                        tablet = t.id,
                        child,
                        "split: child reported; publishing routes"
                    );
                    c.propose(Command::FinishSplit { intent: i.id }).await?;
                    open -= 1;
                } else if !applied && age > c.opts.intent_timeout {
                    let reason = format!(
                        "the group did not apply the split within {:?}",
                        c.opts.intent_timeout
                    );
                    tracing::warn!(intent = i.id, tablet = t.id, %reason, "split given up");
                    c.propose(Command::FailIntent {
                        intent: i.id,
                        reason,
                    })
                    .await?;
                    open -= 1;
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
                    continue;
                };
                let in_phase = c.merge_phase_age(i.id, *phase);
                let step = |to| Command::MergeStep { intent: i.id, to };
                let fail = |reason: String| Command::FailIntent {
                    intent: i.id,
                    reason,
                };
                match phase {
                    MergePhase::Colocate => match a.leaving {
                        Some(_) => {
                            let Some(r) = leaders.get(absorbed) else {
                                continue;
                            };
                            let desired: BTreeSet<u64> =
                                a.voters.iter().map(|r| r.replica_id).collect();
                            let voters: BTreeSet<u64> = r.voters.iter().copied().collect();
                            let learners_ok = r.learners.iter().all(|l| desired.contains(l));
                            let started = voters.contains(moving) || r.joint;
                            let target_dead = s.nodes.get(&node_of(*moving)).is_none_or(|n| n.dead);
                            if voters == desired && !r.joint && learners_ok {
                                c.propose(step(MergeStep::Moved)).await?;
                            } else if !started && (target_dead || in_phase > c.opts.intent_timeout)
                            {
                                let reason = format!(
                                    "merge: tablet {absorbed} did not take its new voter on node {}",
                                    node_of(*moving)
                                );
                                tracing::warn!(intent = i.id, %reason, "merge given up");
                                c.propose(fail(reason)).await?;
                                open -= 1;
                            }
                        }
                        None if s.colocating_move(t.id, *absorbed).is_some() => {
                            tracing::info!(
                                intent = i.id,
                                tablet = t.id,
                                absorbed,
                                "merge: moving a replica to co-locate"
                            );
                            c.propose(step(MergeStep::Move)).await?;
                        }
                        None => {
                            tracing::info!(
                                intent = i.id,
                                tablet = t.id,
                                absorbed,
                                "merge: co-located; freezing"
                            );
                            c.propose(step(MergeStep::Freeze)).await?;
                        }
                    },
                    MergePhase::Freeze => {
                        let frozen = a.voters.iter().all(|v| {
                            c.replica_report(*absorbed, v.replica_id)
                                .is_some_and(|r| r.frozen)
                        });
                        if frozen {
                            tracing::info!(
                                intent = i.id,
                                tablet = t.id,
                                absorbed,
                                "merge: frozen everywhere; merging"
                            );
                            c.propose(step(MergeStep::Merge)).await?;
                        } else if in_phase > c.opts.intent_timeout {
                            let reason = format!(
                                "tablet {absorbed} did not freeze on every voter within {:?}",
                                c.opts.intent_timeout
                            );
                            tracing::warn!(intent = i.id, %reason, "merge given up");
                            c.propose(fail(reason)).await?;
                            open -= 1;
                        }
                    }
                    MergePhase::Merge => {
                        if report.is_some_and(|r| r.published_generation >= *generation) {
                            tracing::info!(
                                intent = i.id,
                                tablet = t.id,
                                absorbed,
                                "merge: published; publishing routes"
                            );
                            c.propose(Command::FinishMerge { intent: i.id }).await?;
                            open -= 1;
                        }
                    }
                }
            }
            IntentKind::TransferLeader { to } => {
                if report.is_some_and(|r| r.replica_id == t.leader_replica) {
                    c.propose(Command::FinishTransfer { intent: i.id }).await?;
                    open -= 1;
                } else if age > c.opts.intent_timeout / 10 {
                    c.propose(Command::FailIntent {
                        intent: i.id,
                        reason: format!("node {to} did not take the leadership"),
                    })
                    .await?;
                    open -= 1;
                }
            }
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
            && c.split_progress(i.tablet, *child, *generation).0
        {
            tracing::warn!(
                intent = i.id,
                child,
                "a given-up split was applied; completing it"
            );
            c.propose(Command::FinishSplit { intent: i.id }).await?;
        }
    }
    // Automatic splits: a tablet over a mark for a whole window, past its
    // cooldown, with nothing else open on it.
    let mut auto = Vec::new();
    {
        let mut h = c.health.lock().expect("lock poisoned");
        let at = h.epoch.get_or_insert_with(Instant::now).elapsed();
        h.loads.retain(|id, _| s.tablets.contains_key(id));
        for t in s.tablets.values() {
            let entry = h
                .loads
                .entry(t.id)
                .or_insert_with(|| ((t.lo, t.hi), Default::default()));
            if entry.0 != (t.lo, t.hi) {
                // Split (or first seen): the cooldown starts now.
                *entry = ((t.lo, t.hi), Default::default());
            }
            if entry.1.changed_at.is_none() {
                entry.1.reset(at);
            }
            if t.intent != 0 || t.leaving.is_some() || t.voters.is_empty() {
                continue;
            }
            if let Some(reason) = crate::autosplit::should_split(&entry.1, &c.opts.split, at) {
                auto.push((t.id, reason));
            }
        }
    }
    for (tablet, reason) in auto {
        if open >= c.opts.max_intents {
            break;
        }
        tracing::info!(tablet, %reason, "automatic split");
        match c
            .propose(Command::StartSplit {
                tablet,
                at: 0,
                reason: reason.clone(),
                expect_generation: 0,
            })
            .await?
        {
            Reply::Intent(_) => open += 1,
            Reply::Refused(why) => {
                tracing::debug!(tablet, %why, "automatic split refused")
            }
            Reply::Ok => {}
        }
        // Sampled afresh after the decision, whatever came of it.
        let mut h = c.health.lock().expect("lock poisoned");
        let at = h.epoch.get_or_insert_with(Instant::now).elapsed();
        if let Some((_, load)) = h.loads.get_mut(&tablet) {
            load.reset(at);
        }
    }
    // Automatic merges: adjacent idle tablets whose load together stays
    // under the low marks for a whole window, both past their cooldowns.
    let mut pairs = Vec::new();
    if c.opts.split.merge_below_percent > 0 {
        let h = c.health.lock().expect("lock poisoned");
        let at = h.epoch.map(|e| e.elapsed()).unwrap_or_default();
        let idle = |t: &TabletRec| t.intent == 0 && t.leaving.is_none() && !t.voters.is_empty();
        let mut ordered: Vec<&TabletRec> = s.tablets.values().collect();
        ordered.sort_by_key(|t| t.lo);
        let mut taken = BTreeSet::new();
        for w in ordered.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a.hi != u64::from(b.lo) || !idle(a) || !idle(b) || taken.contains(&a.id) {
                continue;
            }
            let (Some((_, la)), Some((_, lb))) = (h.loads.get(&a.id), h.loads.get(&b.id)) else {
                continue;
            };
            if let Some(reason) = crate::autosplit::should_merge(la, lb, &c.opts.split, at) {
                taken.insert(a.id);
                taken.insert(b.id);
                pairs.push((a.id, b.id, reason));
            }
        }
    }
    for (a, b, reason) in pairs {
        if open >= c.opts.max_intents {
            break;
        }
        tracing::info!(a, b, %reason, "automatic merge");
        match c
            .propose(Command::StartMerge {
                a,
                b,
                reason: reason.clone(),
                expect_generation_a: 0,
                expect_generation_b: 0,
            })
            .await?
        {
            Reply::Intent(_) => open += 1,
            Reply::Refused(why) => tracing::debug!(a, b, %why, "automatic merge refused"),
            Reply::Ok => {}
        }
        let mut h = c.health.lock().expect("lock poisoned");
        let at = h.epoch.get_or_insert_with(Instant::now).elapsed();
        for t in [a, b] {
            if let Some((_, load)) = h.loads.get_mut(&t) {
                load.reset(at);
            }
        }
    }
    // Retired replicas a live node no longer reports are gone.
    {
        let retired: Vec<(u64, crate::state::ReplicaRec)> = s
            .retired
            .iter()
            .flat_map(|(n, set)| set.iter().map(|r| (*n, *r)))
            .collect();
        let gone: Vec<(u64, crate::state::ReplicaRec)> = {
            let h = c.health.lock().expect("lock poisoned");
            retired
                .into_iter()
                .filter(|(n, r)| {
                    h.reports
                        .get(n)
                        .is_some_and(|reps| !reps.iter().any(|x| x.replica_id == r.replica_id))
                })
                .collect()
        };
        for (node, replica) in gone {
            c.propose(Command::Retired { node, replica }).await?;
        }
    }
    // Repair and drain: replace voters on dead (past the grace), draining
    // and decommissioned nodes.
    if open < c.opts.max_intents {
        let tablets = Controller::tablet_infos(&s, &leaders);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        for m in cluster.repair_plan() {
            if open >= c.opts.max_intents {
                break;
            }
            let Some(from) = m.from else { continue };
            let reason = match s.nodes.get(&from) {
                Some(n) if n.dead => "repair",
                Some(n) if n.admin == Admin::Draining => "drain",
                _ => "decommission",
            };
            let r = c
                .propose(Command::StartMove {
                    tablet: m.tablet,
                    from,
                    to: m.to,
                    reason: reason.into(),
                    expect_generation: 0,
                })
                .await?;
            if let Reply::Intent(id) = r {
                tracing::info!(
                    tablet = m.tablet,
                    from,
                    to = m.to,
                    intent = id,
                    reason,
                    "move started"
                );
                open += 1;
            }
        }
    }
    // Leader balance: a few transfers at a time, every so often, and only
    // while nothing else is moving.
    let due = !c.opts.leader_balance_every.is_zero() && {
        let mut h = c.health.lock().expect("lock poisoned");
        let due = h
            .last_leader_balance
            .is_none_or(|t| now.duration_since(t) >= c.opts.leader_balance_every);
        if due {
            h.last_leader_balance = Some(now);
        }
        due
    };
    if due && open == 0 {
        let tablets = Controller::tablet_infos(&s, &leaders);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        for tr in cluster.leader_plan(0.10).into_iter().take(4) {
            tracing::info!(
                tablet = tr.tablet,
                from = tr.from,
                to = tr.to,
                "leader balance"
            );
            c.propose(Command::TransferLeader {
                tablet: tr.tablet,
                to: tr.to,
                reason: "balance".into(),
            })
            .await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- API

pub struct Api(Arc<Controller>);

#[tonic::async_trait]
impl pb::controller_server::Controller for Api {
    async fn init(
        &self,
        request: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        let req = request.into_inner();
        let c = &self.0;
        if req.controllers.is_empty() {
            return Err(refuse("controllers", "name at least this controller"));
        }
        if !req.controllers.iter().any(|p| p.id == c.opts.id) {
            return Err(refuse(
                "controllers",
                format!("this controller ({}) is not in the list", c.opts.id),
            ));
        }
        let members = req
            .controllers
            .iter()
            .map(|p| (p.id, p.endpoint.clone()))
            .collect();
        c.quorum.initialize(&members).await.map_err(quorum_status)?;
        c.quorum
            .wait_leader(Duration::from_secs(15))
            .await
            .map_err(quorum_status)?;
        let existed = c.snapshot().cell.is_some();
        let cfg = CellConfig {
            cell_id: if req.cell_id.is_empty() {
                "cell".into()
            } else {
                req.cell_id
            },
            replication: req.replication,
            tablets: req.tablets,
        };
        match c.propose(Command::Init(cfg)).await? {
            Reply::Refused(reason) => Err(refuse("init", reason)),
            _ => Ok(Response::new(pb::InitResponse { created: !existed })),
        }
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let c = &self.0;
        let req = request.into_inner();
        let Some(reg) = req.node else {
            return Err(refuse("node", "missing registration"));
        };
        if reg.id == 0 || reg.id >= 1 << 16 {
            return Err(refuse("node.id", "node ids are 1..65535"));
        }
        if reg.client_endpoint.is_empty() || reg.peer_endpoint.is_empty() {
            return Err(refuse("node", "client and peer endpoints are required"));
        }
        c.require_leader()?;
        {
            let mut h = c.health.lock().expect("lock poisoned");
            h.seen.insert(reg.id, Instant::now());
            let at = h.epoch.get_or_insert_with(Instant::now).elapsed();
            for r in req.replicas.iter().filter(|r| r.leader) {
                let sample = crate::autosplit::LoadSample {
                    at,
                    segment_bytes: r.segment_bytes,
                    records_applied: r.records_applied,
                    reads_served: r.reads_served,
                };
                if let Some((_, load)) = h.loads.get_mut(&r.tablet) {
                    load.push(sample, c.opts.split.window);
                }
            }
            h.reports.insert(reg.id, req.replicas);
            h.dead_since.remove(&reg.id);
        }
        let rec = NodeRec {
            id: reg.id,
            client_endpoint: reg.client_endpoint,
            peer_endpoint: reg.peer_endpoint,
            zone: reg.zone,
            rack: reg.rack,
            capacity: reg.capacity.max(1),
            admin: Admin::Active,
            dead: false,
        };
        let known = c.quorum.state().nodes.get(&rec.id).cloned();
        let changed = match &known {
            None => true,
            Some(k) => {
                k.dead
                    || k.client_endpoint != rec.client_endpoint
                    || k.peer_endpoint != rec.peer_endpoint
                    || k.zone != rec.zone
                    || k.rack != rec.rack
                    || k.capacity != rec.capacity
            }
        };
        if changed {
            if known.as_ref().is_some_and(|k| k.dead) {
                tracing::info!(node = rec.id, "node is back");
            }
            c.propose(Command::Register(rec.clone())).await?;
        }
        let s = c.quorum.state();
        let node = rec.id;
        let mut assignments = Vec::new();
        for t in s.tablets.values() {
            let Some(r) = s.replica_on(t, node) else {
                continue;
            };
            let split = s
                .intents
                .get(&t.intent)
                .filter(|i| i.state == IntentState::Pending)
                .and_then(|i| match &i.kind {
                    IntentKind::Split {
                        at,
                        child,
                        child_replicas,
                        generation,
                        ..
                    } => Some(pb::SplitOrder {
                        at: *at,
                        child: *child,
                        child_replicas: child_replicas
                            .iter()
                            .map(|r| pb::ReplicaRef {
                                replica_id: r.replica_id,
                                node: r.node,
                            })
                            .collect(),
                        generation: *generation,
                    }),
                    _ => None,
                });
            let merge = merge_order(&s, t, c.replica_report(t.id, r.replica_id).as_ref());
            assignments.push(pb::Assignment {
                tablet: t.id,
                replica_id: r.replica_id,
                vshard_lo: t.lo,
                vshard_hi: t.hi,
                range_generation: t.range_generation,
                voters: t
                    .voters
                    .iter()
                    .map(|v| pb::ReplicaRef {
                        replica_id: v.replica_id,
                        node: v.node,
                    })
                    .collect(),
                initialize: t.initializer == Some(r.replica_id),
                leader_replica: t.leader_replica,
                split,
                merge,
            });
        }
        let retire = s
            .retired
            .get(&node)
            .map(|set| {
                set.iter()
                    .map(|r| pb::ReplicaRef {
                        replica_id: r.replica_id,
                        node: r.node,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let peers = s
            .nodes
            .values()
            .filter(|n| n.admin != Admin::Decommissioned)
            .map(|n| pb::PeerAddress {
                node: n.id,
                peer_endpoint: n.peer_endpoint.clone(),
                client_endpoint: n.client_endpoint.clone(),
            })
            .collect();
        let node_state = s
            .nodes
            .get(&node)
            .map_or("up", |n| node_state_name(n.placement_state()));
        Ok(Response::new(pb::HeartbeatResponse {
            node_state: node_state.into(),
            assignments,
            retire,
            peers,
            lease_ms: c.opts.lease.as_millis() as u64,
        }))
    }

    async fn get_routes(
        &self,
        request: Request<pb::GetRoutesRequest>,
    ) -> Result<Response<pb::GetRoutesResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let since = request.into_inner().since_generation;
        let leaders = c.leaders();
        let s = c.quorum.state();
        let full = since == 0 || since > s.route_generation;
        let tablets = s
            .tablets
            .values()
            .filter(|t| !t.voters.is_empty() && (full || t.generation > since))
            .map(|t| Controller::descriptor(&s, t, &leaders))
            .collect();
        Ok(Response::new(pb::GetRoutesResponse {
            generation: s.route_generation,
            tablets,
            removed: Vec::new(),
            full,
        }))
    }

    async fn cell_status(
        &self,
        request: Request<pb::CellStatusRequest>,
    ) -> Result<Response<pb::CellStatusResponse>, Status> {
        let c = &self.0;
        if !request.into_inner().local && c.quorum.leader().is_some() {
            c.require_leader()?;
        }
        let now = Instant::now();
        let s = c.snapshot();
        let nodes = c.placement_nodes(&s, now);
        let up: BTreeSet<u64> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Up)
            .map(|n| n.id)
            .collect();
        let replication = s.cell.as_ref().map_or(0, |c| c.replication);
        let under = s
            .tablets
            .values()
            .filter(|t| {
                !t.voters.is_empty()
                    && t.voters.iter().filter(|r| up.contains(&r.node)).count()
                        < replication as usize
            })
            .count();
        let (leader_id, leader_endpoint) = c.quorum.leader().unwrap_or_default();
        Ok(Response::new(pb::CellStatusResponse {
            controller_id: c.opts.id,
            leader_id,
            leader_endpoint,
            initialized: s.cell.is_some(),
            cell_id: s
                .cell
                .as_ref()
                .map(|c| c.cell_id.clone())
                .unwrap_or_default(),
            replication,
            nodes_up: up.len() as u64,
            nodes_total: s
                .nodes
                .values()
                .filter(|n| n.admin != Admin::Decommissioned)
                .count() as u64,
            tablets: s.tablets.len() as u64,
            route_generation: s.route_generation,
            under_replicated: under as u64,
            intents_open: s
                .intents
                .values()
                .filter(|i| i.state == IntentState::Pending)
                .count() as u64,
            controllers: c
                .quorum
                .members()
                .into_iter()
                .map(|(id, endpoint)| pb::ControllerPeer { id, endpoint })
                .collect(),
            tablets_unplaced: s.tablets.values().filter(|t| t.voters.is_empty()).count() as u64,
        }))
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let now = Instant::now();
        let s = c.snapshot();
        let leaders = c.leaders();
        let states = c.placement_nodes(&s, now);
        let seen = c.health.lock().expect("lock poisoned").seen.clone();
        let nodes = s
            .nodes
            .values()
            .zip(states)
            .map(|(n, p)| {
                let mut state = p.state;
                // Placement keeps a dead node Suspect during its grace;
                // operators see the verdict.
                if n.dead && n.admin != Admin::Decommissioned {
                    state = NodeState::Dead;
                }
                pb::NodeInfo {
                    id: n.id,
                    client_endpoint: n.client_endpoint.clone(),
                    peer_endpoint: n.peer_endpoint.clone(),
                    zone: n.zone.clone(),
                    rack: n.rack.clone(),
                    capacity: n.capacity,
                    state: node_state_name(state).into(),
                    replicas: s
                        .tablets
                        .values()
                        .filter(|t| s.replica_on(t, n.id).is_some())
                        .count() as u64,
                    leaders: leaders
                        .values()
                        .filter(|r| node_of(r.replica_id) == n.id)
                        .count() as u64,
                    heartbeat_age_ms: seen
                        .get(&n.id)
                        .map_or(0, |t| now.duration_since(*t).as_millis() as u64),
                }
            })
            .collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn set_node_state(
        &self,
        request: Request<pb::SetNodeStateRequest>,
    ) -> Result<Response<pb::IntentList>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let admin = match req.state.as_str() {
            "draining" | "drain" => Admin::Draining,
            "decommissioned" | "decommission" => Admin::Decommissioned,
            "active" | "up" => Admin::Active,
            other => {
                return Err(refuse(
                    "state",
                    format!("{other:?} is not one of draining, decommissioned, active"),
                ));
            }
        };
        let s = c.snapshot();
        if !s.nodes.contains_key(&req.node) {
            return Err(refuse(
                "node",
                PlacementError::UnknownNode { node: req.node },
            ));
        }
        if admin != Admin::Active {
            let (nodes, tablets, replication) = c.cluster_view(&s);
            let cluster = Cluster {
                nodes: &nodes,
                tablets: &tablets,
                replication,
            };
            cluster
                .check_drain(req.node)
                .map_err(|e| refuse("node", e))?;
        }
        match c
            .propose(Command::SetAdmin {
                node: req.node,
                admin,
            })
            .await?
        {
            Reply::Refused(r) => Err(refuse("node", r)),
            _ => Ok(Response::new(pb::IntentList {
                intents: Vec::new(),
            })),
        }
    }

    async fn list_cell_tablets(
        &self,
        request: Request<pb::ListCellTabletsRequest>,
    ) -> Result<Response<pb::ListCellTabletsResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let only = request.into_inner().tablet;
        let leaders = c.leaders();
        let s = c.quorum.state();
        if let Some(id) = only
            && !s.tablets.contains_key(&id)
        {
            return Err(stele_proto::Error::TabletNotFound { tablet: id }.into());
        }
        let tablets = s
            .tablets
            .values()
            .filter(|t| only.is_none_or(|id| id == t.id))
            .map(|t| {
                let mut replicas: Vec<pb::ReplicaInfo> = t
                    .voters
                    .iter()
                    .map(|r| pb::ReplicaInfo {
                        replica_id: r.replica_id,
                        node: r.node,
                        role: "voter".into(),
                    })
                    .collect();
                if let Some(l) = t.leaving {
                    replicas.push(pb::ReplicaInfo {
                        replica_id: l.replica_id,
                        node: l.node,
                        role: "leaving".into(),
                    });
                }
                pb::CellTablet {
                    id: t.id,
                    vshard_lo: t.lo,
                    vshard_hi: t.hi,
                    generation: t.generation,
                    replicas,
                    leader_node: leaders.get(&t.id).map_or(0, |r| node_of(r.replica_id)),
                    intent: t.intent,
                    last_change: last_change(&s, t.id).map(intent_pb),
                }
            })
            .collect();
        Ok(Response::new(pb::ListCellTabletsResponse { tablets }))
    }

    async fn move_tablet(
        &self,
        request: Request<pb::MoveTabletRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        let (nodes, tablets, replication) = c.cluster_view(&s);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        cluster
            .check_move(req.tablet, req.from, req.to)
            .map_err(|e| refuse("move", e))?;
        let reply = c
            .propose(Command::StartMove {
                tablet: req.tablet,
                from: req.from,
                to: req.to,
                reason: "operator".into(),
                expect_generation: req.expect_generation,
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        if c.quorum
            .state()
            .nodes
            .get(&req.to)
            .is_none_or(|n| n.placement_state() != NodeState::Up)
        {
            return Err(refuse("to", format!("node {} is not an up node", req.to)));
        }
        let reply = c
            .propose(Command::TransferLeader {
                tablet: req.tablet,
                to: req.to,
                reason: "operator".into(),
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn split_tablet(
        &self,
        request: Request<pb::SplitTabletRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        if let Some(why) = s.split_refusal(req.tablet, req.expect_generation) {
            return Err(refuse("tablet", why));
        }
        let t = &s.tablets[&req.tablet];
        let at = CellState::split_point(t, req.at).map_err(|e| refuse("at", e))?;
        if req.dry_run {
            // The plan as StartSplit would record it, recorded nowhere.
            let mut plan = s.clone();
            let reply = plan.apply(Command::StartSplit {
                tablet: req.tablet,
                at,
                reason: "operator (dry run)".into(),
                expect_generation: req.expect_generation,
            });
            return match reply {
                Reply::Intent(id) => {
                    let mut i = intent_pb(&plan.intents[&id]);
                    i.id = 0;
                    i.state = "plan".into();
                    Ok(Response::new(i))
                }
                Reply::Refused(r) => Err(refuse("tablet", r)),
                Reply::Ok => Err(Status::internal("no plan")),
            };
        }
        let reply = c
            .propose(Command::StartSplit {
                tablet: req.tablet,
                at,
                reason: "operator".into(),
                expect_generation: req.expect_generation,
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn merge_tablets(
        &self,
        request: Request<pb::MergeTabletsRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        s.merge_refusal(
            req.a,
            req.b,
            req.expect_generation_a,
            req.expect_generation_b,
        )
        .map_err(|why| refuse("tablet", why))?;
        let cmd = Command::StartMerge {
            a: req.a,
            b: req.b,
            reason: if req.dry_run {
                "operator (dry run)".into()
            } else {
                "operator".into()
            },
            expect_generation_a: req.expect_generation_a,
            expect_generation_b: req.expect_generation_b,
        };
        if req.dry_run {
            let mut plan = s.clone();
            return match plan.apply(cmd) {
                Reply::Intent(id) => {
                    let mut i = intent_pb(&plan.intents[&id]);
                    i.id = 0;
                    // The phase it would start in: colocating or freezing.
                    i.detail = std::mem::replace(&mut i.state, "plan".into());
                    Ok(Response::new(i))
                }
                Reply::Refused(r) => Err(refuse("tablet", r)),
                Reply::Ok => Err(Status::internal("no plan")),
            };
        }
        let reply = c.propose(cmd).await?;
        intent_reply(c, reply)
    }

    async fn abort_intent(
        &self,
        request: Request<pb::AbortIntentRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let id = request.into_inner().id;
        let s = c.snapshot();
        let Some(i) = s.intents.get(&id) else {
            return Err(refuse("id", format!("no intent {id}")));
        };
        if i.state != IntentState::Pending {
            return Err(refuse("id", format!("intent {id} has finished")));
        }
        let past = match &i.kind {
            IntentKind::Split {
                child, generation, ..
            } => c.split_progress(i.tablet, *child, *generation).1,
            IntentKind::Move { new_replica, .. } => c
                .leaders()
                .get(&i.tablet)
                .is_some_and(|r| r.voters.contains(new_replica) || r.joint),
            IntentKind::TransferLeader { .. } => false,
            IntentKind::Merge { phase, moving, .. } => {
                *phase == MergePhase::Merge
                    || (*moving != 0
                        && c.leaders()
                            .get(&i.tablet)
                            .is_some_and(|r| r.voters.contains(moving) || r.joint))
            }
        };
        if past {
            return Err(refuse(
                "id",
                format!("intent {id} is past its point of no return; it completes"),
            ));
        }
        c.propose(Command::FailIntent {
            intent: id,
            reason: "aborted by the operator".into(),
        })
        .await?;
        match c.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(Status::internal("intent vanished")),
        }
    }

    async fn get_intent(
        &self,
        request: Request<pb::GetIntentRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let id = request.into_inner().id;
        match self.0.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(refuse("id", format!("no intent {id}"))),
        }
    }
}

/// The merge step `t`'s leader is to propose, if any: freeze the absorbed
/// tablet of a merge in its freeze phase; merge into the survivor of one
/// in its merge phase; unfreeze a tablet that reports itself frozen with
/// no merge going on (a merge given up).
fn merge_order(
    s: &CellState,
    t: &TabletRec,
    report: Option<&pb::ReplicaReport>,
) -> Option<pb::MergeOrder> {
    let merge = s
        .intents
        .get(&t.intent)
        .filter(|i| i.state == IntentState::Pending)
        .and_then(|i| match &i.kind {
            IntentKind::Merge {
                absorbed,
                lo,
                hi,
                generation,
                phase,
                ..
            } => Some((i.tablet, *absorbed, *lo, *hi, *generation, *phase)),
            _ => None,
        });
    match merge {
        Some((_, absorbed, lo, hi, _, MergePhase::Freeze | MergePhase::Merge))
            if absorbed == t.id =>
        {
            Some(pb::MergeOrder {
                action: "freeze".into(),
                absorbed,
                vshard_lo: lo,
                vshard_hi: hi,
                generation: 0,
            })
        }
        Some((survivor, absorbed, lo, hi, generation, MergePhase::Merge)) if survivor == t.id => {
            Some(pb::MergeOrder {
                action: "merge".into(),
                absorbed,
                vshard_lo: lo,
                vshard_hi: hi,
                generation,
            })
        }
        Some(_) => None,
        None if report.is_some_and(|r| r.leader && r.frozen) => Some(pb::MergeOrder {
            action: "unfreeze".into(),
            ..Default::default()
        }),
        None => None,
    }
}

/// The latest split or merge that made or changed `tablet`: one it split
/// (or was split from), or one it survived.
fn last_change(s: &CellState, tablet: u64) -> Option<&IntentRec> {
    s.intents.values().rev().find(|i| match &i.kind {
        IntentKind::Split { child, .. } => i.tablet == tablet || *child == tablet,
        IntentKind::Merge { .. } => i.tablet == tablet,
        _ => false,
    })
}

fn intent_reply(c: &Controller, reply: Reply) -> Result<Response<pb::Intent>, Status> {
    match reply {
        Reply::Intent(id) => match c.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(Status::internal("intent vanished")),
        },
        Reply::Refused(r) => Err(refuse("request", r)),
        Reply::Ok => Err(Status::internal("no intent recorded")),
    }
}
