//! Hibernation: a tablet group with nothing to do stops heartbeating.
//!
//! An idle group costs its heartbeats: a message per follower per
//! heartbeat interval, each through openraft's core on both ends. A node
//! with thousands of tablets spends most of its idle CPU on them. So a
//! leader whose group has been idle for `hibernate_after` and is quiet (every
//! voter holds the whole log, all of it committed and applied, one
//! uniform membership, no learner) asks each follower to sleep with a
//! [`SleepRequest`] naming its term and last index. A follower agrees only
//! when it follows that leader in that term and holds, has committed and
//! has applied exactly that log. Once every follower agreed, and nothing
//! happened to the group meanwhile, the leader stops heartbeating it.
//!
//! While a group sleeps, the leader's node stands in for it: every
//! heartbeat interval it sends one [`BEAT_GROUP`] message to each node
//! that follows one of its sleeping groups, and every call from a node
//! counts as hearing from it ([`PeerLiveness`]). A sleeping follower
//! campaigns, as an awake one does, a random `[T, 2T)` after it last heard
//! from its leader's node: a dead, stopped or cut-off leader node is
//! replaced in the same time whether its groups sleep or not.
//!
//! Anything wakes a group: on the leader any proposal or read (the first
//! one after sleep runs a read index first, which heartbeats the group,
//! wakes its followers and renews the leader's lease before it takes
//! writes), on a follower any Raft message for it. Reads never trust the
//! sleep: a linearizable read always goes through a read index.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::pacer::now_ms;
use super::router::{self, Lane, Peers, RaftReply, RaftRpc};

/// The transport group of a node-level beat (no tablet has this id).
pub const BEAT_GROUP: u64 = u64::MAX;

/// How long a node waits for a beat to be delivered.
const BEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A leader's request that a follower stop expecting heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SleepRequest {
    /// The leader's replica id.
    pub leader: u64,
    pub term: u64,
    /// The leader's last log index: committed, applied, and matched by
    /// every voter.
    pub index: u64,
}

/// What a replica's group looks like now, as hibernation needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupFacts {
    pub me: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log: u64,
    pub committed: u64,
    pub applied: u64,
    /// Voters other than `me` and the last index each is known to hold
    /// (a leader's view; empty on a follower).
    pub followers: Vec<(u64, Option<u64>)>,
    /// One uniform voter set with no learners, its entry committed.
    pub settled_membership: bool,
}

impl GroupFacts {
    fn settled(&self) -> bool {
        self.settled_membership && self.committed == self.last_log && self.applied == self.last_log
    }

    /// The sleep request a leader may send, if its group is quiet: every
    /// follower matched the whole log.
    pub fn sleep_request(&self) -> Option<SleepRequest> {
        let quiet = self.leader == Some(self.me)
            && self.settled()
            && !self.followers.is_empty()
            && self
                .followers
                .iter()
                .all(|(_, matched)| *matched == Some(self.last_log));
        quiet.then_some(SleepRequest {
            leader: self.me,
            term: self.term,
            index: self.last_log,
        })
    }

    /// Whether a follower agrees to `req`: it follows that leader in that
    /// term and holds, has committed and has applied exactly that log.
    pub fn agrees(&self, req: &SleepRequest) -> bool {
        self.leader == Some(req.leader)
            && req.leader != self.me
            && self.term == req.term
            && self.last_log == req.index
            && self.settled()
    }
}

const AWAKE: u8 = 0;
const LEADER_ASLEEP: u8 = 1;
const FOLLOWER_ASLEEP: u8 = 2;

/// One replica's hibernation state.
#[derive(Debug)]
pub struct Hibernation {
    state: AtomicU8,
    /// The node a sleeping follower's leader is on.
    leader_node: AtomicU64,
    /// Requests seen: a sleep decided on facts older than the last one is
    /// dropped.
    activity: AtomicU64,
    /// When the last request was seen (pacer milliseconds).
    active_ms: AtomicU64,
    /// A sleep request is out.
    asking: AtomicBool,
    /// Slept as leader in its current leadership (only the jepsen negative
    /// control `STELE_UNSAFE_WAKE_READS` reads it).
    slept: AtomicBool,
}

impl Default for Hibernation {
    fn default() -> Self {
        Hibernation {
            state: AtomicU8::new(AWAKE),
            leader_node: AtomicU64::new(0),
            activity: AtomicU64::new(0),
            active_ms: AtomicU64::new(now_ms()),
            asking: AtomicBool::new(false),
            slept: AtomicBool::new(false),
        }
    }
}

