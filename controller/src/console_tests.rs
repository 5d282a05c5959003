//! The console's view, built from states made by hand: hostile cases
//! first (no cell, no leader, no samples, a follower), then what the page
//! highlights (dead nodes, under-replicated and unplaced tablets, intents).

use std::time::{Duration, Instant};

use stele_proto::pb;

use super::*;
use crate::health::ReportUpdate;
use crate::load::{SLOT, SLOTS_MAX};
use crate::state::{CellConfig, Command, NodeRec, Reply};

const LEASE: Duration = Duration::from_secs(10);

fn node(id: u64) -> NodeRec {
    crate::state::test_node(id)
}

fn leader() -> Answerer {
    Answerer {
        controller_id: 1,
        leading: true,
        leader: Some((1, "http://c1".into())),
    }
}

/// A cell of `nodes` nodes and tablets placed as given, every node seen
/// at `t0`, each tablet's first voter leading.
fn cell(nodes: u64, placement: &[&[u64]], t0: Instant) -> (CellState, HealthView) {
    let mut s = CellState::new();
    s.apply(Command::Init(CellConfig {
        cell_id: "c".into(),
        replication: 3,
        tablets: placement.len().max(1) as u32,
    }));
    for id in 1..=nodes {
        s.apply(Command::Register(node(id)));
    }
    let list: Vec<(u64, Vec<u64>)> = placement
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u64 + 1, n.to_vec()))
        .collect();
    assert_eq!(s.apply(Command::Place(list)), Reply::Ok);
    let mut h = HealthView {
        leading: Some((1, t0)),
        ..Default::default()
    };
    beat_all(&s, &mut h, t0, &[]);
    (s, h)
}

/// Every node but `silent` heartbeats at `now` with its replicas.
fn beat_all(s: &CellState, h: &mut HealthView, now: Instant, silent: &[u64]) {
    for id in s.nodes.keys().filter(|id| !silent.contains(id)) {
        let reports = s
            .tablets
            .values()
            .filter_map(|t| {
                let r = s.replica_on(t, *id)?;
                Some(pb::ReplicaReport {
                    tablet: t.id,
                    replica_id: r.replica_id,
                    leader: t.voters.first() == Some(&r),
                    term: 1,
                    voters: t.voters.iter().map(|v| v.replica_id).collect(),
                    range_generation: t.range_generation,
                    segment_bytes: 4096 * t.id,
                    records_applied: 10 * t.id,
                    ..Default::default()
                })
            })
            .collect();
        h.heartbeat(
            *id,
            ReportUpdate::full(reports),
            now,
            Duration::from_secs(60),
        );
    }
}

#[test]
fn an_uninitialized_cell_is_an_empty_view() {
    let v = view(
        &CellState::new(),
        &HealthView::default(),
        &leader(),
        LEASE,
        Instant::now(),
    );
    assert!(!v.initialized);
    assert!(v.nodes.is_empty() && v.tablets.is_empty() && v.intents.is_empty());
    assert_eq!(v.summary, Summary::default());
    assert_eq!(v.lease_ms, 10_000);
    // It serializes (the page reads it as JSON).
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["role"], "controller");
}

#[test]
fn a_healthy_cell_shows_every_node_and_tablet() {
    let t0 = Instant::now();
    let (s, h) = cell(3, &[&[1, 2, 3], &[2, 3, 1]], t0);
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(1));
    assert_eq!(v.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(v.nodes.iter().all(|n| n.state == "up"), "{:?}", v.nodes);
    assert_eq!(v.nodes[0].zone, "z1");
    assert_eq!(v.nodes[0].heartbeat_age_ms, Some(1000));
    assert_eq!(v.tablets.len(), 2);
    let t2 = &v.tablets[1];
    assert_eq!(t2.voters, [2, 3, 1]);
    assert_eq!(t2.leader, Some(2));
    assert_eq!((t2.segment_bytes, t2.records_applied), (8192, 20));
    assert!(v.tablets.iter().all(|t| t.health == "ok"));
    assert_eq!((v.summary.nodes_up, v.summary.nodes_total), (3, 3));
    assert_eq!(v.nodes[1].leaders, 1);
    assert_eq!(v.nodes[1].replicas, 2);
}

