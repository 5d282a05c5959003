//! Membership of a tablet group as the controller wants it: the leader
//! replica moves the group one safe step at a time toward the desired voter
//! set (add learners, let them catch up, then one joint-consensus change),
//! and hands leadership away before it removes itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::impls::BasicNode;

use super::{TabletConfig, TabletRaft};

/// The error of a membership change or an add-learner call.
type WriteError =
    openraft::error::RaftError<TabletConfig, openraft::error::ClientWriteError<TabletConfig>>;

/// Why a reconcile step failed. Every one is retried on the next heartbeat
/// (the controller still wants the change); `NoVoters` means the
/// controller's assignment is wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("empty desired voter set")]
    NoVoters,
    #[error(transparent)]
    ChangeMembership(Box<WriteError>),
    #[error(transparent)]
    TransferLeader(Box<openraft::error::Fatal<TabletConfig>>),
    #[error("add learner {replica}: {source}")]
    AddLearner {
        replica: u64,
        #[source]
        source: Box<WriteError>,
    },
    #[error("learner {replica} did not catch up within {catch_up:?}")]
    CatchUp { replica: u64, catch_up: Duration },
    /// A change or transfer openraft did not answer in time (a leader
    /// that lost its quorum without stepping down): given up here so the
    /// next heartbeat's reconcile starts afresh from what the group shows.
    #[error("{what} not answered within {after:?}")]
    Timeout { what: &'static str, after: Duration },
}

/// `f`, given up after `after`.
async fn bounded<T>(
    what: &'static str,
    after: Duration,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(after, f)
        .await
        .unwrap_or(Err(Error::Timeout { what, after }))
}

/// A group's effective membership as one replica sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembershipView {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// A joint (two-config) membership is in effect.
    pub joint: bool,
    pub leader: Option<u64>,
    pub term: u64,
    pub applied: u64,
}

pub fn view(raft: &TabletRaft) -> MembershipView {
    let m = raft.metrics();
    let m = m.borrow_watched();
    let membership = m.membership_config.membership();
    MembershipView {
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
        joint: membership.get_joint_config().len() > 1,
        leader: m.current_leader,
        term: m.current_term,
        applied: m.last_applied.as_ref().map_or(0, |l| l.index()),
    }
}

/// What one reconcile step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Membership and leader are as desired.
    Done,
    /// Leadership handed to this replica (this one is leaving, or another
    /// was asked for).
    TransferredLeader(u64),
    /// Voters changed to the desired set (learners added first).
    ChangedVoters,
    /// Extra learners removed.
    RemovedLearners,
    /// Not the leader: nothing to do here.
    NotLeader,
}

/// A membership change, given up after `after`.
async fn change(
    raft: &TabletRaft,
    members: ChangeMembers<u64, BasicNode>,
    what: &'static str,
    after: Duration,
) -> Result<(), Error> {
    bounded(what, after, async {
        raft.change_membership(members, false)
            .await
            .map(|_| ())
            .map_err(|e| Error::ChangeMembership(Box::new(e)))
    })
    .await
}

/// A leadership transfer to `to`, given up after `after`.
async fn transfer(raft: &TabletRaft, to: u64, after: Duration) -> Result<(), Error> {
    bounded("a leadership transfer", after, async {
        raft.trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| Error::TransferLeader(Box::new(e)))
    })
    .await
}

/// Moves the group one step toward `desired` voters (and the desired
/// leader, 0 for any). Only the leader acts. Learners are added blocking:
/// the call returns once they caught up (or `catch_up` passed). Every
/// other step is bounded by `catch_up` too, so the caller's one change in
/// flight per tablet never waits on openraft for good.
pub async fn reconcile(
    raft: &TabletRaft,
    me: u64,
    desired: &BTreeSet<u64>,
    want_leader: u64,
    catch_up: Duration,
) -> Result<Step, Error> {
    let v = view(raft);
    if v.leader != Some(me) {
        return Ok(Step::NotLeader);
    }
    if desired.is_empty() {
        return Err(Error::NoVoters);
    }
    if !v.joint && v.voters == *desired {
        let extra: BTreeSet<u64> = v.learners.difference(desired).copied().collect();
        if !extra.is_empty() {
            change(
                raft,
                ChangeMembers::RemoveNodes(extra),
                "removing learners",
                catch_up,
            )
            .await?;
            return Ok(Step::RemovedLearners);
        }
        if want_leader != 0 && want_leader != me && desired.contains(&want_leader) {
            transfer(raft, want_leader, catch_up).await?;
            return Ok(Step::TransferredLeader(want_leader));
        }
        return Ok(Step::Done);
    }
    if !desired.contains(&me) {
        // Leaving: hand over to a voter that stays, the desired leader if
        // it is one. Its new leader finishes the change.
        let stays: Vec<u64> = v.voters.intersection(desired).copied().collect();
        let to = if stays.contains(&want_leader) {
            Some(want_leader)
        } else {
            stays.first().copied()
        };
        if let Some(to) = to {
            transfer(raft, to, catch_up).await?;
            return Ok(Step::TransferredLeader(to));
        }
        // No staying voter: change first (the group stays available; this
        // replica steps down once the new config commits).
    }
    for r in desired.difference(&v.voters) {
        if !v.learners.contains(r) {
            let added =
                tokio::time::timeout(catch_up, raft.add_learner(*r, BasicNode::default(), true))
                    .await;
            match added {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Err(Error::AddLearner {
                        replica: *r,
                        source: Box::new(e),
                    });
                }
                Err(_) => {
                    return Err(Error::CatchUp {
                        replica: *r,
                        catch_up,
                    });
                }
            }
        }
    }
    let voters = ChangeMembers::ReplaceAllVoters(desired.clone());
    change(raft, voters, "the voter change", catch_up).await?;
    Ok(Step::ChangedVoters)
}

/// The voters of a new group, for `initialize`.
pub fn initial_members(voters: &[u64]) -> BTreeMap<u64, BasicNode> {
    voters.iter().map(|r| (*r, BasicNode::default())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_step_openraft_never_answers_is_given_up() {
        let after = Duration::from_millis(20);
        let hung = bounded(
            "the voter change",
            after,
            std::future::pending::<Result<(), Error>>(),
        );
        match hung.await {
            Err(Error::Timeout { what, after: a }) => {
                assert_eq!((what, a), ("the voter change", after));
            }
            other => panic!("{other:?}"),
        }
        let answered = bounded("x", after, async { Err::<(), _>(Error::NoVoters) }).await;
        assert!(matches!(answered, Err(Error::NoVoters)), "{answered:?}");
    }
}