impl Hibernation {
    /// Records a request (a proposal or a read).
    pub fn touch(&self) {
        self.activity.fetch_add(1, Ordering::AcqRel);
        self.active_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the last request.
    pub fn idle_ms(&self, now: u64) -> u64 {
        now.saturating_sub(self.active_ms.load(Ordering::Relaxed))
    }

    pub fn activity(&self) -> u64 {
        self.activity.load(Ordering::Acquire)
    }

    pub fn is_asleep(&self) -> bool {
        self.state.load(Ordering::Acquire) != AWAKE
    }

    pub fn leader_asleep(&self) -> bool {
        self.state.load(Ordering::Acquire) == LEADER_ASLEEP
    }

    /// The leader's node, while this replica sleeps as a follower.
    pub fn follower_asleep_under(&self) -> Option<u64> {
        (self.state.load(Ordering::Acquire) == FOLLOWER_ASLEEP)
            .then(|| self.leader_node.load(Ordering::Acquire))
    }

    /// Wakes the replica; true if it slept.
    pub fn wake(&self) -> bool {
        self.state.swap(AWAKE, Ordering::AcqRel) != AWAKE
    }

    /// Wakes a sleeping leader; true if it was one (the caller then runs
    /// a read index before anything else).
    pub fn wake_leader(&self) -> bool {
        self.state
            .compare_exchange(LEADER_ASLEEP, AWAKE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Sleeps as a follower of a leader on `leader_node`.
    pub fn sleep_as_follower(&self, leader_node: u64) {
        self.leader_node.store(leader_node, Ordering::Release);
        self.state.store(FOLLOWER_ASLEEP, Ordering::Release);
    }

    /// Sleeps as a leader, unless a request came after `seen` (the
    /// activity count the decision was made on); true if it sleeps.
    pub fn sleep_as_leader(&self, seen: u64) -> bool {
        if self
            .state
            .compare_exchange(AWAKE, LEADER_ASLEEP, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        if self.activity() != seen {
            self.state.store(AWAKE, Ordering::Release);
            return false;
        }
        self.slept.store(true, Ordering::Release);
        true
    }

    /// Whether it slept as leader since it last led anew
    /// ([`Hibernation::lost_leadership`]).
    pub fn slept_as_leader(&self) -> bool {
        self.slept.load(Ordering::Acquire)
    }

    /// It no longer leads: wakes, and forgets that it slept as leader.
    pub fn lost_leadership(&self) {
        self.slept.store(false, Ordering::Release);
        self.wake();
    }

    /// Claims the right to send this group's sleep requests; false if a
    /// round is out already.
    pub fn begin_asking(&self) -> bool {
        !self.asking.swap(true, Ordering::AcqRel)
    }

    pub fn end_asking(&self) {
        self.asking.store(false, Ordering::Release);
    }

    /// A sleep request is out (its leader sends no heartbeat meanwhile:
    /// one would wake the followers that agreed).
    pub fn asking(&self) -> bool {
        self.asking.load(Ordering::Acquire)
    }
}

/// When this node last heard from each peer node (any call from it,
/// beats included), in pacer milliseconds.
#[derive(Debug, Default)]
pub struct PeerLiveness {
    heard: RwLock<HashMap<u64, Arc<AtomicU64>>>,
}

impl PeerLiveness {
    pub fn heard(&self, node: u64) {
        let now = now_ms();
        if let Some(at) = self.heard.read().expect("lock poisoned").get(&node) {
            at.fetch_max(now, Ordering::Relaxed);
            return;
        }
        self.heard
            .write()
            .expect("lock poisoned")
            .entry(node)
            .or_default()
            .fetch_max(now, Ordering::Relaxed);
    }

    /// When `node` was last heard from (`None`: never, in this process).
    pub fn last_heard(&self, node: u64) -> Option<u64> {
        let heard = self.heard.read().expect("lock poisoned");
        heard.get(&node).map(|at| at.load(Ordering::Relaxed))
    }
}

/// The future of a sleep request or a beat.
pub type AskFuture<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Object-safe access to the peers for hibernation's messages.
pub trait Sleeper: Send + Sync {
    /// Asks `follower` (a replica of `group`) to sleep; true if it agreed
    /// within `timeout`.
    fn ask(&self, group: u64, follower: u64, req: SleepRequest, timeout: Duration)
    -> AskFuture<'_>;
    /// One beat to `node`; true if it was delivered.
    fn beat(&self, node: u64) -> AskFuture<'_>;
}

impl<P: Peers> Sleeper for P {
    fn ask(
        &self,
        group: u64,
        follower: u64,
        req: SleepRequest,
        timeout: Duration,
    ) -> AskFuture<'_> {
        Box::pin(async move {
            let body = router::encode_msg(RaftRpc::Sleep(req));
            let call = self.call(
                router::node_of(follower),
                group,
                follower,
                Lane::Control,
                body,
            );
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(bytes)) => matches!(
                    router::decode_msg::<RaftReply>("sleep reply", &bytes),
                    Ok(RaftReply::Sleep(true))
                ),
                _ => false,
            }
        })
    }

    fn beat(&self, node: u64) -> AskFuture<'_> {
        Box::pin(async move {
            let call = self.call(node, BEAT_GROUP, 0, Lane::Control, Bytes::new());
            matches!(tokio::time::timeout(BEAT_TIMEOUT, call).await, Ok(Ok(_)))
        })
    }
}

