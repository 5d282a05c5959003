//! A storage node: one journal, one catalog, many tablet replicas, each an
//! openraft group, plus the seal worker and the seal policy.
//!
//! ```text
//! <data>/FORMAT                node data-dir format (durable_write)
//! <data>/catalog.redb          catalog
//! <data>/journal/<seq>.wal     the node's one journal
//! <data>/segments/<tablet>/    segment files of each tablet
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::async_runtime::watch::WatchReceiver;
use openraft::impls::BasicNode;
use serde::{Deserialize, Serialize};
use stele_proto::command::{SealReason, TabletCommand};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, TabletRecord};
use crate::error::{Error, Result};
use crate::journal::{self, Journal, RecoveredFrame};
use crate::raft::log_store::LogStore;
use crate::raft::network::NoPeers;
use crate::raft::router::{self, GroupNetwork, Peers, Router};
use crate::raft::{RaftTiming, TabletRaft, tablet_config};
use crate::tablet::state_machine::StateMachine;
use crate::tablet::{Tablet, TabletOptions, seal};

/// Data directory format. Startup refuses any other.
pub const DATA_DIR_FORMAT: u32 = 1;

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub data_dir: PathBuf,
    pub node_id: u64,
    /// Tablets to create when the data directory is new.
    pub initial_tablets: u32,
    /// Node ids of the cell (static membership until the controller lands);
    /// every tablet has a voter on each. Just this node for a one-node cell.
    pub cell_nodes: Vec<u64>,
    /// This node's client endpoint, advertised in routes.
    pub advertise: String,
    /// Client endpoints of the other nodes of the cell, for leader hints.
    pub peer_endpoints: BTreeMap<u64, String>,
    pub journal: journal::Options,
    pub tablet: TabletOptions,
    pub raft: RaftTiming,
    /// Seal the largest memtables when all of them together pass this.
    pub memtable_budget_bytes: usize,
    /// Force-seal the tablets holding back journal trim past this size.
    pub journal_retained_bytes_max: u64,
    /// Refuse appends with `StorageFull` when free space falls below this.
    pub disk_reserve_bytes: u64,
    /// How often the seal policy runs.
    pub policy_interval: Duration,
    pub value_bytes_max: usize,
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Nodes whose Raft traffic this node drops (fault injection; empty
    /// unless a test or `STELE_PEER_BLOCK_FILE` sets it).
    pub peer_filter: Arc<crate::peering::PeerFilter>,
    /// The cell controller decides which replicas this node hosts
    /// ([`crate::agent`]): no tablets are created at start-up, and
    /// `initial_tablets`/`cell_nodes` are unused.
    pub controlled: bool,
    /// NEGATIVE CONTROL FOR `jepsen/` ONLY: a leader serves linearizable
    /// reads from its local state without confirming it still leads (no
    /// read index, no lease). A deposed leader then serves stale reads; the
    /// harness must catch them. Set only by `STELE_UNSAFE_LOCAL_READS=1`.
    pub unsafe_local_reads: bool,
    /// Unsafe, jepsen's negative control only: a restarted tablet leader
    /// resumes its term without an election (openraft's leader restore;
    /// `raft::tablet_config` says why that is unsafe). Set only by
    /// `STELE_UNSAFE_LEADER_RESTORE=1`.
    pub unsafe_leader_restore: bool,
    /// The cold tier (object storage), if configured: uploads, eviction and
    /// cold reads (`node::tier`).
    pub tier: Option<Arc<crate::tier::Tier>>,
    /// The global directory and this node's cell id: with it, the node
    /// serves only the namespaces the directory placed on its cell
    /// ([`crate::ownership`]); without it, every namespace.
    pub directory: Option<crate::ownership::DirectoryLink>,
}

