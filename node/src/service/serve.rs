//! The gRPC server of a process: the data API (on a node), the extra
//! services of its other roles, gRPC health and reflection on one port.
//!
//! gRPC health reports "" (the whole server), `stele.v1.Data` and the
//! names the caller gives as SERVING or NOT_SERVING, following a
//! [`Serving`] watch the process keeps (the same state as its HTTP
//! `/readyz`); without one, always SERVING.

use std::net::SocketAddr;
use std::time::Duration;

use stele_proto::pb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;

use super::DataService;

/// Whether the process takes calls and, if not, why (starting, catching
/// up, stopping, journal stopped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    pub serving: bool,
    pub reason: String,
}

impl Serving {
    pub fn status(&self) -> ServingStatus {
        if self.serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    }
}

/// Serves the data API, gRPC health and reflection on `addr` until `cancel`.
pub async fn serve(
    service: impl Into<DataService>,
    addr: SocketAddr,
    cancel: CancellationToken,
) -> crate::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::Error::io(format!("bind {addr}"), e))?;
    serve_on(service, listener, cancel).await
}

/// Like [`serve`], on a listener the caller bound (port 0 in tests);
/// health always SERVING.
pub async fn serve_on(
    service: impl Into<DataService>,
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> crate::Result<()> {
    serve_with(
        Some(service.into()),
        tonic::service::Routes::default(),
        Vec::new(),
        None,
        listener,
        None,
        cancel,
    )
    .await
}

/// Serves the data API (when this process is a node) together with
/// `extra` services (the controller's, when it is one) on one port. gRPC
/// health reports "", `stele.v1.Data` (with a data API) and `extra_names`
/// as `serving` says, until `cancel`. With `secure`, every connection is
/// TLS and every call passes the authorization layer first
/// (`stele_tls::auth`); without, plaintext and unchecked.
pub async fn serve_with(
    service: Option<DataService>,
    extra: tonic::service::Routes,
    extra_names: Vec<&'static str>,
    serving: Option<watch::Receiver<Serving>>,
    listener: tokio::net::TcpListener,
    secure: Option<stele_tls::server::Secure>,
    cancel: CancellationToken,
) -> crate::Result<()> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| crate::Error::Serve {
            what: "gRPC reflection",
            reason: e.to_string(),
        })?;
    let mut routes = extra.add_service(health_service).add_service(reflection);
    let mut names = vec![""];
    names.extend(extra_names);
    if let Some(service) = service {
        names.push(pb::data_server::DataServer::<DataService>::NAME);
        routes = routes.add_service(
            pb::data_server::DataServer::new(service).max_decoding_message_size(64 << 20),
        );
    }
    let reporter = health_reporter.clone();
    let all = names.clone();
    let report = move |status: ServingStatus| {
        let reporter = reporter.clone();
        let names = all.clone();
        async move {
            for name in names {
                reporter.set_service_status(name, status).await;
            }
        }
    };
    match serving {
        None => report(ServingStatus::Serving).await,
        Some(mut serving) => {
            // Set before the first call is taken, then followed.
            let first = serving.borrow_and_update().clone();
            report(first.status()).await;
            let cancel = cancel.clone();
            let mut reporter = health_reporter.clone();
            let names = names.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        // A change made just before `cancel` is reported.
                        biased;
                        changed = serving.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                        _ = cancel.cancelled() => {
                            // Ends open `Watch` streams: the server's
                            // graceful stop waits for calls in flight.
                            for name in names {
                                reporter.clear_service_status(name).await;
                            }
                            return;
                        }
                    }
                    let now = serving.borrow_and_update().clone();
                    tracing::info!(serving = now.serving, reason = %now.reason, "gRPC health");
                    report(now.status()).await;
                }
            });
        }
    }
    let mut builder = tonic::transport::Server::builder().timeout(Duration::from_secs(60));
    let served = match secure {
        None => {
            // TCP_NODELAY on every accepted connection, as the TLS path
            // sets it: without it a small response waits on Nagle and the
            // client's delayed ACK (about 40 ms at p99 in a plaintext
            // benchmark, docs/BENCHMARKS.md "TLS on gRPC against
            // plaintext").
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            builder
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, cancel.cancelled())
                .await
        }
        Some(secure) => {
            let incoming = stele_tls::server::incoming(listener, secure.config, cancel.clone());
            builder
                .layer(stele_tls::AuthLayer::new(secure.policy))
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, cancel.cancelled())
                .await
        }
    };
    served.map_err(|e| crate::Error::Serve {
        what: "gRPC data API",
        reason: e.to_string(),
    })
}
