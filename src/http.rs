//! The HTTP status listener (`--http-listen`) of every server role:
//! `/healthz` (liveness: the process answers and, on a node, the journal
//! has not stopped) and `/readyz` (readiness: serving, not starting, not
//! catching up, not stopping, journal up). Load balancers, Compose and
//! Kubernetes probes and `stele health` read them. gRPC health on the
//! client port follows the same readiness ([`Health::serving`]). Also
//! `/metrics`: every metric of the process in the Prometheus text format
//! (`crate::metrics`; docs/OPERATIONS.md "Metrics"). And the read-only web
//! console at `/` (`crate::console`; docs/OPERATIONS.md "Console").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use stele_node::Node;
use stele_node::service::Serving;
use stele_proto::addr::HostPort;
use tokio::sync::watch;

/// How often readiness is recomputed for gRPC health (a journal stops on
/// its own; the rest is also pushed when set).
const REFRESH: Duration = Duration::from_millis(200);

/// What the probes answer from: set by the server as it starts and stops.
pub struct Health {
    ready: AtomicBool,
    /// Why the node is still catching up at start; `None` once caught up
    /// (or with nothing to catch up: controller, directory).
    catching_up: Mutex<Option<String>>,
    node: OnceLock<Arc<Node>>,
    /// Readiness as gRPC health reports it, refreshed every [`REFRESH`].
    serving: watch::Sender<Serving>,
    refresher: OnceLock<()>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            ready: AtomicBool::new(false),
            catching_up: Mutex::new(None),
            node: OnceLock::new(),
            serving: watch::Sender::new(Serving {
                serving: false,
                reason: NOT_READY.into(),
            }),
            refresher: OnceLock::new(),
        }
    }
}

const NOT_READY: &str = "not ready: starting or stopping";

/// The process's one health state (one server per process).
pub fn health() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(Health::default)
}

impl Health {
    /// Serving (true) or not: starting, or in a graceful stop (false).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.refresh();
    }

    /// Still catching up at start (`Some(why)`), or caught up (`None`).
    pub fn set_catching_up(&self, why: Option<String>) {
        *self.catching_up.lock().expect("lock poisoned") = why;
        self.refresh();
    }

    /// The node whose journal the probes watch (node role).
    pub fn watch_node(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
        self.refresh();
    }

    /// Readiness as it changes, for gRPC health (`serve_with`). The first
    /// call starts the refresh that notices a journal stopping.
    pub fn serving(&'static self) -> watch::Receiver<Serving> {
        self.refresher.get_or_init(|| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(REFRESH);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    self.refresh();
                }
            });
        });
        self.refresh();
        self.serving.subscribe()
    }

    /// Recomputes readiness into the watch (receivers wake on a change).
    fn refresh(&self) {
        let (code, reason) = self.readiness();
        let now = Serving {
            serving: code == StatusCode::OK,
            reason,
        };
        self.serving.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
    }

    /// Why the process is not alive, if it is not: a stopped journal (a
    /// device error) takes no write again until restarted.
    fn dead(&self) -> Option<String> {
        let node = self.node.get()?;
        node.journal
            .stats()
            .stopped
            .map(|why| format!("journal stopped: {why}"))
    }

    fn live(&self) -> (StatusCode, String) {
        match self.dead() {
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
            None => (StatusCode::OK, "ok".into()),
        }
    }

    fn readiness(&self) -> (StatusCode, String) {
        if let Some(why) = self.dead() {
            return (StatusCode::SERVICE_UNAVAILABLE, why);
        }
        if !self.ready.load(Ordering::SeqCst) {
            return (StatusCode::SERVICE_UNAVAILABLE, NOT_READY.into());
        }
        if let Some(why) = &*self.catching_up.lock().expect("lock poisoned") {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: catching up: {why}"),
            );
        }
        (StatusCode::OK, "ready".into())
    }
}

/// Marks the node as catching up until every replica it hosts now has a
/// leader that reached it since start and has applied what that leader had
/// committed ([`Node::wait_caught_up`]), retried and logged every
/// `timeout` while it is not; runs in the background (the node serves
/// meanwhile, not ready).
pub fn catch_up(node: Arc<Node>, timeout: Duration) -> tokio::task::JoinHandle<()> {
    let hosted = node.replicas();
    health().set_catching_up(Some(format!("{} replicas starting", hosted.len())));
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        loop {
            match node.wait_caught_up(&hosted, timeout).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "still catching up");
                    health().set_catching_up(Some(e.to_string()));
                    // A group shutting down fails at once: not a busy loop.
                    tokio::select! {
                        _ = node.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
        }
        tracing::info!(
            replicas = hosted.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "caught up"
        );
        health().set_catching_up(None);
    })
}

/// Binds `addr` and serves the probes in the background, with `api`'s
/// routes beside them (a gateway's or a node's HTTP API; an empty router
/// for none); its fallback answers unknown paths. A bind failure is an
/// error at start, naming the flag.
pub async fn spawn_with(
    addr: &HostPort,
    api: axum::Router,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr.to_string())
        .await
        .with_context(|| format!("bind --http-listen {addr}"))?;
    let bound = listener.local_addr()?;
    crate::metrics::spawn_upkeep();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async {
                // The hooks read stats and /proc: cheap, but blocking.
                let text = tokio::task::spawn_blocking(crate::metrics::render)
                    .await
                    .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    text,
                )
            }),
        )
        .route("/healthz", axum::routing::get(|| async { health().live() }))
        .route(
            "/readyz",
            axum::routing::get(|| async { health().readiness() }),
        )
        .merge(crate::console::router())
        .merge(api);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "HTTP status listener stopped");
        }
    });
    Ok(bound)
}
