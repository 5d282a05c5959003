//! The restart plan as cases: a cell, its health, the node to restart;
//! and the refusal or the transfers.

use std::collections::{BTreeSet, HashMap};

use stele_proto::pb;

use super::*;
use crate::state::CellConfig;

/// A cell of nodes `1..=nodes` with tablets placed as given (replication
/// 3, or fewer voters where a placement names fewer).
fn cell(nodes: u64, placement: &[&[u64]]) -> CellState {
    let mut s = CellState::new();
    s.apply(Command::Init(CellConfig {
        cell_id: "c".into(),
        replication: 3,
        tablets: placement.len() as u32,
    }));
    for id in 1..=nodes {
        s.apply(Command::Register(crate::state::test_node(id)));
    }
    let list = placement
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u64 + 1, n.to_vec()))
        .collect();
    assert_eq!(s.apply(Command::Place(list)), Reply::Ok);
    s
}

/// Nodes as placement sees them: `down` ones suspect, the rest up.
fn nodes(s: &CellState, down: &[u64]) -> Vec<NodeInfo> {
    s.nodes
        .keys()
        .map(|&id| {
            let mut n = NodeInfo::new(id, format!("z{id}"), "");
            if down.contains(&id) {
                n.state = NodeState::Suspect;
            }
            n
        })
        .collect()
}

/// Every voter reports every tablet it holds, at `applied(node)`; tablet
/// `t` is led by the node `leaders[t - 1]`.
fn reports(
    s: &CellState,
    leaders: &[u64],
    applied: impl Fn(u64) -> u64,
) -> (HashMap<u64, Reports>, HashMap<u64, pb::ReplicaReport>) {
    let mut by_node: HashMap<u64, Reports> = HashMap::new();
    let mut led = HashMap::new();
    for t in s.tablets.values() {
        for r in &t.voters {
            let report = pb::ReplicaReport {
                tablet: t.id,
                replica_id: r.replica_id,
                leader: leaders[t.id as usize - 1] == r.node,
                applied_index: applied(r.node),
                ..Default::default()
            };
            if report.leader {
                led.insert(t.id, report.clone());
            }
            by_node.entry(r.node).or_default().insert(t.id, report);
        }
    }
    (by_node, led)
}

fn none() -> BTreeSet<u64> {
    BTreeSet::new()
}

#[test]
fn leaders_move_to_the_most_caught_up_healthy_voter() {
    let s = cell(4, &[&[1, 2, 3], &[1, 3, 4], &[2, 3, 4], &[1, 2, 4]]);
    // Node 1 leads tablets 1, 2 and 4; node 3 is behind node 2 and 4.
    let (reps, leaders) = reports(&s, &[1, 1, 2, 1], |n| if n == 3 { 5 } else { 9 });
    let got = plan(&s, &nodes(&s, &[]), &reps, &leaders, &none(), 1).unwrap();
    assert_eq!(
        got,
        RestartPlan {
            leading: vec![1, 2, 4],
            transfers: vec![(1, 2), (2, 4), (4, 2)],
            waiting: vec![],
        }
    );
    // Node 2 is being restarted too: node 3 takes tablet 1 although
    // behind, node 4 takes tablet 4; a tablet with no other choice still
    // goes to node 2.
    let held = BTreeSet::from([2]);
    let got = plan(&s, &nodes(&s, &[]), &reps, &leaders, &held, 1).unwrap();
    assert_eq!(got.transfers, vec![(1, 3), (2, 4), (4, 4)]);
    let five = cell(5, &[&[1, 2, 3, 4, 5]]);
    let (mut reps5, leaders5) = reports(&five, &[1], |_| 1);
    for n in [3, 4, 5] {
        reps5.remove(&n);
    }
    let got = plan(&five, &nodes(&five, &[]), &reps5, &leaders5, &held, 1).unwrap();
    assert_eq!(got.transfers, vec![(1, 2)]);
    // A node that leads nothing needs nothing.
    let got = plan(&s, &nodes(&s, &[]), &reps, &leaders, &none(), 3).unwrap();
    assert_eq!(got, RestartPlan::default());
}

#[test]
fn a_busy_tablet_or_one_without_a_reported_voter_waits() {
    let mut s = cell(3, &[&[1, 2, 3], &[1, 2, 3]]);
    s.tablets.get_mut(&1).unwrap().intent = 42;
    let (mut reps, leaders) = reports(&s, &[1, 1], |_| 3);
    // Nodes 2 and 3 have not reported tablet 2 yet.
    for n in [2, 3] {
        reps.get_mut(&n).unwrap().remove(&2);
    }
    let got = plan(&s, &nodes(&s, &[]), &reps, &leaders, &none(), 1).unwrap();
    assert_eq!(got.leading, [1, 2]);
    assert!(got.transfers.is_empty(), "{got:?}");
    assert!(got.waiting[0].contains("busy with intent 42"), "{got:?}");
    assert!(got.waiting[1].contains("no healthy voter"), "{got:?}");
}

#[test]
fn refusals() {
    let three = cell(3, &[&[1, 2, 3], &[1, 2, 3]]);
    let five = cell(5, &[&[1, 2, 3, 4, 5]]);
    let single = cell(2, &[&[1], &[2]]);
    let two = cell(2, &[&[1, 2]]);
    let check = |name: &str, s: &CellState, down: &[u64], node: u64, want: Option<&str>| {
        let (reps, leaders) = reports(s, &vec![node; s.tablets.len()], |_| 1);
        let got = plan(s, &nodes(s, down), &reps, &leaders, &none(), node);
        match (want, got) {
            (None, Ok(_)) => {}
            (Some(w), Err(e)) => assert!(e.contains(w), "{name}: {e}"),
            (w, got) => panic!("{name}: want {w:?}, got {got:?}"),
        }
    };
    check("all up", &three, &[], 1, None);
    check(
        "another voter down",
        &three,
        &[3],
        1,
        Some("1 of its 3 voters healthy, fewer than a majority (2); not up: node 3"),
    );
    check("the down node itself", &three, &[3], 3, None);
    check("five voters, one other down", &five, &[5], 1, None);
    check(
        "five voters, two others down",
        &five,
        &[4, 5],
        1,
        Some("2 of its 5 voters healthy"),
    );
    check(
        "sole voter",
        &single,
        &[],
        2,
        Some("node 2 is the only voter of tablet 2"),
    );
    check(
        "two voters: the other is not enough",
        &two,
        &[],
        2,
        Some("1 of its 2 voters healthy, fewer than a majority (2)"),
    );
    check("unknown node", &three, &[], 9, Some("unknown node 9"));
    check("node zero", &three, &[], 0, Some("unknown node 0"));
}
