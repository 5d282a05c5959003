//! `stele gateway`: a stateless HTTP/JSON (and, with `--grpc-listen`,
//! gRPC) front for producers in any language (docs/OPERATIONS.md
//! "Gateways and the HTTP API").
//!
//! ```text
//! producer ─HTTP─▶ gateway: admit (memory budget, 429) ─▶ parse, validate (4xx)
//!                      ├─ Idempotency-Key ─▶ batches by vshard, ids from the key (idempotency)
//!                      ├─ one record, no token ─▶ Batcher (coalesced per tablet)
//!                      └─ else ─▶ Client::append with the producer's token
//! producer ─gRPC─▶ gateway (stele.v1.Data, routed for the caller: grpc.rs)
//!                  ─gRPC─▶ tablet leaders, by the route map the controllers push
//! ```
//!
//! It holds nothing but the route map and requests in flight: any number
//! may run side by side, and a killed one loses nothing acknowledged.

pub mod api;
pub mod grpc;
pub mod idempotency;
pub mod json;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use stele_client::{Batcher, BatcherOptions, Client, ClientOptions};
use stele_proto::addr::HostPort;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use json::ApiError;

#[derive(clap::Args)]
pub struct GatewayArgs {
    /// The cell's controllers (gRPC endpoints, comma-separated).
    #[arg(
        long,
        env = "STELE_CONTROLLERS",
        value_delimiter = ',',
        required_unless_present = "nodes",
        conflicts_with = "nodes"
    )]
    controllers: Vec<String>,
    /// Reach the cell through these nodes only (gRPC endpoints,
    /// comma-separated), not its controllers: the nodes relay the route
    /// map, for a gateway on a network that cannot reach the controllers.
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// Where producers reach the HTTP API (also `/openapi.json`,
    /// `/metrics`, `/healthz`, `/readyz`). Plaintext: off loopback only
    /// with --insecure-plaintext.
    #[arg(long, default_value = "127.0.0.1:7460")]
    http_listen: HostPort,
    /// Also serve the data API over gRPC (`stele.v1.Data`, routed by the
    /// gateway) here; off when not given. Plaintext like --http-listen.
    #[arg(long)]
    grpc_listen: Option<HostPort>,
    /// Serve plaintext HTTP on a non-loopback address.
    #[arg(long)]
    insecure_plaintext: bool,
    /// Bytes of request bodies held at once; a request past it is refused
    /// with 429 and Retry-After.
    #[arg(long, default_value_t = 256 << 20)]
    memory_budget_bytes: usize,
    /// Largest request body.
    #[arg(long, default_value_t = 10 << 20)]
    body_bytes_max: usize,
    /// How long a single-record append waits for others to the same
    /// tablet before its batch is sent.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    linger: Duration,
    /// Refuse every request without `Authorization: Bearer <token>` (401;
    /// gRPC: PERMISSION_DENIED), and call the cell with the `--certs-dir`
    /// CA only, presenting no certificate: every request is then
    /// authorised by its producer's token alone, never by the gateway's
    /// own identity.
    #[arg(long)]
    require_token: bool,
}

/// Limits of one gateway.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub memory_budget_bytes: usize,
    pub body_bytes_max: usize,
    pub linger: Duration,
    /// Refuse requests without a producer token instead of sending them
    /// under the gateway's own identity.
    pub require_token: bool,
}

/// What every handler shares.
pub struct Gateway {
    pub client: Client,
    pub batcher: Batcher,
    pub opts: GatewayOptions,
    budget: Arc<Semaphore>,
}

impl Gateway {
    pub fn new(client: Client, opts: GatewayOptions) -> Gateway {
        let batcher = Batcher::new(
            client.clone(),
            BatcherOptions {
                linger: opts.linger,
                ..BatcherOptions::default()
            },
        );
        let budget = Arc::new(Semaphore::new(
            opts.memory_budget_bytes.min(Semaphore::MAX_PERMITS),
        ));
        Gateway {
            client,
            batcher,
            opts,
            budget,
        }
    }

