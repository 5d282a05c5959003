//! Route changes pushed to watching clients (`WatchRoutes`). The leader
//! files each change of the route map as it learns of it — a committed
//! route generation (split, merge, move, placement) or a newer leader in a
//! node's heartbeat — and every open watch sends the tablets changed past
//! its cursor.
//!
//! ```text
//! applied state, route generation bumped ──note_state──┐
//! heartbeat: a leader in a newer Raft term ─note_leader─┤
//!                                                      ▼
//!                  FeedLog { seq, [(seq, tablet)], leaders } ──seq──▶ watch::Sender
//!                                                      │
//!  a watch at cursor c ◀── since(c): tablets changed after c, or Whole
//!                          (c older than what is kept, or another term)
//! ```
//!
//! The log is the leader's soft state, kept per term: a watch belongs to
//! the term it was opened in and ends with it (the client reopens at the
//! new leader, from its route generation). Leaders are kept across terms:
//! a tablet's Raft term only grows, so an older report never wins.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stele_proto::pb;
use tokio::sync::watch;
use tonic::Status;

use crate::server::Controller;
use crate::state::{CellState, TabletRec};

/// Changes kept for watches that fall behind; one further back than this
/// is sent the whole map.
const KEEP: usize = 1 << 18;

/// The route changes of the current leader term, for watches.
pub struct RouteFeed {
    log: Mutex<FeedLog>,
    seq: watch::Sender<u64>,
}

#[derive(Default)]
struct FeedLog {
    /// The controller term this log belongs to (0: none yet).
    term: u64,
    /// The route generation whose changes are filed.
    generation: u64,
    /// The placed tablets' routes as of `generation`: watches describe
    /// tablets from these, never waiting for the state's lock (which the
    /// apply and every heartbeat answer take at full size).
    routes: HashMap<u64, FeedRoute>,
    /// Each node's client endpoint, as of the last state seen.
    endpoints: HashMap<u64, String>,
    seq: u64,
    /// A cursor below this was dropped from `changes`: the whole map.
    floor: u64,
    /// (seq, tablet, when filed in µs since the Unix epoch), seq
    /// ascending.
    changes: VecDeque<(u64, u64, u64)>,
    /// Each tablet's leader: (its Raft term, node).
    leaders: HashMap<u64, (u64, u64)>,
}

/// A placed tablet's route as the feed holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FeedRoute {
    lo: u32,
    hi: u64,
    generation: u64,
    /// The voters' nodes: a leader elsewhere (moved away) is no hint.
    voters: Vec<u64>,
}

impl FeedRoute {
    fn of(t: &TabletRec) -> FeedRoute {
        FeedRoute {
            lo: t.lo,
            hi: t.hi,
            generation: t.generation,
            voters: t.voters.iter().map(|v| v.node).collect(),
        }
    }
}

/// What a watch at a cursor is to send.
#[derive(Debug, PartialEq, Eq)]
pub enum Since {
    /// These tablets changed after the cursor (ascending); the new
    /// cursor; when the earliest of those changes was filed (µs since the
    /// Unix epoch).
    Changed(Vec<u64>, u64, u64),
    /// The cursor is older than the log (or of another term): the whole
    /// map; the new cursor.
    Whole(u64),
}

impl Default for RouteFeed {
    fn default() -> Self {
        RouteFeed {
            log: Mutex::new(FeedLog::default()),
            seq: watch::Sender::new(0),
        }
    }
}

