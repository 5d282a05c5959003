//! A new quorum group that starts from a given state (a restore from a
//! backup, [`crate::backup`]) instead of an empty one.
//!
//! Every member's directory gets the same durable Raft state: a stored
//! snapshot of the state at log id `(term 0, node 0, index)` whose
//! membership is the new members with their endpoints, and the log purged
//! up to it. So the group needs no `initialize` (it answers "already
//! initialized"), the members elect a leader in term 1 among themselves,
//! and a member added later gets the snapshot, never an empty log replay.
//! The same construction as a tablet's split child (`node::raft`).
//!
//! `index` is the backed-up state's log index, so the new group's log goes
//! on past it and its own backups sort after the ones it came from (a
//! backup's name is its log index).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use openraft::impls::BasicNode;
use openraft::vote::RaftLeaderIdExt;

use crate::store::{self, Store, StoredSnapshot};
use crate::{C, Error, LogId, QuorumState, Result, SnapshotMeta, StoredMembership};

/// Writes the Raft state of a new member of a group of `members` (id ->
/// gRPC endpoint) whose state starts as `state` (the state's snapshot
/// bytes) into `dir`, which must not hold a quorum log yet. `fresh` is an
/// empty state: `state` is restored into it first, so bytes this build
/// cannot read are refused before anything is written.
pub fn seed<S: QuorumState>(
    dir: &Path,
    members: &BTreeMap<u64, String>,
    state: &[u8],
    index: u64,
    mut fresh: S,
) -> Result<()> {
    if members.is_empty() || members.contains_key(&0) {
        return Err(Error::Seed {
            path: dir.to_path_buf(),
            reason: "a seeded group needs at least one member, with ids from 1".into(),
        });
    }
    let path = dir.join(store::FILE);
    if path.exists() {
        return Err(Error::Seed {
            path: dir.to_path_buf(),
            reason: format!(
                "{} exists: seed only a new member directory",
                path.display()
            ),
        });
    }
    fresh.restore(state)?;
    let leader = <C as openraft::RaftTypeConfig>::LeaderId::new_committed(0, 0);
    let log_id = LogId::new(leader, index);
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let nodes: BTreeMap<u64, BasicNode> = members
        .iter()
        .map(|(id, ep)| (*id, BasicNode { addr: ep.clone() }))
        .collect();
    let membership = openraft::Membership::new(vec![voters], nodes).map_err(|e| Error::Seed {
        path: dir.to_path_buf(),
        reason: format!("membership: {e}"),
    })?;
    let store = Store::open(dir)?;
    store.put_snapshot(&StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::new(Some(log_id), membership),
        },
        data: state.to_vec(),
    })?;
    store.put_meta(store::PURGED, &Some(log_id))?;
    store.put_meta(store::COMMITTED, &Some(log_id))?;
    Ok(())
}
