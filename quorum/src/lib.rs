//! Small replicated state machines: the cell controller and the global
//! directory. One openraft group of 1, 3 or 5 voters, its log in a redb
//! database, its messages over gRPC (`stele.v1.Quorum/Raft`).
//!
//! The state itself is the caller's [`QuorumState`]: commands and replies
//! are opaque bytes here, so the caller's types never meet openraft.
//!
//! ```text
//!  propose(cmd) ──> Quorum ──> openraft ──> store (quorum.redb: log, vote, snapshot)
//!                     │           │  └────> network (peers' Quorum/Raft) ──> service
//!                     │           └───────> machine ──> QuorumState::apply
//!  state() <──────────┘ (the state as applied here)
//! ```
//!
//! Every write commits with fsync (redb `Durability::Immediate`): a
//! control-plane group writes a few entries a second, not thousands. The
//! state lives in memory; at start-up it is the last snapshot plus the
//! committed log after it, re-applied.
//!
//! **Architecture invariant:** this crate depends on no other workspace
//! crate than `stele-proto`; the storage node is not part of a control
//! plane process.

pub mod backup;
mod error;
mod machine;
mod network;
#[cfg(test)]
mod quorum_test;
mod seed;
mod service;
mod store;
#[cfg(test)]
mod suite_test;
#[cfg(test)]
mod test_state;
mod wire;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::InitializeError;
use openraft::impls::BasicNode;
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
pub use machine::{CborState, QuorumState};
pub use seed::seed;
pub use service::QuorumService;

use machine::Machine;
use network::Network;
use store::Store;

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
type Snapshot = openraft::alias::SnapshotOf<C, std::io::Cursor<Vec<u8>>>;
type QuorumRaft<S> = openraft::Raft<C, Machine<S>>;

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

/// A command, reply or state from CBOR; the error names the type.
pub fn from_cbor<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T> {
    decode(std::any::type_name::<T>(), bytes)
}

/// A value from CBOR; `what` names it in the error.
fn decode<T: for<'de> Deserialize<'de>>(what: &'static str, bytes: &[u8]) -> Result<T> {
    ciborium::from_reader(bytes).map_err(|source| Error::Decode { what, source })
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
    pub async fn open(dir: &Path, id: u64, state: S, timing: &QuorumTiming) -> Result<Quorum<S>> {
        Quorum::open_with(dir, id, state, timing, None, stele_tls::Kind::Controller).await
    }

    /// Like [`Quorum::open`], reaching the other members over TLS with
    /// `tls` (for `https://` members) and expecting each to present a
    /// certificate of kind `expect`.
    pub async fn open_with(
        dir: &Path,
        id: u64,
        state: S,
        timing: &QuorumTiming,
        tls: Option<stele_tls::ClientTls>,
        expect: stele_tls::Kind,
    ) -> Result<Quorum<S>> {
        let store = Store::open(dir)?;
        let state = Arc::new(RwLock::new(state));
        let machine = Machine::<S>::recover(store.clone(), state.clone())?;
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
        .validate()?;
        let raft = openraft::Raft::new(
            id,
            Arc::new(config),
            Network { tls, expect },
            store,
            machine,
        )
        .await?;
        Ok(Quorum { id, raft, state })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Creates the group with `members` (id -> gRPC endpoint). Harmless
    /// when the group already exists with members: answers `false`.
    pub async fn initialize(&self, members: &BTreeMap<u64, String>) -> Result<bool> {
        if self
            .raft
            .is_initialized()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?
        {
            return Ok(false);
        }
        let nodes: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|(id, ep)| (*id, BasicNode { addr: ep.clone() }))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.api_error(), Some(InitializeError::NotAllowed(_))) => Ok(false),
            Err(e) => Err(Error::Unavailable(e.to_string())),
        }
    }

    /// Commits one command and returns its reply once applied here.
    pub async fn propose(&self, cmd: Vec<u8>) -> Result<Vec<u8>> {
        match self.raft.client_write(QuorumCmd(cmd)).await {
            Ok(r) => Ok(r.data.0),
            Err(e) => Err(classify(e.forward_to_leader().cloned(), e.to_string())),
        }
    }

    /// Commits `cmds` as one batch (one message to the Raft core, appended
    /// in this order) and returns each reply once applied here, in order.
    /// The list stops at the first that failed, with its error; a failed
    /// one's entry may still commit, but a later one never commits
    /// without it.
    pub async fn propose_many(&self, cmds: Vec<Vec<u8>>) -> Result<Vec<Result<Vec<u8>>>> {
        use futures::StreamExt;
        use openraft::errors::ClientWriteError;
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut stream = self
            .raft
            .client_write_many(cmds.into_iter().map(QuorumCmd))
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(r) = stream.next().await {
            let reply = match r {
                Ok(Ok(w)) => Ok(w.response.0),
                Ok(Err(e)) => {
                    let forward = match &e {
                        ClientWriteError::ForwardToLeader(f)
                        | ClientWriteError::LogEntryDiscarded(f) => Some(f.clone()),
                        _ => None,
                    };
                    Err(classify(forward, e.to_string()))
                }
                Err(fatal) => Err(Error::Unavailable(fatal.to_string())),
            };
            let failed = reply.is_err();
            out.push(reply);
            if failed {
                break;
            }
        }
        Ok(out)
    }

    /// Waits until this member may serve a linearizable read (it is the
    /// leader and has applied everything committed before the call).
    pub async fn linearizable(&self) -> Result<()> {
        match self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(e.forward_to_leader().cloned(), e.to_string())),
        }
    }

    /// The state as applied on this member (possibly behind the leader).
    ///
    /// Panics if an apply panicked while it held the state: that state may
    /// be half changed, and the member's apply task is gone with it, so
    /// nothing it could answer would be right.
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

    /// The term this member leads in, read together with its leadership
    /// from one view of the metrics; `None` when it does not lead. Soft
    /// state numbered by term (the controller's heartbeat book) is built
    /// only under this, never for a term another member leads.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        (m.current_leader == Some(self.id)).then_some(m.current_term)
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

    /// The last log index applied on this member, if any.
    pub fn applied_index(&self) -> Option<u64> {
        use openraft::LogIdOptionExt;
        self.raft.metrics().borrow_watched().last_applied.index()
    }

    /// Waits up to `timeout` for an entry past index `after` to be applied
    /// on this member; the last applied index then (`None`: none within
    /// the time, or the member stopped).
    pub async fn wait_applied_past(&self, after: u64, timeout: Duration) -> Option<u64> {
        use openraft::LogIdOptionExt;
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| m.last_applied.index().unwrap_or(0) > after,
                "an entry applied",
            )
            .await
            .ok()
            .and_then(|m| m.last_applied.index())
    }

    /// The current term (changes with every new leader).
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// Waits until some member leads, up to `timeout`.
    pub async fn wait_leader(&self, timeout: Duration) -> Result<u64> {
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        self.raft
            .metrics()
            .borrow_watched()
            .current_leader
            .ok_or_else(|| Error::Unavailable("no leader".into()))
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// A failed write or read: a redirect when openraft knows a leader,
/// otherwise unavailable (with openraft's reason).
fn classify(forward: Option<openraft::error::ForwardToLeader<C>>, text: String) -> Error {
    match forward {
        Some(f) => Error::NotLeader {
            leader: f.leader_id,
            endpoint: f.leader_node.map(|n| n.addr),
        },
        None => Error::Unavailable(text),
    }
}
