//! The one place Stele touches openraft. Everything openraft-specific (type
//! configuration, log storage over the journal, the network seam, Raft
//! configuration) lives under this module, so an openraft upgrade is one port.
//!
//! **Architecture invariant:** no module outside `node::raft` and
//! `node::tablet::state_machine` names an openraft type.

pub mod log_store;
pub mod membership;
pub mod network;
pub mod pacer;
pub mod router;
#[cfg(test)]
mod suite_test;

use std::sync::Arc;

use stele_proto::command::{TabletCommand, TabletResponse};

use crate::error::{Error, Result};

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
pub type TabletRaft = openraft::Raft<TabletConfig, crate::tablet::state_machine::StateMachine>;

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
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: 1000,
            election_timeout_ms: 3000,
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
            };
            assert!(tablet_config(&t, false).is_err(), "{t:?} accepted");
        }
        tablet_config(&RaftTiming::for_election_timeout(1500), false).unwrap();
    }
}