    /// Holds `declared` bytes (the body limit when the length is not
    /// declared) of the memory budget for the request, or refuses it.
    fn admit(&self, declared: Option<usize>) -> Result<OwnedSemaphorePermit, ApiError> {
        let limit = self.opts.body_bytes_max;
        if let Some(n) = declared
            && n > limit
        {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("body of {n} bytes, limit {limit}"),
            ));
        }
        self.hold(declared.unwrap_or(limit)).ok_or_else(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "the gateway's memory budget is full",
            )
            .retry_after(1)
        })
    }

    /// Holds the budget for a request of `bytes` (held about twice: its
    /// bytes, then its records), or `None` (counted) when it is full.
    fn hold(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let want = (bytes.max(1) * 2).min(self.opts.memory_budget_bytes);
        let permits = u32::try_from(want).unwrap_or(u32::MAX);
        let Ok(held) = self.budget.clone().try_acquire_many_owned(permits) else {
            metrics::counter!("stele_gateway_refused_total", "reason" => "overloaded").increment(1);
            return None;
        };
        metrics::gauge!("stele_gateway_budget_bytes_held")
            .set((self.opts.memory_budget_bytes - self.budget.available_permits()) as f64);
        Some(held)
    }

    fn count(&self, op: &'static str, status: StatusCode) {
        metrics::counter!("stele_gateway_requests_total", "op" => op, "status" => status.as_str().to_string())
            .increment(1);
    }

    fn records(&self, n: usize) {
        metrics::counter!("stele_gateway_records_total").increment(n as u64);
    }

    /// A read's answer, counted.
    fn answer<T: serde::Serialize>(
        &self,
        op: &'static str,
        r: Result<T, ApiError>,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        match r {
            Ok(v) => {
                self.count(op, StatusCode::OK);
                axum::Json(v).into_response()
            }
            Err(e) => {
                self.count(op, e.status);
                e.into_response()
            }
        }
    }
}

/// The gateway's metrics, present from the first scrape.
pub fn register_metrics() {
    let _ = metrics::counter!("stele_gateway_records_total");
    let _ = metrics::counter!("stele_gateway_refused_total", "reason" => "overloaded");
    let _ = metrics::gauge!("stele_gateway_budget_bytes_held");
    let _ = metrics::counter!("stele_gateway_route_redirects_total");
    let _ = metrics::counter!("stele_gateway_route_pushes_total");
    let _ = metrics::gauge!("stele_gateway_route_watching");
}

/// The route cache's counters as metrics, every second: how many calls
/// took a redirect for want of a current route, and pushed route changes.
async fn route_metrics(client: Client) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = client.route_stats();
        metrics::counter!("stele_gateway_route_redirects_total").absolute(s.redirects);
        metrics::counter!("stele_gateway_route_pushes_total").absolute(s.pushed);
        metrics::gauge!("stele_gateway_route_watching").set(if s.watching { 1.0 } else { 0.0 });
    }
}

/// The API's routes; `/openapi.json` describes them.
pub fn router(gw: Arc<Gateway>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route(
            "/v1/namespaces/{workspace}/{project}/records",
            post(api::append).get(api::scan_namespace),
        )
        .route(
            "/v1/namespaces/{workspace}/{project}/keys/{key}",
            get(api::get_key),
        )
        .route(
            "/v1/namespaces/{workspace}/{project}/keys/{key}/records",
            get(api::scan_key),
        )
        .route("/openapi.json", get(api::openapi))
        .fallback(api::not_found)
        .with_state(gw)
}

/// The HTTP API a node serves itself on its status listener (`stele dev`,
/// `stele server --http-api`; small plaintext setups): routed to once the
/// node serves ([`start_in_node`]), 503 before.
static NODE_API: OnceLock<axum::Router> = OnceLock::new();
static NODE_API_WANTED: AtomicBool = AtomicBool::new(false);

