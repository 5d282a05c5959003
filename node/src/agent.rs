//! The node's side of the control plane: registers with the cell
//! controller, renews its health lease every second with a report of its
//! replicas, and carries out what the reply says: create the replicas
//! assigned here, delete the ones retired, learn peer addresses, and (where
//! this node leads a tablet) move the group toward its desired voters and
//! leader.
//!
//! The data path never waits on any of this.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stele_client::admin::Admin;
use stele_proto::addr::HostPort;
use stele_proto::pb;

use crate::endpoints::Endpoints;
use crate::raft::membership::{self, Step};
use crate::replicas::{ReplicaSet, ReplicaSpec};

#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// gRPC endpoints of the controllers (any one; the leader is found).
    pub controllers: Vec<String>,
    pub client_endpoint: String,
    pub peer_endpoint: String,
    pub zone: String,
    pub rack: String,
    pub capacity: u32,
    /// Heartbeat period (the lease renew interval).
    pub interval: Duration,
    /// How long a leader waits for a new learner to catch up per attempt,
    /// and at most for any other membership step or leadership transfer.
    pub catch_up: Duration,
    /// For `https://` controllers: the cell CA and this node's certificate
    /// (the controllers take heartbeats only from it).
    pub tls: Option<stele_tls::ClientTls>,
}

/// Sets a peer node's QUIC `HOST:PORT` (the transport, when there is one).
pub type SetPeer = Arc<dyn Fn(u64, HostPort) + Send + Sync>;

/// Counters of the agent, for status and tests.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub heartbeats_ok: std::sync::atomic::AtomicU64,
    pub heartbeats_failed: std::sync::atomic::AtomicU64,
    pub replicas_created: std::sync::atomic::AtomicU64,
    pub replicas_removed: std::sync::atomic::AtomicU64,
    pub membership_changes: std::sync::atomic::AtomicU64,
    /// Delta heartbeats the controller could not take (sent again in full).
    pub heartbeat_resyncs: std::sync::atomic::AtomicU64,
}

/// Longest single heartbeat call (also sent as the gRPC deadline).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a connection to a controller.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the agent acts on: the node's replicas (it creates and removes
/// them) and its address book (it learns the other nodes' endpoints).
pub struct AgentHandles {
    pub replicas: ReplicaSet,
    pub endpoints: Arc<Endpoints>,
    /// The cell's token keys, as heartbeat answers bring them.
    pub tokens: Arc<stele_tls::token::Keyring>,
    /// The node's data calls since the last heartbeat, reported in it.
    pub load: Arc<crate::load::LoadMeter>,
}

pub struct Agent {
    replicas: ReplicaSet,
    endpoints: Arc<Endpoints>,
    tokens: Arc<stele_tls::token::Keyring>,
    load: Arc<crate::load::LoadMeter>,
    opts: AgentOptions,
    /// The controllers, leader followed; `None` when none are configured
    /// or their endpoints are unusable (then no heartbeat is sent).
    controllers: Option<Admin>,
    set_peer: Option<SetPeer>,
    /// Tablets with a reconcile task running.
    busy: Arc<Mutex<HashSet<u64>>>,
    /// The reports the controller holds and the assignments it gave.
    sync: Mutex<crate::agent_sync::HeartbeatState>,
    /// Peer addresses already handed to the transport.
    known_peers: Mutex<std::collections::HashMap<u64, HostPort>>,
    pub stats: Arc<AgentStats>,
}

impl Agent {
    pub fn new(
        node: impl Into<AgentHandles>,
        opts: AgentOptions,
        set_peer: Option<SetPeer>,
    ) -> Agent {
        let AgentHandles {
            replicas,
            endpoints,
            tokens,
            load,
        } = node.into();
        Agent {
            replicas,
            endpoints,
            tokens,
            load,
            controllers: controllers(&opts.controllers, opts.tls.clone()),
            opts,
            set_peer,
            busy: Default::default(),
            sync: Default::default(),
            known_peers: Default::default(),
            stats: Default::default(),
        }
    }

