//! `stele server`: a storage node, a controller, or both (`--roles`), or a
//! directory member alone. This module turns the flags into options and
//! picks the assembly (`crate::server`); it starts nothing itself.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use stele_proto::addr::HostPort;

use crate::addresses::{CLIENT, Endpoint, PEER};
use crate::server::{ControlRoles, Peering, run_directory, run_server};
use crate::tuning::{Tuning, node_options};

#[derive(clap::Args)]
pub struct ServerArgs {
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
    /// Controller: most topology intents (moves, transfers, splits,
    /// merges) open at once. Repairing a lost node moves every voter it
    /// held at most this many at a time; a large cell repairs faster with
    /// more, at the cost of more catch-up traffic at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_intents: u32,
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
    /// Controller and directory roles with --object-store: the leader
    /// writes its state to the bucket at most this often, ms, after a change
    /// (`cells/<cell-id>/control/`, `directory/`).
    #[arg(long, default_value_t = 10_000)]
    control_backup_ms: u64,
    /// Client (gRPC, TCP) address to listen on: `HOST:PORT`, a name, an
    /// IPv4 address or `[IPv6]:PORT`; `0.0.0.0` needs --advertise.
    #[arg(long)]
    listen: HostPort,
    /// HTTP status listener, `HOST:PORT`: `/healthz` (alive) and `/readyz`
    /// (serving: not starting or stopping, journal up), for probes and
    /// `stele health`.
    #[arg(long)]
    http_listen: Option<HostPort>,
    /// Also serve the HTTP API of `stele gateway` on --http-listen (a
    /// node of a small plaintext cell; docs/OPERATIONS.md "Gateways and
    /// the HTTP API").
    #[arg(long, requires = "http_listen")]
    http_api: bool,
    /// The client `HOST:PORT` others are told (routes, leader hints); by
    /// default the --listen address, which then must not be 0.0.0.0 or ::.
    #[arg(long)]
    advertise: Option<HostPort>,
    #[arg(long)]
    data_dir: PathBuf,
    /// Tablets to create in a new data directory.
    #[arg(long, default_value_t = 16)]
    tablets: u32,
    /// Node-to-node (QUIC, UDP) address to listen on, `HOST:PORT`;
    /// needed with --peers or --controllers.
    #[arg(long)]
    peer_listen: Option<HostPort>,
    /// The QUIC `HOST:PORT` other nodes are told; by default the
    /// --peer-listen address, which then must not be 0.0.0.0 or ::.
    #[arg(long)]
    peer_advertise: Option<HostPort>,
    /// The other nodes of the cell: `ID=HOST:PORT,...` (their --peer-listen).
    #[arg(long, value_delimiter = ',', value_parser = parse_id_pair)]
    peers: Vec<(u64, String)>,
    /// Client endpoints of the other nodes, for leader hints: `ID=URL,...`.
    #[arg(long, value_delimiter = ',', value_parser = parse_id_pair)]
    peer_endpoints: Vec<(u64, String)>,
    /// This process's certificate directory: node.pem (naming each of its
    /// roles), node.key, ca.pem. With it, the gRPC listener is TLS.
    #[arg(long)]
    certs: Option<PathBuf>,
    /// Serve gRPC in plaintext even off loopback (no TLS, no caller
    /// identities: anyone who reaches the port may call every API).
    #[arg(long)]
    insecure_plaintext: bool,
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

pub async fn run(a: ServerArgs) -> anyhow::Result<()> {
    // Checked before anything binds: a refusal starts nothing.
    let listen = Endpoint::new(CLIENT, a.listen.clone(), a.advertise.clone())?;
    let peer_listen = match (&a.peer_listen, &a.peer_advertise) {
        (Some(l), adv) => Some(Endpoint::new(PEER, l.clone(), adv.clone())?),
        (None, Some(_)) => anyhow::bail!("--peer-advertise needs --peer-listen"),
        (None, None) => None,
    };
    let is_node = a.roles.iter().any(|r| r == "node");
    let is_controller = a.roles.iter().any(|r| r == "controller");
    if let Some(bad) = a
        .roles
        .iter()
        .find(|r| !matches!(r.as_str(), "node" | "controller" | "directory"))
    {
        anyhow::bail!("unknown role {bad:?}: want node, controller, directory");
    }
    let mut want = Vec::new();
    if a.roles.iter().any(|r| r == "directory") {
        want.push(stele_tls::Role::Directory(a.directory_id));
    }
    if is_node {
        want.push(stele_tls::Role::Node(a.node_id));
    }
    if is_controller {
        want.push(stele_tls::Role::Controller(a.controller_id));
    }
    let tls = crate::security::server_credentials(
        a.certs.as_deref(),
        a.insecure_plaintext,
        &a.listen,
        &want,
    )?;
    let client_tls = crate::security::client_of(&tls);
    anyhow::ensure!(
        !a.http_api || tls.is_none(),
        "--http-api serves plaintext HTTP: run `stele gateway` in front of a TLS cell"
    );
    if let Some(h) = &a.http_listen {
        let api = if a.http_api {
            crate::gateway::in_node_router()
        } else {
            axum::Router::new()
        };
        let bound = crate::http::spawn_with(h, api).await?;
        // On stdout: `stele dev` relays it with the member's name.
        println!("stele: HTTP status (/metrics, /healthz, /readyz) at http://{bound}");
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
        let mut d = stele_directory::DirectoryOptions::new(a.directory_id, a.data_dir.clone());
        d.auto_create = a.auto_create_namespaces;
        d.tls = client_tls;
        if let Some(b) = a.tuning.cold.bucket()? {
            let mut backup = stele_directory::backup::DirectoryBackup::new(b.directory);
            backup.interval = Duration::from_millis(a.control_backup_ms);
            d.backup = Some(backup);
        }
        return run_directory(d, listen, tls).await;
    }
    let controller = if is_controller {
        anyhow::ensure!(
            a.controller_id > 0,
            "the controller role needs --controller-id"
        );
        let mut co = controller_options(&a);
        co.tls = client_tls.clone();
        if let Some(b) = a.tuning.cold.bucket()? {
            let mut backup =
                stele_controller::backup::ControlBackup::new(b.controller, &a.tuning.cold.cell_id);
            backup.interval = Duration::from_millis(a.control_backup_ms);
            co.backup = Some(backup);
        }
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
        tls: client_tls.clone(),
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
            tls: client_tls.clone(),
        });
    }
    if is_node {
        o.tier = a.tuning.cold.open()?;
    }
    if controlled {
        let peer_listen = peer_listen.context("--controllers needs --peer-listen")?;
        let certs = a
            .certs
            .clone()
            .context("--controllers needs --certs (see `stele cert`)")?;
        return run_server(
            o,
            listen,
            "server",
            Some(Peering {
                listen: peer_listen,
                peers: Vec::new(),
                certs,
            }),
            roles,
            tls,
        )
        .await;
    }
    if !is_node {
        return run_server(o, listen, "controller", None, roles, tls).await;
    }
    let peering = if a.peers.is_empty() {
        None
    } else {
        let peer_listen = peer_listen.context("--peers needs --peer-listen")?;
        let certs = a
            .certs
            .context("--peers needs --certs (see `stele cert`)")?;
        let mut peers = Vec::new();
        for (id, addr) in &a.peers {
            let addr =
                stele_proto::addr::dialable(addr).with_context(|| format!("--peers {id}"))?;
            peers.push((*id, addr));
        }
        o.cell_nodes = std::iter::once(a.node_id)
            .chain(peers.iter().map(|(id, _)| *id))
            .collect();
        o.cell_nodes.sort_unstable();
        o.cell_nodes.dedup();
        for (id, url) in &a.peer_endpoints {
            stele_proto::addr::dialable_url(url)
                .with_context(|| format!("--peer-endpoints {id}"))?;
        }
        o.peer_endpoints = a.peer_endpoints.into_iter().collect();
        Some(Peering {
            listen: peer_listen,
            peers,
            certs,
        })
    };
    run_server(o, listen, "server", peering, roles, tls).await
}

