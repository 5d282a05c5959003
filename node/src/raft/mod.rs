//! The one place Stele touches openraft. Everything openraft-specific (type
//! configuration, log storage over the journal, the network seam, Raft
//! configuration) lives under this module, so an openraft upgrade is one port.
//!
//! ```text
//! state_machine  openraft's state machine over tablet::apply; snapshots
//! log_store      openraft's log over the node's journal
//! replica        Replica (tablet + group) and the Raft operations services use
//! coalesce       concurrent appends to one tablet as one entry (AppendMany)
//! inbound        a Raft message from a peer, to the replica it names
//! router         outgoing messages, batched per peer (network: none)
//! pacer          heartbeats and campaigns of every group, from one task
//! membership     voter changes toward the controller's assignment
//! ```
//!
//! **Architecture invariant:** no module outside `node::raft` names an
//! openraft type. (The tablet keeps the log ids and memberships it applied
//! as the opaque aliases below.)

pub mod coalesce;
#[cfg(test)]
mod golden_test;
pub mod hibernate;
pub mod inbound;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod pacer;
pub mod replica;
pub mod router;
pub mod state_machine;
#[cfg(test)]
mod suite_test;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use stele_proto::command::{TabletCommand, TabletResponse};

use self::log_store::LogStore;
use self::state_machine::StateMachine;
use crate::error::{Error, Result};

pub use self::replica::Replica;

openraft::declare_raft_types!(
    /// Raft types of a tablet group.
    pub TabletConfig:
        D = TabletCommand,
        R = TabletResponse,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
);

pub type LogId = openraft::alias::LogIdOf<TabletConfig>;
pub type Vote = openraft::alias::VoteOf<TabletConfig>;
pub type Entry = openraft::alias::EntryOf<TabletConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TabletConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TabletConfig>;
pub type TabletRaft = openraft::Raft<TabletConfig, StateMachine>;
/// A snapshot's bytes as openraft moves them.
pub type SnapshotData = std::io::Cursor<Vec<u8>>;

/// Node-wide counters of the Raft side.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// Journal frames read back at start-up (the unsealed tail).
    pub replayed_frames: AtomicU64,
    /// Journal frames skipped at start-up (below a purge point).
    pub skipped_frames: AtomicU64,
    /// Segments fetched from peers to install snapshots.
    pub segments_fetched: AtomicU64,
    /// Data requests refused for want of a token or a right.
    pub requests_refused: AtomicU64,
}

type StartFuture = Pin<Box<dyn Future<Output = Result<TabletRaft>> + Send>>;

/// Starts the openraft instance of one replica over its log and state
/// machine, with the node's group configuration and network (the peers'
/// router, or none for a one-node cell). Cheap to clone.
#[derive(Clone)]
pub struct RaftStarter {
    start: Arc<dyn Fn(u64, u64, LogStore, StateMachine) -> StartFuture + Send + Sync>,
}

impl RaftStarter {
    pub fn new<P: router::Peers>(config: Arc<openraft::Config>, peers: Option<P>) -> RaftStarter {
        let start: Arc<dyn Fn(u64, u64, LogStore, StateMachine) -> StartFuture + Send + Sync> =
            match peers.map(router::Router::new) {
                Some(router) => Arc::new(move |group, id, log, sm| {
                    let net = router::GroupNetwork::new(&router, group);
                    let config = config.clone();
                    Box::pin(async move {
                        TabletRaft::new(id, config, net, log, sm)
                            .await
                            .map_err(|e| raft_init(group, e))
                    })
                }),
                None => Arc::new(move |group, id, log, sm| {
                    let config = config.clone();
                    Box::pin(async move {
                        TabletRaft::new(id, config, network::NoPeers, log, sm)
                            .await
                            .map_err(|e| raft_init(group, e))
                    })
                }),
            };
        RaftStarter { start }
    }

    /// Starts replica `id` of group (tablet) `group`.
    pub async fn start(
        &self,
        group: u64,
        id: u64,
        log: LogStore,
        sm: StateMachine,
    ) -> Result<TabletRaft> {
        (self.start)(group, id, log, sm).await
    }
}

