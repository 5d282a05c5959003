//! Raft messages between replicas of a tablet on different nodes.
//!
//! ```text
//! openraft (tablet k) ─► GroupNetworkAdapter ─► Router::{append_entries,..}
//!     ─► RaftRpc (CBOR) ─► Peers::call(node, group k, target replica) ─► network
//!     ─► dispatch() on the receiving node ─► that replica's openraft
//! ```
//!
//! The group id is the tablet id. Replica ids carry their node id in the low
//! 16 bits (`node_of`), so a message needs no directory lookup to find its
//! node. Every message names its group and target replica; the receiver
//! refuses a message for a group it does not host or a replica that is not
//! its own.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_multi::GroupRouter;
use serde::{Deserialize, Serialize};

use super::{SnapshotMeta, TabletConfig, TabletRaft, Vote, decode, encode};
use crate::tablet::state_machine::SnapshotData;

type C = TabletConfig;
type Snapshot = openraft::alias::SnapshotOf<C, SnapshotData>;

/// Bits of a replica id that name its node.
pub const NODE_BITS: u32 = 16;

/// The node that hosts `replica`.
pub fn node_of(replica: u64) -> u64 {
    replica & ((1 << NODE_BITS) - 1)
}

/// The replica id of `tablet` on `node` (static placement; the controller
/// will allocate ids that are never reused).
pub fn replica_id(tablet: u64, node: u64) -> u64 {
    (tablet << NODE_BITS) | node
}

/// Version of the RPC envelope.
const RPC_V: u16 = 1;

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub enum RaftRpc {
    Append(AppendEntriesRequest<C>),
    Vote(VoteRequest<C>),
    PreVote(VoteRequest<C>),
    Snapshot {
        vote: Vote,
        meta: SnapshotMeta,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    TransferLeader(TransferLeaderRequest<C>),
    /// A byte range of a published segment of the group (snapshot catch-up).
    FetchSegment {
        id: String,
        offset: u64,
        len: u32,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub enum RaftReply {
    Append(AppendEntriesResponse<C>),
    Vote(VoteResponse<C>),
    Snapshot(SnapshotResponse<C>),
    TransferLeader(Result<(), String>),
    /// A segment chunk and the segment's whole length.
    Segment {
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
        file_len: u64,
    },
    /// The receiver could not hand the message to Raft.
    Refused(String),
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u16,
    msg: T,
}

pub fn encode_msg<T: Serialize>(msg: T) -> Bytes {
    Bytes::from(encode(&Envelope { v: RPC_V, msg }))
}

pub fn decode_msg<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T, String> {
    let env: Envelope<T> = decode(what, bytes).map_err(|e| e.to_string())?;
    if env.v != RPC_V {
        return Err(format!("{what}: unknown version {}", env.v));
    }
    Ok(env.msg)
}

/// Whether a message is small control traffic or a bulk transfer that must
/// not delay control messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Control,
    Bulk,
}

/// The future of one peer call.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + 'a>>;

/// Sends one request to a peer node and returns its reply bytes. The
/// transport implements this; tests may loop it back in process.
pub trait Peers: Clone + Send + Sync + 'static {
    fn call(
        &self,
        node: u64,
        group: u64,
        target_replica: u64,
        lane: Lane,
        body: Bytes,
    ) -> CallFuture<'_>;
}

/// Largest segment chunk one fetch asks for.
pub const SEGMENT_CHUNK_BYTES: u32 = 8 << 20;

/// Fetches segment `id` of `group` from `node` (replica `replica`) in
/// chunks, verifying the content hash before returning it.
pub async fn fetch_segment<P: Peers>(
    peers: &P,
    node: u64,
    group: u64,
    replica: u64,
    id: &str,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let rpc = RaftRpc::FetchSegment {
            id: id.to_string(),
            offset: out.len() as u64,
            len: SEGMENT_CHUNK_BYTES,
        };
        let bytes = peers
            .call(node, group, replica, Lane::Bulk, encode_msg(rpc))
            .await?;
        match decode_msg::<RaftReply>("segment chunk", &bytes)? {
            RaftReply::Segment { bytes, file_len } => {
                if bytes.is_empty() && (out.len() as u64) < file_len {
                    return Err(format!("segment {id}: empty chunk before the end"));
                }
                out.extend_from_slice(&bytes);
                if out.len() as u64 > file_len {
                    return Err(format!(
                        "segment {id}: peer sent more than {file_len} bytes"
                    ));
                }
                if out.len() as u64 == file_len {
                    break;
                }
            }
            RaftReply::Refused(e) => return Err(e),
            _ => return Err(format!("segment {id}: unexpected reply")),
        }
    }
    let got = crate::segment::segment_id(&out);
    if got != id {
        return Err(format!("segment {id}: fetched bytes hash to {got}"));
    }
    Ok(out)
}