/// The status listener's fallback when the node serves the API: the API's
/// router once [`start_in_node`] made it.
pub fn in_node_router() -> axum::Router {
    NODE_API_WANTED.store(true, Ordering::SeqCst);
    axum::Router::new().fallback(|req: axum::extract::Request| async move {
        use axum::response::IntoResponse;
        match NODE_API.get() {
            // A Router is always ready: `call` needs no `poll_ready` first.
            Some(r) => match tower_service::Service::call(&mut r.clone(), req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            },
            None => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the node's HTTP API starts once the node serves",
            )
            .retry_after(1)
            .into_response(),
        }
    })
}

/// Whether this process serves the API on its status listener.
pub fn in_node_wanted() -> bool {
    NODE_API_WANTED.load(Ordering::SeqCst)
}

/// Makes the node's HTTP API: a client of its own cell, its routes from
/// the node's relay of the controllers' map when the cell has controllers,
/// else from the node's own tablets.
pub async fn start_in_node(controllers: Vec<String>, own: String) -> anyhow::Result<()> {
    let opts = ClientOptions::default();
    let client = if controllers.is_empty() {
        Client::connect(&own, opts).await
    } else {
        Client::connect_nodes(&[own], opts).await
    }
    .context("the node's HTTP API: loading routes")?;
    let gw = Arc::new(Gateway::new(
        client,
        GatewayOptions {
            memory_budget_bytes: 256 << 20,
            body_bytes_max: 10 << 20,
            linger: Duration::from_millis(2),
            // A plaintext cell: no identity to borrow.
            require_token: false,
        },
    ));
    register_metrics();
    tokio::spawn(route_metrics(gw.client.clone()));
    let _ = NODE_API.set(router(gw));
    Ok(())
}

pub async fn run(a: GatewayArgs) -> anyhow::Result<()> {
    if !a.insecure_plaintext {
        for (flag, at) in std::iter::once(("--http-listen", &a.http_listen))
            .chain(a.grpc_listen.iter().map(|g| ("--grpc-listen", g)))
        {
            anyhow::ensure!(
                crate::security::is_loopback(at),
                "{flag} {at} is not loopback: the gateway serves plaintext, so pass --insecure-plaintext (behind a TLS proxy) to serve it there",
            );
        }
    }
    let mut opts: ClientOptions = crate::security::cli_options()?;
    if a.require_token {
        // The nodes then see only the producers' tokens: with the
        // gateway's certificate on the connection, its rights would
        // stand in for a token's (a certificate's rights win).
        opts.tls = crate::security::cli_anonymous()?;
    }
    let client = if a.nodes.is_empty() {
        Client::connect_cell(&a.controllers, opts).await
    } else {
        Client::connect_nodes(&a.nodes, opts).await
    }
    .with_context(|| {
        let from = if a.nodes.is_empty() {
            &a.controllers
        } else {
            &a.nodes
        };
        format!("loading routes from {}", from.join(","))
    })?;
    let gw = Arc::new(Gateway::new(
        client,
        GatewayOptions {
            memory_budget_bytes: a.memory_budget_bytes.max(1),
            body_bytes_max: a.body_bytes_max.max(1),
            linger: a.linger,
            require_token: a.require_token,
        },
    ));
    register_metrics();
    // Printed before the HTTP line, which says the gateway is up.
    if let Some(at) = &a.grpc_listen {
        let listener = tokio::net::TcpListener::bind(at.to_string())
            .await
            .with_context(|| format!("--grpc-listen {at}"))?;
        let bound = listener.local_addr()?;
        let service = grpc::GrpcData::new(gw.clone()).server();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!(error = %e, "the gateway's gRPC listener stopped");
            }
        });
        println!("stele gateway: gRPC data API (stele.v1.Data) at http://{bound}");
    }
    let bound = crate::http::spawn_with(&a.http_listen, router(gw.clone())).await?;
    crate::http::health().set_ready(true);
    println!("stele gateway: listening on http://{bound} (HTTP API; OpenAPI at /openapi.json)");
    tokio::spawn(route_metrics(gw.client.clone()));
    crate::stop::Signals::new()?.next().await;
    crate::http::health().set_ready(false);
    Ok(())
}
