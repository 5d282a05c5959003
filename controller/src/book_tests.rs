//! The book against the full answer it replaces: a node that applies
//! every delta it receives holds exactly the assignments a full answer
//! would list, whatever answers were lost on the way.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use stele_proto::pb;

use super::*;
use crate::health::HealthView;
use crate::orders::assignments;
use crate::state::{CellConfig, Command, IntentKind, IntentState, NodeRec, Reply};

const TERM: u64 = 5;

fn node(id: u64) -> NodeRec {
    crate::state::test_node(id)
}

/// A cell of `nodes` nodes and `tablets` tablets, placed round the nodes.
fn cell(nodes: u64, tablets: u64) -> CellState {
    let mut s = CellState::new();
    s.apply(Command::Init(CellConfig {
        cell_id: "c".into(),
        replication: 3,
        tablets: tablets as u32,
    }));
    for id in 1..=nodes {
        s.apply(Command::Register(node(id)));
    }
    let list = (0..tablets)
        .map(|t| (t + 1, (0..3).map(|k| (t + k) % nodes + 1).collect()))
        .collect();
    assert_eq!(s.apply(Command::Place(list)), Reply::Ok);
    for t in 1..=tablets {
        s.apply(Command::Started { tablet: t });
    }
    s
}

/// What a node keeps: its assignments by tablet, its peers and the
/// generation it holds.
#[derive(Default, Debug)]
struct Held {
    generation: u64,
    assignments: BTreeMap<u64, pb::Assignment>,
    peers: Vec<pb::PeerAddress>,
}

impl Held {
    fn apply(&mut self, a: Answer) {
        if !a.delta {
            self.assignments.clear();
        }
        for t in a.removed {
            self.assignments.remove(&t);
        }
        for x in a.assignments {
            self.assignments.insert(x.tablet, x);
        }
        if let Some(p) = a.peers {
            self.peers = p;
        }
        self.generation = a.generation;
    }
}

/// Brings the book to `s` past the rate limit.
fn refresh(book: &mut Book, s: &CellState, applied: &mut u64, now: &mut Instant) {
    *applied += 1;
    *now += REFRESH_MIN;
    book.refresh(s, *applied, *now);
}

fn full(s: &CellState, node: u64) -> BTreeMap<u64, pb::Assignment> {
    assignments(s, &HealthView::default(), node)
        .into_iter()
        .map(|a| (a.tablet, a))
        .collect()
}

/// Starts the move of node 1's first tablet to a node without one, in a
/// cell of four nodes: (tablet, intent).
fn move_off_node_1(s: &mut CellState) -> (u64, u64) {
    let t = *full(s, 1).keys().next().unwrap();
    let to = (1..=4)
        .find(|n| s.tablets[&t].voters.iter().all(|r| r.node != *n))
        .unwrap();
    let Reply::Intent(intent) = s.apply(Command::StartMove {
        tablet: t,
        from: 1,
        to,
        reason: "test".into(),
        expect_generation: 0,
    }) else {
        panic!("no move");
    };
    (t, intent)
}

#[test]
fn a_node_gets_everything_once_then_only_what_changed() {
    let mut s = cell(4, 8);
    let (mut applied, mut now) = (0, Instant::now());
    let mut book = Book::new(TERM);
    refresh(&mut book, &s, &mut applied, &mut now);
    let mut n1 = Held::default();
    let first = book.answer(1, 0);
    assert!(!first.delta);
    assert_eq!(first.peers.as_ref().map(Vec::len), Some(4));
    n1.apply(first);
    assert_eq!(n1.assignments, full(&s, 1));
    // Nothing changed: an empty delta, no peers.
    let quiet = book.answer(1, n1.generation);
    assert!(quiet.delta);
    assert!(quiet.assignments.is_empty() && quiet.removed.is_empty() && quiet.peers.is_none());
    // A move of a tablet onto node 4, then its end: node 1 (a voter of
    // tablet 1) sees the voters change, then, moved away, the removal.
    let (t, intent) = move_off_node_1(&mut s);
    refresh(&mut book, &s, &mut applied, &mut now);
    let moving = book.answer(1, n1.generation);
    assert!(moving.delta);
    assert_eq!(
        moving
            .assignments
            .iter()
            .map(|a| a.tablet)
            .collect::<Vec<_>>(),
        vec![t]
    );
    n1.apply(moving);
    assert_eq!(n1.assignments, full(&s, 1));
    assert_eq!(s.apply(Command::FinishMove { intent }), Reply::Ok);
    refresh(&mut book, &s, &mut applied, &mut now);
    let gone = book.answer(1, n1.generation);
    assert_eq!((gone.removed.clone(), gone.assignments.len()), (vec![t], 0));
    n1.apply(gone);
    assert_eq!(n1.assignments, full(&s, 1));
    assert!(!n1.assignments.contains_key(&t));
}

