//! Heartbeat deltas, the controller's side: what each node was told.
//!
//! ```text
//! refresh(state, applied, now)     once per applied change, at most every
//!   REFRESH_MIN: walks the tablets, compares each with what the book
//!   holds, and files each changed assignment (or its removal) under the
//!   nodes that hold a replica, at a new sequence number
//! answer(node, held) ─▶ Answer
//!   held names the book's term and the sequence the node was last
//!   brought to: the assignments filed since (and removals, and the peer
//!   list if it changed); any other generation: everything
//! ```
//!
//! A node's generation is `term << 32 | sequence`: a new leader (a new
//! term) starts a new book, and a node holding another term's generation
//! gets everything. The book is the leader's soft state, like the health
//! view: rebuilt from the replicated state, never replicated itself.
//!
//! A heartbeat used to walk every tablet of the cell to find its node's
//! assignments and send all of them; with the book a heartbeat costs what
//! changed for its node, and the walk happens once per state change.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use stele_proto::pb;

use crate::orders::assignment;
use crate::state::{Admin, CellState, IntentRec, ReplicaRec, TabletRec};

/// Least time between two refreshes: a heartbeat in between answers from
/// the book as it is (at most this much behind), so a cell whose state
/// changes many times a second walks its tablets at most this often.
pub const REFRESH_MIN: Duration = Duration::from_millis(100);

/// Sequence numbers stay below this within a term (they are the low 32
/// bits of a generation).
const SEQ_LIMIT: u64 = 1 << 32;

pub struct Book {
    term: u64,
    /// The applied index of the state the book was last brought to.
    applied: Option<u64>,
    refreshed: Option<Instant>,
    /// The latest sequence number handed out.
    seq: u64,
    tablets: HashMap<u64, Filed>,
    peers: Vec<pb::PeerAddress>,
    peers_seq: u64,
    nodes: HashMap<u64, NodeBook>,
}

/// A tablet as the book last saw it, and the nodes holding a replica.
struct Filed {
    rec: TabletRec,
    intent: Option<IntentRec>,
    nodes: Vec<u64>,
}

/// One node's assignments, each with the sequence it last changed at.
#[derive(Default)]
struct NodeBook {
    /// The sequence at which this node's entry was created: a generation
    /// from before it cannot be answered with a delta.
    since: u64,
    held: BTreeMap<u64, (pb::Assignment, u64)>,
    /// Tablets no longer assigned here, with the sequence they left at;
    /// kept until the node holds a generation past that.
    removed: BTreeMap<u64, u64>,
}

/// What a heartbeat answer carries of assignments and peers.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub generation: u64,
    /// `assignments` and `removed` are what changed since the generation
    /// the node held; otherwise `assignments` is all of them.
    pub delta: bool,
    pub assignments: Vec<pb::Assignment>,
    pub removed: Vec<u64>,
    /// The peer list, when the node does not hold it already.
    pub peers: Option<Vec<pb::PeerAddress>>,
}

/// The nodes of a cell, as heartbeat answers list them.
pub fn peers_of(s: &CellState) -> Vec<pb::PeerAddress> {
    s.nodes
        .values()
        .filter(|n| n.admin != Admin::Decommissioned)
        .map(|n| pb::PeerAddress {
            node: n.id,
            peer_endpoint: n.peer_endpoint.clone(),
            client_endpoint: n.client_endpoint.clone(),
        })
        .collect()
}

/// Each replica of `t` with its node: voters and the voters leaving.
fn replicas(t: &TabletRec) -> impl Iterator<Item = ReplicaRec> + '_ {
    t.voters.iter().chain(t.leaving.iter()).copied()
}

impl Book {
    pub fn new(term: u64) -> Book {
        Book {
            term,
            applied: None,
            refreshed: None,
            seq: 0,
            tablets: HashMap::new(),
            peers: Vec::new(),
            peers_seq: 0,
            nodes: HashMap::new(),
        }
    }

    /// A new book for the same term as `old`, whose generations all come
    /// after `old`'s: a node holding one of those gets everything.
    pub fn after(old: &Book) -> Book {
        Book {
            seq: old.seq + 1,
            ..Book::new(old.term)
        }
    }

    /// The term the book was started in.
    pub fn term(&self) -> u64 {
        self.term
    }

    fn generation(&self, seq: u64) -> u64 {
        (self.term << 32) | seq
    }

