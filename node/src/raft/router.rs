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

use super::{SnapshotData, SnapshotMeta, TabletConfig, TabletRaft, Vote, decode, encode};

type C = TabletConfig;
type Snapshot = openraft::alias::SnapshotOf<C, SnapshotData>;

/// Bits of a replica id that name its node.
pub const NODE_BITS: u32 = 16;

/// The shortest deadline of a control-lane Raft call (appends, votes).
const CONTROL_TIMEOUT_MIN: std::time::Duration = std::time::Duration::from_secs(2);

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

/// Why a Raft message or a segment fetch between nodes failed. openraft
/// takes each as "unreachable" and retries on its own schedule; a failed
/// segment fetch fails the snapshot's delivery, which the leader repeats.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport did not deliver the call or got no answer.
    #[error(transparent)]
    Transport(#[from] crate::transport::Error),
    /// The node's peer filter drops traffic with `node` (fault injection).
    #[error("node {node} is cut off by the peer filter (fault injection)")]
    Filtered { node: u64 },
    /// The receiving node could not hand the message to Raft, in its words.
    #[error("{reason}")]
    Refused { reason: String },
    /// Bytes that are not a message of any kind.
    #[error(transparent)]
    Decode(Box<crate::error::Error>),
    /// A message in an envelope version this build does not speak.
    #[error("{what}: unknown version {version}")]
    Version { what: String, version: u16 },
    /// A control call got no answer within openraft's deadline for it.
    #[error("{what} to replica {target} timed out after {ttl:?}")]
    TimedOut {
        what: String,
        target: u64,
        ttl: std::time::Duration,
    },
    /// A well-formed reply of the wrong kind.
    #[error("unexpected reply to {what}")]
    UnexpectedReply { what: String },
    /// A segment chunk larger than the fetch asked for.
    #[error(
        "segment {id}: peer sent a chunk of {bytes} bytes, more than the {SEGMENT_CHUNK_BYTES} asked for"
    )]
    ChunkTooLarge { id: String, bytes: usize },
    /// A fetch named something other than a segment id.
    #[error("{id:?} is not a segment id")]
    NotASegmentId { id: String },
    /// Receiving or verifying a fetched segment failed.
    #[error(transparent)]
    Segment(#[from] crate::segment::Error),
    /// Reading a segment chunk to send failed.
    #[error("{}: {source}", .path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A blocking file task panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// `router::Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    /// A leader asks a follower of an idle group to stop expecting
    /// heartbeats (`raft::hibernate`); answered by [`RaftReply::Sleep`].
    /// A node built before hibernation cannot decode it and refuses, which
    /// keeps the group awake.
    Sleep(super::hibernate::SleepRequest),
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
    /// Whether the follower agreed to sleep.
    Sleep(bool),
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u16,
    msg: T,
}

pub fn encode_msg<T: Serialize>(msg: T) -> Bytes {
    Bytes::from(encode(&Envelope { v: RPC_V, msg }))
}

