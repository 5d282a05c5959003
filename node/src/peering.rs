//! Wires the QUIC transport to the tablets' Raft groups: outgoing Raft
//! messages go out as transport calls, incoming calls are handed to the
//! replica they name. Both directions pass the node's [`PeerFilter`]
//! (fault injection; empty unless a test sets it).

mod filter;

use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;

use crate::node::Node;
use crate::raft::router::{CallFuture, Lane, Peers};
use crate::transport::{Handler, HandlerFuture, MsgKind, RemoteError, Request, Transport};

pub use filter::{PeerFilter, WATCH_INTERVAL};

/// A transport shared by every tablet group of the node, and the filter
/// its outgoing calls pass (the node's `NodeOptions::peer_filter`).
#[derive(Clone)]
pub struct SharedTransport(pub Arc<Transport>, pub Arc<PeerFilter>);

impl Peers for SharedTransport {
    fn call(
        &self,
        node: u64,
        group: u64,
        target_replica: u64,
        lane: Lane,
        body: Bytes,
    ) -> CallFuture<'_> {
        let req = Request {
            group,
            target_replica,
            kind: match lane {
                Lane::Control => MsgKind::Control,
                Lane::Bulk => MsgKind::Bulk,
            },
            body,
        };
        Box::pin(async move {
            if self.1.drops(node) {
                return Err(crate::raft::router::Error::Filtered { node });
            }
            Ok(self.0.call(node, req).await?)
        })
    }
}

/// The transport handler of a node. The node is set once it is open (the
/// transport must exist first so the node's Raft groups can use it).
#[derive(Default)]
pub struct RaftHandler {
    node: OnceLock<Weak<Node>>,
}

impl RaftHandler {
    pub fn new() -> Arc<RaftHandler> {
        Arc::new(RaftHandler::default())
    }

    pub fn set_node(&self, node: &Arc<Node>) {
        let _ = self.node.set(Arc::downgrade(node));
    }
}

impl Handler for RaftHandler {
    fn handle(&self, from_node: u64, req: Request) -> HandlerFuture {
        let node = self.node.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(node) = node else {
                return Err(RemoteError::ShuttingDown);
            };
            if node.options.peer_filter.drops(from_node) {
                return Err(RemoteError::Refused {
                    reason: PeerFilter::reason(from_node),
                });
            }
            if node.replica(req.group).is_none() {
                return Err(RemoteError::UnknownGroup { group: req.group });
            }
            node.handle_raft(req.group, req.target_replica, &req.body)
                .await
                .map_err(|reason| RemoteError::Refused { reason })
        })
    }
}