    /// Runs until the node shuts down. Each heartbeat tries the controllers
    /// in one pass (the one that answered last first, then any leader a
    /// controller names, then the others); the next heartbeat is the retry.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.opts.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.replicas.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(controllers) = &self.controllers else {
                continue;
            };
            // A delta the controller could not take is sent again in full
            // at once (a new leader, a lost answer).
            for _ in 0..2 {
                let req = self.heartbeat_request();
                let reply = controllers
                    .call(|mut c| {
                        let mut request = tonic::Request::new(req.clone());
                        request.set_timeout(HEARTBEAT_TIMEOUT);
                        async move { c.heartbeat(request).await }
                    })
                    .await;
                match reply {
                    Ok(r) => {
                        let taken = self.sync.lock().expect("lock poisoned").answer(&r);
                        let delta_reports = req.report_base != 0;
                        if taken == crate::agent_sync::Taken::Resync {
                            crate::metrics::record_heartbeat("resync", delta_reports);
                            self.stats.heartbeat_resyncs.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let answer = match &r.sync {
                            Some(s) if s.delta => "delta",
                            _ => "full",
                        };
                        crate::metrics::record_heartbeat(answer, delta_reports);
                        self.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed);
                        self.apply(r).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "heartbeat failed");
                        self.stats.heartbeats_failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                break;
            }
        }
    }

    fn heartbeat_request(&self) -> pb::HeartbeatRequest {
        let replicas: Vec<pb::ReplicaReport> = self
            .replicas
            .replicas()
            .iter()
            .map(|r| {
                let v = membership::view(&r.raft);
                pb::ReplicaReport {
                    tablet: r.tablet.id,
                    replica_id: r.replica_id,
                    leader: v.leader == Some(r.replica_id),
                    term: v.term,
                    applied_index: v.applied,
                    voters: v.voters.into_iter().collect(),
                    learners: v.learners.into_iter().collect(),
                    joint: v.joint,
                    range_generation: r.tablet.generation(),
                    segment_bytes: r.tablet.read_bytes(),
                    records_applied: r.tablet.stats.records_applied.load(Ordering::Relaxed),
                    reads_served: r.tablet.stats.reads_served.load(Ordering::Relaxed),
                    frozen: r.tablet.is_frozen() && {
                        let d = r.tablet.read();
                        d.published.frozen && d.frozen.is_empty()
                    },
                    published_generation: r.tablet.read().published.generation,
                }
            })
            .collect();
        let mut req = pb::HeartbeatRequest {
            node: Some(pb::NodeRegistration {
                id: self.replicas.node_id(),
                client_endpoint: self.opts.client_endpoint.clone(),
                peer_endpoint: self.opts.peer_endpoint.clone(),
                zone: self.opts.zone.clone(),
                rack: self.opts.rack.clone(),
                capacity: self.opts.capacity,
                version: stele_proto::formats::binary_version().into(),
                formats: stele_proto::formats::supported_pb(),
            }),
            token_epoch: self.tokens.epoch(),
            load: Some(self.load.take()),
            ..Default::default()
        };
        self.sync
            .lock()
            .expect("lock poisoned")
            .request(replicas, &mut req);
        req
    }

    async fn apply(&self, r: pb::HeartbeatResponse) {
        let me = self.replicas.node_id();
        if let Some(t) = &r.tokens {
            self.tokens.set(
                t.epoch,
                t.keys.iter().map(|k| (k.id, k.public_key.clone())),
                t.revoked.iter().cloned(),
            );
            tracing::debug!(
                epoch = t.epoch,
                keys = t.keys.len(),
                revoked = t.revoked.len(),
                "token keys from the controller"
            );
        }
        let segment = stele_proto::formats::version_of(&r.formats, stele_proto::formats::SEGMENT);
        if let Err(e) = self.replicas.set_segment_format(segment) {
            tracing::error!(error = %e, "the cell's segment format is one this build cannot write");
        }
        let log = stele_proto::formats::version_of(&r.formats, stele_proto::formats::LOG);
        if let Err(e) = self.replicas.set_log_format(log) {
            tracing::error!(error = %e, "the cell's log format is one this build cannot write");
        }
        if let Some(set) = &self.set_peer {
            let mut known = self.known_peers.lock().expect("lock poisoned");
            let (new, bad) = peer_changes(me, &r.peers, &known);
            for (node, endpoint, error) in bad {
                self.endpoints.count_bad_peer_endpoint();
                tracing::warn!(node, endpoint, %error, "peer endpoint from the controller cannot be dialled; ignored");
            }
            for (node, addr) in new {
                known.insert(node, addr.clone());
                set(node, addr);
            }
        }
        self.endpoints.learn(
            r.peers
                .iter()
                .filter(|p| p.node != me)
                .map(|p| (p.node, p.client_endpoint.clone())),
        );
        let assignments = self.sync.lock().expect("lock poisoned").assignments();
        // A replica this answer retires is never created from an
        // assignment (one held from an earlier answer may lag the retire
        // list): created, it would outlive its retirement.
        let retiring: BTreeSet<u64> = r
            .retire
            .iter()
            .filter(|rr| rr.node == me)
            .map(|rr| rr.replica_id)
            .collect();
        for a in assignments
            .iter()
            .filter(|a| !retiring.contains(&a.replica_id))
        {
            let spec = ReplicaSpec {
                tablet: a.tablet,
                replica_id: a.replica_id,
                vshard_lo: a.vshard_lo,
                vshard_hi: a.vshard_hi,
                range_generation: a.range_generation,
            };
            let voters: Vec<u64> = a.voters.iter().map(|v| v.replica_id).collect();
            let replica = match self.replicas.replica(a.tablet) {
                Some(r) if r.replica_id == a.replica_id => r,
                Some(r) => {
                    tracing::warn!(
                        tablet = a.tablet,
                        here = r.replica_id,
                        assigned = a.replica_id,
                        "assigned a different replica of a tablet this node holds; waiting for its retirement"
                    );
                    continue;
                }
                None => {
                    let init = a.initialize.then_some(voters.as_slice());
                    match self.replicas.create_replica(&spec, init).await {
                        Ok(r) => {
                            self.stats
                                .replicas_created
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            r
                        }
                        Err(e) => {
                            tracing::warn!(tablet = a.tablet, error = %e, "cannot create assigned replica");
                            continue;
                        }
                    }
                }
            };
            if !replica.is_leader() {
                continue;
            }
            if let Some(order) = &a.split {
                self.propose_split(&replica, order);
            }
            if let Some(order) = &a.merge {
                self.propose_merge(&replica, order);
            }
            let desired: BTreeSet<u64> = voters.iter().copied().collect();
            let v = membership::view(&replica.raft);
            let leader_ok = a.leader_replica == 0 || a.leader_replica == replica.replica_id;
            if !v.joint
                && v.voters == desired
                && v.learners.is_subset(&desired)
                && (leader_ok || !desired.contains(&a.leader_replica))
            {
                continue;
            }
            if !self.busy.lock().expect("lock poisoned").insert(a.tablet) {
                continue;
            }
            let busy = self.busy.clone();
            let stats = self.stats.clone();
            let want = a.leader_replica;
            let catch_up = self.opts.catch_up;
            let tablet = a.tablet;
            tokio::spawn(async move {
                // A group that sleeps has a leader without a lease: every
                // change below would be refused until something woke it,
                // and a tablet nobody writes to is never woken otherwise.
                if let Err(e) = replica.wake().await {
                    tracing::debug!(tablet, error = %e, "wake before a membership change");
                }
                let result = membership::reconcile(
                    &replica.raft,
                    replica.replica_id,
                    &desired,
                    want,
                    catch_up,
                )
                .await;
                match result {
                    Ok(Step::ChangedVoters) | Ok(Step::RemovedLearners) => {
                        stats
                            .membership_changes
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!(tablet, ?desired, "membership changed");
                    }
                    Ok(step) => tracing::debug!(tablet, ?step, "reconcile"),
                    Err(e) => {
                        tracing::warn!(tablet, error = %e, "membership change failed; retried on the next heartbeat")
                    }
                }
                busy.lock().expect("lock poisoned").remove(&tablet);
            });
        }
        self.remove_absorbed().await;
        for rr in &r.retire {
            if rr.node != me {
                continue;
            }
            let tablet = self
                .replicas
                .replicas()
                .into_iter()
                .find(|x| x.replica_id == rr.replica_id)
                .map(|x| x.tablet.id);
            if let Some(tablet) = tablet {
                match self.replicas.remove_replica(tablet, rr.replica_id).await {
                    Ok(true) => {
                        self.stats
                            .replicas_removed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(tablet, error = %e, "cannot remove retired replica"),
                }
            }
        }
    }
}