fn raft_init(tablet: u64, e: impl std::fmt::Display) -> Error {
    Error::RaftInit {
        tablet,
        reason: e.to_string(),
    }
}

/// Timing of tablet groups: long heartbeats, elections of seconds and
/// pre-vote, so thousands of idle groups per node cost little. The node's
/// [`pacer`] drives both timers for every group.
#[derive(Debug, Clone)]
pub struct RaftTiming {
    /// A leader heartbeats its followers this often.
    pub heartbeat_ms: u64,
    /// `T`: a follower that has not heard from a leader for a random time in
    /// `[T, 2T)` campaigns; a leader's lease (openraft's
    /// `election_timeout_max`) is `T`.
    pub election_timeout_ms: u64,
    /// A group with no request for this long sleeps (`raft::hibernate`);
    /// 0: never.
    pub hibernate_after_ms: u64,
}

/// The default of [`RaftTiming::hibernate_after_ms`]: ten seconds with no
/// request (ten default heartbeats).
pub const HIBERNATE_AFTER_MS: u64 = 10_000;

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: 1000,
            election_timeout_ms: 3000,
            hibernate_after_ms: HIBERNATE_AFTER_MS,
        }
    }
}

impl RaftTiming {
    /// The heartbeat interval for an election timeout: three heartbeats per
    /// lease. Heartbeats ride one QUIC connection (retransmitted, never
    /// silently lost), so a follower campaigns only after three intervals of
    /// silence from a leader that is dead, cut off or stalled.
    pub fn for_election_timeout(election_timeout_ms: u64) -> RaftTiming {
        RaftTiming {
            heartbeat_ms: (election_timeout_ms / 3).max(20),
            election_timeout_ms,
            hibernate_after_ms: HIBERNATE_AFTER_MS,
        }
    }
}

/// The validated openraft configuration of a tablet group.
///
/// openraft's own tick is off: the node's pacer sends heartbeats and starts
/// campaigns for all groups from one task. `election_timeout_max` is the
/// leader lease followers honour; `election_timeout_min` is unused with
/// the tick off and set to half of it to satisfy openraft's validation.
///
/// Snapshots are never built by openraft's policy: a tablet builds one right
/// after it publishes a seal and then purges the log up to its checkpoint
/// (`tablet::seal`). `max_in_snapshot_log_to_keep` is therefore irrelevant
/// and set to keep everything, so openraft never purges past a checkpoint.
///
/// `unsafe_leader_restore` turns openraft's leader restore back on: the
/// jepsen negative control (`STELE_UNSAFE_LEADER_RESTORE=1`) that must be
/// caught after power cuts. Never set it otherwise.
pub fn tablet_config(
    timing: &RaftTiming,
    unsafe_leader_restore: bool,
) -> Result<Arc<openraft::Config>> {
    let t = timing.election_timeout_ms;
    if timing.heartbeat_ms == 0 || timing.heartbeat_ms.saturating_mul(3) > t {
        return Err(Error::Config(format!(
            "tablet raft timing: heartbeat {} ms must be positive and at most a third of the election timeout {} ms",
            timing.heartbeat_ms, t
        )));
    }
    let config = openraft::Config {
        cluster_name: "stele-tablet".to_string(),
        heartbeat_interval: timing.heartbeat_ms,
        election_timeout_min: t / 2,
        election_timeout_max: t,
        enable_pre_vote: Some(true),
        // A restarted leader campaigns like any node. Leader restore (the
        // default) would let it resume its old term without an election,
        // which is unsafe here twice over: its journal may have lost an
        // unsynced tail its followers hold (new entries would reuse those
        // indexes in the same term, and the followers keep theirs as the
        // same entries), and the committed index it recovers is advisory
        // and may be behind (its reads would miss acknowledged writes).
        // Jepsen found both after power cuts; `replication_test` covers it.
        enable_leader_restore: Some(unsafe_leader_restore),
        enable_tick: false,
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: u64::MAX,
        // Client writes are whole batches; a few hundred per Raft round is
        // plenty and keeps each group's preallocated buffer small.
        api_batch_capacity: 256,
        // No linger before a log append (openraft's api_batch_linger_ms):
        // 1 ms measured 1.15x the appends at 256 single-record clients on
        // three nodes but 0.86x at 64 on one node (docs/BENCHMARKS.md,
        // issue 21), where the core loop it blocks also delays commits.
        ..Default::default()
    };
    let config = config
        .validate()
        .map_err(|e| Error::Config(format!("tablet raft config: {e}")))?;
    Ok(Arc::new(config))
}