#[test]
fn a_silent_node_turns_suspect_then_dead_and_its_tablets_under_replicated() {
    let t0 = Instant::now();
    let (s, mut h) = cell(4, &[&[1, 2, 3], &[2, 4, 1]], t0);
    beat_all(&s, &mut h, t0 + Duration::from_secs(6), &[3]);
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(6));
    assert_eq!(v.nodes[2].state, "suspect", "silent past half the lease");
    assert_eq!(v.tablets[0].health, "under-replicated");
    assert_eq!(v.tablets[1].health, "ok");
    beat_all(&s, &mut h, t0 + Duration::from_secs(11), &[3]);
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(11));
    assert_eq!(v.nodes[2].state, "dead", "silent past the lease");
    assert_eq!(v.summary.under_replicated, 1);
    assert_eq!(v.summary.nodes_up, 3);
}

#[test]
fn a_tablet_with_most_voters_on_dead_nodes_lost_its_majority() {
    let t0 = Instant::now();
    let (s, mut h) = cell(5, &[&[1, 2, 3], &[2, 4, 5], &[1, 4, 5]], t0);
    // Suspect nodes still count as alive.
    beat_all(&s, &mut h, t0 + Duration::from_secs(6), &[2, 3]);
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(6));
    assert_eq!(v.tablets[0].health, "under-replicated");
    assert_eq!(v.summary.lost_majority, 0);
    beat_all(&s, &mut h, t0 + Duration::from_secs(11), &[2, 3]);
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(11));
    let health: Vec<&str> = v.tablets.iter().map(|t| t.health).collect();
    assert_eq!(health, ["lost-majority", "under-replicated", "ok"]);
    assert_eq!(v.summary.lost_majority, 1);
    assert_eq!(v.summary.under_replicated, 1, "counted once, as lost");
}

#[test]
fn a_tablet_without_voters_is_unplaced_and_without_a_leader_has_none() {
    let t0 = Instant::now();
    let (mut s, _) = cell(3, &[&[1, 2, 3]], t0);
    let mut t = s.tablets[&1].clone();
    t.id = 2;
    t.voters.clear();
    s.tablets.insert(2, t);
    // No heartbeat at all: no leader, no age, no size, no samples.
    let h = HealthView {
        leading: Some((1, t0)),
        ..Default::default()
    };
    let v = view(&s, &h, &leader(), LEASE, t0);
    assert_eq!(v.tablets[1].health, "unplaced");
    assert_eq!(v.summary.unplaced, 1);
    assert!(
        v.tablets
            .iter()
            .all(|t| t.leader.is_none() && t.segment_bytes == 0)
    );
    assert!(
        v.nodes
            .iter()
            .all(|n| n.heartbeat_age_ms.is_none() && n.load.is_empty())
    );
    assert!(v.nodes.iter().all(|n| n.state == "suspect"), "never seen");
}

#[test]
fn a_follower_says_it_does_not_lead_and_claims_no_health() {
    let t0 = Instant::now();
    let (s, h) = cell(3, &[&[1, 2, 3]], t0);
    let who = Answerer {
        controller_id: 2,
        leading: false,
        leader: Some((1, "http://c1".into())),
    };
    let v = view(&s, &h, &who, LEASE, t0);
    assert!(!v.leading);
    assert_eq!((v.leader_id, v.leader_endpoint.as_str()), (1, "http://c1"));
    assert!(v.nodes.iter().all(|n| n.state == "unknown"));
    assert!(
        v.tablets
            .iter()
            .all(|t| t.health == "unknown" && t.leader.is_none())
    );
    assert_eq!(v.summary.under_replicated, 0);
}