/// The controller role's options from the flags.
fn controller_options(a: &ServerArgs) -> stele_controller::ControllerOptions {
    let mut co = stele_controller::ControllerOptions::new(
        a.controller_id,
        a.data_dir.clone(),
        String::new(),
    );
    co.lease = Duration::from_millis(a.lease_ms);
    co.repair_grace = Duration::from_millis(a.repair_grace_ms);
    co.leader_balance_every = Duration::from_millis(a.leader_balance_ms);
    co.max_intents = a.max_intents as usize;
    co.split = stele_controller::autosplit::SplitPolicy {
        bytes: a.split_bytes,
        writes_per_s: a.split_writes_per_s,
        reads_per_s: a.split_reads_per_s,
        window: Duration::from_millis(a.split_window_ms),
        cooldown: Duration::from_millis(a.split_cooldown_ms),
        merge_below_percent: a.merge_below_percent,
    };
    co
}

impl ServerArgs {
    /// Who this process is to an OpenTelemetry collector (`crate::otel`).
    pub fn telemetry(&self) -> crate::otel::Identity {
        let mut attributes = Vec::new();
        for role in &self.roles {
            match role.as_str() {
                "node" => attributes.push(("stele.node.id", self.node_id.to_string())),
                "controller" => {
                    attributes.push(("stele.controller.id", self.controller_id.to_string()))
                }
                "directory" => {
                    attributes.push(("stele.directory.id", self.directory_id.to_string()))
                }
                _ => {}
            }
        }
        if !self.roles.iter().any(|r| r == "directory") {
            attributes.push(("stele.cell.id", self.tuning.cold.cell_id.clone()));
        }
        crate::otel::Identity {
            service: self.roles.join("+"),
            attributes,
        }
    }
}