/// Reads `len` bytes at `offset` of segment `id` in `dir`. The id must be a
/// segment id (32 hex digits): a peer cannot name any other file.
fn read_segment_chunk(
    dir: &std::path::Path,
    id: &str,
    offset: u64,
    len: u32,
) -> Result<RaftReply, String> {
    use std::os::unix::fs::FileExt;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{id:?} is not a segment id"));
    }
    let path = dir.join(crate::segment::file_name(id));
    let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file_len = file.metadata().map_err(|e| e.to_string())?.len();
    let len = u64::from(len.min(SEGMENT_CHUNK_BYTES)).min(file_len.saturating_sub(offset));
    let mut bytes = vec![0; len as usize];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| e.to_string())?;
    Ok(RaftReply::Segment { bytes, file_len })
}

/// openraft-multi router over [`Peers`]: one per node, shared by every group.
#[derive(Clone)]
pub struct Router<P: Peers> {
    peers: P,
}

impl<P: Peers> Router<P> {
    pub fn new(peers: P) -> Self {
        Router { peers }
    }

    /// A control-lane call whose reply `pick` extracts.
    async fn control<T>(
        &self,
        target: u64,
        group: u64,
        rpc: RaftRpc,
        what: &str,
        pick: impl FnOnce(RaftReply) -> Option<T>,
    ) -> Result<T, RPCError<C>> {
        match self.rpc(target, group, Lane::Control, rpc).await {
            Ok(RaftReply::Refused(e)) | Err(e) => Err(unreachable(e)),
            Ok(reply) => pick(reply).ok_or_else(|| unexpected(what)),
        }
    }

    async fn rpc(
        &self,
        target: u64,
        group: u64,
        lane: Lane,
        rpc: RaftRpc,
    ) -> Result<RaftReply, String> {
        let bytes = self
            .peers
            .call(node_of(target), group, target, lane, encode_msg(rpc))
            .await?;
        decode_msg("raft reply", &bytes)
    }
}

#[derive(Debug)]
struct PeerError(String);

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerError {}

fn unreachable(e: String) -> RPCError<C> {
    RPCError::Unreachable(Unreachable::new(&PeerError(e)))
}

fn unexpected(what: &str) -> RPCError<C> {
    RPCError::Network(NetworkError::new(&PeerError(format!(
        "unexpected reply to {what}"
    ))))
}

