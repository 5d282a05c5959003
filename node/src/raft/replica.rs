//! A hosted tablet replica: the tablet's applied state and the openraft
//! group that drives it, with the few Raft operations the services above
//! need, named in Stele's terms so no service touches openraft.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::Instant as _;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::impls::BasicNode;
use stele_proto::command::{AppendBatch, TabletCommand, TabletResponse};
use tracing::Instrument;

use super::TabletRaft;
use super::coalesce::{Coalescer, Limits, Proposer};
use super::hibernate::{GroupFacts, Hibernation, SleepRequest};
use super::log_store::LogStore;
use super::pacer::Contact;
use crate::tablet::Tablet;

/// A hosted tablet replica.
pub struct Replica {
    pub tablet: Arc<Tablet>,
    pub raft: TabletRaft,
    pub replica_id: u64,
    pub log: LogStore,
    /// Last contact from a leader or candidate, for the pacer's campaigns.
    pub contact: Contact,
    /// Whether the group sleeps (`raft::hibernate`), and its requests.
    pub hibernation: Hibernation,
    /// Concurrent appends waiting to share an entry (`raft::coalesce`).
    coalescer: Arc<Coalescer>,
}

/// Why a proposal or a read barrier did not go through.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    /// This replica does not lead its group (the caller redirects).
    #[error("tablet {tablet}: not the leader")]
    NotLeader { tablet: u64 },
    /// The group could not take it (shutting down, a quorum lost, ...):
    /// the caller may retry.
    #[error("tablet {tablet}: {reason}")]
    Unavailable { tablet: u64, reason: String },
}

/// The log positions of a replica's group, for descriptors and status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogState {
    /// The replica its group follows, if it knows one.
    pub leader: Option<u64>,
    pub last_log_index: u64,
    pub purged_index: u64,
}

/// What the metrics read of a replica's group at scrape time, in Stele's
/// terms (openraft's metrics stay in `node::raft`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RaftView {
    pub leader: Option<u64>,
    pub term: u64,
    pub committed: u64,
    pub applied: u64,
    /// On a leader: each follower's node, how many entries it is behind
    /// the leader's last log index, and the seconds since it last
    /// acknowledged (`None`: never yet). Empty on a follower.
    pub followers: Vec<(u64, u64, Option<f64>)>,
}

impl Replica {
    pub fn new(tablet: Arc<Tablet>, raft: TabletRaft, replica_id: u64, log: LogStore) -> Replica {
        Replica {
            tablet,
            raft,
            replica_id,
            log,
            contact: Contact::default(),
            hibernation: Hibernation::default(),
            coalescer: Default::default(),
        }
    }

    fn proposer(&self) -> Proposer {
        Proposer {
            raft: self.raft.clone(),
            tablet: self.tablet.id,
            replica_id: self.replica_id,
        }
    }

