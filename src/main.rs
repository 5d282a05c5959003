//! `stele`: one binary, roles and operator commands by subcommand.
//!
//! This file only wires arguments to the crates; behaviour lives in
//! `stele-node` (the server) and `stele-client` (everything that talks to one).

mod cellops;
mod dev_cell;
mod dirops;
mod ops;
mod restore;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use stele_node::{Node, NodeOptions};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "stele",
    version,
    about = "Stele: a Raft-replicated, multi-tablet storage cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a single-node cell on embedded defaults (plaintext, loopback).
    Dev(Box<DevArgs>),
    /// Run a storage node, a controller, or both (`--roles`).
    Server(Box<ServerArgs>),
    /// Create and inspect a controller-managed cell.
    #[command(subcommand)]
    Cell(cellops::CellCommand),
    /// Storage nodes of a cell: list, drain, decommission.
    #[command(subcommand, name = "node")]
    NodeCmd(cellops::NodeCommand),
    /// Tablets of a cell: list, show, move, transfer leadership, split.
    #[command(subcommand)]
    Tablet(cellops::TabletCommand),
    /// Operator intents (moves, transfers, splits): show, abort.
    #[command(subcommand)]
    Intent(cellops::IntentCommand),
    /// The global directory quorum: create it, see its state.
    #[command(subcommand)]
    Directory(dirops::DirectoryCommand),
    /// Namespaces: create, list, show, update (through the directory).
    #[command(subcommand)]
    Ns(dirops::NsCommand),
    /// Append one record.
    Append(ops::AppendArgs),
    /// Read records of a key or a namespace.
    Scan(ops::ScanArgs),
    /// Measure durable appends against a running cell, or the raw fsync rate of a device.
    Bench(ops::BenchArgs),
    /// Print one node's counters (journal, seals, peers, pacer).
    Status(ops::StatusArgs),
    /// Cell CA and node certificates for node-to-node mutual TLS.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Rebuild a cell's tablets from its object store into a new data directory.
    Restore(restore::RestoreArgs),
}