/// A peer endpoint that cannot be dialled: node, endpoint, why.
type BadPeer = (u64, String, stele_proto::addr::Error);

/// What a heartbeat reply's peer list changes for the transport: the
/// peers whose QUIC address is new or moved, and the endpoints that cannot
/// be dialled (node, endpoint, why), which are left out.
fn peer_changes(
    me: u64,
    peers: &[pb::PeerAddress],
    known: &std::collections::HashMap<u64, HostPort>,
) -> (Vec<(u64, HostPort)>, Vec<BadPeer>) {
    let (mut new, mut bad) = (Vec::new(), Vec::new());
    for p in peers.iter().filter(|p| p.node != me) {
        let parsed = p.peer_endpoint.parse::<HostPort>();
        match parsed.and_then(|a| a.dialable().cloned()) {
            Ok(addr) if known.get(&p.node) != Some(&addr) => new.push((p.node, addr)),
            Ok(_) => {}
            Err(e) => bad.push((p.node, p.peer_endpoint.clone(), e)),
        }
    }
    (new, bad)
}

/// The leader-following client of the controllers, bounded for a
/// heartbeat: one pass over them, each attempt `HEARTBEAT_TIMEOUT`, no
/// waiting through an election (the next heartbeat is a second away).
fn controllers(endpoints: &[String], tls: Option<stele_tls::ClientTls>) -> Option<Admin> {
    if endpoints.is_empty() {
        return None;
    }
    match Admin::with_tls(endpoints.to_vec(), tls) {
        Ok(mut c) => {
            c.request_timeout = HEARTBEAT_TIMEOUT;
            c.connect_timeout = CONNECT_TIMEOUT;
            c.rounds_max = 1;
            // Bounded by the one pass, not by time.
            c.deadline = Duration::MAX;
            c.round_pause = Duration::ZERO;
            Some(c)
        }
        Err(e) => {
            tracing::error!(error = %e, "controller endpoints unusable: this node sends no heartbeats");
            None
        }
    }
}