impl<P: Peers> GroupRouter<C, u64> for Router<P> {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: u64,
        group: u64,
        rpc: AppendEntriesRequest<C>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        self.control(target, group, RaftRpc::Append(rpc), "append", |r| match r {
            RaftReply::Append(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn vote(
        &self,
        target: u64,
        group: u64,
        rpc: VoteRequest<C>,
        _option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.control(target, group, RaftRpc::Vote(rpc), "vote", |r| match r {
            RaftReply::Vote(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn pre_vote(
        &self,
        target: u64,
        group: u64,
        rpc: VoteRequest<C>,
        _option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.control(
            target,
            group,
            RaftRpc::PreVote(rpc),
            "pre-vote",
            |r| match r {
                RaftReply::Vote(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn full_snapshot(
        &self,
        target: u64,
        group: u64,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let rpc = RaftRpc::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
        };
        let send = self.rpc(target, group, Lane::Bulk, rpc);
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = send => match reply {
                Ok(RaftReply::Snapshot(r)) => Ok(r),
                Ok(RaftReply::Refused(e)) | Err(e) => Err(StreamingError::Unreachable(Unreachable::new(&PeerError(e)))),
                Ok(_) => Err(StreamingError::Network(NetworkError::new(&PeerError("unexpected reply to snapshot".into())))),
            },
        }
    }

    async fn transfer_leader(
        &self,
        target: u64,
        group: u64,
        req: TransferLeaderRequest<C>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<C>, RPCError<C>> {
        match self
            .rpc(target, group, Lane::Control, RaftRpc::TransferLeader(req))
            .await
        {
            Ok(RaftReply::TransferLeader(Ok(()))) => Ok(Ok(())),
            Ok(RaftReply::TransferLeader(Err(e))) | Ok(RaftReply::Refused(e)) | Err(e) => {
                Err(unreachable(e))
            }
            Ok(_) => Err(unexpected("transfer-leader")),
        }
    }
}

/// Hands one decoded message to the local replica's Raft and encodes the
/// reply. `raft` is the replica named by the message (the caller checked the
/// group and the target replica id).
pub async fn dispatch(raft: &TabletRaft, segment_dir: &std::path::Path, body: &[u8]) -> Bytes {
    let rpc: RaftRpc = match decode_msg("raft rpc", body) {
        Ok(rpc) => rpc,
        Err(e) => return encode_msg(RaftReply::Refused(e)),
    };
    let reply = match rpc {
        RaftRpc::Append(r) => raft
            .append_entries(r)
            .await
            .map(RaftReply::Append)
            .map_err(|e| e.to_string()),
        RaftRpc::Vote(r) => raft
            .vote(r)
            .await
            .map(RaftReply::Vote)
            .map_err(|e| e.to_string()),
        RaftRpc::PreVote(r) => raft
            .pre_vote(r)
            .await
            .map(RaftReply::Vote)
            .map_err(|e| e.to_string()),
        RaftRpc::Snapshot { vote, meta, data } => raft
            .install_full_snapshot(
                vote,
                Snapshot {
                    meta,
                    snapshot: std::io::Cursor::new(data),
                },
            )
            .await
            .map(RaftReply::Snapshot)
            .map_err(|e| e.to_string()),
        RaftRpc::TransferLeader(r) => raft
            .handle_transfer_leader(r)
            .await
            .map(|r| RaftReply::TransferLeader(r.map_err(|e| e.to_string())))
            .map_err(|e| e.to_string()),
        RaftRpc::FetchSegment { id, offset, len } => {
            let dir = segment_dir.to_path_buf();
            tokio::task::spawn_blocking(move || read_segment_chunk(&dir, &id, offset, len))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r)
        }
    };
    encode_msg(reply.unwrap_or_else(RaftReply::Refused))
}

/// The network factory of one tablet group: hands openraft a client per
/// target replica, all sharing the node's one router.
#[derive(Clone)]
pub struct GroupNetwork<P: Peers> {
    router: Router<P>,
    group: u64,
}

impl<P: Peers> GroupNetwork<P> {
    pub fn new(router: &Router<P>, group: u64) -> Self {
        GroupNetwork {
            router: router.clone(),
            group,
        }
    }
}

impl<P: Peers> openraft::network::RaftNetworkFactory<C> for GroupNetwork<P> {
    type Network = openraft_multi::GroupNetworkAdapter<C, u64, Router<P>>;

    async fn new_client(
        &mut self,
        target: u64,
        _node: &openraft::impls::BasicNode,
    ) -> Self::Network {
        openraft_multi::GroupNetworkAdapter::new(self.router.clone(), target, self.group)
    }
}