/// CBOR of an opaque openraft value stored in the catalog or journal.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    crate::catalog::to_cbor(value)
}

pub(crate) fn decode<T: for<'de> serde::Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T> {
    crate::catalog::from_cbor(what, bytes)
}

pub(crate) fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The durable Raft state of a tablet rebuilt from the bucket (`stele
/// restore`): the catalog's `applied_state` and `purged` values for a log
/// purged up to `checkpoint` whose only voter is `replica`. The log id's
/// term is 1: the restored group starts a new history on a new cell.
pub fn restored_state(replica: u64, checkpoint: u64) -> (Vec<u8>, Vec<u8>) {
    use openraft::vote::RaftLeaderIdExt;
    let leader = <TabletConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(1, replica);
    let log_id = LogId::new(leader, checkpoint);
    let membership = openraft::Membership::new_with_defaults(
        vec![std::collections::BTreeSet::from([replica])],
        [replica],
    );
    let stored = StoredMembership::new(Some(log_id), membership);
    (encode(&(Some(log_id), stored)), encode(&Some(log_id)))
}

/// The durable Raft state of a replica of a group rebuilt from the bucket
/// with `voters` (a whole-cell restore, `tier::restore_cell`): the same on
/// every voter, as if the group had applied a membership of `voters` at
/// `checkpoint` and purged the log up to it; the members elect a leader
/// among themselves, with no `initialize`.
pub fn restored_group_state(voters: &[u64], checkpoint: u64) -> (Vec<u8>, Vec<u8>) {
    use openraft::vote::RaftLeaderIdExt;
    let leader = <TabletConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(0, 0);
    let log_id = LogId::new(leader, checkpoint);
    let set: std::collections::BTreeSet<u64> = voters.iter().copied().collect();
    let membership = openraft::Membership::new_with_defaults(vec![set], []);
    let stored = StoredMembership::new(Some(log_id), membership);
    (encode(&(Some(log_id), stored)), encode(&Some(log_id)))
}

/// The durable Raft state a split child starts from, the same on every
/// replica the split creates: as if its group had applied a membership of
/// `voters` at log index 0 and purged it. So the group needs no
/// `initialize`, and a replica that joins later with nothing (an
/// assignment, a move) cannot be sent the log from its start, which does
/// not hold the rows the child began with: it gets a snapshot, which does.
pub fn split_child_state(voters: &[u64]) -> (Vec<u8>, Vec<u8>) {
    use openraft::vote::RaftLeaderIdExt;
    let leader = <TabletConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(0, 0);
    let log_id = LogId::new(leader, 0);
    let set: std::collections::BTreeSet<u64> = voters.iter().copied().collect();
    let membership = openraft::Membership::new_with_defaults(vec![set], []);
    let stored = StoredMembership::new(Some(log_id), membership);
    (encode(&(Some(log_id), stored)), encode(&Some(log_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timing_validates() {
        tablet_config(&RaftTiming::default(), false).unwrap();
    }

    #[test]
    fn bad_timing_is_refused() {
        for (heartbeat_ms, election_timeout_ms) in [(0, 3000), (1001, 3000), (500, 0)] {
            let t = RaftTiming {
                heartbeat_ms,
                election_timeout_ms,
                ..RaftTiming::default()
            };
            assert!(tablet_config(&t, false).is_err(), "{t:?} accepted");
        }
        tablet_config(&RaftTiming::for_election_timeout(1500), false).unwrap();
    }
}