#[test]
fn another_term_or_an_unknown_generation_gets_everything() {
    let s = cell(3, 4);
    let mut book = Book::new(TERM);
    book.refresh(&s, 1, Instant::now());
    let g = book.answer(2, 0).generation;
    assert!(book.answer(2, g).delta);
    for stale in [(TERM - 1) << 32 | (g & 0xffff_ffff), g + 1, 0] {
        let a = book.answer(2, stale);
        assert!(!a.delta, "generation {stale:#x}");
        assert_eq!(a.assignments.len(), 4);
        assert!(a.peers.is_some());
    }
    // A new leader's book: the old generation is from another term.
    let mut next = Book::new(TERM + 1);
    next.refresh(&s, 1, Instant::now());
    assert!(!next.answer(2, g).delta);
}

#[test]
fn peers_come_again_only_when_they_change() {
    let mut s = cell(3, 2);
    let (mut applied, mut now) = (0, Instant::now());
    let mut book = Book::new(TERM);
    refresh(&mut book, &s, &mut applied, &mut now);
    let mut held = Held::default();
    held.apply(book.answer(1, 0));
    s.apply(Command::Register(node(9)));
    refresh(&mut book, &s, &mut applied, &mut now);
    let a = book.answer(1, held.generation);
    assert!(a.delta && a.assignments.is_empty());
    assert_eq!(a.peers.map(|p| p.len()), Some(4));
}

#[test]
fn refreshes_wait_out_the_rate_limit() {
    let mut s = cell(3, 2);
    let t0 = Instant::now();
    let mut book = Book::new(TERM);
    book.refresh(&s, 1, t0);
    let g = book.answer(1, 0).generation;
    s.apply(Command::Register(node(4)));
    book.refresh(&s, 2, t0 + REFRESH_MIN / 2);
    assert!(book.answer(1, g).peers.is_none(), "refreshed too soon");
    book.refresh(&s, 2, t0 + REFRESH_MIN);
    assert!(
        book.answer(1, g).peers.is_some(),
        "not refreshed after the limit"
    );
}

