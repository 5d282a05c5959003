//! Keeps a controller-routed client's route cache current from the
//! controllers' pushed route changes (`WatchRoutes`), so requests after a
//! split, merge, move or leader change go straight to the right leader. A
//! client connected through nodes ([`Client::connect_nodes`]) watches one
//! node's relay of the same changes instead, moving to the next node when
//! that one fails.
//!
//! ```text
//! open WatchRoutes(since = cached generation) at the controller leader
//!                                            (or a node, in turn)
//!   ├─ each message ─▶ Client::apply_routes (whole map, or changed/removed tablets)
//!   └─ stream ends or fails (leader change, network) ─▶ poll GetRoutes once,
//!        wait (250 ms doubling to 5 s, reset by a message), open again
//! ```
//!
//! `StaleRoute`/`NotLeader` still repair the cache as hints between
//! messages. The task holds the client only weakly: it ends when the last
//! handle is dropped (and is aborted then).

use std::sync::Weak;
use std::time::Duration;

use stele_proto::pb;

use crate::client::{Client, Inner};

const PAUSE_MIN: Duration = Duration::from_millis(250);
const PAUSE_MAX: Duration = Duration::from_secs(5);

/// Runs until the client is dropped.
pub(crate) async fn run(inner: Weak<Inner>) {
    let mut pause = PAUSE_MIN;
    loop {
        let Some(opened) = open(&inner).await else {
            return;
        };
        match opened {
            Ok(mut stream) => {
                set_watching(&inner, true);
                loop {
                    match stream.message().await {
                        Ok(Some(msg)) => {
                            let Some(client) = upgrade(&inner) else {
                                return;
                            };
                            client.apply_routes(&msg);
                            client.inner.stats.pushed(&msg);
                            pause = PAUSE_MIN;
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(error = %status, "route watch ended");
                            break;
                        }
                    }
                }
                set_watching(&inner, false);
            }
            Err(e) => tracing::debug!(error = %e, "route watch not opened"),
        }
        // Changes made while no stream was open: poll once.
        if let Some(client) = upgrade(&inner)
            && let Err(e) = client.refresh_routes().await
        {
            tracing::debug!(error = %e, "route refresh failed");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PAUSE_MAX);
    }
}

fn upgrade(inner: &Weak<Inner>) -> Option<Client> {
    inner.upgrade().map(Client::from_inner)
}

fn set_watching(inner: &Weak<Inner>, on: bool) {
    if let Some(i) = inner.upgrade() {
        i.stats.set_watching(on);
    }
}

type RouteStream = tonic::codec::Streaming<pb::GetRoutesResponse>;

/// Opens the stream at the controller leader (following `NotLeader`
/// through the admin client), or at a relaying node; `None` once the
/// client is gone.
async fn open(inner: &Weak<Inner>) -> Option<crate::Result<RouteStream>> {
    let client = upgrade(inner)?;
    let since = client.route_since();
    if !client.inner.route_nodes.is_empty() {
        return Some(
            at_nodes(&client, |mut c| async move {
                c.watch_routes(pb::WatchRoutesRequest {
                    since_generation: since,
                })
                .await
            })
            .await,
        );
    }
    let admin = client.inner.admin.as_ref()?;
    Some(
        admin
            .call(|mut c| async move {
                c.watch_routes(pb::WatchRoutesRequest {
                    since_generation: since,
                })
                .await
            })
            .await,
    )
}

/// The route map since `since` from the first relaying node that answers.
pub(crate) async fn get_routes_from_nodes(
    client: &Client,
    since: u64,
) -> crate::Result<pb::GetRoutesResponse> {
    at_nodes(client, |mut c| async move {
        c.get_routes(pb::GetRoutesRequest {
            since_generation: since,
        })
        .await
    })
    .await
}

/// Makes `call` at the client's route nodes in turn, from the one that
/// answered last, until one answers; the last failure if none does. A node
/// that refuses (a cell without controllers, a caller without access) is
/// an answer: no other node of that cell would do better.
async fn at_nodes<T, F, Fut>(client: &Client, call: F) -> crate::Result<T>
where
    F: Fn(crate::client::Data) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    use std::sync::atomic::Ordering;
    let nodes = &client.inner.route_nodes;
    let first = client.inner.route_node.load(Ordering::Relaxed);
    let mut last = None;
    for i in 0..nodes.len() {
        let at = (first + i) % nodes.len();
        let endpoint = &nodes[at];
        let answer = match client.data(endpoint) {
            Ok(c) => client.timed(endpoint, call(c)).await,
            Err(e) => Err(e),
        };
        match answer {
            Err(e) if !refused(&e) => {
                tracing::debug!(endpoint, error = %e, "route node did not answer");
                last = Some(e);
            }
            other => {
                client.inner.route_node.store(at, Ordering::Relaxed);
                return other;
            }
        }
    }
    Err(last.expect("at least one route node"))
}

/// A node's refusal, which every node of the cell would repeat.
fn refused(e: &crate::Error) -> bool {
    matches!(
        e.api(),
        Some(
            stele_proto::Error::InvalidArgument { .. }
                | stele_proto::Error::PermissionDenied { .. }
        )
    )
}