#[derive(Subcommand)]
enum CertCommand {
    /// Create a cell CA (ca.key, ca.pem) in a new directory.
    Init {
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a node certificate (node.key, node.pem, ca.pem) signed by the cell CA.
    Node {
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        node_id: u64,
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(clap::Args)]
struct DevArgs {
    /// Data directory.
    #[arg(long, default_value = "./stele-data")]
    data_dir: PathBuf,
    /// Client API address (loopback only: `dev` serves plaintext).
    #[arg(long, default_value = "127.0.0.1:7450")]
    listen: SocketAddr,
    /// Tablets to create in a new data directory.
    #[arg(long, default_value_t = 16)]
    tablets: u32,
    /// Nodes in the cell: more than one runs each as its own `stele server`
    /// process on consecutive ports, every tablet on every node.
    #[arg(long, default_value_t = 1)]
    nodes: u64,
    /// Cells: more than one runs a directory on --listen and each cell
    /// (`--nodes` nodes, ids c1, c2, ...) on its own ports.
    #[arg(long, default_value_t = 1)]
    cells: u64,
    #[command(flatten)]
    tuning: Tuning,
}

#[derive(clap::Args)]
struct ServerArgs {
    /// `node`, `controller`, or both (`node,controller`); or `directory`
    /// (alone in its process).
    #[arg(long, value_delimiter = ',', default_value = "node")]
    roles: Vec<String>,
    /// Directory member id (directory role).
    #[arg(long, default_value_t = 0)]
    directory_id: u64,
    /// Directory role: create a namespace on first use when a client asks
    /// (`stele dev` turns this on; off by default).
    #[arg(long)]
    auto_create_namespaces: bool,
    /// The global directory (node role): `URL,...`. With it, the node
    /// serves only the namespaces the directory placed on its cell
    /// (`--cell-id`), and refuses others with WrongCell.
    #[arg(long, value_delimiter = ',')]
    directory: Vec<String>,
    /// Node id (node role).
    #[arg(long, default_value_t = 0)]
    node_id: u64,
    /// Controller id (controller role); its quorum member id.
    #[arg(long, default_value_t = 0)]
    controller_id: u64,
    /// The cell's controllers (node role): `URL,...`. With it, the node
    /// registers with the controller and hosts what it assigns.
    #[arg(long, value_delimiter = ',')]
    controllers: Vec<String>,
    /// Failure domain labels and relative capacity (node role).
    #[arg(long, default_value = "")]
    zone: String,
    #[arg(long, default_value = "")]
    rack: String,
    #[arg(long, default_value_t = 1)]
    capacity: u32,
    /// Node heartbeat (health lease renewal) period, ms.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Controller: a node missing heartbeats this long is dead, ms.
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// Controller: a dead node's replicas move away after this much more, ms.
    #[arg(long, default_value_t = 60_000)]
    repair_grace_ms: u64,
    /// Controller: rebalance tablet leaders across nodes this often, ms
    /// (0: never).
    #[arg(long, default_value_t = 10_000)]
    leader_balance_ms: u64,
    /// Controller: split a tablet by itself once its sealed segments hold
    /// this many bytes for a whole window (0: never).
    #[arg(long, default_value_t = 1 << 30)]
    split_bytes: u64,
    /// Controller: split a tablet applying this many records per second
    /// over a whole window (0: never).
    #[arg(long, default_value_t = 0)]
    split_writes_per_s: u64,
    /// Controller: split a tablet serving this many reads per second over a
    /// whole window (0: never).
    #[arg(long, default_value_t = 0)]
    split_reads_per_s: u64,
    /// Controller: how long a split mark must hold, ms.
    #[arg(long, default_value_t = 60_000)]
    split_window_ms: u64,
    /// Controller: no automatic split or merge of a tablet this soon after
    /// it last split, merged or was made, ms.
    #[arg(long, default_value_t = 300_000)]
    split_cooldown_ms: u64,
    /// Controller: merge two adjacent tablets by themselves when their
    /// bytes and rates together stay below this percent of every split
    /// mark that is on, over a window (0: never; at most 50).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=50))]
    merge_below_percent: u64,
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    data_dir: PathBuf,
    /// Tablets to create in a new data directory.
    #[arg(long, default_value_t = 16)]
    tablets: u32,
    /// Node-to-node (QUIC) address; needed with --peers.
    #[arg(long)]
    peer_listen: Option<SocketAddr>,
    /// The other nodes of the cell: `ID=HOST:PORT,...` (their --peer-listen).
    #[arg(long, value_delimiter = ',', value_parser = parse_id_pair)]
    peers: Vec<(u64, String)>,
    /// Client endpoints of the other nodes, for leader hints: `ID=URL,...`.
    #[arg(long, value_delimiter = ',', value_parser = parse_id_pair)]
    peer_endpoints: Vec<(u64, String)>,
    /// This node's certificate directory (node.key, node.pem, ca.pem).
    #[arg(long)]
    certs: Option<PathBuf>,
    #[command(flatten)]
    tuning: Tuning,
}

fn parse_id_pair(s: &str) -> Result<(u64, String), String> {
    let (id, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: want ID=VALUE"))?;
    let id = id.parse().map_err(|_| format!("{id:?} is not a node id"))?;
    Ok((id, rest.to_string()))
}

/// Storage tuning shared by `dev` and `server`.
#[derive(clap::Args)]
struct Tuning {
    /// Seal a tablet's memtable at this many bytes.
    #[arg(long, default_value_t = 32 << 20)]
    memtable_bytes_max: usize,
    /// Seal a tablet's memtable once its oldest row is this old, so a quiet
    /// tablet's data reaches a segment (and the cold tier) in bounded time.
    #[arg(long, default_value_t = 300)]
    memtable_age_max_s: u64,
    /// Compact runs of (at least 4) segments smaller than a quarter of this
    /// into segments of up to this many bytes; 0 turns compaction off.
    #[arg(long, default_value_t = 64 << 20)]
    compact_target_bytes: u64,
    /// Roll journal files at this size.
    #[arg(long, default_value_t = 64 << 20)]
    journal_file_bytes_max: u64,
    /// Force-seal tablets holding back journal trim past this many retained bytes.
    #[arg(long, default_value_t = 1 << 30)]
    journal_retained_bytes_max: u64,
    /// Refuse appends with StorageFull below this much free space.
    #[arg(long, default_value_t = 256 << 20)]
    disk_reserve_bytes: u64,
    /// The journal's own last-resort reserve (must be at most disk-reserve-bytes).
    #[arg(long, default_value_t = 64 << 20)]
    journal_reserve_bytes: u64,
    /// Group-commit linger, in microseconds.
    #[arg(long, default_value_t = 2000)]
    linger_us: u64,
    /// Largest batch (keys + values) one append may carry.
    #[arg(long, default_value_t = stele_proto::limits::BATCH_BYTES_MAX_DEFAULT)]
    batch_bytes_max: usize,
    /// Most records one append may carry.
    #[arg(long, default_value_t = stele_proto::limits::BATCH_RECORDS_MAX_DEFAULT)]
    batch_records_max: usize,
    /// Tablet election timeout T, in ms: a follower that has not heard from
    /// its leader for a random time in [T, 2T) campaigns; heartbeats every T/3.
    #[arg(long, default_value_t = 3000)]
    election_timeout_ms: u64,
    #[command(flatten)]
    cold: ColdTierArgs,
}

/// The cold tier (object storage). `stele dev` defaults to
/// `file://<data-dir>/bucket`; `stele server` has none unless given.
#[derive(clap::Args, Clone)]
struct ColdTierArgs {
    /// Object store for sealed segments: `file:///abs/dir` or
    /// `s3://bucket/prefix`. S3 credentials come from --s3-access-key-id /
    /// --s3-secret-access-key or the standard AWS_* environment variables.
    #[arg(long)]
    object_store: Option<String>,
    /// Opaque cell id, part of every object key ([a-z0-9-], at most 64).
    #[arg(long, default_value = "dev")]
    cell_id: String,
    /// S3 endpoint override (path-style requests); http is allowed for
    /// loopback endpoints, elsewhere only with --s3-allow-http.
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long)]
    s3_region: Option<String>,
    #[arg(long)]
    s3_allow_http: bool,
    #[arg(long)]
    s3_access_key_id: Option<String>,
    #[arg(long)]
    s3_secret_access_key: Option<String>,
    /// Keep an uploaded segment locally at least this long (seconds) unless
    /// the disk passes 70% used.
    #[arg(long, default_value_t = 24 * 3600)]
    hot_age_s: u64,
    /// Bytes of cold blocks cached in memory.
    #[arg(long, default_value_t = 256 << 20)]
    cold_cache_bytes_max: u64,
    /// Namespace retention, `NAMESPACE=SECONDS` (repeatable): whole
    /// segments of that namespace older than the period are dropped, locally
    /// and in the bucket. Needs --object-store.
    #[arg(long)]
    retention: Vec<String>,
}

impl ColdTierArgs {
    fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            "--cell-id".to_string(),
            self.cell_id.clone(),
            "--hot-age-s".into(),
            self.hot_age_s.to_string(),
            "--cold-cache-bytes-max".into(),
            self.cold_cache_bytes_max.to_string(),
        ];
        for (flag, v) in [
            ("--object-store", &self.object_store),
            ("--s3-endpoint", &self.s3_endpoint),
            ("--s3-region", &self.s3_region),
            ("--s3-access-key-id", &self.s3_access_key_id),
            ("--s3-secret-access-key", &self.s3_secret_access_key),
        ] {
            if let Some(v) = v {
                out.extend([flag.to_string(), v.clone()]);
            }
        }
        if self.s3_allow_http {
            out.push("--s3-allow-http".into());
        }
        for r in &self.retention {
            out.extend(["--retention".to_string(), r.clone()]);
        }
        out
    }

    /// The node's cold tier, if one is configured.
    fn open(&self) -> anyhow::Result<Option<Arc<stele_node::tier::Tier>>> {
        let Some(url) = &self.object_store else {
            return Ok(None);
        };
        let mut o = stele_node::tier::TierOptions::new(url.clone(), self.cell_id.clone());
        o.s3_endpoint = self.s3_endpoint.clone();
        o.s3_region = self.s3_region.clone();
        let loopback = self.s3_endpoint.as_deref().is_some_and(|e| {
            ["http://127.", "http://localhost", "http://[::1]"]
                .iter()
                .any(|p| e.starts_with(p))
        });
        o.s3_allow_http = self.s3_allow_http || loopback;
        o.s3_access_key_id = self.s3_access_key_id.clone();
        o.s3_secret_access_key = self.s3_secret_access_key.clone();
        o.hot_age = Duration::from_secs(self.hot_age_s);
        o.cache_bytes_max = self.cold_cache_bytes_max;
        for r in &self.retention {
            let (ns, secs) = r
                .rsplit_once('=')
                .with_context(|| format!("--retention {r:?}: want NAMESPACE=SECONDS"))?;
            let secs: u64 = secs
                .parse()
                .with_context(|| format!("--retention {r:?}: {secs:?} is not seconds"))?;
            o.retention
                .insert(ns.to_string(), Duration::from_secs(secs));
        }
        let tier =
            stele_node::tier::Tier::open(o).with_context(|| format!("object store {url}"))?;
        Ok(Some(tier))
    }
}