impl RouteFeed {
    /// The log; a panic while filing leaves at worst a change unfiled,
    /// which the next one of that tablet repairs.
    fn log(&self) -> MutexGuard<'_, FeedLog> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes on every filed change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.seq.subscribe()
    }

    /// Starts the log of controller term `term` from state `s` (nothing
    /// if it is that term's already), taking leaders newer than the ones
    /// held. Every cursor of an earlier term now gets the whole map.
    pub fn start_term(&self, term: u64, s: &CellState, leaders: &HashMap<u64, pb::ReplicaReport>) {
        let mut log = self.log();
        if log.term == term {
            return;
        }
        log.term = term;
        log.generation = s.route_generation;
        log.routes = s
            .tablets
            .values()
            .filter(|t| placed(t))
            .map(|t| (t.id, FeedRoute::of(t)))
            .collect();
        log.note_endpoints(s);
        log.changes.clear();
        log.seq += 1;
        log.floor = log.seq;
        for r in leaders.values() {
            log.leader(r.tablet, r.term, crate::state::node_of(r.replica_id));
        }
        let seq = log.seq;
        drop(log);
        self.seq.send_replace(seq);
    }

    /// Files the tablets that state `s` changed since the generation filed
    /// last: placed, moved, split, merged away.
    pub fn note_state(&self, s: &CellState) {
        let mut log = self.log();
        if log.term == 0 {
            return;
        }
        log.note_endpoints(s);
        if s.route_generation <= log.generation {
            return;
        }
        let since = log.generation;
        let mut placed_now = 0usize;
        let mut changed = Vec::new();
        let now = unix_us();
        for t in s.tablets.values() {
            placed_now += usize::from(placed(t));
            if t.generation > since {
                changed.push(t.id);
                if placed(t) {
                    log.routes.insert(t.id, FeedRoute::of(t));
                } else {
                    log.routes.remove(&t.id);
                }
            }
        }
        if log.routes.len() > placed_now {
            // Some tablet left the map without a generation of its own (a
            // merge's absorbed tablet): find it.
            let gone: Vec<u64> = log
                .routes
                .keys()
                .filter(|id| !s.tablets.get(id).is_some_and(placed))
                .copied()
                .collect();
            for id in gone {
                log.routes.remove(&id);
                changed.push(id);
            }
        }
        log.generation = s.route_generation;
        for id in changed {
            log.push(id, now);
        }
        let seq = log.seq;
        drop(log);
        self.seq.send_replace(seq);
    }

    /// Files `node` as the leader of each `(tablet, Raft term)` where that
    /// is newer than the leader held. Returns how many were.
    pub fn note_leaders(&self, node: u64, leading: impl IntoIterator<Item = (u64, u64)>) -> usize {
        let mut log = self.log();
        let mut newer = 0;
        let now = unix_us();
        for (tablet, term) in leading {
            if log.leader(tablet, term, node) {
                newer += 1;
                if log.term != 0 {
                    log.push(tablet, now);
                }
            }
        }
        if newer > 0 {
            let seq = log.seq;
            drop(log);
            self.seq.send_replace(seq);
        }
        newer
    }

    /// The leader node held for `tablet` (0: none).
    pub fn leader_of(&self, tablet: u64) -> u64 {
        self.log().leaders.get(&tablet).map_or(0, |l| l.1)
    }

    /// The cursor a new watch of term `term` starts from, if the log is
    /// that term's.
    pub fn cursor(&self, term: u64) -> Option<u64> {
        let log = self.log();
        (log.term == term).then_some(log.seq)
    }

    /// What a watch of term `term` at `cursor` is to send.
    #[cfg(test)]
    fn since(&self, term: u64, cursor: u64) -> Since {
        self.log().since(term, cursor)
    }

    /// Descriptors of `tablets` with the leaders held, and the tablets
    /// that are no longer in the map; the route generation they are of.
    #[cfg(test)]
    fn describe(
        &self,
        tablets: impl Iterator<Item = u64>,
    ) -> (Vec<pb::TabletDescriptor>, Vec<u64>, u64) {
        let log = self.log();
        let (found, removed) = log.describe(tablets);
        (found, removed, log.generation)
    }

    /// The whole map, or its tablets changed after generation `since` (all
    /// when 0 or ahead of the feed), with the leaders held.
    pub fn map(&self, since: u64) -> pb::GetRoutesResponse {
        self.map_of(&self.log(), since)
    }

    fn map_of(&self, log: &FeedLog, since: u64) -> pb::GetRoutesResponse {
        let full = since == 0 || since > log.generation;
        let mut tablets: Vec<pb::TabletDescriptor> = log
            .routes
            .iter()
            .filter(|(_, r)| full || r.generation > since)
            .map(|(id, r)| log.descriptor(*id, r))
            .collect();
        tablets.sort_unstable_by_key(|d| d.vshard_lo);
        pb::GetRoutesResponse {
            generation: log.generation,
            tablets,
            removed: Vec::new(),
            full,
            filed_at_unix_us: 0,
        }
    }

    /// What a watch of term `term` at `cursor` sends next, with its new
    /// cursor (`None`: nothing changed). One view of the log: the
    /// message's generation covers exactly the changes it carries.
    pub fn next(&self, term: u64, cursor: u64) -> Option<(u64, pb::GetRoutesResponse)> {
        let log = self.log();
        match log.since(term, cursor) {
            Since::Changed(ids, ..) if ids.is_empty() => None,
            Since::Changed(ids, at, filed) => {
                let (tablets, removed) = log.describe(ids.into_iter());
                Some((
                    at,
                    pb::GetRoutesResponse {
                        generation: log.generation,
                        tablets,
                        removed,
                        full: false,
                        filed_at_unix_us: filed,
                    },
                ))
            }
            Since::Whole(at) => Some((at, self.map_of(&log, 0))),
        }
    }

    /// A new watch of term `term` from generation `since`: its cursor and
    /// first message, read together; `None` if the log is not that term's.
    pub fn open(&self, term: u64, since: u64) -> Option<(u64, pb::GetRoutesResponse)> {
        let log = self.log();
        (log.term == term).then(|| (log.seq, self.map_of(&log, since)))
    }
}

