//! Wires the QUIC transport to the tablets' Raft groups: outgoing Raft
//! messages go out as transport calls, incoming calls are handed to the
//! replica they name. Both directions pass the node's [`PeerFilter`]
//! (fault injection; empty unless a test sets it).

mod filter;

use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;

use crate::raft::hibernate::{BEAT_GROUP, PeerLiveness};
use crate::raft::inbound::Inbound;
use crate::raft::router::{CallFuture, Lane, Peers};
use crate::replicas::ReplicaSet;
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

/// What the handler delivers to: the node's replicas, the Raft inbound
/// side, and the node's filter. The node owns it.
pub struct Receiver {
    pub replicas: ReplicaSet,
    pub inbound: Inbound,
    pub filter: Arc<PeerFilter>,
    /// When each peer node was last heard from (sleeping groups count
    /// it as their leader's heartbeat).
    pub liveness: Arc<PeerLiveness>,
}

impl Receiver {
    /// Delivers a Raft message from a peer node to the replica of `group`
    /// it names (no filter: the handler applies it first).
    pub async fn deliver(
        &self,
        group: u64,
        target_replica: u64,
        body: &[u8],
    ) -> Result<Bytes, crate::raft::inbound::Error> {
        let r = self
            .replicas
            .replica(group)
            .ok_or(crate::raft::inbound::Error::UnknownGroup { group })?;
        self.inbound.deliver(&r, target_replica, body).await
    }
}

/// The transport handler of a node. The transport is bound before the node
/// opens (the node's Raft groups send through it, and the inbound side
/// fetches snapshot segments through it), so the node's [`Receiver`] is
/// attached once the node is open. The handler holds it weakly: the
/// receiver's replicas hold the transport, which holds this handler.
#[derive(Default)]
pub struct RaftHandler {
    receiver: OnceLock<Weak<Receiver>>,
}

impl RaftHandler {
    pub fn new() -> Arc<RaftHandler> {
        Arc::new(RaftHandler::default())
    }

    /// Starts delivering to `receiver` (the first call wins); until then
    /// every call is refused as from a node shutting down.
    pub fn attach(&self, receiver: &Arc<Receiver>) {
        let _ = self.receiver.set(Arc::downgrade(receiver));
    }
}

impl Handler for RaftHandler {
    fn handle(&self, from_node: u64, req: Request) -> HandlerFuture {
        let receiver = self.receiver.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(receiver) = receiver else {
                return Err(RemoteError::ShuttingDown);
            };
            if receiver.filter.drops(from_node) {
                return Err(RemoteError::Refused {
                    reason: PeerFilter::reason(from_node),
                });
            }
            receiver.liveness.heard(from_node);
            if req.group == BEAT_GROUP {
                return Ok(Bytes::new());
            }
            let Some(r) = receiver.replicas.replica(req.group) else {
                return Err(RemoteError::UnknownGroup { group: req.group });
            };
            receiver
                .inbound
                .deliver(&r, req.target_replica, &req.body)
                .await
                .map_err(|e| RemoteError::Refused {
                    reason: e.to_string(),
                })
        })
    }
}
