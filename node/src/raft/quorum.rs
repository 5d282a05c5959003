//! Small replicated state machines: the cell controller (and later the
//! directory). One openraft group of 1, 3 or 5 voters, its log in a redb
//! database, its messages over gRPC (`stele.v1.Quorum/Raft`).
//!
//! The state itself is the caller's [`QuorumState`]: commands and replies
//! are opaque bytes here, so the caller's types never meet openraft.
//!
//! ```text
//! <dir>/quorum.redb
//!   log   index -> CBOR Entry
//!   meta  "vote" | "committed" | "purged" | "snapshot" -> CBOR
//! ```
//! Every write commits with fsync (redb `Durability::Immediate`): a
//! control-plane group writes a few entries a second, not thousands. The
//! state lives in memory; at start-up it is the last snapshot plus the
//! committed log after it, re-applied.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::{self, Cursor};
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::entry::RaftEntry;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::impls::BasicNode;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder,
    RaftStateMachine,
};
use openraft::{EntryPayload, OptionalSend, RaftNetworkV2};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use stele_proto::pb;

use super::{decode, encode, io_err};

/// A command of a quorum group: the caller's encoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumCmd(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// The reply to one applied command: the caller's encoding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumReply(#[serde(with = "serde_bytes")] pub Vec<u8>);

impl std::fmt::Display for QuorumCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "quorum command ({} bytes)", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// Raft types of a small quorum group (controller, directory).
    pub QuorumConfig:
        D = QuorumCmd,
        R = QuorumReply,
        NodeId = u64,
        Node = BasicNode,
);

type C = QuorumConfig;
type LogId = openraft::alias::LogIdOf<C>;
type Vote = openraft::alias::VoteOf<C>;
type Entry = openraft::alias::EntryOf<C>;
type StoredMembership = openraft::alias::StoredMembershipOf<C>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<C>;
type Snapshot = openraft::alias::SnapshotOf<C, Cursor<Vec<u8>>>;
type QuorumRaft<S> = openraft::Raft<C, Machine<S>>;

/// A deterministic state machine replicated by a quorum group.
pub trait QuorumState: Send + Sync + 'static {
    /// Applies one committed command (at log `index`) and returns the reply.
    /// Must depend only on the state and the command: never the clock.
    fn apply(&mut self, index: u64, cmd: &[u8]) -> Vec<u8>;
    /// The whole state, for a snapshot.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot's.
    fn restore(&mut self, bytes: &[u8]) -> Result<(), String>;
}

/// Why a proposal or read was not served.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QuorumError {
    #[error("not the leader (leader: {leader:?} at {endpoint:?})")]
    NotLeader {
        leader: Option<u64>,
        endpoint: Option<String>,
    },
    #[error("quorum unavailable: {0}")]
    Unavailable(String),
}

impl From<QuorumError> for tonic::Status {
    /// `NotLeader` with the leader's endpoint, or `Unavailable`: what a
    /// leader-following client retries on.
    fn from(e: QuorumError) -> tonic::Status {
        match e {
            QuorumError::NotLeader { leader, endpoint } => stele_proto::Error::NotLeader {
                leader_node: leader,
                leader_endpoint: endpoint.unwrap_or_default(),
            }
            .into(),
            QuorumError::Unavailable(reason) => stele_proto::Error::Unavailable { reason }.into(),
        }
    }
}

/// A refused request to a quorum's API: `InvalidArgument` naming the field.
pub fn refuse(field: &str, reason: impl ToString) -> tonic::Status {
    stele_proto::Error::InvalidArgument {
        field: field.into(),
        reason: reason.to_string(),
    }
    .into()
}

/// CBOR of a command, reply or state.
pub fn to_cbor<T: Serialize>(v: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    ciborium::into_writer(v, &mut buf).expect("CBOR into a Vec cannot fail");
    buf
}

pub fn from_cbor<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    ciborium::from_reader(bytes).map_err(|e| e.to_string())
}

/// A quorum state whose commands, replies and snapshots are CBOR: it only
/// applies typed commands; [`QuorumState`] comes with it.
pub trait CborState: Serialize + for<'de> Deserialize<'de> + Send + Sync + 'static {
    type Command: for<'de> Deserialize<'de>;
    type Reply: Serialize;
    /// The snapshot format version this build reads and writes.
    const VERSION: u16;
    /// The version a decoded snapshot carries.
    fn version(&self) -> u16;
    fn apply_command(&mut self, cmd: Self::Command) -> Self::Reply;
    /// The reply to a command that does not decode.
    fn refused(reason: String) -> Self::Reply;
    /// What the state is called in errors ("controller", "directory").
    fn name() -> &'static str;
}

