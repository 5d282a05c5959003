//! One clock for every tablet group of a node.
//!
//! openraft gives each Raft instance its own tick task, which wakes every
//! `heartbeat_interval * 13 / 64` ms to check its election and heartbeat
//! timers: with a thousand replicas per node that is tens of thousands of
//! wake-ups a second while nothing happens. Tablet groups therefore run
//! with openraft's tick disabled (`raft::tablet_config`) and the pacer
//! drives them all from one task:
//!
//! - a replica that leads its group sends a heartbeat every
//!   `heartbeat_ms`; every group the node leads sends at the same instant,
//!   so the transport carries them to each peer together;
//! - a replica that follows starts a campaign (pre-vote first) when it has
//!   not been contacted by a leader or candidate for a random time in
//!   `[T, 2T)`, `T = election_timeout_ms`. Contact is recorded by
//!   [`Inbound::deliver`](super::inbound::Inbound::deliver) for appends,
//!   heartbeats, snapshots and votes.
//!
//! openraft's leader lease is its `election_timeout_max`, set to `T`: a
//! follower rejects votes for `T` after it last heard from its leader. The
//! campaign window starts at `T`, so it begins right as the other
//! followers' leases expire, and failover after a leader dies takes at most
//! `2T` plus one vote round (not `T` of lease plus a full timer, as with
//! openraft's own tick). A campaign that does not produce a leader is
//! retried after a random `[T/2, T)`.
//!
//! The pacer also runs hibernation (`raft::hibernate`): it asks the
//! followers of an idle, quiet group to sleep, stops heartbeating a group
//! that sleeps and beats each node that follows one instead, and counts a
//! sleeping follower as contacted while it hears from its leader's node.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::hibernate::Hibernate;
use super::{RaftTiming, Replica};

/// Milliseconds since the process's pacer epoch.
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// When a replica was last contacted by a leader or candidate.
#[derive(Debug)]
pub struct Contact(AtomicU64);

impl Default for Contact {
    fn default() -> Self {
        Contact(AtomicU64::new(now_ms()))
    }
}

impl Contact {
    pub fn touch(&self) {
        self.0.fetch_max(now_ms(), Ordering::Relaxed);
    }