impl Agent {
    /// Proposes the merge step the controller ordered, unless the group
    /// has applied it already or a proposal is in flight.
    fn propose_merge(&self, replica: &Arc<crate::raft::Replica>, order: &pb::MergeOrder) {
        use stele_proto::command::TabletCommand;
        let t = &replica.tablet;
        let cmd = match order.action.as_str() {
            "freeze" if !t.is_frozen() => TabletCommand::Freeze {
                generation: order.generation,
            },
            "unfreeze" if t.is_frozen() => TabletCommand::Unfreeze,
            "merge" => {
                let (lo, hi) = t.range();
                let adjacent = hi == u64::from(order.vshard_lo) || u64::from(lo) == order.vshard_hi;
                if !adjacent || t.is_frozen() {
                    return;
                }
                TabletCommand::Merge {
                    absorbed: order.absorbed,
                    lo: order.vshard_lo,
                    hi: order.vshard_hi,
                    generation: order.generation,
                }
            }
            _ => return,
        };
        let tablet = t.id;
        if !self.busy.lock().expect("lock poisoned").insert(tablet) {
            return;
        }
        let (replica, busy) = (replica.clone(), self.busy.clone());
        tokio::spawn(async move {
            let what = cmd.to_string();
            match replica.propose(cmd).await {
                Ok(_) => tracing::info!(tablet, step = %what, "merge step proposed and applied"),
                Err(e) => {
                    tracing::warn!(tablet, step = %what, error = %e, "merge step not proposed; retried on the next heartbeat")
                }
            }
            busy.lock().expect("lock poisoned").remove(&tablet);
        });
    }