impl<T: CborState> QuorumState for T {
    fn apply(&mut self, _index: u64, cmd: &[u8]) -> Vec<u8> {
        let reply = match from_cbor::<T::Command>(cmd) {
            Ok(cmd) => self.apply_command(cmd),
            Err(e) => T::refused(format!("undecodable command: {e}")),
        };
        to_cbor(&reply)
    }

    fn snapshot(&self) -> Vec<u8> {
        to_cbor(self)
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let s: T = from_cbor(bytes)?;
        if s.version() != T::VERSION {
            return Err(format!(
                "{} state version {} unknown",
                T::name(),
                s.version()
            ));
        }
        *self = s;
        Ok(())
    }
}

/// Timing of a quorum group: short, since a few groups per process cost
/// nothing and topology changes should resume quickly after a failover.
#[derive(Debug, Clone)]
pub struct QuorumTiming {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// Build a snapshot (and purge the log before it) after this many
    /// entries.
    pub snapshot_every: u64,
}

impl Default for QuorumTiming {
    fn default() -> Self {
        QuorumTiming {
            heartbeat_ms: 250,
            election_min_ms: 1000,
            election_max_ms: 2000,
            snapshot_every: 1000,
        }
    }
}

/// One member of a quorum group: this process's voter.
pub struct Quorum<S: QuorumState> {
    id: u64,
    raft: QuorumRaft<S>,
    state: Arc<RwLock<S>>,
}