    fn last_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Most campaigns a node has in flight at once (started, with no leader
/// or candidate heard from since, for less than `T/2`). A node that
/// follows thousands of groups led by a node that just died would
/// otherwise start them all within one election timeout; when the rounds
/// outlast the retry timer, every group campaigns again (measured before
/// this cap and the catalog's grouped votes: 10,000 tablets on three
/// nodes, 12,000-16,000 campaigns for 3,367 groups, all led again after
/// 4.7-5.4 T; with both, about one campaign per group and 3.3-3.9 T).
/// Due campaigns past the cap wait for the next tick, earliest deadline
/// first.
const CAMPAIGNS_IN_FLIGHT_MAX: usize = 128;

/// The pacer's view of one replica.
struct Timer {
    /// Contact time the deadline was computed from.
    seen_ms: u64,
    /// Campaign deadline while following; next heartbeat while leading.
    at_ms: u64,
    leading: bool,
    /// When this replica's latest campaign started, until it hears from a
    /// leader or candidate or leads.
    campaign_ms: Option<u64>,
}

impl Timer {
    fn campaigning(&self, now: u64, t: u64) -> bool {
        self.campaign_ms.is_some_and(|c| now < c + t / 2)
    }
}

/// Node-wide counters of the pacer.
#[derive(Debug, Default)]
pub struct PacerStats {
    pub heartbeat_rounds: AtomicU64,
    pub campaigns: AtomicU64,
    /// Groups this node's leaders put to sleep.
    pub sleeps: AtomicU64,
    /// Node beats sent for sleeping groups.
    pub beats: AtomicU64,
    /// Due campaigns put off to a later tick by `CAMPAIGNS_IN_FLIGHT_MAX`.
    pub campaigns_deferred: AtomicU64,
}

/// Runs until `cancel`, over the replicas `replicas` lists at each tick
/// (the node's replica set).
pub async fn run(
    replicas: impl Fn() -> Vec<Arc<Replica>>,
    timing: RaftTiming,
    stats: Arc<PacerStats>,
    hibernate: Option<Hibernate>,
    cancel: CancellationToken,
) {
    let hb = timing.heartbeat_ms.max(1);
    let t = timing.election_timeout_ms.max(2);
    let mut tick = tokio::time::interval(Duration::from_millis((hb / 2).max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut timers: HashMap<u64, Timer> = HashMap::new();
    let mut next_round_ms = 0u64;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = now_ms();
        let heartbeat_round = now >= next_round_ms;
        if heartbeat_round {
            next_round_ms = now + hb;
        }
        let mut sent = false;
        let mut beat_nodes = std::collections::BTreeSet::new();
        let mut in_flight = timers.values().filter(|x| x.campaigning(now, t)).count();
        let mut due: Vec<(u64, &Arc<Replica>)> = Vec::new();
        let replicas = replicas();
        if timers.len() > replicas.len() {
            // Replicas removed (moved away) leave no timer behind.
            let live: std::collections::HashSet<u64> =
                replicas.iter().map(|r| r.tablet.id).collect();
            timers.retain(|id, _| live.contains(id));
        }
        for r in &replicas {
            let id = &r.tablet.id;
            let leading = r.is_leader();
            let mut contact = r.contact.last_ms();
            if !leading
                && let (Some(h), Some(node)) = (&hibernate, r.hibernation.follower_asleep_under())
            {
                // Asleep: hearing from the leader's node is contact.
                contact = contact.max(h.liveness.last_heard(node).unwrap_or(0));
            }
            let timer = timers.entry(*id).or_insert_with(|| Timer {
                seen_ms: contact,
                at_ms: campaign_at(contact, t),
                leading,
                campaign_ms: None,
            });
            if leading {
                timer.leading = true;
                if timer.campaigning(now, t) {
                    in_flight -= 1;
                }
                timer.campaign_ms = None;
                if let Some(h) = &hibernate {
                    if r.hibernation.leader_asleep() {
                        if heartbeat_round {
                            beat_nodes.extend(r.follower_nodes());
                        }
                        continue;
                    }
                    if heartbeat_round
                        && h.after_ms > 0
                        && r.hibernation.idle_ms(now) >= h.after_ms
                        && ask_to_sleep(r, h, hb, &stats)
                    {
                        // No heartbeat while the followers are asked: it
                        // would wake the ones that agreed.
                        continue;
                    }
                    if r.hibernation.asking() {
                        continue;
                    }
                }
                if heartbeat_round {
                    let _ = r.raft.trigger().heartbeat().await;
                    sent = true;
                }
                continue;
            }
            if r.hibernation.slept_as_leader() {
                // Stepped down (in its sleep or after).
                r.hibernation.lost_leadership();
            }
            if timer.leading {
                // Stepped down: someone else holds a newer term; give its
                // leader a full timeout to make contact.
                timer.leading = false;
                timer.seen_ms = contact;
                timer.at_ms = campaign_at(now, t);
            } else if contact != timer.seen_ms {
                timer.seen_ms = contact;
                timer.at_ms = campaign_at(contact, t);
                if timer.campaign_ms.is_some_and(|c| contact >= c) {
                    // Heard from a leader or candidate since: resolved.
                    if timer.campaigning(now, t) {
                        in_flight -= 1;
                    }
                    timer.campaign_ms = None;
                }
            }
            if now >= timer.at_ms {
                due.push((timer.at_ms, r));
            }
        }
        // Earliest deadline first, up to the cap.
        due.sort_unstable_by_key(|(at, r)| (*at, r.tablet.id));
        let room = CAMPAIGNS_IN_FLIGHT_MAX.saturating_sub(in_flight);
        if due.len() > room {
            stats
                .campaigns_deferred
                .fetch_add((due.len() - room) as u64, Ordering::Relaxed);
        }
        for (_, r) in due.into_iter().take(room) {
            r.hibernation.wake();
            stats.campaigns.fetch_add(1, Ordering::Relaxed);
            let _ = r.raft.trigger().elect(true).await;
            if let Some(timer) = timers.get_mut(&r.tablet.id) {
                timer.at_ms = now + rand::rng().random_range(t / 2..t);
                timer.campaign_ms = Some(now);
            }
        }
        if sent {
            stats.heartbeat_rounds.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(h) = &hibernate {
            for node in beat_nodes {
                stats.beats.fetch_add(1, Ordering::Relaxed);
                let sleeper = h.sleeper.clone();
                tokio::spawn(async move { sleeper.beat(node).await });
            }
        }
    }
}

/// A random campaign deadline in `[contact + T, contact + 2T)`.
fn campaign_at(contact_ms: u64, t: u64) -> u64 {
    contact_ms + t + rand::rng().random_range(0..t)
}

/// Asks the followers of `r`'s group to sleep if the group is quiet and
/// no round is out yet (true if it asked); the group sleeps once every
/// follower agreed within half a heartbeat interval and nothing happened
/// to it meanwhile.
fn ask_to_sleep(r: &Arc<Replica>, h: &Hibernate, hb_ms: u64, stats: &Arc<PacerStats>) -> bool {
    let facts = r.group_facts();
    let Some(req) = facts.sleep_request() else {
        return false;
    };
    if !r.hibernation.begin_asking() {
        return false;
    }
    let timeout = Duration::from_millis((hb_ms / 2).max(1));
    let seen = r.hibernation.activity();
    let (r, sleeper, stats) = (r.clone(), h.sleeper.clone(), stats.clone());
    tokio::spawn(async move {
        let asks = facts
            .followers
            .iter()
            .map(|(follower, _)| sleeper.ask(r.tablet.id, *follower, req, timeout));
        let agreed = futures::future::join_all(asks).await;
        if agreed.iter().all(|a| *a)
            && r.group_facts().sleep_request() == Some(req)
            && r.hibernation.sleep_as_leader(seen)
        {
            stats.sleeps.fetch_add(1, Ordering::Relaxed);
        }
        r.hibernation.end_asking();
    });
    true
}