pub fn decode_msg<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T> {
    let env: Envelope<T> = decode(what, bytes).map_err(|e| Error::Decode(Box::new(e)))?;
    if env.v != RPC_V {
        return Err(Error::Version {
            what: what.to_owned(),
            version: env.v,
        });
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
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<Bytes>> + Send + 'a>>;

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

/// Fetches segment `id` (`file_len` bytes, as the snapshot naming it
/// records) of `group` from `node` (replica `replica`) into `dir`, one chunk
/// of at most [`SEGMENT_CHUNK_BYTES`] at a time: each chunk goes to a part
/// file as it arrives ([`crate::segment::Incoming`]), and the file is
/// published as `<dir>/<id>.seg` only once its length and content hash
/// check out. On any failure, or if this future is dropped, no file is left
/// under either name.
pub async fn fetch_segment<P: Peers>(
    peers: &P,
    node: u64,
    group: u64,
    replica: u64,
    id: &str,
    file_len: u64,
    dir: &std::path::Path,
) -> Result<std::path::PathBuf> {
    let (dir_, id_) = (dir.to_path_buf(), id.to_string());
    let mut incoming =
        blocking(move || crate::segment::Incoming::create(&dir_, &id_, file_len)).await?;
    while !incoming.is_complete() {
        let rpc = RaftRpc::FetchSegment {
            id: id.to_string(),
            offset: incoming.received(),
            len: SEGMENT_CHUNK_BYTES,
        };
        let bytes = peers
            .call(node, group, replica, Lane::Bulk, encode_msg(rpc))
            .await?;
        let (chunk, declared) = match decode_msg::<RaftReply>("segment chunk", &bytes)? {
            RaftReply::Segment { bytes, file_len } => (bytes, file_len),
            RaftReply::Refused(reason) => return Err(Error::Refused { reason }),
            _ => {
                return Err(Error::UnexpectedReply {
                    what: format!("segment {id} fetch"),
                });
            }
        };
        drop(bytes);
        if chunk.len() > SEGMENT_CHUNK_BYTES as usize {
            return Err(Error::ChunkTooLarge {
                id: id.to_owned(),
                bytes: chunk.len(),
            });
        }
        // The part file moves to a blocking thread and back; if this future
        // is dropped meanwhile, the thread drops it, which removes the file.
        incoming = blocking(move || incoming.append(&chunk, declared).map(|()| incoming)).await?;
    }
    blocking(move || incoming.finish()).await
}

/// Runs blocking file I/O off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::segment::Result<T> + Send + 'static,
) -> Result<T> {
    Ok(tokio::task::spawn_blocking(f).await??)
}

/// Reads `len` bytes at `offset` of segment `id` in `dir`. The id must be a
/// segment id (32 hex digits): a peer cannot name any other file.
fn read_segment_chunk(dir: &std::path::Path, id: &str, offset: u64, len: u32) -> Result<RaftReply> {
    use std::os::unix::fs::FileExt;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::NotASegmentId { id: id.to_owned() });
    }
    let path = dir.join(crate::segment::file_name(id));
    let read = || {
        let file = std::fs::File::open(&path)?;
        let file_len = file.metadata()?.len();
        let len = u64::from(len.min(SEGMENT_CHUNK_BYTES)).min(file_len.saturating_sub(offset));
        let mut bytes = vec![0; len as usize];
        file.read_exact_at(&mut bytes, offset)?;
        Ok(RaftReply::Segment { bytes, file_len })
    };
    read().map_err(|source| Error::Io { path, source })
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
    /// A control-lane call bounded by openraft's deadline for it (with a
    /// floor, so a large append on a busy machine is not cut short): a
    /// peer that stops answering (SIGSTOP, a black-holed link) fails the
    /// call instead of holding it until the QUIC idle timeout, and openraft
    /// backs off, stops counting the entries in flight, and may purge.
    async fn control<T>(
        &self,
        target: u64,
        group: u64,
        rpc: RaftRpc,
        what: &str,
        option: &RPCOption,
        pick: impl FnOnce(RaftReply) -> Option<T>,
    ) -> Result<T, RPCError<C>> {
        let ttl = option.hard_ttl().max(CONTROL_TIMEOUT_MIN);
        match tokio::time::timeout(ttl, self.rpc(target, group, Lane::Control, rpc)).await {
            Err(_) => Err(unreachable(Error::TimedOut {
                what: what.to_owned(),
                target,
                ttl,
            })),
            Ok(Ok(RaftReply::Refused(reason))) => Err(unreachable(Error::Refused { reason })),
            Ok(Err(e)) => Err(unreachable(e)),
            Ok(Ok(reply)) => pick(reply).ok_or_else(|| unexpected(what)),
        }
    }

    async fn rpc(&self, target: u64, group: u64, lane: Lane, rpc: RaftRpc) -> Result<RaftReply> {
        let bytes = self
            .peers
            .call(node_of(target), group, target, lane, encode_msg(rpc))
            .await?;
        decode_msg("raft reply", &bytes)
    }
}