impl NodeOptions {
    pub fn new(data_dir: PathBuf) -> NodeOptions {
        NodeOptions {
            journal: journal::Options::new(data_dir.join("journal")),
            data_dir,
            node_id: 1,
            initial_tablets: 16,
            cell_nodes: vec![1],
            advertise: String::new(),
            peer_endpoints: BTreeMap::new(),
            tablet: TabletOptions::default(),
            raft: RaftTiming::default(),
            memtable_budget_bytes: 1 << 30,
            journal_retained_bytes_max: 1 << 30,
            disk_reserve_bytes: 256 << 20,
            policy_interval: Duration::from_millis(250),
            value_bytes_max: stele_proto::limits::VALUE_BYTES_MAX_DEFAULT,
            batch_bytes_max: stele_proto::limits::BATCH_BYTES_MAX_DEFAULT,
            batch_records_max: stele_proto::limits::BATCH_RECORDS_MAX_DEFAULT,
            peer_filter: Default::default(),
            controlled: false,
            unsafe_local_reads: false,
            unsafe_leader_restore: false,
            tier: None,
            directory: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.node_id == 0 || self.node_id >= 1 << router::NODE_BITS {
            return Err(Error::Config("node ids must be 1..65535".into()));
        }
        if !self.controlled && !self.cell_nodes.contains(&self.node_id) {
            return Err(Error::Config(format!(
                "cell_nodes {:?} must include this node ({})",
                self.cell_nodes, self.node_id
            )));
        }
        if self
            .cell_nodes
            .iter()
            .any(|n| *n == 0 || *n >= 1 << router::NODE_BITS)
        {
            return Err(Error::Config("node ids must be 1..65535".into()));
        }
        if self.initial_tablets == 0 || self.initial_tablets > 65_536 {
            return Err(Error::Config("initial_tablets must be 1..=65536".into()));
        }
        if self.disk_reserve_bytes < self.journal.reserve_bytes {
            return Err(Error::Config(
                "disk_reserve_bytes must be at least the journal's reserve, so the node refuses appends before the journal must".into(),
            ));
        }
        self.journal.validate().map_err(Error::from)?;
        // A whole batch is one journal frame; leave room for its encoding.
        let frame_need = self.batch_bytes_max + self.batch_records_max * 64 + 4096;
        if frame_need > self.journal.frame_payload_bytes_max {
            return Err(Error::Config(format!(
                "batch_bytes_max {} (+ encoding) exceeds the journal frame limit {}",
                self.batch_bytes_max, self.journal.frame_payload_bytes_max
            )));
        }
        crate::raft::tablet_config(&self.raft, self.unsafe_leader_restore)?;
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct DataDirFormat {
    magic: String,
    format: u32,
    node_id: u64,
}

/// A hosted tablet replica.
pub struct Replica {
    pub tablet: Arc<Tablet>,
    pub raft: TabletRaft,
    pub replica_id: u64,
    pub log: LogStore,
    /// Last contact from a leader or candidate, for the pacer's campaigns.
    pub contact: crate::raft::pacer::Contact,
}

impl Replica {
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.replica_id)
    }
}

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// Journal frames read back at start-up (the unsealed tail).
    pub replayed_frames: AtomicU64,
    /// Journal frames skipped at start-up (below a purge point).
    pub skipped_frames: AtomicU64,
    /// Segments fetched from peers to install snapshots.
    pub segments_fetched: AtomicU64,
}

/// Starts the openraft instance of one replica: (group, replica id, log,
/// state machine). Hides whether the node has peers.
type RaftFactory = Arc<
    dyn Fn(
            u64,
            u64,
            LogStore,
            StateMachine,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<TabletRaft>> + Send>>
        + Send
        + Sync,
>;

/// A replica the controller asks this node to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSpec {
    pub tablet: u64,
    pub replica_id: u64,
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    pub range_generation: u64,
}

/// The future of one segment fetch: the published file's path.
type FetchFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = router::Result<PathBuf>> + Send + 'a>>;

/// Object-safe access to the peers, for fetching segments.
pub trait SegmentSource: Send + Sync {
    /// Fetches segment `seg` of `group` from `replica` on `node` into `dir`
    /// ([`router::fetch_segment`]).
    fn fetch<'a>(
        &'a self,
        node: u64,
        group: u64,
        replica: u64,
        seg: &'a crate::catalog::SegmentRef,
        dir: &'a Path,
    ) -> FetchFuture<'a>;
}

impl<P: Peers> SegmentSource for P {
    fn fetch<'a>(
        &'a self,
        node: u64,
        group: u64,
        replica: u64,
        seg: &'a crate::catalog::SegmentRef,
        dir: &'a Path,
    ) -> FetchFuture<'a> {
        Box::pin(router::fetch_segment(
            self, node, group, replica, &seg.id, seg.bytes, dir,
        ))
    }
}