    /// Deletes frozen replicas whose range another replica here has
    /// published as its own at a later generation: the absorbed side of a
    /// merge this node learned by snapshot rather than by applying it.
    async fn remove_absorbed(&self) {
        let replicas = self.replicas.replicas();
        for x in &replicas {
            if !x.tablet.is_frozen() {
                continue;
            }
            let (lo, hi) = x.tablet.range();
            let covered = replicas.iter().any(|y| {
                let p = y.tablet.read().published;
                y.tablet.id != x.tablet.id
                    && !p.frozen
                    && p.lo <= lo
                    && p.hi >= hi
                    && p.generation > x.tablet.generation()
            });
            if covered {
                match self
                    .replicas
                    .remove_replica(x.tablet.id, x.replica_id)
                    .await
                {
                    Ok(true) => tracing::info!(
                        tablet = x.tablet.id,
                        "merged away (learned by snapshot): replica removed"
                    ),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(tablet = x.tablet.id, error = %e, "cannot remove a merged-away replica")
                    }
                }
            }
        }
    }

    /// Proposes the split the controller ordered, unless this group has
    /// applied it (its range no longer reaches past `at`) or a proposal is
    /// in flight. The child's replica on this node (the leader's) comes
    /// first, so it is the one that creates the child group at once.
    fn propose_split(&self, replica: &Arc<crate::raft::Replica>, order: &pb::SplitOrder) {
        let (lo, hi) = replica.tablet.range();
        if order.at <= lo || u64::from(order.at) >= hi {
            return;
        }
        let tablet = replica.tablet.id;
        if !self.busy.lock().expect("lock poisoned").insert(tablet) {
            return;
        }
        let me = self.replicas.node_id();
        let mut child_replicas: Vec<u64> = order
            .child_replicas
            .iter()
            .filter(|r| r.node == me)
            .map(|r| r.replica_id)
            .collect();
        child_replicas.extend(
            order
                .child_replicas
                .iter()
                .filter(|r| r.node != me)
                .map(|r| r.replica_id),
        );
        let cmd = stele_proto::command::TabletCommand::Split {
            at: order.at,
            child: order.child,
            child_replicas,
            generation: order.generation,
        };
        let (replica, busy) = (replica.clone(), self.busy.clone());
        tokio::spawn(async move {
            match replica.propose(cmd).await {
                Ok(_) => tracing::info!(tablet, "split proposed and applied"),
                Err(e) => {
                    tracing::warn!(tablet, error = %e, "split proposal failed; retried on the next heartbeat")
                }
            }
            busy.lock().expect("lock poisoned").remove(&tablet);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node: u64, ep: &str) -> pb::PeerAddress {
        pb::PeerAddress {
            node,
            peer_endpoint: ep.into(),
            client_endpoint: format!("http://n{node}:7450"),
        }
    }

    #[test]
    fn peer_changes_take_names_skip_known_and_report_undialable() {
        let known = std::collections::HashMap::from([(2, "node2:7550".parse().unwrap())]);
        let peers = [
            peer(1, "me:1"),
            peer(2, "node2:7550"),
            peer(3, "node3:7550"),
            peer(4, "[::1]:7550"),
            peer(5, "0.0.0.0:7550"),
            peer(6, "nonsense"),
            peer(7, ""),
        ];
        let (new, bad) = peer_changes(1, &peers, &known);
        let new: Vec<(u64, String)> = new.into_iter().map(|(n, a)| (n, a.to_string())).collect();
        assert_eq!(
            new,
            [(3, "node3:7550".to_string()), (4, "[::1]:7550".to_string())]
        );
        let bad: Vec<u64> = bad.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(bad, [5, 6, 7]);
        // A known peer whose name moved to another port is handed over again.
        let (new, _) = peer_changes(1, &[peer(2, "node2:7551")], &known);
        assert_eq!(new, [(2, "node2:7551".parse().unwrap())]);
    }
}
