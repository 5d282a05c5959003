//! A controller process: one member of the cell's controller quorum, its
//! gRPC services ([`crate::api`]), and (while it leads) the health view
//! ([`crate::health`]) and the scheduler's driver ([`crate::driver`]).
//!
//! Health is the leader's soft state: a new leader gives every node a full
//! lease from the moment it took over before declaring anything dead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_quorum::{Error as QuorumError, Quorum, QuorumService, QuorumTiming};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::api::Api;
use crate::error::{Error, Result};
use crate::health::{HealthView, tablet_infos};
use crate::placement::{NodeInfo, TabletInfo};
use crate::scheduler::Policy;
use crate::state::{CellState, Command, Reply, TabletRec, from_cbor, node_of, to_cbor};

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
    /// For `https://` members: the CA and this member's certificate.
    pub tls: Option<stele_tls::ClientTls>,
    /// Back the cell state up to the cell's bucket (`None`: no bucket).
    pub backup: Option<crate::backup::ControlBackup>,
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
            backup: None,
            tls: None,
        }
    }

    /// The scheduler's knobs.
    pub fn policy(&self) -> Policy {
        Policy {
            lease: self.lease,
            repair_grace: self.repair_grace,
            max_intents: self.max_intents,
            intent_timeout: self.intent_timeout,
            leader_balance_every: self.leader_balance_every,
            split: self.split.clone(),
        }
    }
}

pub struct Controller {
    pub opts: ControllerOptions,
    pub quorum: Arc<Quorum<CellState>>,
    health: Mutex<HealthView>,
    /// What each node was told, for delta heartbeats (the leader's soft
    /// state, started afresh in each term).
    book: Mutex<Option<crate::book::Book>>,
    /// Route changes for `WatchRoutes` (the leader's soft state).
    pub(crate) routes: crate::routes_feed::RouteFeed,
    pub(crate) cancel: CancellationToken,
}

impl Controller {
    pub async fn start(opts: ControllerOptions) -> Result<Arc<Controller>, stele_quorum::Error> {
        let quorum = Quorum::open_with(
            &opts.data_dir.join("controller"),
            opts.id,
            CellState::new(),
            &opts.timing,
            opts.tls.clone(),
            stele_tls::Kind::Controller,
        )
        .await?;
        let c = Arc::new(Controller {
            opts,
            quorum: Arc::new(quorum),
            health: Default::default(),
            book: Default::default(),
            routes: Default::default(),
            cancel: CancellationToken::new(),
        });
        tokio::spawn(crate::driver::run(c.clone()));
        tokio::spawn(crate::routes_feed::run(c.clone()));
        if let Some(b) = c.opts.backup.clone() {
            crate::backup::spawn(&c, b);
        }
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

    pub(crate) fn not_leader(&self) -> Status {
        let (leader, endpoint) = match self.quorum.leader() {
            Some((id, ep)) => (Some(id), Some(ep)),
            None => (None, None),
        };
        QuorumError::NotLeader { leader, endpoint }.into()
    }

    pub(crate) fn require_leader(&self) -> Result<(), Status> {
        if self.quorum.is_leader() {
            Ok(())
        } else {
            Err(self.not_leader())
        }
    }

    pub async fn propose(&self, cmd: Command) -> Result<Reply> {
        let bytes = self.quorum.propose(to_cbor(&cmd)).await?;
        from_cbor(&bytes).map_err(Error::Reply)
    }

    /// Proposes `cmds` as one batch ([`Quorum::propose_many`]): each
    /// reply in order, up to and including the first failure.
    pub(crate) async fn propose_many(&self, cmds: Vec<Command>) -> Result<Vec<Result<Reply>>> {
        let bytes = self
            .quorum
            .propose_many(cmds.iter().map(to_cbor).collect())
            .await?;
        Ok(bytes
            .into_iter()
            .map(|r| {
                r.map_err(Error::from)
                    .and_then(|b| from_cbor(&b).map_err(Error::Reply))
            })
            .collect())
    }

    pub(crate) fn snapshot(&self) -> CellState {
        self.quorum.state().clone()
    }

    /// The leader's health view. It is soft state that every writer leaves
    /// consistent between statements, so a panic elsewhere while holding
    /// the lock poisons nothing worth refusing service over.
    pub(crate) fn health(&self) -> MutexGuard<'_, HealthView> {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f`, which may wait for the health view's lock (a scheduler
    /// plan holds it throughout) or walk every tablet, telling a
    /// multi-threaded runtime so: its other tasks (the quorum's Raft
    /// messages above all) move to another thread meanwhile instead of
    /// queueing behind it. At 400 nodes a worker thread blocked on the
    /// lock by each heartbeat starved the quorum into elections
    /// (docs/BENCHMARKS.md, "Controller at full size").
    pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(f)
            }
            _ => f(),
        }
    }

    /// The heartbeat book of `term`: this leader's, or a new one if it
    /// was another term's.
    pub(crate) fn book(&self, term: u64) -> MutexGuard<'_, Option<crate::book::Book>> {
        let mut b = self.book.lock().unwrap_or_else(|e| {
            // A refresh that panicked may have filed half a change: start
            // over past every generation the old book gave out.
            let mut b = e.into_inner();
            *b = b.as_ref().map(crate::book::Book::after);
            self.book.clear_poison();
            b
        });
        if b.as_ref().map(|b| b.term()) != Some(term) {
            *b = Some(crate::book::Book::new(term));
        }
        b
    }

    /// The nodes as placement sees them at `now`.
    pub(crate) fn placement_nodes(&self, s: &CellState, now: Instant) -> Vec<NodeInfo> {
        self.health()
            .placement_nodes(s, now, self.opts.lease, self.opts.repair_grace)
    }

    /// The replica of each tablet that leads, from the latest reports.
    pub(crate) fn leaders(&self) -> HashMap<u64, pb::ReplicaReport> {
        self.health().leaders()
    }

    /// Nodes and tablets as placement sees them now, with the cell's
    /// replication factor.
    pub(crate) fn cluster_view(&self, s: &CellState) -> (Vec<NodeInfo>, Vec<TabletInfo>, usize) {
        let nodes = self.placement_nodes(s, Instant::now());
        let tablets = tablet_infos(s, &self.leaders());
        let replication = s.cell.as_ref().map_or(3, |c| c.replication as usize);
        (nodes, tablets, replication)
    }

    pub(crate) fn descriptor(
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