impl<S: QuorumState> Quorum<S> {
    /// Opens (or creates) the group's storage in `dir` and starts this
    /// member. A new group does nothing until [`Quorum::initialize`].
    pub async fn open(
        dir: &Path,
        id: u64,
        state: S,
        timing: &QuorumTiming,
    ) -> crate::Result<Quorum<S>> {
        crate::fsutil::create_dir_durable(dir)
            .map_err(|e| crate::Error::io(format!("create {}", dir.display()), e))?;
        let path = dir.join("quorum.redb");
        let db = Database::create(&path).map_err(|e| crate::Error::Catalog {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let store = Store {
            db: Arc::new(db),
            cache: Default::default(),
        };
        store.init_tables().map_err(|e| crate::Error::Catalog {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let state = Arc::new(RwLock::new(state));
        let machine = Machine::<S>::recover(store.clone(), state.clone())
            .map_err(|e| crate::Error::Config(format!("quorum state: {e}")))?;
        let config = openraft::Config {
            cluster_name: "stele-quorum".into(),
            heartbeat_interval: timing.heartbeat_ms,
            election_timeout_min: timing.election_min_ms,
            election_timeout_max: timing.election_max_ms,
            enable_pre_vote: Some(true),
            // As for tablets (`tablet_config`): a restarted leader holds an
            // election. The log and committed index here are synced on
            // every write, so restore would be safe today; an election
            // costs a fraction of a second and keeps that one rule.
            enable_leader_restore: Some(false),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(timing.snapshot_every),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        }
        .validate()
        .map_err(|e| crate::Error::Config(format!("quorum raft config: {e}")))?;
        let raft = openraft::Raft::new(id, Arc::new(config), Network, store, machine)
            .await
            .map_err(|e| crate::Error::Config(format!("quorum raft: {e}")))?;
        Ok(Quorum { id, raft, state })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Creates the group with `members` (id -> gRPC endpoint). Harmless
    /// when the group already exists with members.
    pub async fn initialize(&self, members: &BTreeMap<u64, String>) -> Result<bool, QuorumError> {
        if self
            .raft
            .is_initialized()
            .await
            .map_err(|e| QuorumError::Unavailable(e.to_string()))?
        {
            return Ok(false);
        }
        let nodes: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|(id, ep)| (*id, BasicNode { addr: ep.clone() }))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(true),
            Err(e)
                if e.to_string().contains("NotAllowed")
                    || e.to_string().contains("not allowed") =>
            {
                Ok(false)
            }
            Err(e) => Err(QuorumError::Unavailable(e.to_string())),
        }
    }

    /// Commits one command and returns its reply once applied here.
    pub async fn propose(&self, cmd: Vec<u8>) -> Result<Vec<u8>, QuorumError> {
        match self.raft.client_write(QuorumCmd(cmd)).await {
            Ok(r) => Ok(r.data.0),
            Err(e) => Err(self.classify(e.forward_to_leader().cloned(), e.to_string())),
        }
    }

    /// Waits until this member may serve a linearizable read (it is the
    /// leader and has applied everything committed before the call).
    pub async fn linearizable(&self) -> Result<(), QuorumError> {
        match self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(self.classify(e.forward_to_leader().cloned(), e.to_string())),
        }
    }

    fn classify(
        &self,
        forward: Option<openraft::error::ForwardToLeader<C>>,
        text: String,
    ) -> QuorumError {
        match forward {
            Some(f) => QuorumError::NotLeader {
                leader: f.leader_id,
                endpoint: f.leader_node.map(|n| n.addr),
            },
            None => QuorumError::Unavailable(text),
        }
    }

    /// The state as applied on this member (possibly behind the leader).
    pub fn state(&self) -> std::sync::RwLockReadGuard<'_, S> {
        self.state.read().expect("lock poisoned")
    }

    /// The leader this member knows, with its endpoint.
    pub fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader?;
        let ep = m
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        Some((leader, ep))
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.id)
    }

    /// The group's members (id -> endpoint) as this member knows them.
    pub fn members(&self) -> BTreeMap<u64, String> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// The current term (changes with every new leader).
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// Waits until some member leads, up to `timeout`.
    pub async fn wait_leader(&self, timeout: Duration) -> Result<u64, QuorumError> {
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .map_err(|e| QuorumError::Unavailable(e.to_string()))?;
        self.raft
            .metrics()
            .borrow_watched()
            .current_leader
            .ok_or_else(|| QuorumError::Unavailable("no leader".into()))
    }

    /// Serves one peer message (the gRPC `Quorum/Raft` call).
    pub async fn handle_raft(&self, body: &[u8]) -> Vec<u8> {
        let reply = match decode::<Envelope<Rpc>>("quorum rpc", body) {
            Err(e) => Reply::Refused(e.to_string()),
            Ok(env) if env.v != RPC_V => Reply::Refused(format!("quorum rpc version {}", env.v)),
            Ok(env) => match env.msg {
                Rpc::Append(r) => self
                    .raft
                    .append_entries(r)
                    .await
                    .map(Reply::Append)
                    .unwrap_or_else(|e| Reply::Refused(e.to_string())),
                Rpc::Vote(r) => self
                    .raft
                    .vote(r)
                    .await
                    .map(Reply::Vote)
                    .unwrap_or_else(|e| Reply::Refused(e.to_string())),
                Rpc::PreVote(r) => self
                    .raft
                    .pre_vote(r)
                    .await
                    .map(Reply::Vote)
                    .unwrap_or_else(|e| Reply::Refused(e.to_string())),
                Rpc::Snapshot { vote, meta, data } => self
                    .raft
                    .install_full_snapshot(
                        vote,
                        Snapshot {
                            meta,
                            snapshot: Cursor::new(data),
                        },
                    )
                    .await
                    .map(Reply::Snapshot)
                    .unwrap_or_else(|e| Reply::Refused(e.to_string())),
                Rpc::TransferLeader(r) => self
                    .raft
                    .handle_transfer_leader(r)
                    .await
                    .map(|r| Reply::TransferLeader(r.map_err(|e| e.to_string())))
                    .unwrap_or_else(|e| Reply::Refused(e.to_string())),
            },
        };
        encode(&Envelope {
            v: RPC_V,
            msg: reply,
        })
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

// ---------------------------------------------------------------- wire

const RPC_V: u16 = 1;

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u16,
    msg: T,
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
enum Rpc {
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
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
enum Reply {
    Append(AppendEntriesResponse<C>),
    Vote(VoteResponse<C>),
    Snapshot(SnapshotResponse<C>),
    TransferLeader(Result<(), String>),
    Refused(String),
}

// ---------------------------------------------------------------- network

#[derive(Clone)]
struct Network;

/// A client to one peer member, connected lazily and reconnected on error.
struct Peer {
    endpoint: String,
    client: Option<pb::quorum_client::QuorumClient<tonic::transport::Channel>>,
}

#[derive(Debug)]
struct PeerError(String);

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerError {}

impl RaftNetworkFactory<C> for Network {
    type Network = Peer;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> Peer {
        Peer {
            endpoint: node.addr.clone(),
            client: None,
        }
    }
}

impl Peer {
    async fn call(&mut self, rpc: Rpc, timeout: Duration) -> Result<Reply, PeerError> {
        if self.client.is_none() {
            let ep = tonic::transport::Endpoint::from_shared(self.endpoint.clone())
                .map_err(|e| PeerError(format!("endpoint {}: {e}", self.endpoint)))?
                .connect_timeout(Duration::from_secs(1));
            let ch = ep.connect_lazy();
            self.client = Some(
                pb::quorum_client::QuorumClient::new(ch)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            );
        }
        let client = self.client.as_mut().expect("set above");
        let mut req = tonic::Request::new(pb::RaftMessage {
            body: encode(&Envelope { v: RPC_V, msg: rpc }),
        });
        req.set_timeout(timeout);
        let result = tokio::time::timeout(timeout, client.raft(req)).await;
        let body = match result {
            Ok(Ok(r)) => r.into_inner().body,
            Ok(Err(status)) => {
                self.client = None;
                return Err(PeerError(format!(
                    "{}: {}",
                    self.endpoint,
                    status.message()
                )));
            }
            Err(_) => {
                return Err(PeerError(format!("{}: timed out", self.endpoint)));
            }
        };
        let env: Envelope<Reply> =
            decode("quorum reply", &body).map_err(|e| PeerError(e.to_string()))?;
        if env.v != RPC_V {
            return Err(PeerError(format!("quorum reply version {}", env.v)));
        }
        match env.msg {
            Reply::Refused(reason) => Err(PeerError(reason)),
            other => Ok(other),
        }
    }
}

fn unreachable(e: PeerError) -> RPCError<C> {
    RPCError::Unreachable(Unreachable::new(&e))
}

fn unexpected() -> RPCError<C> {
    unreachable(PeerError("unexpected reply kind".into()))
}

impl RaftNetworkV2<C> for Peer {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        match self.call(Rpc::Append(rpc), option.hard_ttl()).await {
            Ok(Reply::Append(r)) => Ok(r),
            Ok(_) => Err(unexpected()),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self.call(Rpc::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(_) => Err(unexpected()),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self.call(Rpc::PreVote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(_) => Err(unexpected()),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let rpc = Rpc::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
        };
        match self
            .call(rpc, option.hard_ttl().max(Duration::from_secs(10)))
            .await
        {
            Ok(Reply::Snapshot(r)) => Ok(r),
            Ok(_) => Err(StreamingError::Unreachable(Unreachable::new(&PeerError(
                "unexpected reply kind".into(),
            )))),
            Err(e) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<C>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<C>, RPCError<C>> {
        match self.call(Rpc::TransferLeader(req), option.hard_ttl()).await {
            Ok(Reply::TransferLeader(Ok(()))) => Ok(Ok(())),
            Ok(Reply::TransferLeader(Err(e))) => Err(unreachable(PeerError(e))),
            Ok(_) => Err(unexpected()),
            Err(e) => Err(unreachable(e)),
        }
    }
}

// ---------------------------------------------------------------- storage

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

#[derive(Clone)]
struct Store {
    db: Arc<Database>,
    /// vote, committed and purged, read often.
    cache: Arc<Mutex<Cache>>,
}

#[derive(Default)]
struct Cache {
    loaded: bool,
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

impl Store {
    fn init_tables(&self) -> Result<(), redb::Error> {
        let txn = self.db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        let mut cache = self.cache.lock().expect("lock poisoned");
        cache.vote = self.get_meta("vote").ok().flatten();
        cache.committed = self.get_meta("committed").ok().flatten();
        cache.purged = self.get_meta("purged").ok().flatten();
        cache.loaded = true;
        Ok(())
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &str) -> io::Result<Option<T>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let table = txn.open_table(META).map_err(io_err)?;
        match table.get(key).map_err(io_err)? {
            Some(v) => Ok(Some(decode(key, v.value()).map_err(io_err)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> io::Result<()> {
        let bytes = encode(value);
        let txn = self.db.begin_write().map_err(io_err)?;
        {
            let mut table = txn.open_table(META).map_err(io_err)?;
            table.insert(key, bytes.as_slice()).map_err(io_err)?;
        }
        txn.commit().map_err(io_err)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().expect("lock poisoned")
    }
}

impl RaftLogReader<C> for Store {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let table = txn.open_table(LOG).map_err(io_err)?;
        let mut out = Vec::new();
        for item in table.range(range).map_err(io_err)? {
            let (_, v) = item.map_err(io_err)?;
            out.push(decode("quorum log entry", v.value()).map_err(io_err)?);
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.cache().vote)
    }
}

impl RaftLogStorage<C> for Store {
    type LogReader = Store;

    async fn get_log_state(&mut self) -> io::Result<LogState<C>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let table = txn.open_table(LOG).map_err(io_err)?;
        let last: Option<Entry> = match table.last().map_err(io_err)? {
            Some((_, v)) => Some(decode("quorum log entry", v.value()).map_err(io_err)?),
            None => None,
        };
        let purged = self.cache().purged;
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.map(|e| e.log_id()).or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Store {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.put_meta("vote", vote)?;
        self.cache().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        self.put_meta("committed", &committed)?;
        self.cache().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.cache().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = (|| {
            let txn = self.db.begin_write().map_err(io_err)?;
            {
                let mut table = txn.open_table(LOG).map_err(io_err)?;
                for e in entries {
                    let bytes = encode(&e);
                    table.insert(e.index(), bytes.as_slice()).map_err(io_err)?;
                }
            }
            txn.commit().map_err(io_err)
        })();
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.as_ref().map_or(0, |l| l.index() + 1);
        let txn = self.db.begin_write().map_err(io_err)?;
        {
            let mut table = txn.open_table(LOG).map_err(io_err)?;
            table.retain_in(from.., |_, _| false).map_err(io_err)?;
        }
        txn.commit().map_err(io_err)
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(io_err)?;
        {
            let mut meta = txn.open_table(META).map_err(io_err)?;
            meta.insert("purged", encode(&Some(log_id)).as_slice())
                .map_err(io_err)?;
            let mut table = txn.open_table(LOG).map_err(io_err)?;
            table
                .retain_in(..=log_id.index(), |_, _| false)
                .map_err(io_err)?;
        }
        txn.commit().map_err(io_err)?;
        self.cache().purged = Some(log_id);
        Ok(())
    }
}

// ---------------------------------------------------------------- state machine

/// A stored snapshot: meta and the state's bytes.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

struct Machine<S> {
    store: Store,
    state: Arc<RwLock<S>>,
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl<S: QuorumState> Machine<S> {
    /// The state as of the stored snapshot; openraft re-applies the
    /// committed log after it.
    fn recover(store: Store, state: Arc<RwLock<S>>) -> Result<Machine<S>, String> {
        let snap: Option<StoredSnapshot> = store.get_meta("snapshot").map_err(|e| e.to_string())?;
        let (applied, membership) = match snap {
            Some(s) => {
                state.write().expect("lock poisoned").restore(&s.data)?;
                (s.meta.last_log_id, s.meta.last_membership)
            }
            None => (None, StoredMembership::default()),
        };
        Ok(Machine {
            store,
            state,
            applied,
            membership,
        })
    }
}

impl<S: QuorumState> RaftStateMachine<C> for Machine<S> {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<C>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id();
            let reply = match &entry.payload {
                EntryPayload::Blank => QuorumReply::default(),
                EntryPayload::Normal(cmd) => QuorumReply(
                    self.state
                        .write()
                        .expect("lock poisoned")
                        .apply(log_id.index(), &cmd.0),
                ),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(log_id), m.clone());
                    QuorumReply::default()
                }
            };
            self.applied = Some(log_id);
            if let Some(r) = responder {
                r.send(reply);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Builder> {
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        // Taken here, between applies, so the bytes match `applied`.
        Builder {
            store: self.store.clone(),
            data: self.state.read().expect("lock poisoned").snapshot(),
            applied: self.applied,
            membership: self.membership.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let data = snapshot.into_inner();
        self.state
            .write()
            .expect("lock poisoned")
            .restore(&data)
            .map_err(io_err)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.store.put_meta(
            "snapshot",
            &StoredSnapshot {
                meta: meta.clone(),
                data,
            },
        )
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let s: Option<StoredSnapshot> = self.store.get_meta("snapshot")?;
        Ok(s.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}

struct Builder {
    store: Store,
    data: Vec<u8>,
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl RaftSnapshotBuilder<C> for Builder {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let data = std::mem::take(&mut self.data);
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        };
        self.store.put_meta(
            "snapshot",
            &StoredSnapshot {
                meta: meta.clone(),
                data: data.clone(),
            },
        )?;
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

/// The gRPC face of a quorum member: peers' Raft messages.
pub struct QuorumService<S: QuorumState>(pub Arc<Quorum<S>>);

#[tonic::async_trait]
impl<S: QuorumState> pb::quorum_server::Quorum for QuorumService<S> {
    async fn raft(
        &self,
        request: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        let body = self.0.handle_raft(&request.into_inner().body).await;
        Ok(tonic::Response::new(pb::RaftReply { body }))
    }
}
