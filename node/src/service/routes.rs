//! The cell's route map relayed by a node (`Data.GetRoutes`,
//! `Data.WatchRoutes`), so clients that reach only nodes keep their routes
//! current without reaching the controllers.
//!
//! ```text
//! controllers ──WatchRoutes──▶ the node's relay (a routing client: its
//!   route cache, the controllers' stream, polling when it breaks)
//!        │ every route answer applied, in order (broadcast)
//!        ▼
//!   each client's WatchRoutes(since): the cache since `since`, then each
//!   answer as it is applied; one that falls behind gets the whole map
//! ```
//!
//! The relay connects at the first call and stays: one stream per node to
//! the controller leader however many clients watch the node.

use std::sync::Arc;

use stele_client::{Client, ClientOptions};
use stele_proto::Error as ApiError;
use stele_proto::pb;
use tonic::Status;

/// The stream of one relayed `WatchRoutes` call.
pub type RouteWatch = tokio_stream::wrappers::ReceiverStream<Result<pb::GetRoutesResponse, Status>>;

/// A node's relay of its cell's route map.
pub struct RouteRelay {
    controllers: Vec<String>,
    opts: ClientOptions,
    client: tokio::sync::OnceCell<Client>,
}

impl RouteRelay {
    /// A relay of the map of the controllers at `controllers`, reached
    /// with `tls` (the node's own client credentials).
    pub fn new(controllers: Vec<String>, tls: Option<stele_tls::ClientTls>) -> RouteRelay {
        RouteRelay {
            controllers,
            opts: ClientOptions {
                tls,
                ..ClientOptions::default()
            },
            client: tokio::sync::OnceCell::new(),
        }
    }

    /// The routing client, connected at the first call (a failed connect
    /// is tried again by the next call).
    async fn client(&self) -> Result<&Client, ApiError> {
        self.client
            .get_or_try_init(|| Client::connect_cell(&self.controllers, self.opts.clone()))
            .await
            .map_err(|e| ApiError::Unavailable {
                reason: format!("this node cannot reach its controllers' route map: {e}"),
            })
    }

    /// The map since `since` (all of it when 0 or ahead of the relay).
    pub async fn get(&self, since: u64) -> Result<pb::GetRoutesResponse, ApiError> {
        Ok(self.client().await?.route_map(since))
    }

    /// A watch from `since`: the map since then, then every route answer
    /// the relay applies, until the caller leaves.
    pub async fn watch(&self, since: u64) -> Result<RouteWatch, ApiError> {
        Ok(RouteWatch::new(self.client().await?.relay_routes(since)))
    }
}

/// What a node without controllers answers route calls with.
pub(super) fn not_managed() -> ApiError {
    ApiError::InvalidArgument {
        field: "routes".into(),
        reason: "this node is not in a controller-managed cell, so it relays no route map \
                 (ListTablets lists its own tablets)"
            .into(),
    }
}

pub(super) type Relay = Option<Arc<RouteRelay>>;
