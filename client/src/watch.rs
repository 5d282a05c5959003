//! Keeps a controller-routed client's route cache current from the
//! controllers' pushed route changes (`WatchRoutes`), so requests after a
//! split, merge, move or leader change go straight to the right leader.
//!
//! ```text
//! open WatchRoutes(since = cached generation) at the controller leader
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

/// Opens the stream at the controller leader (following `NotLeader`
/// through the admin client); `None` once the client is gone.
async fn open(
    inner: &Weak<Inner>,
) -> Option<crate::Result<tonic::codec::Streaming<pb::GetRoutesResponse>>> {
    let client = upgrade(inner)?;
    let admin = client.inner.admin.as_ref()?;
    let since = client.route_since();
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
