//! Server assembly: what `stele dev` and `stele server` run once their flags
//! are read. One process serves one client port; on it, in this order:
//!
//! ```text
//! bind --listen ─► controller (controller role: its API and quorum service)
//!               ─► node (node role): Node::open, or with peers: certificate,
//!                  QUIC transport, peer filter, Node::open_with_peers
//!               ─► agent (registers with controllers) or wait for tablets
//!               ─► serve data API + extra routes ─► print "listening on"
//!               ─► Ctrl-C / SIGTERM ─► hand off leaderships, stop serving
//!                  (in-flight calls end), node, agent, controller down
//!                  (`crate::stop`, within --shutdown-deadline-ms)
//! ```
//!
//! A directory member (`--roles directory`) is its own process:
//! [`run_directory`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stele_node::{Node, NodeOptions};
use stele_proto::addr::HostPort;
use tokio_util::sync::CancellationToken;

use crate::addresses::{Endpoint, PEER, bind_address};
use crate::stop::Signals;

/// The controller side of a process, and the node's link to controllers.
pub struct ControlRoles {
    pub controller: Option<stele_controller::ControllerOptions>,
    /// The node registers with these controllers (node role).
    pub agent: Option<stele_node::agent::AgentOptions>,
    /// Run a node at all.
    pub node: bool,
}

impl ControlRoles {
    pub fn node_only() -> ControlRoles {
        ControlRoles {
            controller: None,
            agent: None,
            node: true,
        }
    }
}

/// Node-to-node settings of a multi-node cell.
pub struct Peering {
    pub listen: Endpoint,
    pub peers: Vec<(u64, HostPort)>,
    pub certs: PathBuf,
}

/// An opened node and what its peering leaves running or to hand on.
struct OpenNode {
    node: Arc<Node>,
    /// The agent's way to tell the transport about a peer it learns of.
    set_peer: Option<stele_node::agent::SetPeer>,
    /// The peer-filter file watch (fault injection), stopped by `cancel`.
    filter_watch: Option<tokio::task::JoinHandle<()>>,
    /// The QUIC endpoint other nodes are told (with peers).
    peer_advertised: Option<HostPort>,
}

