//! The network seam of tablet groups. A single-voter tablet never sends a
//! message; this implementation answers every call with `Unreachable`, which
//! openraft treats as a peer it cannot reach. The QUIC transport replaces it
//! when tablets get peers.

use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RaftNetworkV2};

use super::{SnapshotData, TabletConfig, Vote};

type Snapshot = openraft::alias::SnapshotOf<TabletConfig, SnapshotData>;

#[derive(Clone, Default)]
pub struct NoPeers;

#[derive(Debug)]
struct NoTransportError;

impl std::fmt::Display for NoTransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("this node has no transport to other replicas")
    }
}

impl std::error::Error for NoTransportError {}

impl RaftNetworkFactory<TabletConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: u64, _node: &openraft::impls::BasicNode) -> NoPeers {
        NoPeers
    }
}

fn unreachable() -> RPCError<TabletConfig> {
    RPCError::Unreachable(Unreachable::new(&NoTransportError))
}

impl RaftNetworkV2<TabletConfig> for NoPeers {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TabletConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TabletConfig>, RPCError<TabletConfig>> {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TabletConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TabletConfig>, RPCError<TabletConfig>> {
        Err(unreachable())
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TabletConfig>, StreamingError<TabletConfig>> {
        Err(StreamingError::Unreachable(Unreachable::new(
            &NoTransportError,
        )))
    }

    async fn transfer_leader(
        &mut self,
        _req: TransferLeaderRequest<TabletConfig>,
        _option: RPCOption,
    ) -> Result<openraft::raft::TransferLeaderResponse<TabletConfig>, RPCError<TabletConfig>> {
        Err(unreachable())
    }
}

/// The [`Peers`](super::router::Peers) of a node without peers: never
/// called, because a one-node cell's groups have no other voter.
#[derive(Clone)]
pub enum NoTransport {}

impl super::router::Peers for NoTransport {
    fn call(
        &self,
        _node: u64,
        _group: u64,
        _target_replica: u64,
        _lane: super::router::Lane,
        _body: bytes::Bytes,
    ) -> super::router::CallFuture<'_> {
        match *self {}
    }
}