    /// If this replica leads, asks the voter that has replicated the most
    /// of the log (caught up, or closest to it) to take over, and returns
    /// its replica id; `None` when not leading or alone.
    pub async fn hand_off_leadership(&self) -> Option<u64> {
        let m = self.raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(self.replica_id) {
            return None;
        }
        let matched = |v: u64| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&v).cloned().flatten())
                .map(|l| l.index())
        };
        let to = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != self.replica_id)
            .max_by_key(|v| matched(*v))?;
        self.raft.trigger().transfer_leader(to).await.ok()?;
        Some(to)
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.replica_id)
    }

    /// The replica id of the group's leader, as this replica knows it.
    pub fn leader(&self) -> Option<u64> {
        self.raft.metrics().borrow_watched().current_leader
    }

    pub fn log_state(&self) -> LogState {
        let m = self.raft.metrics().borrow_watched().clone();
        LogState {
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            purged_index: m.purged.as_ref().map_or(0, |l| l.index()),
        }
    }

    /// The group as the metrics see it now ([`RaftView`]).
    pub fn raft_view(&self) -> RaftView {
        let m = self.raft.metrics().borrow_watched().clone();
        let last = m.last_log_index.unwrap_or(0);
        let mut followers = Vec::new();
        for (id, matched) in m.replication.iter().flatten() {
            if *id == self.replica_id {
                continue;
            }
            let behind = last.saturating_sub(matched.as_ref().map_or(0, |l| l.index()));
            let acked = m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .map(|t| t.elapsed().as_secs_f64());
            followers.push((super::router::node_of(*id), behind, acked));
        }
        RaftView {
            leader: m.current_leader,
            term: m.current_term,
            committed: m.local_committed.as_ref().map_or(0, |l| l.index()),
            applied: m.last_applied.as_ref().map_or(0, |l| l.index()),
            followers,
        }
    }

    /// The group's facts for hibernation, from openraft's metrics.
    pub fn group_facts(&self) -> GroupFacts {
        let m = self.raft.metrics().borrow_watched().clone();
        let index = |l: Option<&super::LogId>| l.map_or(0, |l| l.index());
        let committed = index(m.local_committed.as_ref());
        let membership = m.membership_config.membership();
        let settled_membership = membership.get_joint_config().len() == 1
            && membership.learner_ids().next().is_none()
            && index(m.membership_config.log_id().as_ref()) <= committed;
        let followers = if m.current_leader == Some(self.replica_id) {
            membership
                .voter_ids()
                .filter(|v| *v != self.replica_id)
                .map(|v| {
                    let matched = m
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&v).cloned().flatten())
                        .map(|l| l.index());
                    (v, matched)
                })
                .collect()
        } else {
            Vec::new()
        };
        GroupFacts {
            me: self.replica_id,
            leader: m.current_leader,
            term: m.current_term,
            last_log: m.last_log_index.unwrap_or(0),
            committed,
            applied: index(m.last_applied.as_ref()),
            followers,
            settled_membership,
        }
    }

    /// The nodes of the group's other voters.
    pub fn follower_nodes(&self) -> Vec<u64> {
        let m = self.raft.metrics().borrow_watched().clone();
        m.membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != self.replica_id)
            .map(super::router::node_of)
            .collect()
    }

    /// A leader's request to sleep: agreed (and this replica sleeps) only
    /// if it follows that leader in that term at the same log
    /// ([`GroupFacts::agrees`]). Its data is then complete as of now.
    pub fn agree_to_sleep(&self, req: &SleepRequest) -> bool {
        if !self.group_facts().agrees(req) {
            return false;
        }
        *self.tablet.leader_contact.lock().expect("lock poisoned") =
            Some((std::time::Instant::now(), req.index));
        self.hibernation
            .sleep_as_follower(super::router::node_of(req.leader));
        true
    }

    /// Records a request; a sleeping leader wakes with a read index first,
    /// which heartbeats the group (waking its followers) and renews the
    /// lease it needs to take writes.
    async fn wake_for_request(&self) -> Result<(), ProposeError> {
        self.hibernation.touch();
        if self.hibernation.wake_leader() {
            self.read_index_now().await?;
        }
        Ok(())
    }

    /// Wakes the group for work that goes to openraft directly (a
    /// membership change, a leadership transfer): a sleeping leader's
    /// lease has lapsed, and openraft refuses such changes on a leader
    /// without one (`LeaseExpired`) until a read index renews it.
    pub async fn wake(&self) -> Result<(), ProposeError> {
        self.wake_for_request().await
    }

    /// Proposes `cmd` and waits for it to be applied here.
    pub async fn propose(&self, cmd: TabletCommand) -> Result<TabletResponse, ProposeError> {
        self.wake_for_request().await?;
        propose_on(&self.proposer(), cmd).await
    }

    /// Proposes an append, coalesced with the appends to this tablet that
    /// arrive while `limits.in_flight` proposals are out (one
    /// `AppendMany` entry; `raft::coalesce`), and returns its own
    /// response. Only for a cell whose log format is 2 or more.
    pub async fn append_coalesced(
        &self,
        batch: AppendBatch,
        limits: Limits,
    ) -> Result<TabletResponse, ProposeError> {
        self.wake_for_request().await?;
        self.coalescer.append(&self.proposer(), batch, limits).await
    }

    /// A linearizable read barrier (read index): once it returns, this
    /// replica leads and has applied everything committed before the call.
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        self.hibernation.touch();
        self.hibernation.wake_leader();
        self.read_index_now().await
    }

    /// Reads of a leader that slept in its current leadership, served
    /// from its state without a read index, as if the sleep had been a
    /// lease: wrong (another leader may have been elected while it slept,
    /// or since). Only for the jepsen negative control
    /// (`STELE_UNSAFE_WAKE_READS`); true if the read may be served so.
    pub fn unsafe_wake_read(&self) -> bool {
        self.hibernation.touch();
        self.hibernation.wake_leader();
        self.hibernation.slept_as_leader() && self.is_leader()
    }

    async fn read_index_now(&self) -> Result<(), ProposeError> {
        let tablet = self.tablet.id;
        match self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.forward_to_leader().is_some() => Err(ProposeError::NotLeader { tablet }),
            Err(e) => Err(ProposeError::Unavailable {
                tablet,
                reason: e.to_string(),
            }),
        }
    }

    /// Waits until the group has a leader and this replica applied its
    /// whole log.
    pub async fn wait_ready(&self, timeout: Duration) -> crate::Result<()> {
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| {
                    m.current_leader.is_some()
                        && m.last_applied.as_ref().map(|l| l.index()) >= m.last_log_index
                },
                "leader elected and log applied",
            )
            .await
            .map(drop)
            .map_err(|e| crate::Error::Timeout {
                what: format!("tablet {} not ready", self.tablet.id),
                after: timeout,
                reason: e.to_string(),
            })
    }

    /// Waits until this replica has caught up since the process started:
    /// [`Replica::wait_ready`], and then, on a follower, a leader has
    /// reached it in this process and it applied what that leader had
    /// committed by then. (A restarted follower remembers the leader of its
    /// last term, so a known leader alone says nothing.)
    pub async fn wait_caught_up(&self, timeout: Duration) -> crate::Result<()> {
        let until = tokio::time::Instant::now() + timeout;
        self.wait_ready(timeout).await?;
        let mut target = None;
        loop {
            if self.is_leader() {
                return Ok(());
            }
            let contact = *self.tablet.leader_contact.lock().expect("lock poisoned");
            let applied = self.tablet.read().applied_index();
            let reason = match contact {
                Some((_, commit)) => {
                    // What the leader had committed when it first reached
                    // this wait: a moving target would never be met under
                    // steady writes.
                    let target = *target.get_or_insert(commit);
                    if applied >= target {
                        return Ok(());
                    }
                    format!("applied {applied} of {target}")
                }
                None => "no leader has reached it since start".to_string(),
            };
            if tokio::time::Instant::now() >= until {
                return Err(crate::Error::Timeout {
                    what: format!("tablet {} not caught up", self.tablet.id),
                    after: timeout,
                    reason,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Builds a snapshot (at the tablet's checkpoint) and purges the log
    /// up to `checkpoint` once the snapshot covers it.
    pub async fn purge_after_snapshot(&self, checkpoint: u64) {
        if self.raft.trigger().snapshot().await.is_err() {
            return;
        }
        let waited = self
            .raft
            .wait(Some(Duration::from_secs(30)))
            .metrics(
                |m| m.snapshot.as_ref().map(|l| l.index()) >= Some(checkpoint),
                "snapshot covers checkpoint",
            )
            .await;
        if waited.is_ok() {
            let _ = self.raft.trigger().purge_log(checkpoint).await;
        }
    }
}

/// Proposes `cmd` on `p`'s group and waits for it to be applied there.
/// Runs in a `propose` span (`crate::trace`) that records the log index
/// the command got.
pub async fn propose_on(p: &Proposer, cmd: TabletCommand) -> Result<TabletResponse, ProposeError> {
    let tablet = p.tablet;
    let span = tracing::debug_span!(
        "propose",
        tablet,
        replica = p.replica_id,
        index = tracing::field::Empty
    );
    match p.raft.client_write(cmd).instrument(span.clone()).await {
        Ok(resp) => {
            span.record("index", resp.log_id.index());
            Ok(resp.data)
        }
        Err(e) if e.forward_to_leader().is_some() => Err(ProposeError::NotLeader { tablet }),
        Err(e) => Err(ProposeError::Unavailable {
            tablet,
            reason: e.to_string(),
        }),
    }
}

/// Creates the group of `tablet` with these voter replica ids on `raft`.
pub async fn initialize(raft: &TabletRaft, tablet: u64, voters: &[u64]) -> crate::Result<()> {
    let members: BTreeMap<u64, BasicNode> =
        voters.iter().map(|r| (*r, BasicNode::default())).collect();
    raft.initialize(members)
        .await
        .map_err(|e| crate::Error::RaftInit {
            tablet,
            reason: format!("initialize: {e}"),
        })
}

/// Starts a campaign now (`pre_vote`: with a pre-vote round first).
pub async fn campaign(raft: &TabletRaft, pre_vote: bool) {
    let _ = raft.trigger().elect(pre_vote).await;
}

/// True when openraft's effective membership (from the log or the state
/// machine) has exactly one voter: `me`.
pub fn sole_voter_in_log(raft: &TabletRaft, me: u64) -> bool {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    m.membership().voter_ids().eq([me])
}
