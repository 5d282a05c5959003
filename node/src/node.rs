//! A storage node, the composition root: opens the data directory,
//! recovers the journal and every tablet replica, starts the node's
//! services over the replica set, and shuts them down. It decides nothing
//! itself, and nothing in the crate imports it.
//!
//! ```text
//! <data>/FORMAT                node data-dir format (durable_write)
//! <data>/catalog.redb          catalog
//! <data>/journal/<seq>.wal     the node's one journal
//! <data>/segments/<tablet>/    segment files of each tablet
//!
//! Node::open ─► journal, catalog ─► ReplicaSet (recovered replicas)
//!            ─► sealer, policy, pacer, tier worker   (tasks, joined on shutdown)
//!            ─► handles for peering (Receiver), the data service, the agent
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stele_proto::command::SealReason;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::AgentHandles;
use crate::catalog::{Catalog, TabletRecord};
use crate::disk::Disk;
use crate::endpoints::Endpoints;
use crate::error::{Error, Result};
use crate::journal::{self, Journal, RecoveredFrame};
use crate::peering::Receiver;
use crate::raft::inbound::{Inbound, SegmentSource};
use crate::raft::log_store::LogStore;
use crate::raft::network::NoTransport;
use crate::raft::pacer::PacerStats;
use crate::raft::router::{self, Peers};
use crate::raft::{NodeStats, RaftStarter, RaftTiming, Replica, tablet_config};
use crate::replicas::{HostOptions, ReplicaSet, ReplicaSpec};
use crate::service::{DataOptions, DataParts, DataService};
use crate::tablet::TabletOptions;

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
    /// How many of the busiest tablets this node leads get per-tablet
    /// series on /metrics (`metrics::Observer`); 0: none.
    pub metrics_hot_tablets: usize,
    /// How often the seal policy runs.
    pub policy_interval: Duration,
    pub value_bytes_max: usize,
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Nodes whose Raft traffic this node drops (fault injection; empty
    /// unless a test or `STELE_PEER_BLOCK_FILE` sets it).
    pub peer_filter: Arc<crate::peering::PeerFilter>,
    /// The TLS credentials this node presents (its `--certs`), reported by
    /// `Status` (serial, expiry); `None` without a certificate.
    pub tls: Option<Arc<stele_tls::Credentials>>,
    /// The data service's fail points (fault injection for in-process
    /// tests; this node's own, never armed otherwise).
    pub fail_points: Arc<crate::service::FailPoints>,
    /// The cell controller decides which replicas this node hosts
    /// ([`crate::agent`]): no tablets are created at start-up, and
    /// `initial_tablets`/`cell_nodes` are unused.
    pub controlled: bool,
    /// NEGATIVE CONTROL FOR `jepsen/` ONLY: a leader serves linearizable
    /// reads from its local state without confirming it still leads (no
    /// read index, no lease). A deposed leader then serves stale reads; the
    /// harness must catch them. Set only by `STELE_UNSAFE_LOCAL_READS=1`.
    pub unsafe_local_reads: bool,
    /// NEGATIVE CONTROL FOR `jepsen/` ONLY: a leader that slept
    /// (`raft::hibernate`) in its current leadership serves linearizable
    /// reads from its local state, as if the sleep had kept its lease,
    /// until it sees it no longer leads; a leader deposed in or after its
    /// sleep then serves stale reads. Set only by
    /// `STELE_UNSAFE_WAKE_READS=1`.
    pub unsafe_wake_reads: bool,
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
    /// How long a graceful stop (SIGTERM) may take: leadership hand-off,
    /// in-flight calls, shutdown (`Node::drain_leadership`).
    pub drain_deadline: Duration,
    /// How many proposals of one tablet a leader keeps out at a time
    /// before later appends wait and share an entry (`raft::coalesce`);
    /// only with log format 2.
    pub append_in_flight: usize,
    /// The tablet log format (`formats::LOG`) of a node without a
    /// controller; a controlled node starts at 1 and takes the cell's.
    pub log_format: u32,
}