    /// Brings the book to `s`, the state applied at index `applied`;
    /// nothing if it is there already or was brought up to date less than
    /// [`REFRESH_MIN`] before `now`.
    pub fn refresh(&mut self, s: &CellState, applied: u64, now: Instant) {
        if self.applied == Some(applied)
            || self
                .refreshed
                .is_some_and(|t| now.duration_since(t) < REFRESH_MIN)
        {
            return;
        }
        self.applied = Some(applied);
        self.refreshed = Some(now);
        // Every change of this refresh is filed at one new sequence.
        let seq = self.seq + 1;
        assert!(seq < SEQ_LIMIT, "heartbeat book sequence overflow");
        let mut changed = false;
        for t in s.tablets.values() {
            let intent = s.intents.get(&t.intent);
            let old = match self.tablets.get(&t.id) {
                Some(f) if f.rec == *t && f.intent.as_ref() == intent => continue,
                Some(f) => f.nodes.clone(),
                None => Vec::new(),
            };
            let mut nodes = Vec::new();
            for r in replicas(t) {
                // A node holds one replica of a tablet: the first listed.
                if nodes.contains(&r.node) {
                    continue;
                }
                nodes.push(r.node);
                let a = assignment(s, t, r, None);
                let nb = self.nodes.entry(r.node).or_insert_with(|| NodeBook {
                    since: seq,
                    ..Default::default()
                });
                if nb.held.get(&t.id).is_some_and(|(held, _)| *held == a) {
                    continue;
                }
                nb.held.insert(t.id, (a, seq));
                nb.removed.remove(&t.id);
                changed = true;
            }
            for n in old.iter().filter(|n| !nodes.contains(n)) {
                changed |= self.unfile(*n, t.id, seq);
            }
            self.tablets.insert(
                t.id,
                Filed {
                    rec: t.clone(),
                    intent: intent.cloned(),
                    nodes,
                },
            );
        }
        let gone: Vec<u64> = self
            .tablets
            .keys()
            .filter(|id| !s.tablets.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(f) = self.tablets.remove(&id) {
                for n in f.nodes {
                    changed |= self.unfile(n, id, seq);
                }
            }
        }
        let before = self.nodes.len();
        self.nodes.retain(|n, _| s.nodes.contains_key(n));
        changed |= self.nodes.len() != before;
        let peers = peers_of(s);
        if peers != self.peers {
            self.peers = peers;
            self.peers_seq = seq;
            changed = true;
        }
        if changed {
            self.seq = seq;
        }
    }

    /// Files the removal of `tablet` from `node` at `seq`; true if the
    /// node had it.
    fn unfile(&mut self, node: u64, tablet: u64, seq: u64) -> bool {
        let Some(nb) = self.nodes.get_mut(&node) else {
            return false;
        };
        if nb.held.remove(&tablet).is_none() {
            return false;
        }
        nb.removed.insert(tablet, seq);
        true
    }

    /// The answer to `node`, which holds generation `held` (0: none).
    pub fn answer(&mut self, node: u64, held: u64) -> Answer {
        let seq = self.seq;
        let generation = self.generation(seq);
        let nb = self.nodes.entry(node).or_insert_with(|| NodeBook {
            since: seq,
            ..Default::default()
        });
        let from = held & (SEQ_LIMIT - 1);
        let usable = held != 0 && held >> 32 == self.term && from >= nb.since && from <= seq;
        if !usable {
            return Answer {
                generation,
                delta: false,
                assignments: nb.held.values().map(|(a, _)| a.clone()).collect(),
                removed: Vec::new(),
                peers: Some(self.peers.clone()),
            };
        }
        // The node holds everything up to `from`: removals it has seen
        // need not be kept.
        nb.removed.retain(|_, at| *at > from);
        Answer {
            generation,
            delta: true,
            assignments: nb
                .held
                .values()
                .filter(|(_, at)| *at > from)
                .map(|(a, _)| a.clone())
                .collect(),
            removed: nb.removed.keys().copied().collect(),
            peers: (self.peers_seq > from).then(|| self.peers.clone()),
        }
    }

    /// Whether the book assigns replica `replica_id` to `node`.
    pub fn assigns(&self, node: u64, replica_id: u64) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|nb| nb.held.values().any(|(a, _)| a.replica_id == replica_id))
    }

    /// Assignments the book holds, over all nodes (for tests and status).
    pub fn filed(&self) -> usize {
        self.nodes.values().map(|n| n.held.len()).sum()
    }
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