impl FeedLog {
    fn since(&self, term: u64, cursor: u64) -> Since {
        let log = self;
        if log.term != term || cursor < log.floor {
            return Since::Whole(log.seq);
        }
        let from = log.changes.partition_point(|(seq, ..)| *seq <= cursor);
        let earliest = log.changes.get(from).map_or(0, |c| c.2);
        let mut ids: Vec<u64> = log.changes.range(from..).map(|c| c.1).collect();
        ids.sort_unstable();
        ids.dedup();
        Since::Changed(ids, log.seq, earliest)
    }

    fn describe(
        &self,
        tablets: impl Iterator<Item = u64>,
    ) -> (Vec<pb::TabletDescriptor>, Vec<u64>) {
        let (mut found, mut removed) = (Vec::new(), Vec::new());
        for id in tablets {
            match self.routes.get(&id) {
                Some(r) => found.push(self.descriptor(id, r)),
                None => removed.push(id),
            }
        }
        (found, removed)
    }

    /// Takes the nodes' client endpoints of `s` if any changed.
    fn note_endpoints(&mut self, s: &CellState) {
        let same = self.endpoints.len() == s.nodes.len()
            && s.nodes
                .values()
                .all(|n| self.endpoints.get(&n.id) == Some(&n.client_endpoint));
        if !same {
            self.endpoints = s
                .nodes
                .values()
                .map(|n| (n.id, n.client_endpoint.clone()))
                .collect();
        }
    }