fn unreachable(e: Error) -> RPCError<C> {
    RPCError::Unreachable(Unreachable::new(&e))
}

fn unexpected(what: &str) -> RPCError<C> {
    RPCError::Network(NetworkError::new(&Error::UnexpectedReply {
        what: what.to_owned(),
    }))
}

impl<P: Peers> GroupRouter<C, u64> for Router<P> {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: u64,
        group: u64,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        self.control(
            target,
            group,
            RaftRpc::Append(rpc),
            "append",
            &option,
            |r| match r {
                RaftReply::Append(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn vote(
        &self,
        target: u64,
        group: u64,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.control(
            target,
            group,
            RaftRpc::Vote(rpc),
            "vote",
            &option,
            |r| match r {
                RaftReply::Vote(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn pre_vote(
        &self,
        target: u64,
        group: u64,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.control(
            target,
            group,
            RaftRpc::PreVote(rpc),
            "pre-vote",
            &option,
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
                Ok(RaftReply::Refused(reason)) => Err(StreamingError::Unreachable(Unreachable::new(&Error::Refused { reason }))),
                Err(e) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
                Ok(_) => Err(StreamingError::Network(NetworkError::new(&Error::UnexpectedReply { what: "snapshot".into() }))),
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
            Ok(RaftReply::TransferLeader(Err(reason)) | RaftReply::Refused(reason)) => {
                Err(unreachable(Error::Refused { reason }))
            }
            Err(e) => Err(unreachable(e)),
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
        Err(e) => return encode_msg(RaftReply::Refused(e.to_string())),
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
                .map_err(Error::from)
                .and_then(|r| r)
                .map_err(|e| e.to_string())
        }
        // Answered by `Inbound::deliver`, which knows the replica.
        RaftRpc::Sleep(_) => Ok(RaftReply::Sleep(false)),
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::segment::file_name;

    /// What the fake peer does to its answers.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Fault {
        None,
        FlipByteInSecondChunk,
        RefuseSecondChunk,
        HangOnSecondChunk,
        LieAboutLength,
    }

    /// Serves one segment in chunks of 1,000 bytes (less than asked, as a
    /// peer may), with an optional fault.
    #[derive(Clone)]
    struct FakePeer {
        bytes: Arc<Vec<u8>>,
        fault: Fault,
        calls: Arc<AtomicU32>,
    }

    impl Peers for FakePeer {
        fn call(&self, _: u64, _: u64, _: u64, _: Lane, body: Bytes) -> CallFuture<'_> {
            Box::pin(async move {
                let RaftRpc::FetchSegment { offset, .. } = decode_msg("fetch", &body)? else {
                    return Err(Error::Refused {
                        reason: "not a fetch".into(),
                    });
                };
                let n = self.calls.fetch_add(1, Ordering::SeqCst);
                let at = offset as usize;
                let mut chunk = self.bytes[at..(at + 1000).min(self.bytes.len())].to_vec();
                let mut file_len = self.bytes.len() as u64;
                match (self.fault, n) {
                    (Fault::FlipByteInSecondChunk, 1) => chunk[10] ^= 0x40,
                    (Fault::RefuseSecondChunk, 1) => {
                        return Ok(encode_msg(RaftReply::Refused("gone".into())));
                    }
                    (Fault::HangOnSecondChunk, 1) => std::future::pending::<()>().await,
                    (Fault::LieAboutLength, _) => file_len += 1,
                    _ => {}
                }
                Ok(encode_msg(RaftReply::Segment {
                    bytes: chunk,
                    file_len,
                }))
            })
        }
    }

    fn sample() -> (String, Vec<u8>) {
        // Incompressible values, so the file spans several 1,000-byte chunks.
        crate::segment::sample_segment(30, |i| {
            (0..200u64)
                .scan(i + 1, |x, _| {
                    *x ^= *x << 13;
                    *x ^= *x >> 7;
                    *x ^= *x << 17;
                    Some(*x as u8)
                })
                .collect()
        })
    }

    fn files(dir: &Path) -> Vec<String> {
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    #[tokio::test]
    async fn fetch_streams_chunks_into_the_published_file() {
        let (id, bytes) = sample();
        assert!(
            bytes.len() > 3000,
            "want several chunks, got {}",
            bytes.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let seg_dir = dir.path().join("segments");
        let peer = FakePeer {
            bytes: Arc::new(bytes.clone()),
            fault: Fault::None,
            calls: Default::default(),
        };
        let path = fetch_segment(&peer, 2, 7, 9, &id, bytes.len() as u64, &seg_dir)
            .await
            .unwrap();
        assert_eq!(path, seg_dir.join(file_name(&id)));
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        assert_eq!(files(&seg_dir), vec![file_name(&id)]);
        assert!(peer.calls.load(Ordering::SeqCst) > 3);
    }

    #[tokio::test]
    async fn a_chunk_that_does_not_verify_leaves_no_file() {
        let (id, bytes) = sample();
        for fault in [
            Fault::FlipByteInSecondChunk,
            Fault::RefuseSecondChunk,
            Fault::LieAboutLength,
            Fault::HangOnSecondChunk,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let peer = FakePeer {
                bytes: Arc::new(bytes.clone()),
                fault,
                calls: Default::default(),
            };
            let fetch = fetch_segment(&peer, 2, 7, 9, &id, bytes.len() as u64, dir.path());
            let result = tokio::time::timeout(std::time::Duration::from_millis(500), fetch).await;
            match (fault, result) {
                // Dropped mid-fetch: the part file goes with it.
                (Fault::HangOnSecondChunk, result) => assert!(result.is_err()),
                (Fault::RefuseSecondChunk, Ok(Err(Error::Refused { reason }))) => {
                    assert_eq!(reason, "gone")
                }
                (
                    Fault::FlipByteInSecondChunk | Fault::LieAboutLength,
                    Ok(Err(Error::Segment(_))),
                ) => {}
                (_, Ok(Err(e))) => panic!("{fault:?} failed with the wrong error: {e}"),
                (_, Ok(Ok(_))) => panic!("{fault:?} accepted"),
                (_, Err(_)) => panic!("{fault:?} hung"),
            }
            assert!(files(dir.path()).is_empty(), "left {:?}", files(dir.path()));
        }
    }

    #[test]
    fn a_chunk_request_names_a_segment_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for id in ["../catalog.redb", "", "0123456789abcdef0123456789abcdeg"] {
            match read_segment_chunk(dir.path(), id, 0, 10) {
                Err(Error::NotASegmentId { id: got }) => assert_eq!(got, id),
                Err(e) => panic!("{id:?}: {e}"),
                Ok(_) => panic!("{id:?}: read"),
            }
        }
        // A well-formed id of a segment that is not here.
        let id = "0123456789abcdef0123456789abcdef";
        match read_segment_chunk(dir.path(), id, 0, 10) {
            Err(Error::Io { path, source }) => {
                assert_eq!(path, dir.path().join(file_name(id)));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("read a missing segment"),
        }
    }

    #[test]
    fn messages_of_another_envelope_version_are_refused() {
        let future = Bytes::from(encode(&Envelope {
            v: RPC_V + 1,
            msg: RaftReply::Refused("x".into()),
        }));
        match decode_msg::<RaftReply>("raft reply", &future) {
            Err(Error::Version { what, version }) => {
                assert_eq!((what.as_str(), version), ("raft reply", RPC_V + 1))
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("decoded a message of another version"),
        }
        assert!(matches!(
            decode_msg::<RaftReply>("raft reply", b"\xff"),
            Err(Error::Decode(_))
        ));
    }
}