pub struct Node {
    pub options: NodeOptions,
    pub journal: Journal,
    pub catalog: Catalog,
    /// Replicas by tablet id (one replica of a tablet per node).
    replicas: std::sync::RwLock<BTreeMap<u64, Arc<Replica>>>,
    raft_factory: RaftFactory,
    seal_tx: mpsc::UnboundedSender<(Arc<Tablet>, u64)>,
    /// Client endpoints of other nodes learned from the controller.
    learned_endpoints: std::sync::RwLock<BTreeMap<u64, String>>,
    /// Serializes replica creation and removal.
    lifecycle: tokio::sync::Mutex<()>,
    pub stats: NodeStats,
    pub pacer_stats: crate::raft::pacer::PacerStats,
    cancel: CancellationToken,
    peers: Option<Arc<dyn SegmentSource>>,
    /// The node-to-node transport's counters, when the node has peers.
    transport: std::sync::OnceLock<Arc<crate::transport::Transport>>,
    /// Background tasks (seal worker, policy), joined on shutdown.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Namespace owners, when the cell is directory-managed.
    ownership: Option<crate::ownership::Ownership>,
    /// The open tablets by id, for merges.
    locals: crate::tablet::Locals,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn check_data_dir(opts: &NodeOptions) -> Result<()> {
    let dir = &opts.data_dir;
    crate::fsutil::create_dir_durable(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let path = dir.join("FORMAT");
    match std::fs::read(&path) {
        Ok(bytes) => {
            let f: DataDirFormat = crate::catalog::from_cbor("data dir FORMAT", &bytes)?;
            if f.magic != "stele" || f.format != DATA_DIR_FORMAT {
                return Err(Error::UnknownVersion {
                    what: format!("data directory {}", dir.display()),
                    found: f.format,
                    supported: DATA_DIR_FORMAT,
                });
            }
            if f.node_id != opts.node_id {
                return Err(Error::Config(format!(
                    "data directory {} belongs to node {}, not {}",
                    dir.display(),
                    f.node_id,
                    opts.node_id
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let f = DataDirFormat {
                magic: "stele".into(),
                format: DATA_DIR_FORMAT,
                node_id: opts.node_id,
            };
            crate::fsutil::durable_write(&path, &crate::catalog::to_cbor(&f))
                .map_err(|e| Error::io(format!("write {}", path.display()), e))
        }
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

impl Node {
    /// Opens (or creates) the node's data directory, recovers the journal,
    /// and starts every tablet's Raft group, the seal worker and the policy.
    pub async fn open(options: NodeOptions) -> Result<Arc<Node>> {
        Node::open_with_peers::<NoTransport>(options, None).await
    }

    /// Opens a node of a multi-node cell: Raft messages to the other nodes of
    /// `options.cell_nodes` go through `peers`.
    pub async fn open_with_peers<P: Peers>(
        options: NodeOptions,
        peers: Option<P>,
    ) -> Result<Arc<Node>> {
        let source: Option<Arc<dyn SegmentSource>> =
            peers.clone().map(|p| Arc::new(p) as Arc<dyn SegmentSource>);
        let router = peers.map(Router::new);
        let config = tablet_config(&options.raft, options.unsafe_leader_restore)?;
        let raft_factory: RaftFactory = match router {
            Some(router) => {
                let config = config.clone();
                Arc::new(move |group, id, log, sm| {
                    let net = GroupNetwork::new(&router, group);
                    let config = config.clone();
                    Box::pin(async move {
                        TabletRaft::new(id, config, net, log, sm)
                            .await
                            .map_err(|e| Error::Config(format!("tablet {group} raft: {e}")))
                    })
                })
            }
            None => {
                let config = config.clone();
                Arc::new(move |group, id, log, sm| {
                    let config = config.clone();
                    Box::pin(async move {
                        TabletRaft::new(id, config, NoPeers, log, sm)
                            .await
                            .map_err(|e| Error::Config(format!("tablet {group} raft: {e}")))
                    })
                })
            }
        };
        let first_node = options
            .cell_nodes
            .iter()
            .copied()
            .min()
            .unwrap_or(options.node_id);
        options.validate()?;
        check_data_dir(&options)?;
        let catalog = Catalog::open(&options.data_dir.join("catalog.redb"))?;
        let (journal, recovery) = Journal::open(options.journal.clone())?;
        if let Some((file, offset)) = &recovery.truncated {
            tracing::warn!(file = %file.display(), offset, "journal: torn final frame truncated");
        }
        let mut records = catalog.tablets()?;
        if records.is_empty() && !options.controlled {
            records = bootstrap(&catalog, options.initial_tablets, options.node_id)?;
        }
        let mut by_tablet: HashMap<u64, Vec<&RecoveredFrame>> = HashMap::new();
        for f in &recovery.frames {
            by_tablet.entry(f.tablet).or_default().push(f);
        }
        let (seal_tx, seal_rx) = mpsc::unbounded_channel();
        let stats = NodeStats::default();
        let mut replicas = BTreeMap::new();
        let cancel = CancellationToken::new();
        let locals = crate::tablet::Locals::new(cancel.clone());
        remove_stray_dirs(&options.data_dir.join("segments"), &records)?;
        // Every tablet is open before any group starts: a merge replayed
        // by one reads the tablet it absorbs.
        let mut opened = Vec::with_capacity(records.len());
        for record in &records {
            let dir = options
                .data_dir
                .join("segments")
                .join(record.id.to_string());
            let tablet = Tablet::open_tiered(
                record,
                dir,
                catalog.clone(),
                options.tablet.clone(),
                options.tier.clone(),
            )?;
            locals.insert(tablet.clone());
            opened.push(tablet);
        }
        for (record, tablet) in records.iter().zip(opened) {
            let frames = by_tablet.remove(&record.id).unwrap_or_default();
            let (log, replay) = LogStore::recover(
                record.id,
                journal.clone(),
                catalog.clone(),
                frames.into_iter(),
            )?;
            stats
                .replayed_frames
                .fetch_add(replay.frames_read, Ordering::Relaxed);
            stats
                .skipped_frames
                .fetch_add(replay.frames_skipped, Ordering::Relaxed);
            let replica_id = record.replica_id;
            let fresh = record.checkpoint == 0 && log.is_empty();
            let sm = StateMachine::new(tablet.clone(), seal_tx.clone(), locals.clone());
            let raft = raft_factory(record.id, replica_id, log.clone(), sm).await?;
            // Exactly one replica initializes a new group: the one on the
            // lowest node id of the cell (static cells; the controller
            // names the initializer of its tablets).
            if fresh && !options.controlled && options.node_id == first_node {
                let members: BTreeMap<u64, BasicNode> = options
                    .cell_nodes
                    .iter()
                    .map(|n| (router::replica_id(record.id, *n), BasicNode::default()))
                    .collect();
                raft.initialize(members)
                    .await
                    .map_err(|e| Error::Config(format!("initialize tablet {}: {e}", record.id)))?;
                // Campaign at once rather than after a timeout; if the
                // other voters are not up yet the pacer tries again.
                let _ = raft.trigger().elect(true).await;
            } else if tablet
                .read()
                .membership
                .membership()
                .voter_ids()
                .eq([replica_id])
                || sole_voter_in_log(&raft, replica_id)
            {
                // A group whose only voter is this replica cannot lose an
                // election: hold it now instead of after the election timeout,
                // so a restarted single-node cell serves at once.
                let _ = raft.trigger().elect(false).await;
            }
            replicas.insert(
                record.id,
                Arc::new(Replica {
                    tablet,
                    raft,
                    replica_id,
                    log,
                    contact: Default::default(),
                }),
            );
        }
        // Frames of tablets this node no longer hosts hold nothing back.
        for tablet in by_tablet.keys() {
            journal.forget_tablet(*tablet);
        }
        let ownership = match &options.directory {
            Some(link) => Some(crate::ownership::Ownership::open(link.clone(), &catalog)?),
            None => None,
        };
        let node = Arc::new(Node {
            ownership,
            options,
            journal,
            catalog,
            replicas: std::sync::RwLock::new(replicas),
            raft_factory,
            seal_tx,
            learned_endpoints: Default::default(),
            lifecycle: Default::default(),
            stats,
            pacer_stats: Default::default(),
            cancel,
            locals,
            peers: source,
            transport: std::sync::OnceLock::new(),
            tasks: Default::default(),
        });
        let mut tasks = vec![
            tokio::spawn(seal_worker(node.clone(), seal_rx)),
            tokio::spawn(policy_loop(node.clone())),
            tokio::spawn(crate::raft::pacer::run(node.clone())),
        ];
        if let Some(tier) = node.options.tier.clone() {
            tasks.push(tokio::spawn(crate::tier::worker::run(node.clone(), tier)));
        }
        *node.tasks.lock().expect("lock poisoned") = tasks;
        Ok(node)
    }

    /// Resolves when the node starts shutting down.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    pub fn replica(&self, tablet: u64) -> Option<Arc<Replica>> {
        self.replicas
            .read()
            .expect("lock poisoned")
            .get(&tablet)
            .cloned()
    }

    /// Every hosted replica, by tablet id (a snapshot of the map).
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas
            .read()
            .expect("lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.read().expect("lock poisoned").len()
    }

    /// The replica whose range holds `vshard`, not counting one frozen for
    /// a merge: the tablet absorbing it may take writes for its range
    /// before it is gone, so it serves no reads.
    pub fn replica_for(&self, vshard: u32) -> Option<Arc<Replica>> {
        self.replicas
            .read()
            .expect("lock poisoned")
            .values()
            .find(|r| r.tablet.contains(vshard) && !r.tablet.is_frozen())
            .cloned()
    }

    /// Creates (or finds) the replica the controller assigned to this node.
    /// With `initialize`, a new, empty replica creates its Raft group with
    /// these voter replica ids; every other replica waits to hear from a
    /// leader. A tombstoned replica id is refused: ids are never reused.
    pub async fn create_replica(
        &self,
        spec: &ReplicaSpec,
        initialize: Option<&[u64]>,
    ) -> Result<Arc<Replica>> {
        let _guard = self.lifecycle.lock().await;
        if let Some(r) = self.replica(spec.tablet) {
            if r.replica_id != spec.replica_id {
                return Err(Error::Config(format!(
                    "tablet {} already has replica {} here, not {}",
                    spec.tablet, r.replica_id, spec.replica_id
                )));
            }
            return Ok(r);
        }
        if self.catalog.is_tombstoned(spec.replica_id)? {
            return Err(Error::Config(format!(
                "replica {} of tablet {} was removed from this node; ids are never reused",
                spec.replica_id, spec.tablet
            )));
        }
        if router::node_of(spec.replica_id) != self.options.node_id {
            return Err(Error::Config(format!(
                "replica {} belongs to node {}, not {}",
                spec.replica_id,
                router::node_of(spec.replica_id),
                self.options.node_id
            )));
        }
        // A split on this node made the replica already (its record names
        // the parent's segments): open that one, never an empty one over it.
        if let Some(record) = self.catalog.tablet(spec.tablet)?
            && record.replica_id == spec.replica_id
        {
            return self.open_created(record).await;
        }
        let record = TabletRecord {
            v: 1,
            id: spec.tablet,
            vshard_lo: spec.vshard_lo,
            vshard_hi: spec.vshard_hi,
            generation: spec.range_generation,
            checkpoint: 0,
            applied_state: Vec::new(),
            segments: Vec::new(),
            replica_id: spec.replica_id,
            init_voters: Vec::new(),
            frozen: false,
        };
        let dir = self
            .options
            .data_dir
            .join("segments")
            .join(spec.tablet.to_string());
        // Files of an earlier replica of the tablet here are not ours.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
        }
        let log = LogStore::create(spec.tablet, self.journal.clone(), self.catalog.clone()).await?;
        self.catalog.put_tablet(&record)?;
        let tablet = Tablet::open_tiered(
            &record,
            dir,
            self.catalog.clone(),
            self.options.tablet.clone(),
            self.options.tier.clone(),
        )?;
        self.locals.insert(tablet.clone());
        let sm = StateMachine::new(tablet.clone(), self.seal_tx.clone(), self.locals.clone());
        let raft = (self.raft_factory)(spec.tablet, spec.replica_id, log.clone(), sm).await?;
        if let Some(voters) = initialize {
            let members: BTreeMap<u64, BasicNode> =
                voters.iter().map(|r| (*r, BasicNode::default())).collect();
            raft.initialize(members)
                .await
                .map_err(|e| Error::Config(format!("initialize tablet {}: {e}", spec.tablet)))?;
            let _ = raft.trigger().elect(true).await;
        }
        let replica = Arc::new(Replica {
            tablet,
            raft,
            replica_id: spec.replica_id,
            log,
            contact: Default::default(),
        });
        self.replicas
            .write()
            .expect("lock poisoned")
            .insert(spec.tablet, replica.clone());
        tracing::info!(
            tablet = spec.tablet,
            replica = spec.replica_id,
            initialize = initialize.is_some(),
            "replica created"
        );
        Ok(replica)
    }

    /// Opens the child replica a split created in the catalog on this node
    /// (nothing if it is open already).
    pub(crate) async fn open_split_child(&self, record: TabletRecord) -> Result<()> {
        let _guard = self.lifecycle.lock().await;
        if self.replica(record.id).is_some() {
            return Ok(());
        }
        self.open_created(record).await.map(|_| ())
    }

    /// Opens a replica whose catalog record exists but that has no journal
    /// frames yet (a split child). Called with the lifecycle lock held.
    async fn open_created(&self, record: TabletRecord) -> Result<Arc<Replica>> {
        let dir = self
            .options
            .data_dir
            .join("segments")
            .join(record.id.to_string());
        let tablet = Tablet::open_tiered(
            &record,
            dir,
            self.catalog.clone(),
            self.options.tablet.clone(),
            self.options.tier.clone(),
        )?;
        let log = LogStore::create(record.id, self.journal.clone(), self.catalog.clone()).await?;
        self.locals.insert(tablet.clone());
        let sm = StateMachine::new(tablet.clone(), self.seal_tx.clone(), self.locals.clone());
        let raft = (self.raft_factory)(record.id, record.replica_id, log.clone(), sm).await?;
        // The child's group exists from its first state on (a membership
        // applied at index 0): the replica on the node that proposed the
        // split campaigns at once, the others wait for it, or time out.
        if record.init_voters.first() == Some(&record.replica_id) {
            let _ = raft.trigger().elect(true).await;
        }
        let replica = Arc::new(Replica {
            tablet,
            raft,
            replica_id: record.replica_id,
            log,
            contact: Default::default(),
        });
        self.replicas
            .write()
            .expect("lock poisoned")
            .insert(record.id, replica.clone());
        Ok(replica)
    }

    /// Removes a replica that was moved away: stops its Raft group, deletes
    /// its catalog rows and segment files, and tombstones its id. Nothing
    /// when this node does not hold that replica.
    pub async fn remove_replica(&self, tablet: u64, replica_id: u64) -> Result<bool> {
        let _guard = self.lifecycle.lock().await;
        let Some(r) = self.replica(tablet) else {
            return Ok(false);
        };
        if r.replica_id != replica_id {
            return Ok(false);
        }
        self.replicas
            .write()
            .expect("lock poisoned")
            .remove(&tablet);
        self.locals.remove(tablet);
        let _ = r.raft.shutdown().await;
        self.catalog.remove_tablet(tablet, replica_id)?;
        self.journal.forget_tablet(tablet);
        let dir = &r.tablet.segment_dir;
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
        }
        tracing::info!(tablet, replica = replica_id, "replica removed");
        Ok(true)
    }

    /// Records the client endpoints of other nodes (from the controller).
    pub fn learn_endpoints(&self, endpoints: impl IntoIterator<Item = (u64, String)>) {
        let mut map = self.learned_endpoints.write().expect("lock poisoned");
        for (node, ep) in endpoints {
            map.insert(node, ep);
        }
    }

    /// Lets status report the transport's counters.
    pub fn set_transport(&self, transport: Arc<crate::transport::Transport>) {
        let _ = self.transport.set(transport);
    }

    /// Ok if this node may serve `namespace`: always, unless the cell is
    /// directory-managed and the directory placed it on another cell
    /// (`WrongCell`) or nowhere (`NamespaceNotFound`).
    pub async fn check_namespace(
        &self,
        namespace: &str,
    ) -> std::result::Result<(), stele_proto::Error> {
        match &self.ownership {
            None => Ok(()),
            Some(o) => o.check(namespace, &self.catalog).await,
        }
    }

    /// The transport's counters, if this node has peers.
    pub fn transport_stats(&self) -> Option<crate::transport::TransportStats> {
        self.transport.get().map(|t| t.stats())
    }

    /// The client endpoint of `node`, if known.
    pub fn endpoint_of(&self, node: u64) -> String {
        if node == self.options.node_id {
            return self.options.advertise.clone();
        }
        if let Some(ep) = self.options.peer_endpoints.get(&node) {
            return ep.clone();
        }
        self.learned_endpoints
            .read()
            .expect("lock poisoned")
            .get(&node)
            .cloned()
            .unwrap_or_default()
    }

    /// Delivers a Raft message from a peer node to the replica it names.
    pub async fn handle_raft(
        &self,
        group: u64,
        target_replica: u64,
        body: &[u8],
    ) -> std::result::Result<bytes::Bytes, String> {
        let r = self
            .replica(group)
            .ok_or_else(|| format!("tablet {group} is not on node {}", self.options.node_id))?;
        if r.replica_id != target_replica {
            return Err(format!(
                "replica {target_replica} of tablet {group} is not here (this node holds replica {})",
                r.replica_id
            ));
        }
        let rpc = router::decode_msg::<router::RaftRpc>("raft rpc", body);
        if matches!(
            &rpc,
            Ok(router::RaftRpc::Append(_)
                | router::RaftRpc::Vote(_)
                | router::RaftRpc::Snapshot { .. })
        ) {
            r.contact.touch();
        }
        if let Ok(router::RaftRpc::Append(req)) = &rpc {
            let commit = req.leader_commit.as_ref().map_or(0, |l| l.index());
            *r.tablet.leader_contact.lock().expect("lock poisoned") =
                Some((std::time::Instant::now(), commit));
        }
        if let Ok(router::RaftRpc::Snapshot { vote, data, .. }) = rpc {
            // A snapshot names segments; fetch the ones this replica lacks
            // from the leader that sent it before openraft installs it.
            self.fetch_missing_segments(&r, vote.leader_id.node_id, &data)
                .await?;
        }
        Ok(router::dispatch(&r.raft, &r.tablet.segment_dir, body).await)
    }

    async fn fetch_missing_segments(
        &self,
        r: &Replica,
        leader_replica: u64,
        snapshot: &[u8],
    ) -> std::result::Result<(), String> {
        let Some(peers) = &self.peers else {
            return Err("no peers to fetch segments from".into());
        };
        let segments =
            crate::tablet::state_machine::snapshot_segments(snapshot).map_err(|e| e.to_string())?;
        for seg in segments {
            let path = r
                .tablet
                .segment_dir
                .join(crate::segment::file_name(&seg.id));
            // A segment in the bucket is read from there instead (the
            // install opens it remotely): only the rest crosses the node
            // transport (node::tier).
            if path.exists() {
                continue;
            }
            if let Some(tier) = &self.options.tier
                && crate::tier::in_bucket(Some(tier), r.tablet.id, &seg).await
            {
                // Opened here first, which keeps its stub: the install then
                // opens it with no request, and a failing bucket fails this
                // delivery (the leader sends the snapshot again) rather
                // than the install, which openraft takes as fatal.
                let (tier, id, dir) = (tier.clone(), r.tablet.id, r.tablet.segment_dir.clone());
                tokio::task::spawn_blocking(move || {
                    crate::tier::cold::open_reader(&tier, id, &seg, &dir).map(drop)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("open the cold copy of a snapshot's segment: {e}"))?;
                continue;
            }
            // Streamed to a part file, verified, then renamed into place:
            // never more than one chunk in memory.
            peers
                .fetch(
                    router::node_of(leader_replica),
                    r.tablet.id,
                    leader_replica,
                    &seg,
                    &r.tablet.segment_dir,
                )
                .await
                .map_err(|e| e.to_string())?;
            self.stats.segments_fetched.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Free bytes on the data directory's filesystem.
    /// The journal's free-space fault override, when set, stands in for the
    /// filesystem (tests drive a filling disk through it), then a simulated
    /// disk (`disk-bytes`).
    pub fn free_bytes(&self) -> u64 {
        match self.options.journal.faults.free_bytes() {
            Some(free) => free,
            None => self.disk_usage().map_or(u64::MAX, |(_, avail)| avail),
        }
    }

    /// `(total, available)` bytes of the disk holding the data directory:
    /// the filesystem's, or the simulated disk's (`disk-bytes`, whose
    /// contents are the data directory alone).
    pub fn disk_usage(&self) -> std::io::Result<(u64, u64)> {
        match self.options.journal.faults.disk_bytes() {
            Some(total) => {
                let used = crate::fsutil::tree_bytes(&self.options.data_dir)?;
                Ok((total, total.saturating_sub(used)))
            }
            None => crate::fsutil::disk_usage(&self.options.data_dir),
        }
    }

    /// Waits until every tablet has a leader and has applied its log. A
    /// replica removed while this waits (the absorbed side of a merge that
    /// publishes during start, a replica moved away) is not waited for: its
    /// group shuts down, and that is not a failure to become ready.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        for r in self.replicas() {
            let waited = r
                .raft
                .wait(Some(timeout))
                .metrics(
                    |m| {
                        m.current_leader.is_some()
                            && m.last_applied.as_ref().map(|l| l.index()) >= m.last_log_index
                    },
                    "leader elected and log applied",
                )
                .await;
            if let Err(e) = waited {
                let still_hosted = self
                    .replica(r.tablet.id)
                    .is_some_and(|now| Arc::ptr_eq(&now, &r));
                if still_hosted {
                    return Err(Error::Config(format!(
                        "tablet {} not ready: {e}",
                        r.tablet.id
                    )));
                }
                tracing::debug!(
                    tablet = r.tablet.id,
                    "replica removed while waiting for it to be ready"
                );
            }
        }
        Ok(())
    }

    /// Proposes a seal of one tablet (operator or policy).
    pub async fn seal(&self, tablet: u64, reason: SealReason) -> Result<()> {
        let r = self
            .replica(tablet)
            .ok_or(stele_proto::Error::TabletNotFound { tablet })?;
        r.raft
            .client_write(TabletCommand::Seal { reason })
            .await
            .map_err(|e| stele_proto::Error::Unavailable {
                reason: e.to_string(),
            })?;
        Ok(())
    }

    /// Proposes a compaction of `inputs` (segment ids of `tablet`).
    pub async fn compact(&self, tablet: u64, inputs: Vec<String>) -> Result<()> {
        let r = self
            .replica(tablet)
            .ok_or(stele_proto::Error::TabletNotFound { tablet })?;
        r.raft
            .client_write(TabletCommand::Compact { inputs })
            .await
            .map_err(|e| stele_proto::Error::Unavailable {
                reason: e.to_string(),
            })?;
        Ok(())
    }

    /// Stops background work and every Raft group, and flushes the journal.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        // Joined until none is left: a task may spawn another (the seal
        // worker starts purges) while we wait.
        loop {
            let tasks = std::mem::take(&mut *self.tasks.lock().expect("lock poisoned"));
            if tasks.is_empty() {
                break;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
        for r in self.replicas() {
            let _ = r.raft.shutdown().await;
        }
        self.journal.shutdown();
    }
}

/// True when openraft's effective membership (from the log or the state
/// machine) has exactly one voter: `me`.
fn sole_voter_in_log(raft: &TabletRaft, me: u64) -> bool {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    m.membership().voter_ids().eq([me])
}

/// The [`Peers`] of a node without peers: never called, because a one-node
/// cell's groups have no other voter.
#[derive(Clone)]
pub enum NoTransport {}

impl Peers for NoTransport {
    fn call(
        &self,
        _node: u64,
        _group: u64,
        _target_replica: u64,
        _lane: router::Lane,
        _body: bytes::Bytes,
    ) -> router::CallFuture<'_> {
        match *self {}
    }
}

/// Creates the tablets of a new cell on this node: `n` even vshard ranges.
fn bootstrap(catalog: &Catalog, n: u32, node_id: u64) -> Result<Vec<TabletRecord>> {
    let mut out = Vec::new();
    for (i, (lo, hi)) in stele_proto::vshard::even_ranges(n).into_iter().enumerate() {
        let id = i as u64 + 1;
        let record = TabletRecord {
            v: 1,
            id,
            vshard_lo: lo,
            vshard_hi: hi,
            generation: 1,
            checkpoint: 0,
            applied_state: Vec::new(),
            segments: Vec::new(),
            replica_id: router::replica_id(id, node_id),
            init_voters: Vec::new(),
            frozen: false,
        };
        catalog.put_tablet(&record)?;
        out.push(record);
    }
    Ok(out)
}

/// Builds and publishes sealed memtables, one at a time in seal order, then
/// lets openraft snapshot and purge the log up to the new checkpoint.
async fn seal_worker(node: Arc<Node>, mut rx: mpsc::UnboundedReceiver<(Arc<Tablet>, u64)>) {
    loop {
        let job = tokio::select! {
            _ = node.cancel.cancelled() => return,
            job = rx.recv() => job,
        };
        let Some((tablet, seal_index)) = job else {
            return;
        };
        let t = tablet.clone();
        let result = tokio::task::spawn_blocking(move || seal::run_seal(&t, seal_index)).await;
        match result {
            Ok(Ok(Some(done))) => {
                let checkpoint = done.checkpoint;
                if let Some(child) = done.child {
                    let (id, parent) = (child.id, tablet.id);
                    match node.open_split_child(child).await {
                        Ok(()) => tracing::info!(
                            tablet = parent,
                            child = id,
                            "split: child replica opened"
                        ),
                        Err(e) => {
                            tracing::error!(tablet = parent, child = id, error = %e, "split: child replica not opened; it opens at the next start")
                        }
                    }
                }
                if let Some((absorbed, replica)) = done.absorbed {
                    // Its catalog rows went with the seal's publish.
                    match node.remove_replica(absorbed, replica).await {
                        Ok(_) => tracing::info!(
                            tablet = tablet.id,
                            absorbed,
                            "merge: absorbed replica adopted and removed"
                        ),
                        Err(e) => {
                            tracing::error!(tablet = tablet.id, absorbed, error = %e, "merge: absorbed replica not removed; its files go at the next start")
                        }
                    }
                }
                if let Some(r) = node.replica(tablet.id) {
                    let cancel = node.cancel.clone();
                    let task = tokio::spawn(async move {
                        tokio::select! {
                            _ = cancel.cancelled() => {}
                            _ = purge_after_snapshot(r, checkpoint) => {}
                        }
                    });
                    let mut tasks = node.tasks.lock().expect("lock poisoned");
                    tasks.retain(|t| !t.is_finished());
                    tasks.push(task);
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::error!(tablet = tablet.id, seal_index, error = %e, "seal failed; rows kept in memory and journal")
            }
            Err(e) => tracing::error!(tablet = tablet.id, error = %e, "seal task panicked"),
        }
    }
}

/// Removes the segment directories of tablets the catalog does not name:
/// left by a crash between a merge's publish (which deleted the absorbed
/// tablet's rows) and the removal of its files, or between a split's links
/// and its publish (replayed after this).
fn remove_stray_dirs(segments: &Path, records: &[TabletRecord]) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(segments) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", segments.display()), e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let Ok(id) = name.parse::<u64>() else {
            continue;
        };
        if entry.path().is_dir() && !records.iter().any(|r| r.id == id) {
            tracing::info!(
                tablet = id,
                "removing the files of a tablet this node no longer holds"
            );
            std::fs::remove_dir_all(entry.path())
                .map_err(|e| Error::io(format!("remove {}", entry.path().display()), e))?;
        }
    }
    Ok(())
}

async fn purge_after_snapshot(r: Arc<Replica>, checkpoint: u64) {
    if r.raft.trigger().snapshot().await.is_err() {
        return;
    }
    let waited = r
        .raft
        .wait(Some(Duration::from_secs(30)))
        .metrics(
            |m| m.snapshot.as_ref().map(|l| l.index()) >= Some(checkpoint),
            "snapshot covers checkpoint",
        )
        .await;
    if waited.is_ok() {
        let _ = r.raft.trigger().purge_log(checkpoint).await;
    }
}

/// Decides which tablets to seal (size, age, node budget, journal trim) and
/// trims the journal.
async fn policy_loop(node: Arc<Node>) {
    let mut tick = tokio::time::interval(node.options.policy_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = node.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut to_seal: Vec<(u64, SealReason)> = Vec::new();
        let now = now_us();
        let mut sizes = Vec::new();
        let mut total = 0usize;
        for r in node.replicas() {
            let data = r.tablet.read();
            // One seal in flight per tablet: a frozen memtable is pending.
            // An empty memtable has nothing to seal; skipping it before the
            // leadership check keeps idle tablets cheap.
            if !data.frozen.is_empty() || data.memtable.bytes() == 0 || !r.is_leader() {
                continue;
            }
            let bytes = data.memtable.bytes();
            total += bytes;
            let opts = &r.tablet.options;
            if bytes >= opts.memtable_bytes_max {
                to_seal.push((r.tablet.id, SealReason::Size));
            } else if data
                .memtable
                .oldest_at_us()
                .is_some_and(|t| now.saturating_sub(t) >= opts.memtable_age_max_us)
            {
                to_seal.push((r.tablet.id, SealReason::Age));
            } else if bytes > 0 {
                sizes.push((bytes, r.tablet.id));
            }
        }
        if total > node.options.memtable_budget_bytes {
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let mut over = total - node.options.memtable_budget_bytes;
            for (bytes, id) in sizes {
                if over == 0 {
                    break;
                }
                to_seal.push((id, SealReason::NodeBudget));
                over = over.saturating_sub(bytes);
            }
        }
        for id in node
            .journal
            .laggards(node.options.journal_retained_bytes_max)
        {
            if let Some(r) = node.replica(id)
                && r.is_leader()
                && r.tablet.read().frozen.is_empty()
                && !to_seal.iter().any(|(t, _)| *t == id)
            {
                to_seal.push((id, SealReason::JournalTrim));
            }
        }
        // Compactions: a leader with no seal in flight and a segment to
        // trim or a run of small segments (one per tablet and pass: the
        // work per pass is bounded).
        let mut to_compact = Vec::new();
        for r in node.replicas() {
            if to_seal.iter().any(|(t, _)| *t == r.tablet.id)
                || r.tablet.is_frozen()
                || !r.is_leader()
            {
                continue;
            }
            let data = r.tablet.read();
            if !data.frozen.is_empty() {
                continue;
            }
            let range = r.tablet.range();
            let cold_tier = node.options.tier.is_some();
            let list: Vec<seal::Candidate> = data
                .segments
                .iter()
                .map(|(s, reader)| {
                    let h = reader.header();
                    seal::Candidate {
                        id: s.id.clone(),
                        bytes: s.bytes,
                        origin: h.tablet,
                        movable: seal::may_rewrite(s, cold_tier),
                        holds_unread: s.holds_unread((h.vshard_lo, h.vshard_hi), range),
                    }
                })
                .collect();
            let opts = &r.tablet.options;
            if let Some(inputs) =
                seal::compaction_plan(&list, opts.compact_target_bytes, opts.compact_min_inputs)
            {
                to_compact.push((r.tablet.id, inputs));
            }
        }
        for (id, reason) in to_seal {
            if let Err(e) = node.seal(id, reason).await {
                tracing::warn!(tablet = id, ?reason, error = %e, "seal proposal failed");
            }
        }
        for (id, inputs) in to_compact {
            let n = inputs.len();
            match node.compact(id, inputs).await {
                Ok(()) => tracing::info!(tablet = id, inputs = n, "compaction proposed"),
                Err(e) => tracing::warn!(tablet = id, error = %e, "compaction proposal failed"),
            }
        }
        match node.journal.trim() {
            Ok(deleted) if !deleted.is_empty() => {
                tracing::debug!(files = deleted.len(), "journal trimmed")
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "journal trim failed"),
        }
    }
}

/// Reads the data directory's node id without opening the node.
pub fn data_dir_node_id(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("FORMAT")).ok()?;
    let f: DataDirFormat = crate::catalog::from_cbor("data dir FORMAT", &bytes).ok()?;
    Some(f.node_id)
}