/// What the pacer needs to put groups to sleep and keep them asleep.
#[derive(Clone)]
pub struct Hibernate {
    pub sleeper: Arc<dyn Sleeper>,
    pub liveness: Arc<PeerLiveness>,
    /// A group idle this long may sleep (milliseconds).
    pub after_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One way a group's facts differ from the quiet case.
    type Change = fn(&mut GroupFacts);

    fn leader() -> GroupFacts {
        GroupFacts {
            me: 1,
            leader: Some(1),
            term: 4,
            last_log: 10,
            committed: 10,
            applied: 10,
            followers: vec![(2, Some(10)), (3, Some(10))],
            settled_membership: true,
        }
    }

    fn follower() -> GroupFacts {
        GroupFacts {
            me: 2,
            followers: vec![],
            ..leader()
        }
    }

    #[test]
    fn a_quiet_leader_asks_and_each_unfinished_thing_stops_it() {
        let want = SleepRequest {
            leader: 1,
            term: 4,
            index: 10,
        };
        assert_eq!(leader().sleep_request(), Some(want));
        let cases: Vec<(&str, Change)> = vec![
            ("not leading", |f| f.leader = Some(2)),
            ("a follower behind", |f| f.followers[1].1 = Some(9)),
            ("a follower never heard from", |f| f.followers[0].1 = None),
            ("uncommitted tail", |f| f.committed = 9),
            ("unapplied tail", |f| f.applied = 9),
            ("membership changing", |f| f.settled_membership = false),
            ("no followers (one voter)", |f| f.followers.clear()),
        ];
        for (why, change) in cases {
            let mut f = leader();
            change(&mut f);
            assert_eq!(f.sleep_request(), None, "{why}");
        }
    }

    #[test]
    fn a_follower_agrees_only_to_its_leader_at_its_own_log() {
        let req = leader().sleep_request().expect("quiet");
        assert!(follower().agrees(&req));
        let cases: Vec<(&str, Change)> = vec![
            ("another leader", |f| f.leader = Some(3)),
            ("no leader known", |f| f.leader = None),
            ("a newer term", |f| f.term = 5),
            ("a longer log", |f| {
                f.last_log = 11;
                f.committed = 11;
                f.applied = 11;
            }),
            ("a shorter log", |f| {
                f.last_log = 9;
                f.committed = 9;
                f.applied = 9;
            }),
            ("not yet committed", |f| f.committed = 9),
            ("not yet applied", |f| f.applied = 9),
            ("membership changing", |f| f.settled_membership = false),
            ("asked by itself", |f| f.me = 1),
        ];
        for (why, change) in cases {
            let mut f = follower();
            change(&mut f);
            assert!(!f.agrees(&req), "{why}");
        }
    }

    #[test]
    fn a_request_between_the_decision_and_the_sleep_keeps_the_leader_awake() {
        let h = Hibernation::default();
        let seen = h.activity();
        h.touch();
        assert!(!h.sleep_as_leader(seen));
        assert!(!h.is_asleep());
        let seen = h.activity();
        assert!(h.sleep_as_leader(seen));
        assert!(h.leader_asleep());
        assert!(h.wake_leader());
        assert!(!h.wake_leader(), "woken once");
        h.sleep_as_follower(7);
        assert_eq!(h.follower_asleep_under(), Some(7));
        assert!(!h.wake_leader(), "a follower is not woken as a leader");
        assert!(h.wake());
        assert_eq!(h.follower_asleep_under(), None);
    }

    #[test]
    fn liveness_remembers_the_latest_call_per_node() {
        let l = PeerLiveness::default();
        assert_eq!(l.last_heard(2), None);
        l.heard(2);
        let first = l.last_heard(2).expect("heard");
        l.heard(2);
        assert!(l.last_heard(2).expect("heard") >= first);
        assert_eq!(l.last_heard(3), None);
    }
}
