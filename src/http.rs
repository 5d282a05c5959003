//! The HTTP status listener (`--http-listen`) of every server role:
//! `/healthz` (liveness: the process answers and, on a node, the journal
//! has not stopped) and `/readyz` (readiness: serving, not starting, not
//! stopping, journal up). Load balancers, Compose and Kubernetes probes
//! and `stele health` read them. A small axum router, so metrics and a
//! console can join it later.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use axum::http::StatusCode;
use stele_node::Node;
use stele_proto::addr::HostPort;

/// What the probes answer from: set by the server as it starts and stops.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    node: OnceLock<Arc<Node>>,
}

/// The process's one health state (one server per process).
pub fn health() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(Health::default)
}

impl Health {
    /// Serving (true) or not: starting, or in a graceful stop (false).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// The node whose journal the probes watch (node role).
    pub fn watch_node(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
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
        if self.ready.load(Ordering::SeqCst) {
            (StatusCode::OK, "ready".into())
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: starting or stopping".into(),
            )
        }
    }
}

/// Binds `addr` and serves the probes in the background. A bind failure is
/// an error at start, naming the flag.
pub async fn spawn(addr: &HostPort) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr.to_string())
        .await
        .with_context(|| format!("bind --http-listen {addr}"))?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { health().live() }))
        .route(
            "/readyz",
            axum::routing::get(|| async { health().readiness() }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "HTTP status listener stopped");
        }
    });
    Ok(bound)
}