impl NodeOptions {
    pub fn new(data_dir: PathBuf) -> NodeOptions {
        NodeOptions {
            journal: journal::Options::new(data_dir.join("journal")),
            data_dir,
            node_id: 1,
            initial_tablets: 16,
            drain_deadline: Duration::from_secs(10),
            append_in_flight: 2,
            log_format: stele_proto::formats::BASELINE,
            cell_nodes: vec![1],
            advertise: String::new(),
            peer_endpoints: BTreeMap::new(),
            tablet: TabletOptions::default(),
            raft: RaftTiming::default(),
            memtable_budget_bytes: 1 << 30,
            journal_retained_bytes_max: 1 << 30,
            disk_reserve_bytes: 256 << 20,
            metrics_hot_tablets: 10,
            policy_interval: Duration::from_millis(250),
            value_bytes_max: stele_proto::limits::VALUE_BYTES_MAX_DEFAULT,
            batch_bytes_max: stele_proto::limits::BATCH_BYTES_MAX_DEFAULT,
            batch_records_max: stele_proto::limits::BATCH_RECORDS_MAX_DEFAULT,
            peer_filter: Default::default(),
            tls: None,
            fail_points: Default::default(),
            controlled: false,
            unsafe_local_reads: false,
            unsafe_wake_reads: false,
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
        if !(1..=1024).contains(&self.append_in_flight) {
            return Err(Error::Config(format!(
                "append_in_flight must be 1..=1024, not {}",
                self.append_in_flight
            )));
        }
        let formats = stele_proto::formats::BASELINE..=stele_proto::formats::LOG_MAX;
        if !formats.contains(&self.log_format) {
            return Err(Error::Config(format!(
                "log format {} is not one this build writes ({formats:?})",
                self.log_format
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

pub struct Node {
    pub options: NodeOptions,
    pub journal: Journal,
    pub catalog: Catalog,
    pub stats: Arc<NodeStats>,
    pub pacer_stats: Arc<PacerStats>,
    /// Data calls and Append latency since the last heartbeat (the console).
    pub load: Arc<crate::load::LoadMeter>,
    replicas: ReplicaSet,
    endpoints: Arc<Endpoints>,
    /// The cell's token keys (from the controller's heartbeat answers).
    tokens: Arc<stele_tls::token::Keyring>,
    disk: Disk,
    /// Namespace owners, when the cell is directory-managed.
    ownership: Option<Arc<crate::ownership::Ownership>>,
    /// What peer nodes' Raft messages are delivered to.
    receiver: Arc<Receiver>,
    cancel: CancellationToken,
    /// Background tasks (seal worker, policy, pacer, tier worker, purges),
    /// waited for on shutdown.
    tasks: TaskTracker,
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
        let sleeper: Option<Arc<dyn crate::raft::hibernate::Sleeper>> = peers
            .clone()
            .map(|p| Arc::new(p) as Arc<dyn crate::raft::hibernate::Sleeper>);
        let config = tablet_config(&options.raft, options.unsafe_leader_restore)?;
        let starter = RaftStarter::new(config, peers);
        let first_node = options
            .cell_nodes
            .iter()
            .copied()
            .min()
            .unwrap_or(options.node_id);
        options.validate()?;
        check_data_dir(&options)?;
        let catalog = Catalog::open(&options.data_dir.join("catalog.redb"))?;
        if let Some(tier) = &options.tier {
            catalog.bind_cell(&tier.options.cell)?;
        }
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
        let stats = Arc::new(NodeStats::default());
        let cancel = CancellationToken::new();
        let segments_dir = options.data_dir.join("segments");
        let replicas = ReplicaSet::new(
            HostOptions {
                node_id: options.node_id,
                segments_dir: segments_dir.clone(),
                tablet: options.tablet.clone(),
                tier: options.tier.clone(),
                log_format: if options.controlled {
                    stele_proto::formats::BASELINE
                } else {
                    options.log_format
                },
            },
            journal.clone(),
            catalog.clone(),
            starter,
            seal_tx,
            cancel.clone(),
        );
        remove_stray_dirs(&segments_dir, &records)?;
        // Every tablet is open before any group starts: a merge replayed
        // by one reads the tablet it absorbs.
        let mut opened = Vec::with_capacity(records.len());
        for record in &records {
            let tablet = replicas.open_tablet(record)?;
            replicas.insert_opening(tablet.clone());
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
            let fresh = record.checkpoint == 0 && log.is_empty();
            // Exactly one replica initializes a new group: the one on the
            // lowest node id of the cell (static cells; the controller
            // names the initializer of its tablets).
            let initialize =
                (fresh && !options.controlled && options.node_id == first_node).then(|| {
                    options
                        .cell_nodes
                        .iter()
                        .map(|n| router::replica_id(record.id, *n))
                        .collect()
                });
            replicas.start_recovered(tablet, log, initialize).await?;
        }
        // Frames of tablets this node no longer hosts hold nothing back.
        for tablet in by_tablet.keys() {
            journal.forget_tablet(*tablet);
        }
        let ownership = match &options.directory {
            Some(link) => Some(Arc::new(crate::ownership::Ownership::open(
                link.clone(),
                &catalog,
            )?)),
            None => None,
        };
        let endpoints = Arc::new(Endpoints::new(
            options.node_id,
            options.advertise.clone(),
            options.peer_endpoints.clone(),
        ));
        let disk = Disk::new(options.data_dir.clone(), options.journal.faults.clone());
        let liveness = Arc::new(crate::raft::hibernate::PeerLiveness::default());
        let hibernate = sleeper.map(|sleeper| crate::raft::hibernate::Hibernate {
            sleeper,
            liveness: liveness.clone(),
            after_ms: options.raft.hibernate_after_ms,
        });
        let receiver = Arc::new(Receiver {
            replicas: replicas.clone(),
            inbound: Inbound::new(source, options.tier.clone(), stats.clone()),
            filter: options.peer_filter.clone(),
            liveness,
        });
        let pacer_stats = Arc::new(PacerStats::default());
        let tasks = TaskTracker::new();
        tasks.spawn(crate::sealer::run(replicas.clone(), seal_rx, tasks.clone()));
        tasks.spawn(crate::policy::run(
            replicas.clone(),
            journal.clone(),
            crate::policy::PolicyOptions {
                interval: options.policy_interval,
                memtable_budget_bytes: options.memtable_budget_bytes,
                journal_retained_bytes_max: options.journal_retained_bytes_max,
                cold_tier: options.tier.is_some(),
            },
        ));
        tasks.spawn(crate::raft::pacer::run(
            {
                let replicas = replicas.clone();
                move || replicas.replicas()
            },
            options.raft.clone(),
            pacer_stats.clone(),
            hibernate,
            cancel.clone(),
        ));
        if let Some(tier) = options.tier.clone() {
            tasks.spawn(crate::tier::worker::run(
                replicas.clone(),
                disk.clone(),
                tier,
            ));
        }
        Ok(Arc::new(Node {
            options,
            journal,
            catalog,
            stats,
            pacer_stats,
            load: Default::default(),
            replicas,
            endpoints,
            tokens: Default::default(),
            disk,
            ownership,
            receiver,
            cancel,
            tasks,
        }))
    }

    /// The node's replicas: the handle services take.
    pub fn replica_set(&self) -> &ReplicaSet {
        &self.replicas
    }

    /// The node's address book.
    pub fn endpoints(&self) -> &Arc<Endpoints> {
        &self.endpoints
    }

    /// What a [`crate::peering::RaftHandler`] delivers peers' Raft
    /// messages to: attach it once the node is open.
    pub fn receiver(&self) -> &Arc<Receiver> {
        &self.receiver
    }

    /// The gRPC data service over this node.
    pub fn data_service(&self) -> DataService {
        let o = &self.options;
        DataService::new(DataParts {
            options: DataOptions {
                node_id: o.node_id,
                controlled: o.controlled,
                unsafe_local_reads: o.unsafe_local_reads,
                unsafe_wake_reads: o.unsafe_wake_reads,
                value_bytes_max: o.value_bytes_max,
                batch_bytes_max: o.batch_bytes_max,
                batch_records_max: o.batch_records_max,
                append_in_flight: o.append_in_flight,
                // A leader lease (`raft::coalesce`).
                append_stall: Duration::from_millis(o.raft.election_timeout_ms),
                disk_reserve_bytes: o.disk_reserve_bytes,
                peer_filter: o.peer_filter.clone(),
                tier: o.tier.clone(),
                fail_points: o.fail_points.clone(),
                tls: o.tls.clone(),
            },
            replicas: self.replicas.clone(),
            endpoints: self.endpoints.clone(),
            journal: self.journal.clone(),
            catalog: self.catalog.clone(),
            disk: self.disk.clone(),
            ownership: self.ownership.clone(),
            tokens: self.tokens.clone(),
            stats: self.stats.clone(),
            pacer_stats: self.pacer_stats.clone(),
            load: self.load.clone(),
        })
    }

    /// Graceful stop, the node's half (`src/stop.rs` is the process's):
    /// every tablet this node leads is handed to a caught-up voter, so it
    /// has a leader again in a round trip instead of after an election
    /// timeout. Hands off every leadership this node holds and waits, until
    /// `deadline`, for it to lead nothing; a tablet that comes back (the
    /// controller's balancer) is handed off again. Nothing else stops: the
    /// caller stops serving and shuts the node down after.
    pub async fn drain_leadership(&self, deadline: Duration) -> DrainReport {
        let started = std::time::Instant::now();
        let mut handed = std::collections::BTreeSet::new();
        loop {
            let leading: Vec<_> = self
                .replicas()
                .into_iter()
                .filter(|r| r.is_leader())
                .collect();
            if leading.is_empty() || started.elapsed() >= deadline {
                return DrainReport {
                    handed_off: handed.len(),
                    still_leading: leading.len(),
                    elapsed: started.elapsed(),
                };
            }
            for r in &leading {
                if r.hand_off_leadership().await.is_some() {
                    handed.insert(r.tablet.id);
                }
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Resolves when the node starts shutting down.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    pub fn replica(&self, tablet: u64) -> Option<Arc<Replica>> {
        self.replicas.replica(tablet)
    }

    /// Every hosted replica, by tablet id (a snapshot of the set).
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas.replicas()
    }

    /// Free bytes of the data directory's file system.
    pub fn free_bytes(&self) -> u64 {
        self.disk.free_bytes()
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.replica_count()
    }

    /// See [`ReplicaSet::create_replica`].
    pub async fn create_replica(
        &self,
        spec: &ReplicaSpec,
        initialize: Option<&[u64]>,
    ) -> Result<Arc<Replica>> {
        self.replicas.create_replica(spec, initialize).await
    }

    /// See [`ReplicaSet::remove_replica`].
    pub async fn remove_replica(&self, tablet: u64, replica_id: u64) -> Result<bool> {
        self.replicas.remove_replica(tablet, replica_id).await
    }

    /// Lets status report the transport's counters.
    pub fn set_transport(&self, transport: Arc<crate::transport::Transport>) {
        self.endpoints.set_transport(transport);
    }

    /// See [`ReplicaSet::wait_ready`].
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        self.replicas.wait_ready(timeout).await
    }

    /// Waits until each of `replicas` (those hosted at start, from
    /// [`Node::replicas`]) has caught up with its group; see
    /// [`ReplicaSet::wait_caught_up`].
    pub async fn wait_caught_up(&self, replicas: &[Arc<Replica>], timeout: Duration) -> Result<()> {
        self.replicas.wait_caught_up(replicas, timeout).await
    }

    /// Proposes a seal of one tablet (operator).
    pub async fn seal(&self, tablet: u64, reason: SealReason) -> Result<()> {
        self.replicas.seal(tablet, reason).await
    }

    /// Proposes a compaction of `inputs` (segment ids of `tablet`).
    pub async fn compact(&self, tablet: u64, inputs: Vec<String>) -> Result<()> {
        self.replicas.compact(tablet, inputs).await
    }

    /// Stops background work and every Raft group, and flushes the journal.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        // Waited for until none is left: a task may spawn another (the
        // seal worker starts purges) while we wait.
        self.tasks.close();
        self.tasks.wait().await;
        self.replicas.shutdown_groups().await;
        self.journal.shutdown();
    }
}

impl From<Arc<Node>> for DataService {
    fn from(node: Arc<Node>) -> DataService {
        node.data_service()
    }
}

impl From<Arc<Node>> for AgentHandles {
    fn from(node: Arc<Node>) -> AgentHandles {
        AgentHandles {
            replicas: node.replicas.clone(),
            endpoints: node.endpoints.clone(),
            tokens: node.tokens.clone(),
            load: node.load.clone(),
        }
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

/// Reads the data directory's node id without opening the node.
pub fn data_dir_node_id(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("FORMAT")).ok()?;
    let f: DataDirFormat = crate::catalog::from_cbor("data dir FORMAT", &bytes).ok()?;
    Some(f.node_id)
}

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Tablets whose leadership was handed off.
    pub handed_off: usize,
    /// Tablets still led here when the drain ended (deadline reached, or no
    /// other voter to take them).
    pub still_leading: usize,
    pub elapsed: Duration,
}

/// How often a drain looks again at what this node leads.
const DRAIN_POLL: Duration = Duration::from_millis(50);