/// Runs the roles of one process on `listen` until Ctrl-C or SIGTERM.
pub async fn run_server(
    options: NodeOptions,
    listen: Endpoint,
    label: &str,
    peering: Option<Peering>,
    roles: ControlRoles,
    tls: Option<Arc<stele_tls::Credentials>>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen.listen.to_string())
        .await
        .with_context(|| format!("bind --listen {}", listen.listen))?;
    let addr = listener.local_addr()?;
    let advertised = url(&listen.advertised(addr), &tls);
    let cancel = CancellationToken::new();
    let quorum = roles
        .controller
        .is_some()
        .then_some(stele_tls::Kind::Controller);
    let secure = secure(&tls, quorum, &cancel)?;
    let mut routes = tonic::service::Routes::default();
    let mut names = Vec::new();
    let controller = match roles.controller {
        Some(co) => {
            let c = start_controller(co, &advertised).await?;
            let observed = c.clone();
            crate::metrics::on_scrape(move || stele_controller::metrics::observe(&observed));
            crate::console::show_controller(c.clone());
            let (api, quorum) = c.services();
            names.push(service_name(&api));
            routes = routes.add_service(api).add_service(quorum);
            Some(c)
        }
        None => None,
    };
    if !roles.node {
        serve_until_signal(
            routes,
            names,
            listener,
            secure,
            &format!("stele {label}: controller listening on {advertised} (bound {addr})"),
        )
        .await?;
        cancel.cancel();
        if let Some(c) = controller {
            c.shutdown().await;
        }
        return Ok(());
    }
    let mut options = options;
    options.advertise = advertised.clone();
    let data_dir = options.data_dir.clone();
    let tablets = options.initial_tablets;
    let OpenNode {
        node,
        set_peer,
        filter_watch,
        peer_advertised,
    } = open_node(options, peering, &tls, &cancel).await?;
    let controllers = roles
        .agent
        .as_ref()
        .map(|a| a.controllers.clone())
        .unwrap_or_default();
    // Nodes relay the controllers' route map to clients that reach only
    // them (`Data.WatchRoutes`), reaching the controllers as the agent does.
    let relay = roles
        .agent
        .as_ref()
        .map(|a| stele_node::service::RouteRelay::new(a.controllers.clone(), a.tls.clone()));
    let agent = match roles.agent {
        Some(mut ao) => {
            ao.client_endpoint = advertised.clone();
            if ao.peer_endpoint.is_empty() {
                ao.peer_endpoint = peer_advertised.map(|a| a.to_string()).unwrap_or_default();
            }
            // Serves at once (the controller finds it by its client
            // port), not ready until the replicas it has caught up.
            crate::http::catch_up(node.clone(), CATCH_UP_LOG);
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
    crate::http::health().watch_node(node.clone());
    let observer = stele_node::metrics::Observer::new(node.clone());
    crate::metrics::on_scrape(move || observer.observe());
    let data = match relay {
        Some(relay) => node.data_service().with_route_relay(relay),
        None => node.data_service(),
    };
    let server = tokio::spawn(stele_node::service::serve_with(
        Some(data),
        routes,
        names,
        Some(crate::http::health().serving()),
        listener,
        secure,
        cancel.clone(),
    ));
    println!(
        "stele {label}: listening on {advertised} (bound {addr}, data dir {}, {} tablets, replayed {} journal frames)",
        data_dir.display(),
        node.replica_count()
            .max(tablets as usize)
            .min(node.replica_count()),
        node.stats
            .replayed_frames
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    crate::http::health().set_ready(true);
    if crate::gateway::in_node_wanted() {
        // A TLS cell was refused before anything bound (cmd/server.rs).
        let own = advertised.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::gateway::start_in_node(controllers, own).await {
                tracing::error!(error = %format!("{e:#}"), "the node's HTTP API did not start");
            }
        });
    }
    let mut signals = Signals::new()?;
    let mut server = server;
    tokio::select! {
        _ = signals.next() => {}
        r = &mut server => { r??; }
    }
    crate::stop::graceful(&node, &mut signals, &cancel, server).await;
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

/// The endpoint URL others dial: `https://` with TLS.
fn url(advertised: &HostPort, tls: &Option<Arc<stele_tls::Credentials>>) -> String {
    if tls.is_some() {
        advertised.https_url()
    } else {
        advertised.http_url()
    }
}

/// The TLS side of a listener (`None`: plaintext); with it, the
/// credentials are kept fresh (file change, SIGHUP) until `cancel`.
fn secure(
    tls: &Option<Arc<stele_tls::Credentials>>,
    quorum: Option<stele_tls::Kind>,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<stele_tls::server::Secure>> {
    let Some(creds) = tls else {
        return Ok(None);
    };
    crate::security::keep_fresh(creds, cancel);
    let policy = stele_tls::Policy { quorum };
    Ok(Some(
        stele_tls::server::Secure::new(creds.clone(), policy).context("TLS listener")?,
    ))
}

/// How often a node still catching up at start says so in its log.
const CATCH_UP_LOG: Duration = Duration::from_secs(5);

/// The gRPC service name gRPC health reports `svc` under
/// (`stele.v1.Controller`, ...).
fn service_name<S: tonic::server::NamedService>(_: &S) -> &'static str {
    S::NAME
}

/// Starts the controller role; it advertises this process's client port
/// unless told otherwise.
async fn start_controller(
    mut co: stele_controller::ControllerOptions,
    advertised: &str,
) -> anyhow::Result<Arc<stele_controller::Controller>> {
    if co.advertise.is_empty() {
        co.advertise = advertised.to_string();
    }
    stele_controller::Controller::start(co)
        .await
        .context("start controller")
}

/// Opens the node: alone, or with its certificate, QUIC transport and peer
/// filter when it has peers.
async fn open_node(
    mut options: NodeOptions,
    peering: Option<Peering>,
    tls: &Option<Arc<stele_tls::Credentials>>,
    cancel: &CancellationToken,
) -> anyhow::Result<OpenNode> {
    options.tls.clone_from(tls);
    let Some(p) = peering else {
        let node = Node::open(options).await.context("open node")?;
        return Ok(OpenNode {
            node,
            set_peer: None,
            filter_watch: None,
            peer_advertised: None,
        });
    };
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
    let bind = bind_address(PEER.listen, &p.listen.listen).await?;
    let transport = Transport::bind(
        TransportOptions::new(options.node_id, bind, identity),
        handler.clone(),
    )
    .context("bind peer transport")?;
    let peer_advertised = p.listen.advertised(transport.local_addr()?);
    for (id, peer) in &p.peers {
        transport.set_peer(*id, peer.clone());
    }
    let transport = Arc::new(transport);
    // The transport follows the gRPC listener's reloads (the same
    // `--certs`); with a plaintext listener it has credentials of its own,
    // kept fresh the same way.
    let creds = match tls {
        Some(c) => c.clone(),
        None => {
            let c = stele_tls::Credentials::load(stele_tls::Files::in_dir(
                &p.certs,
                crate::security::SERVER_STEM,
            ))
            .with_context(|| format!("load node certificate from {}", p.certs.display()))?;
            crate::security::keep_fresh(&c, cancel);
            options.tls = Some(c.clone());
            c
        }
    };
    crate::security::follow_in_transport(&creds, &p.certs, transport.clone(), cancel);
    let t = transport.clone();
    let set_peer: stele_node::agent::SetPeer = Arc::new(move |id, addr| t.set_peer(id, addr));
    // Fault injection for partition tests: a file of node ids to cut off,
    // reread while the process runs (docs/OPERATIONS.md).
    let filter = options.peer_filter.clone();
    let mut filter_watch = None;
    if let Some(path) = crate::switches::peer_block_file() {
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
    Ok(OpenNode {
        node,
        set_peer: Some(set_peer),
        filter_watch,
        peer_advertised: Some(peer_advertised),
    })
}

/// A directory member: its quorum and API on one port, until SIGTERM.
pub async fn run_directory(
    opts: stele_directory::DirectoryOptions,
    listen: Endpoint,
    tls: Option<Arc<stele_tls::Credentials>>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen.listen.to_string())
        .await
        .with_context(|| format!("bind --listen {}", listen.listen))?;
    let addr = listener.local_addr()?;
    let advertised = url(&listen.advertised(addr), &tls);
    let cancel = CancellationToken::new();
    let secure = secure(&tls, Some(stele_tls::Kind::Directory), &cancel)?;
    let d = stele_directory::Directory::start(opts)
        .await
        .context("start directory")?;
    let observed = d.clone();
    crate::metrics::on_scrape(move || stele_directory::metrics::observe(&observed));
    crate::console::show_directory(d.clone());
    let (api, quorum) = d.services();
    let names = vec![service_name(&api)];
    let routes = tonic::service::Routes::default()
        .add_service(api)
        .add_service(quorum);
    serve_until_signal(
        routes,
        names,
        listener,
        secure,
        &format!("stele directory: listening on {advertised} (bound {addr})"),
    )
    .await?;
    cancel.cancel();
    d.shutdown().await;
    Ok(())
}

/// Serves `routes` (no data API) on `listener`, prints `ready`, and returns
/// after Ctrl-C or SIGTERM (or an error of the server), the server stopped.
async fn serve_until_signal(
    routes: tonic::service::Routes,
    names: Vec<&'static str>,
    listener: tokio::net::TcpListener,
    secure: Option<stele_tls::server::Secure>,
    ready: &str,
) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let server = tokio::spawn(stele_node::service::serve_with(
        None,
        routes,
        names,
        Some(crate::http::health().serving()),
        listener,
        secure,
        cancel.clone(),
    ));
    println!("{ready}");
    crate::http::health().set_ready(true);
    let mut signals = Signals::new()?;
    tokio::select! {
        _ = signals.next() => {}
        r = server => { r??; }
    }
    crate::http::health().set_ready(false);
    cancel.cancel();
    Ok(())
}