    fn descriptor(&self, id: u64, r: &FeedRoute) -> pb::TabletDescriptor {
        // A leader that is no longer a voter (moved away) is no hint.
        let leader_node = self
            .leaders
            .get(&id)
            .map(|l| l.1)
            .filter(|n| r.voters.contains(n))
            .unwrap_or(0);
        pb::TabletDescriptor {
            id,
            vshard_lo: r.lo,
            vshard_hi: r.hi,
            generation: r.generation,
            leader_node,
            leader_endpoint: self
                .endpoints
                .get(&leader_node)
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn leader(&mut self, tablet: u64, term: u64, node: u64) -> bool {
        match self.leaders.get(&tablet) {
            Some(&(t, n)) if t > term || (t == term && n == node) => false,
            _ => {
                self.leaders.insert(tablet, (term, node));
                true
            }
        }
    }

    fn push(&mut self, tablet: u64, now_us: u64) {
        self.seq += 1;
        self.changes.push_back((self.seq, tablet, now_us));
        if self.changes.len() > KEEP
            && let Some((seq, ..)) = self.changes.pop_front()
        {
            self.floor = seq;
        }
    }
}

/// Now, in µs since the Unix epoch (0 if the clock is before it).
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A tablet in the route map: one with voters.
fn placed(t: &TabletRec) -> bool {
    !t.voters.is_empty()
}

/// The stream of one `WatchRoutes` call.
pub type Watch = tokio_stream::wrappers::ReceiverStream<Result<pb::GetRoutesResponse, Status>>;

/// Messages a watch may have waiting for a slow reader; past that it waits,
/// and past [`KEEP`] changes it is sent the whole map.
const WATCH_BUFFER: usize = 4;

/// How often an idle watch checks that this controller still leads.
const WATCH_RECHECK: Duration = Duration::from_millis(500);

/// Opens a watch from route generation `since`: the map's delta since then
/// first, then every change filed, until the caller leaves, this
/// controller stops leading (the stream ends with `NotLeader`) or stops.
pub(crate) fn watch(c: Arc<Controller>, since: u64) -> Result<Watch, Status> {
    let term = c.quorum.leading_term().ok_or_else(|| c.not_leader())?;
    // The log of this term exists once the feed task saw the lead; until
    // then (a moment after an election) the caller retries.
    let (mut cursor, first) = Controller::blocking(|| c.routes.open(term, since))
        .ok_or_else(|| Status::unavailable("the route feed of this leader is starting"))?;
    let mut changed = c.routes.subscribe();
    let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
    tokio::spawn(async move {
        crate::metrics::route_watchers(1.0);
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            if !msg.tablets.is_empty() || !msg.removed.is_empty() || msg.full {
                crate::metrics::route_delta_sent(msg.tablets.len() + msg.removed.len());
            }
            if tx.send(Ok(msg)).await.is_err() {
                break;
            }
            next = loop {
                tokio::select! {
                    _ = c.cancel.cancelled() => break None,
                    _ = tx.closed() => break None,
                    r = tokio::time::timeout(WATCH_RECHECK, changed.changed()) => {
                        if matches!(r, Ok(Err(_))) {
                            break None;
                        }
                    }
                }
                if c.quorum.leading_term() != Some(term) {
                    let _ = tx.send(Err(c.not_leader())).await;
                    break None;
                }
                if let Some((at, msg)) = c.routes.next(term, cursor) {
                    cursor = at;
                    break Some(msg);
                }
            };
        }
        crate::metrics::route_watchers(-1.0);
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Files the route changes of every applied entry while this controller
/// leads, until it stops.
pub async fn run(c: Arc<Controller>) {
    let mut applied = 0;
    loop {
        if let Some(term) = c.quorum.leading_term() {
            let leaders = c.routes.cursor(term).is_none().then(|| c.leaders());
            Controller::blocking(|| {
                let s = c.quorum.state();
                if let Some(leaders) = &leaders {
                    c.routes.start_term(term, &s, leaders);
                }
                c.routes.note_state(&s);
            });
        }
        tokio::select! {
            _ = c.cancel.cancelled() => return,
            a = c.quorum.wait_applied_past(applied, Duration::from_millis(500)) => {
                applied = a.unwrap_or(applied);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ReplicaRec;

    fn tablet(id: u64, generation: u64) -> TabletRec {
        TabletRec {
            id,
            lo: 0,
            hi: 0,
            generation,
            range_generation: generation,
            voters: vec![ReplicaRec {
                replica_id: (id << crate::state::NODE_BITS) | 1,
                node: 1,
            }],
            leaving: None,
            initializer: None,
            leader_replica: 0,
            intent: 0,
        }
    }

    fn state(tablets: &[(u64, u64)]) -> CellState {
        let mut s = CellState::new();
        for &(id, g) in tablets {
            s.tablets.insert(id, tablet(id, g));
            s.route_generation = s.route_generation.max(g);
        }
        s
    }

    #[test]
    fn a_watch_gets_the_tablets_changed_past_its_cursor_once_each() {
        let feed = RouteFeed::default();
        let s = state(&[(1, 1), (2, 2)]);
        feed.start_term(5, &s, &HashMap::new());
        let c0 = feed.cursor(5).unwrap();
        assert_eq!(feed.since(5, c0), Since::Changed(vec![], c0, 0));
        // A split of 1 (1 and 3 at generation 3), then a move of 2.
        let mut s = state(&[(1, 3), (2, 4), (3, 3)]);
        feed.note_state(&s);
        let Since::Changed(ids, c1, filed) = feed.since(5, c0) else {
            panic!("whole map")
        };
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(filed > 0 && filed <= unix_us(), "filed at {filed}");
        // A leader report, twice, then an older one: one change.
        assert_eq!(feed.note_leaders(2, [(3, 7)]), 1);
        assert_eq!(feed.note_leaders(2, [(3, 7)]), 0);
        assert_eq!(feed.note_leaders(1, [(3, 6)]), 0);
        assert_eq!(feed.leader_of(3), 2);
        // A merge absorbing 3 into 1: 3 leaves the map with no generation.
        s.tablets.remove(&3);
        s.tablets.get_mut(&1).unwrap().generation = 5;
        s.route_generation = 5;
        feed.note_state(&s);
        let Since::Changed(ids, c2, _) = feed.since(5, c1) else {
            panic!("whole map")
        };
        assert_eq!(ids, vec![1, 3]);
        let (found, removed, generation) = feed.describe(ids.into_iter());
        assert_eq!(generation, 5);
        assert_eq!(found.iter().map(|d| d.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(removed, vec![3]);
        // Nothing new: nothing to send; the same generation again: nothing filed.
        feed.note_state(&s);
        assert_eq!(feed.since(5, c2), Since::Changed(vec![], c2, 0));
    }

    #[test]
    fn a_cursor_of_another_term_or_past_the_kept_changes_gets_the_whole_map() {
        let feed = RouteFeed::default();
        let s = state(&[(1, 1)]);
        feed.start_term(1, &s, &HashMap::new());
        let c = feed.cursor(1).unwrap();
        assert!(feed.cursor(2).is_none());
        feed.start_term(2, &s, &HashMap::new());
        assert!(matches!(feed.since(1, c), Since::Whole(_)));
        assert!(matches!(feed.since(2, c), Since::Whole(_)));
        let c = feed.cursor(2).unwrap();
        for i in 0..(KEEP as u64 + 10) {
            feed.note_leaders(1 + i % 2, [(1, i + 1)]);
        }
        assert!(matches!(feed.since(2, c), Since::Whole(_)));
        let Since::Whole(last) = feed.since(2, c) else {
            unreachable!()
        };
        assert_eq!(feed.since(2, last), Since::Changed(vec![], last, 0));
    }

    #[test]
    fn a_watch_opens_with_the_map_then_gets_each_change_with_its_leader() {
        let feed = RouteFeed::default();
        let mut s = state(&[(1, 1), (2, 2)]);
        s.nodes.insert(1, crate::state::test_node(1));
        s.nodes.insert(2, crate::state::test_node(2));
        assert!(feed.open(3, 0).is_none(), "no log of term 3 yet");
        feed.start_term(3, &s, &HashMap::new());
        let (cursor, first) = feed.open(3, 0).unwrap();
        assert!(first.full);
        assert_eq!(first.generation, 2);
        let mut ids: Vec<u64> = first.tablets.iter().map(|d| d.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2]);
        assert!(feed.next(3, cursor).is_none(), "nothing changed");
        // From a generation: only what changed after it.
        let (_, delta) = feed.open(3, 1).unwrap();
        assert!(!delta.full);
        assert_eq!(
            delta.tablets.iter().map(|d| d.id).collect::<Vec<_>>(),
            vec![2]
        );
        // A leader on a voter's node: pushed with its endpoint. A leader
        // elsewhere (a replica that moved away): no hint.
        feed.note_leaders(1, [(1, 4)]);
        feed.note_leaders(2, [(2, 4)]);
        let (cursor, msg) = feed.next(3, cursor).unwrap();
        assert_eq!(msg.generation, 2);
        assert!(msg.filed_at_unix_us > 0);
        let by_id: HashMap<u64, &pb::TabletDescriptor> =
            msg.tablets.iter().map(|d| (d.id, d)).collect();
        assert_eq!(by_id[&1].leader_node, 1);
        assert_eq!(by_id[&1].leader_endpoint, "http://n1");
        assert_eq!(by_id[&2].leader_node, 0);
        assert_eq!(by_id[&2].leader_endpoint, "");
        // A move of 2 onto node 2: its leader becomes a hint; a node's new
        // endpoint is taken without a route generation.
        s.tablets.get_mut(&2).unwrap().voters[0].node = 2;
        s.tablets.get_mut(&2).unwrap().generation = 3;
        s.route_generation = 3;
        s.nodes.get_mut(&2).unwrap().client_endpoint = "http://n2b".into();
        feed.note_state(&s);
        let (_, msg) = feed.next(3, cursor).unwrap();
        assert_eq!((msg.generation, msg.tablets.len()), (3, 1));
        assert_eq!(msg.tablets[0].leader_endpoint, "http://n2b");
        // Another term's watch: the whole map.
        let (_, whole) = feed.next(2, cursor).unwrap();
        assert!(whole.full && whole.tablets.len() == 2);
    }

    #[test]
    fn leaders_learned_before_a_term_starts_are_kept() {
        let feed = RouteFeed::default();
        // A report filed before the first term's log exists is kept, and
        // pushes nothing.
        assert_eq!(feed.note_leaders(2, [(1, 3)]), 1);
        let mut seeded = HashMap::new();
        seeded.insert(
            1,
            pb::ReplicaReport {
                tablet: 1,
                term: 2,
                replica_id: (1 << crate::state::NODE_BITS) | 3,
                leader: true,
                ..Default::default()
            },
        );
        feed.start_term(1, &state(&[(1, 1)]), &seeded);
        assert_eq!(feed.leader_of(1), 2, "an older seeded leader does not win");
    }
}