#[test]
fn node_load_becomes_chart_points_bounded_by_the_ring() {
    let t0 = Instant::now();
    let (s, mut h) = cell(3, &[&[1, 2, 3]], t0);
    let load = pb::NodeLoad {
        window_ms: 1000,
        appends: 50,
        append_records: 500,
        reads: 7,
        append_p99_us: 2500,
    };
    for i in 0..(2 * SLOTS_MAX as u32) {
        h.record_load(1, &load, t0 + SLOT * i);
    }
    let now = t0 + SLOT * (2 * SLOTS_MAX as u32);
    let v = view(&s, &h, &leader(), LEASE, now);
    let points = &v.nodes[0].load;
    assert_eq!(points.len(), SLOTS_MAX);
    let last = points.last().unwrap();
    assert_eq!(last.appends_per_s, 50.0);
    assert_eq!(last.records_per_s, 500.0);
    assert_eq!(last.append_p99_ms, 2.5);
    assert_eq!(last.age_s, SLOT.as_secs_f64());
    assert!(
        points.windows(2).all(|w| w[0].age_s > w[1].age_s),
        "oldest first"
    );
    assert!(v.nodes[1].load.is_empty(), "a node with no samples");
    // A node removed from the state loses its ring at the next pass.
    let mut s2 = s.clone();
    s2.nodes.remove(&1);
    h.observe(&s2, 1, now, LEASE);
    assert!(!h.node_loads.contains_key(&1));
}

#[test]
fn a_split_shows_as_an_open_intent_then_a_finished_one() {
    let t0 = Instant::now();
    let (mut s, mut h) = cell(3, &[&[1, 2, 3]], t0);
    let Reply::Intent(id) = s.apply(Command::StartSplit {
        tablet: 1,
        at: 0,
        reason: "operator".into(),
        expect_generation: 0,
    }) else {
        panic!("no split intent")
    };
    h.note(crate::health::Note::IntentsSeen {
        pending: vec![id],
        now: t0,
    });
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(2));
    assert_eq!(v.intents.len(), 1);
    let i = &v.intents[0];
    assert_eq!(
        (i.kind, i.state, i.open, i.tablet),
        ("split", "pending", true, 1)
    );
    assert!(i.progress.starts_with("step 1/3"), "{}", i.progress);
    assert_eq!(i.age_s, Some(2.0));
    assert!(i.what.contains("into tablet"), "{}", i.what);
    assert_eq!(v.summary.intents_open, 1);
    assert_eq!(v.tablets[0].intent, id);
    s.apply(Command::FinishSplit { intent: id });
    let v = view(&s, &h, &leader(), LEASE, t0 + Duration::from_secs(3));
    let i = &v.intents[0];
    assert_eq!((i.state, i.open, i.age_s), ("done", false, None));
    assert_eq!(v.tablets.len(), 2, "the child is a tablet of its own");
    assert_eq!(v.summary.intents_open, 0);
}

#[test]
fn finished_intents_shown_are_bounded() {
    let t0 = Instant::now();
    let (mut s, h) = cell(3, &[&[1, 2, 3]], t0);
    for _ in 0..(FINISHED_SHOWN + 5) {
        let tablet = *s.tablets.keys().next_back().unwrap();
        let Reply::Intent(id) = s.apply(Command::StartSplit {
            tablet,
            at: 0,
            reason: "operator".into(),
            expect_generation: 0,
        }) else {
            panic!("no split intent")
        };
        s.apply(Command::FinishSplit { intent: id });
    }
    let v = view(&s, &h, &leader(), LEASE, t0);
    assert_eq!(v.intents.len(), FINISHED_SHOWN);
    assert!(
        v.intents.windows(2).all(|w| w[0].id > w[1].id),
        "newest first"
    );
}