impl Tuning {
    /// The same settings as command-line flags (for child processes).
    fn to_args(&self) -> Vec<String> {
        [
            ("--memtable-bytes-max", self.memtable_bytes_max.to_string()),
            ("--memtable-age-max-s", self.memtable_age_max_s.to_string()),
            (
                "--compact-target-bytes",
                self.compact_target_bytes.to_string(),
            ),
            (
                "--journal-file-bytes-max",
                self.journal_file_bytes_max.to_string(),
            ),
            (
                "--journal-retained-bytes-max",
                self.journal_retained_bytes_max.to_string(),
            ),
            ("--disk-reserve-bytes", self.disk_reserve_bytes.to_string()),
            (
                "--journal-reserve-bytes",
                self.journal_reserve_bytes.to_string(),
            ),
            ("--linger-us", self.linger_us.to_string()),
            ("--batch-bytes-max", self.batch_bytes_max.to_string()),
            ("--batch-records-max", self.batch_records_max.to_string()),
            (
                "--election-timeout-ms",
                self.election_timeout_ms.to_string(),
            ),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .chain(self.cold.to_args())
        .collect()
    }
}

fn node_options(
    data_dir: PathBuf,
    node_id: u64,
    tablets: u32,
    advertise: String,
    t: &Tuning,
) -> NodeOptions {
    let mut o = NodeOptions::new(data_dir);
    o.node_id = node_id;
    o.initial_tablets = tablets;
    o.advertise = advertise;
    o.tablet.memtable_bytes_max = t.memtable_bytes_max;
    o.tablet.memtable_age_max_us = t.memtable_age_max_s.saturating_mul(1_000_000);
    o.tablet.compact_target_bytes = t.compact_target_bytes;
    o.journal.file_bytes_max = t.journal_file_bytes_max;
    o.journal.linger = Duration::from_micros(t.linger_us);
    o.journal.reserve_bytes = t.journal_reserve_bytes;
    o.journal.faults = Arc::new(stele_node::journal::Faults::from_env());
    o.journal_retained_bytes_max = t.journal_retained_bytes_max;
    o.disk_reserve_bytes = t.disk_reserve_bytes;
    o.batch_bytes_max = t.batch_bytes_max;
    o.batch_records_max = t.batch_records_max;
    // One batch is one journal frame: size the frame limit from the batch.
    o.journal.frame_payload_bytes_max = t.batch_bytes_max + o.batch_records_max * 64 + 64 * 1024;
    o.raft = stele_node::raft::RaftTiming::for_election_timeout(t.election_timeout_ms);
    if std::env::var("STELE_UNSAFE_LOCAL_READS").is_ok_and(|v| v == "1") {
        tracing::error!(
            "STELE_UNSAFE_LOCAL_READS=1: linearizable reads skip the read index; this node can serve stale reads (jepsen negative control only)"
        );
        o.unsafe_local_reads = true;
    }
    if std::env::var("STELE_UNSAFE_LEADER_RESTORE").is_ok_and(|v| v == "1") {
        tracing::error!(
            "STELE_UNSAFE_LEADER_RESTORE=1: a restarted tablet leader resumes its term without an election; replicas can diverge after a power cut (jepsen negative control only)"
        );
        o.unsafe_leader_restore = true;
    }
    o
}

/// The controller side of a process, and the node's link to controllers.
struct ControlRoles {
    controller: Option<stele_controller::ControllerOptions>,
    /// The node registers with these controllers (node role).
    agent: Option<stele_node::agent::AgentOptions>,
    /// Run a node at all.
    node: bool,
}

impl ControlRoles {
    fn node_only() -> ControlRoles {
        ControlRoles {
            controller: None,
            agent: None,
            node: true,
        }
    }
}

/// Node-to-node settings of a multi-node cell.
struct Peering {
    listen: SocketAddr,
    peers: Vec<(u64, SocketAddr)>,
    certs: PathBuf,
}

async fn run_server(
    options: NodeOptions,
    listen: SocketAddr,
    label: &str,
    peering: Option<Peering>,
    roles: ControlRoles,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let addr = listener.local_addr()?;
    let cancel = CancellationToken::new();
    let mut routes = tonic::service::Routes::default();
    let controller = match roles.controller {
        Some(mut co) => {
            if co.advertise.is_empty() {
                co.advertise = format!("http://{addr}");
            }
            let c = stele_controller::Controller::start(co)
                .await
                .context("start controller")?;
            let (api, quorum) = c.services();
            routes = routes.add_service(api).add_service(quorum);
            Some(c)
        }
        None => None,
    };
    if !roles.node {
        serve_until_signal(
            routes,
            listener,
            &format!("stele {label}: controller listening on http://{addr}"),
        )
        .await?;
        if let Some(c) = controller {
            c.shutdown().await;
        }
        return Ok(());
    }
    let mut options = options;
    options.advertise = format!("http://{addr}");
    let data_dir = options.data_dir.clone();
    let tablets = options.initial_tablets;
    let mut filter_watch = None;
    let mut set_peer: Option<stele_node::agent::SetPeer> = None;
    let peer_listen = peering.as_ref().map(|p| p.listen);
    let node: Arc<Node> = match peering {
        None => Node::open(options).await.context("open node")?,
        Some(p) => {
            use stele_node::peering::{RaftHandler, SharedTransport};
            use stele_node::transport::{Transport, TransportOptions};
            let identity = stele_node::certs::NodeIdentity::load(&p.certs)
                .with_context(|| format!("load node certificate from {}", p.certs.display()))?;
            anyhow::ensure!(
                identity.node_id() == options.node_id,
                "certificate in {} is for node {}, not {}",
                p.certs.display(),
                identity.node_id(),
                options.node_id
            );
            let handler = RaftHandler::new();
            let transport = Transport::bind(
                TransportOptions::new(options.node_id, p.listen, identity),
                handler.clone(),
            )
            .context("bind peer transport")?;
            for (id, peer) in &p.peers {
                transport.set_peer(*id, *peer);
            }
            let transport = Arc::new(transport);
            let t = transport.clone();
            set_peer = Some(Arc::new(move |id, addr| t.set_peer(id, addr)));
            // Fault injection for partition tests: a file of node ids to
            // cut off, reread while the process runs (docs/OPERATIONS.md).
            let filter = options.peer_filter.clone();
            if let Some(path) = std::env::var_os("STELE_PEER_BLOCK_FILE") {
                tracing::warn!(file = ?path, "peer filter armed from STELE_PEER_BLOCK_FILE (fault injection)");
                filter_watch = Some(filter.clone().watch_file(
                    path.into(),
                    stele_node::peering::WATCH_INTERVAL,
                    cancel.clone(),
                ));
            }
            let peers = SharedTransport(transport.clone(), filter);
            let node = Node::open_with_peers(options, Some(peers))
                .await
                .context("open node")?;
            handler.attach(node.receiver());
            node.set_transport(transport);
            node
        }
    };
    let agent = match roles.agent {
        Some(mut ao) => {
            ao.client_endpoint = format!("http://{addr}");
            if ao.peer_endpoint.is_empty() {
                ao.peer_endpoint = peer_listen.map(|a| a.to_string()).unwrap_or_default();
            }
            let agent = stele_node::agent::Agent::new(node.clone(), ao, set_peer);
            Some(tokio::spawn(agent.run()))
        }
        None => {
            node.wait_ready(Duration::from_secs(60))
                .await
                .context("tablets not ready")?;
            None
        }
    };
    let server = tokio::spawn(stele_node::service::serve_with(
        Some(node.data_service()),
        routes,
        listener,
        cancel.clone(),
    ));
    println!(
        "stele {label}: listening on http://{addr} (data dir {}, {} tablets, replayed {} journal frames)",
        data_dir.display(),
        node.replica_count()
            .max(tablets as usize)
            .min(node.replica_count()),
        node.stats
            .replayed_frames
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        r = server => { r??; }
    }
    cancel.cancel();
    if let Some(watch) = filter_watch {
        let _ = watch.await;
    }
    node.shutdown().await;
    if let Some(a) = agent {
        let _ = a.await;
    }
    if let Some(c) = controller {
        c.shutdown().await;
    }
    Ok(())
}

/// A directory member: its quorum and API on one port, until SIGTERM.
async fn run_directory(
    opts: stele_directory::DirectoryOptions,
    listen: SocketAddr,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let addr = listener.local_addr()?;
    let d = stele_directory::Directory::start(opts)
        .await
        .context("start directory")?;
    let (api, quorum) = d.services();
    let routes = tonic::service::Routes::default()
        .add_service(api)
        .add_service(quorum);
    serve_until_signal(
        routes,
        listener,
        &format!("stele directory: listening on http://{addr}"),
    )
    .await?;
    d.shutdown().await;
    Ok(())
}

/// Serves `routes` (no data API) on `listener`, prints `ready`, and returns
/// after Ctrl-C or SIGTERM (or an error of the server), the server stopped.
async fn serve_until_signal(
    routes: tonic::service::Routes,
    listener: tokio::net::TcpListener,
    ready: &str,
) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let server = tokio::spawn(stele_node::service::serve_with(
        None,
        routes,
        listener,
        cancel.clone(),
    ));
    println!("{ready}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        r = server => { r??; }
    }
    cancel.cancel();
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the cause chain; RUST_BACKTRACE stays for panics.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,stele=info,stele_node=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Dev(mut a) => {
                if a.tuning.cold.object_store.is_none() {
                    // Dev default: a local bucket beside the nodes' data,
                    // shared by every node of a dev cell.
                    std::fs::create_dir_all(&a.data_dir)?;
                    let abs = std::fs::canonicalize(&a.data_dir)?;
                    a.tuning.cold.object_store =
                        Some(format!("file://{}", abs.join("bucket").display()));
                }
                anyhow::ensure!(
                    a.listen.ip().is_loopback(),
                    "stele dev serves plaintext and listens on loopback only; got {}",
                    a.listen
                );
                if a.nodes > 1 || a.cells > 1 {
                    let mut tuning = a.tuning.to_args();
                    if a.cells > 1 {
                        // Each cell gets its own id (c1, c2, ...).
                        let at = tuning.iter().position(|f| f == "--cell-id");
                        if let Some(at) = at {
                            tuning.drain(at..at + 2);
                        }
                    }
                    let flags = dev_cell::ChildFlags {
                        tablets: a.tablets,
                        tuning,
                    };
                    return dev_cell::run(&a.data_dir, a.listen, a.cells, a.nodes, flags).await;
                }
                let mut o = node_options(a.data_dir, 1, a.tablets, String::new(), &a.tuning);
                o.tier = a.tuning.cold.open()?;
                run_server(o, a.listen, "dev", None, ControlRoles::node_only()).await
            }
            Command::Server(a) => {
                let is_node = a.roles.iter().any(|r| r == "node");
                let is_controller = a.roles.iter().any(|r| r == "controller");
                if let Some(bad) = a
                    .roles
                    .iter()
                    .find(|r| !matches!(r.as_str(), "node" | "controller" | "directory"))
                {
                    anyhow::bail!("unknown role {bad:?}: want node, controller, directory");
                }
                if a.roles.iter().any(|r| r == "directory") {
                    anyhow::ensure!(
                        !is_node && !is_controller,
                        "the directory role runs alone in its process (its own --listen)"
                    );
                    anyhow::ensure!(
                        a.directory_id > 0,
                        "the directory role needs --directory-id"
                    );
                    let mut d =
                        stele_directory::DirectoryOptions::new(a.directory_id, a.data_dir.clone());
                    d.auto_create = a.auto_create_namespaces;
                    return run_directory(d, a.listen).await;
                }
                let controller = if is_controller {
                    anyhow::ensure!(
                        a.controller_id > 0,
                        "the controller role needs --controller-id"
                    );
                    let mut co = stele_controller::ControllerOptions::new(
                        a.controller_id,
                        a.data_dir.clone(),
                        String::new(),
                    );
                    co.lease = Duration::from_millis(a.lease_ms);
                    co.repair_grace = Duration::from_millis(a.repair_grace_ms);
                    co.leader_balance_every = Duration::from_millis(a.leader_balance_ms);
                    co.split = stele_controller::autosplit::SplitPolicy {
                        bytes: a.split_bytes,
                        writes_per_s: a.split_writes_per_s,
                        reads_per_s: a.split_reads_per_s,
                        window: Duration::from_millis(a.split_window_ms),
                        cooldown: Duration::from_millis(a.split_cooldown_ms),
                        merge_below_percent: a.merge_below_percent,
                    };
                    Some(co)
                } else {
                    None
                };
                let controlled = !a.controllers.is_empty();
                let agent = controlled.then(|| stele_node::agent::AgentOptions {
                    controllers: a.controllers.clone(),
                    client_endpoint: String::new(),
                    peer_endpoint: String::new(),
                    zone: a.zone.clone(),
                    rack: a.rack.clone(),
                    capacity: a.capacity,
                    interval: Duration::from_millis(a.heartbeat_ms),
                    catch_up: Duration::from_secs(60),
                });
                let roles = ControlRoles {
                    controller,
                    agent,
                    node: is_node,
                };
                let node_dir = if is_controller && is_node {
                    a.data_dir.join("node")
                } else {
                    a.data_dir.clone()
                };
                let mut o = node_options(node_dir, a.node_id, a.tablets, String::new(), &a.tuning);
                o.controlled = controlled;
                if !a.directory.is_empty() {
                    o.directory = Some(stele_node::ownership::DirectoryLink {
                        endpoints: a.directory.clone(),
                        cell: a.tuning.cold.cell_id.clone(),
                        timeout: Duration::from_secs(2),
                    });
                }
                if is_node {
                    o.tier = a.tuning.cold.open()?;
                }
                if controlled {
                    let listen = a.peer_listen.context("--controllers needs --peer-listen")?;
                    let certs = a
                        .certs
                        .clone()
                        .context("--controllers needs --certs (see `stele cert`)")?;
                    return run_server(
                        o,
                        a.listen,
                        "server",
                        Some(Peering {
                            listen,
                            peers: Vec::new(),
                            certs,
                        }),
                        roles,
                    )
                    .await;
                }
                if !is_node {
                    return run_server(o, a.listen, "controller", None, roles).await;
                }
                let peering = if a.peers.is_empty() {
                    None
                } else {
                    let listen = a.peer_listen.context("--peers needs --peer-listen")?;
                    let certs = a
                        .certs
                        .context("--peers needs --certs (see `stele cert`)")?;
                    let mut peers = Vec::new();
                    for (id, addr) in &a.peers {
                        let addr: SocketAddr = addr
                            .parse()
                            .with_context(|| format!("peer {id} address {addr:?}"))?;
                        peers.push((*id, addr));
                    }
                    o.cell_nodes = std::iter::once(a.node_id)
                        .chain(peers.iter().map(|(id, _)| *id))
                        .collect();
                    o.cell_nodes.sort_unstable();
                    o.cell_nodes.dedup();
                    o.peer_endpoints = a.peer_endpoints.into_iter().collect();
                    Some(Peering {
                        listen,
                        peers,
                        certs,
                    })
                };
                run_server(o, a.listen, "server", peering, roles).await
            }
            Command::Cert(CertCommand::Init { out }) => {
                stele_node::certs::init_ca(&out)
                    .with_context(|| format!("create CA in {}", out.display()))?;
                println!("cell CA written to {}", out.display());
                Ok(())
            }
            Command::Cert(CertCommand::Node { ca, node_id, out }) => {
                stele_node::certs::issue_node(&ca, node_id, &out)
                    .with_context(|| format!("issue node {node_id} certificate"))?;
                println!("node {node_id} certificate written to {}", out.display());
                Ok(())
            }
            Command::Append(a) => ops::run_append(a).await,
            Command::Scan(a) => ops::run_scan(a).await,
            Command::Bench(a) => ops::run_bench(a).await,
            Command::Status(a) => ops::run_status(a).await,
            Command::Cell(c) => cellops::run_cell(c).await,
            Command::NodeCmd(c) => cellops::run_node(c).await,
            Command::Tablet(c) => cellops::run_tablet(c).await,
            Command::Intent(c) => cellops::run_intent(c).await,
            Command::Directory(c) => dirops::run_directory(c).await,
            Command::Ns(c) => dirops::run_ns(c).await,
            Command::Restore(a) => restore::run(a).await,
        }
    })
}