#[derive(Debug, Clone)]
enum Op {
    /// Moves a voter of a tablet (by index) from a node (by index) away.
    Move(usize, usize, u64),
    /// Finishes or fails every open intent.
    Settle(bool),
    Split(usize),
    Register(u64),
    /// The state reaches the book, which answers a node; the answer is
    /// lost or not.
    Beat(u64, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..16usize, 0..3usize, 1..=6u64).prop_map(|(t, v, n)| Op::Move(t, v, n)),
        any::<bool>().prop_map(Op::Settle),
        (0..16usize).prop_map(Op::Split),
        (7..=9u64).prop_map(Op::Register),
        (1..=9u64, any::<bool>()).prop_map(|(n, lost)| Op::Beat(n, lost)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the changes and whichever answers are lost, a node that
    /// applies the answers it gets holds what a full answer lists.
    #[test]
    fn deltas_add_up_to_the_full_answer(ops in prop::collection::vec(op(), 1..60)) {
        let mut s = cell(6, 8);
        let (mut applied, mut now) = (0, Instant::now());
        let mut book = Book::new(TERM);
        let mut nodes: BTreeMap<u64, Held> = BTreeMap::new();
        let mut opened = 0;
        for op in ops {
            match op {
                Op::Move(t, v, to) => {
                    let ids: Vec<u64> = s.tablets.keys().copied().collect();
                    let t = ids[t % ids.len()];
                    let rec = &s.tablets[&t];
                    let from = rec.voters[v % rec.voters.len()].node;
                    if let Reply::Intent(_) = s.apply(Command::StartMove { tablet: t, from, to, reason: "p".into(), expect_generation: 0 }) {
                        opened += 1;
                    }
                }
                Op::Settle(finish) => {
                    let open: Vec<(u64, bool)> = s.intents.values()
                        .filter(|i| i.state == IntentState::Pending)
                        .map(|i| (i.id, matches!(i.kind, IntentKind::Move { .. })))
                        .collect();
                    for (intent, is_move) in open {
                        if finish && is_move {
                            s.apply(Command::FinishMove { intent });
                        } else if finish {
                            s.apply(Command::FinishSplit { intent });
                        } else {
                            s.apply(Command::FailIntent { intent, reason: "p".into() });
                        }
                    }
                }
                Op::Split(t) => {
                    let ids: Vec<u64> = s.tablets.keys().copied().collect();
                    let t = ids[t % ids.len()];
                    if let Reply::Intent(_) = s.apply(Command::StartSplit { tablet: t, at: 0, reason: "p".into(), expect_generation: 0 }) {
                        opened += 1;
                    }
                }
                Op::Register(n) => {
                    s.apply(Command::Register(node(n)));
                }
                Op::Beat(n, lost) => {
                    refresh(&mut book, &s, &mut applied, &mut now);
                    let held = nodes.entry(n).or_default();
                    let a = book.answer(n, held.generation);
                    if !lost {
                        held.apply(a);
                        prop_assert_eq!(&held.assignments, &full(&s, n), "node {}", n);
                        prop_assert_eq!(&held.peers, &peers_of(&s));
                    }
                }
            }
        }
        prop_assert!(book.filed() <= s.tablets.len() * 4);
        OPENED.fetch_add(opened, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Intents the property's cases opened: moves and splits must happen for
/// it to show anything.
static OPENED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn the_property_opens_moves_and_splits() {
    deltas_add_up_to_the_full_answer();
    assert!(OPENED.load(std::sync::atomic::Ordering::Relaxed) > 100);
}

#[test]
fn a_refresh_of_an_unchanged_state_changes_no_generation() {
    let s = cell(3, 3);
    let mut book = Book::new(TERM);
    book.refresh(&s, 1, Instant::now());
    let g = book.answer(3, 0).generation;
    book.refresh(&s, 2, Instant::now() + Duration::from_secs(1));
    assert_eq!(book.answer(3, g).generation, g);
}

/// The heartbeat handler withholds the retirement of a replica the book
/// still assigns (a refresh waiting out the rate limit): told to retire
/// it and still holding its assignment, the node would create it again.
#[test]
fn a_moved_replica_is_assigned_until_the_book_catches_up() {
    let mut s = cell(4, 2);
    let t0 = Instant::now();
    let mut book = Book::new(TERM);
    book.refresh(&s, 1, t0);
    let (t, intent) = move_off_node_1(&mut s);
    // Still held (leaving) until the move finishes.
    let old = s.replica_on(&s.tablets[&t], 1).unwrap();
    assert_eq!(s.apply(Command::FinishMove { intent }), Reply::Ok);
    assert!(s.retired[&1].contains(&old), "the moved replica retires");
    book.refresh(&s, 2, t0 + REFRESH_MIN / 2);
    assert!(book.assigns(1, old.replica_id), "the book caught up early");
    book.refresh(&s, 2, t0 + REFRESH_MIN);
    assert!(!book.assigns(1, old.replica_id));
    assert!(
        !book.assigns(9, old.replica_id),
        "a node the book never saw"
    );
}
