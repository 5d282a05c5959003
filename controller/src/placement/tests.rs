//! Placement against simulated cells: a full-size one (400 nodes, 20,000
//! tablets) through placement, leader balancing and repair, small cells for
//! each rule and refusal, and random small cells for the invariants.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use proptest::prelude::*;

use super::*;

/// `zones × racks × per_rack` Up nodes of capacity 1, ids from 1, zone
/// `z{i}`, rack `r{j}`, numbered zone by zone and rack by rack.
fn cell(zones: usize, racks: usize, per_rack: usize) -> Vec<NodeInfo> {
    let mut nodes = Vec::new();
    for z in 0..zones {
        for r in 0..racks {
            for _ in 0..per_rack {
                let id = nodes.len() as NodeId + 1;
                nodes.push(NodeInfo::new(id, format!("z{z}"), format!("r{r}")));
            }
        }
    }
    nodes
}

fn set_state(nodes: &mut [NodeInfo], id: NodeId, state: NodeState) {
    nodes.iter_mut().find(|n| n.id == id).unwrap().state = state;
}

/// Tablets with ids from 1 over the given voter sets.
fn tablets_from(sets: Vec<Vec<NodeId>>) -> Vec<TabletInfo> {
    sets.into_iter()
        .enumerate()
        .map(|(i, voters)| TabletInfo::new(i as TabletId + 1, voters))
        .collect()
}

fn tablet(id: TabletId, voters: &[NodeId]) -> TabletInfo {
    TabletInfo::new(id, voters.to_vec())
}

/// Applies a plan as the scheduler would once every move completed: at most
/// one move per tablet, `from` a voter, `to` not.
fn apply_moves(tablets: &mut [TabletInfo], moves: &[Move]) {
    let at: HashMap<TabletId, usize> = tablets.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
    let mut seen = BTreeSet::new();
    for m in moves {
        assert!(
            seen.insert(m.tablet),
            "two moves for tablet {} in one plan",
            m.tablet
        );
        let t = &mut tablets[at[&m.tablet]];
        assert!(!t.voters.contains(&m.to), "{m:?} targets a voter of {t:?}");
        match m.from {
            Some(from) => {
                let i = t
                    .voters
                    .iter()
                    .position(|&v| v == from)
                    .expect("from is a voter");
                t.voters[i] = m.to;
                if t.leader == Some(from) {
                    t.leader = Some(m.to);
                }
            }
            None => t.voters.push(m.to),
        }
    }
}

fn apply_transfers(tablets: &mut [TabletInfo], transfers: &[Transfer]) {
    let at: HashMap<TabletId, usize> = tablets.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
    let mut seen = BTreeSet::new();
    for x in transfers {
        assert!(
            seen.insert(x.tablet),
            "two transfers for tablet {}",
            x.tablet
        );
        let t = &mut tablets[at[&x.tablet]];
        assert_eq!(
            t.leader,
            Some(x.from),
            "{x:?} is not from the leader of {t:?}"
        );
        assert!(t.voters.contains(&x.to), "{x:?} is not to a voter of {t:?}");
        t.leader = Some(x.to);
    }
}

/// Voters per node id.
fn replica_counts(tablets: &[TabletInfo]) -> HashMap<NodeId, u64> {
    let mut counts = HashMap::new();
    for t in tablets {
        for &v in &t.voters {
            *counts.entry(v).or_insert(0) += 1;
        }
    }
    counts
}

fn leader_counts(tablets: &[TabletInfo]) -> HashMap<NodeId, u64> {
    let mut counts = HashMap::new();
    for t in tablets {
        if let Some(l) = t.leader {
            *counts.entry(l).or_insert(0) += 1;
        }
    }
    counts
}

/// Asserts every Up node's count is within `tolerance` of the mean over Up
/// nodes (all of capacity 1), literally: `|count - mean| <= tolerance * mean`.
fn assert_within(nodes: &[NodeInfo], counts: &HashMap<NodeId, u64>, tolerance: f64, what: &str) {
    let up: Vec<&NodeInfo> = nodes.iter().filter(|n| n.state == NodeState::Up).collect();
    let total: u64 = up
        .iter()
        .map(|n| counts.get(&n.id).copied().unwrap_or(0))
        .sum();
    let mean = total as f64 / up.len() as f64;
    for n in up {
        let c = counts.get(&n.id).copied().unwrap_or(0) as f64;
        assert!(
            (c - mean).abs() <= tolerance * mean,
            "{what}: node {} has {c}, mean {mean:.2}, tolerance {tolerance}",
            n.id
        );
    }
}

/// Asserts every tablet has `replication` voters, all on Up nodes, no two
/// in one zone.
fn assert_well_placed(nodes: &[NodeInfo], tablets: &[TabletInfo], replication: usize) {
    let by_id: HashMap<NodeId, &NodeInfo> = nodes.iter().map(|n| (n.id, n)).collect();
    for t in tablets {
        assert_eq!(t.voters.len(), replication, "{t:?}");
        let zones: BTreeSet<&str> = t.voters.iter().map(|v| by_id[v].zone.as_str()).collect();
        assert_eq!(zones.len(), replication, "two voters in one zone: {t:?}");
        for v in &t.voters {
            assert_eq!(
                by_id[v].state,
                NodeState::Up,
                "voter {v} of {t:?} is not Up"
            );
        }
    }
}

#[test]
fn full_size_cell_places_balances_leaders_and_repairs() {
    let started = Instant::now();
    let mut nodes = cell(5, 4, 20);
    let sets = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    }
    .place_new(20_000)
    .unwrap();
    let mut tablets = tablets_from(sets);
    assert_eq!(tablets.len(), 20_000);
    assert_well_placed(&nodes, &tablets, 3);
    assert_within(
        &nodes,
        &replica_counts(&tablets),
        0.05,
        "replicas after place_new",
    );
    // Replica sets are scattered, not a few fixed groups: each node's ~300
    // peer slots go to well over 100 distinct nodes (random placement gives
    // about 195; ties broken by position gave at most 80).
    let mut peers: HashMap<NodeId, BTreeSet<NodeId>> = HashMap::new();
    for t in &tablets {
        for &a in &t.voters {
            peers
                .entry(a)
                .or_default()
                .extend(t.voters.iter().filter(|&&b| b != a));
        }
    }
    let fewest = peers.values().map(BTreeSet::len).min().unwrap();
    assert!(
        fewest > 150,
        "a node shares tablets with only {fewest} others"
    );

    // A deliberately skewed start: the lowest node id leads, so zone z0 leads
    // every tablet it holds.
    for t in &mut tablets {
        t.leader = t.voters.iter().min().copied();
    }
    let transfers = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .leader_plan(0.10);
    assert!(!transfers.is_empty());
    apply_transfers(&mut tablets, &transfers);
    assert_within(
        &nodes,
        &leader_counts(&tablets),
        0.10,
        "leaders after leader_plan",
    );

    // One node per rack dies: 20 nodes, 4 per zone.
    let dead: BTreeSet<NodeId> = (0..20).map(|rack| rack as NodeId * 20 + 7).collect();
    for &id in &dead {
        set_state(&mut nodes, id, NodeState::Dead);
    }
    let affected: BTreeSet<TabletId> = tablets
        .iter()
        .filter(|t| t.voters.iter().any(|v| dead.contains(v)))
        .map(|t| t.id)
        .collect();
    // 20 nodes of 150 voters: about 2,850 tablets lose one voter and about
    // 150 lose two, as with random placement. Those lost their majority:
    // no move could commit, so repair leaves them.
    assert!(
        affected.len() > 2_700,
        "{} tablets affected",
        affected.len()
    );
    let lost: BTreeSet<TabletId> = tablets
        .iter()
        .filter(|t| t.voters.iter().filter(|v| dead.contains(v)).count() >= 2)
        .map(|t| t.id)
        .collect();
    assert!(lost.len() > 50, "{} tablets lost two voters", lost.len());
    let mut rounds = 0;
    loop {
        let repair = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication: 3,
        }
        .repair();
        assert_eq!(
            repair
                .lost_majority
                .iter()
                .copied()
                .collect::<BTreeSet<_>>(),
            lost
        );
        let plan = repair.moves;
        if plan.is_empty() {
            break;
        }
        rounds += 1;
        assert!(rounds <= 3, "repair did not converge");
        for m in &plan {
            assert!(
                affected.contains(&m.tablet),
                "{m:?} touches an unaffected tablet"
            );
            assert!(
                dead.contains(&m.from.unwrap()),
                "{m:?} is not off a dead node"
            );
        }
        apply_moves(&mut tablets, &plan);
    }
    let (stuck, repaired): (Vec<TabletInfo>, Vec<TabletInfo>) =
        tablets.iter().cloned().partition(|t| lost.contains(&t.id));
    assert_well_placed(&nodes, &repaired, 3);
    assert_eq!(stuck.len(), lost.len());
    assert_within(
        &nodes,
        &replica_counts(&tablets),
        0.05,
        "replicas after repair",
    );
    // Debug build; the release figures are in benches/placement.rs.
    assert!(
        started.elapsed().as_secs() < 30,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn place_new_is_deterministic_and_counts_existing_load() {
    let nodes = cell(3, 1, 2);
    let existing = vec![tablet(1, &[1, 3, 5]), tablet(2, &[1, 3, 5])];
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &existing,
        replication: 3,
    };
    let mut sets = cluster.place_new(2).unwrap();
    assert_eq!(sets, cluster.place_new(2).unwrap());
    // Nodes 1, 3 and 5 already hold two voters each; the others catch up first.
    for set in &mut sets {
        set.sort();
    }
    assert_eq!(sets, vec![vec![2, 4, 6], vec![2, 4, 6]]);
}

#[test]
fn one_zone_dev_cell_falls_back_to_distinct_nodes() {
    let nodes = cell(1, 1, 3);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Node);
    for set in cluster.place_new(10).unwrap() {
        assert_eq!(
            set.iter().collect::<BTreeSet<_>>(),
            BTreeSet::from([&1, &2, &3])
        );
    }
}

#[test]
fn two_zones_fall_back_to_racks_but_span_both_zones() {
    // Two zones of two racks of two nodes.
    let nodes = cell(2, 2, 2);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Rack);
    let sets = cluster.place_new(40).unwrap();
    let by_id: HashMap<NodeId, &NodeInfo> = nodes.iter().map(|n| (n.id, n)).collect();
    for set in &sets {
        let racks: BTreeSet<(&str, &str)> = set
            .iter()
            .map(|v| (by_id[v].zone.as_str(), by_id[v].rack.as_str()))
            .collect();
        let zones: BTreeSet<&str> = set.iter().map(|v| by_id[v].zone.as_str()).collect();
        assert_eq!(racks.len(), 3, "{set:?}");
        assert_eq!(zones.len(), 2, "{set:?}");
    }
    let tablets = tablets_from(sets);
    assert_within(
        &nodes,
        &replica_counts(&tablets),
        0.0,
        "40 tablets on 8 nodes",
    );
}

#[test]
fn rack_names_are_scoped_to_their_zone() {
    // Both zones name their racks "r0" and "r1": that is four racks, not
    // two, so three voters can still be kept on distinct racks.
    let nodes = cell(2, 2, 1);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Rack);
    let cluster = Cluster {
        replication: 5,
        ..cluster
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Node);
}

#[test]
fn single_node_with_replication_one() {
    let nodes = cell(1, 1, 1);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 1,
    };
    assert_eq!(
        cluster.place_new(3).unwrap(),
        vec![vec![1], vec![1], vec![1]]
    );
    let tablets = vec![tablet(1, &[1])];
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 1,
    };
    assert!(cluster.repair_plan().is_empty());
    assert!(cluster.balance_plan(0.05, 10).is_empty());
}

#[test]
fn capacity_weights_the_share() {
    let mut nodes = cell(1, 1, 3);
    for (n, cap) in nodes.iter_mut().zip([1, 2, 3]) {
        n.capacity = cap;
    }
    let sets = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 1,
    }
    .place_new(600)
    .unwrap();
    let counts = replica_counts(&tablets_from(sets));
    assert_eq!((counts[&1], counts[&2], counts[&3]), (100, 200, 300));
}

#[test]
fn too_few_up_nodes_or_domains_are_typed_errors() {
    let mut nodes = cell(1, 1, 3);
    set_state(&mut nodes, 2, NodeState::Dead);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(
        cluster.place_new(1),
        Err(PlacementError::NotEnoughUpNodes { need: 3, have: 2 })
    );

    // Three zones, and z2's only nodes are down: the rule stays at zone level
    // (they are still members), so placement refuses instead of doubling up.
    let mut nodes = cell(3, 1, 2);
    set_state(&mut nodes, 5, NodeState::Dead);
    set_state(&mut nodes, 6, NodeState::Suspect);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Zone);
    assert_eq!(
        cluster.place_new(1),
        Err(PlacementError::NotEnoughDomains { need: 3, have: 2 })
    );

    // Once they are decommissioned the cell has two zones and falls back.
    set_state(&mut nodes, 5, NodeState::Decommissioned);
    set_state(&mut nodes, 6, NodeState::Decommissioned);
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    };
    assert_eq!(cluster.domain_level(), DomainLevel::Node);
    assert_eq!(cluster.place_new(1).unwrap().len(), 1);

    let cluster = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 0,
    };
    assert_eq!(
        cluster.place_new(1),
        Err(PlacementError::InvalidReplication { replication: 0 })
    );
}

#[test]
fn check_move_refusals() {
    // Zones z0: 1,2  z1: 3,4  z2: 5,6  z3: 7,8.
    let mut nodes = cell(4, 1, 2);
    set_state(&mut nodes, 8, NodeState::Dead);
    let mut tablets = vec![tablet(1, &[1, 3, 5]), tablet(2, &[2, 4, 6])];
    tablets[1].busy = true;
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    let check =
        |tablet: TabletId, from: NodeId, to: NodeId, expected: Result<(), PlacementError>| {
            assert_eq!(
                cluster.check_move(tablet, from, to),
                expected,
                "move {tablet}: {from} -> {to}"
            );
        };
    use PlacementError::*;
    check(1, 1, 7, Ok(()));
    check(1, 1, 2, Ok(()));
    check(9, 1, 7, Err(UnknownTablet { tablet: 9 }));
    check(1, 1, 99, Err(UnknownNode { node: 99 }));
    check(1, 2, 7, Err(NotAVoter { tablet: 1, node: 2 }));
    check(1, 1, 3, Err(AlreadyHolds { tablet: 1, node: 3 }));
    check(1, 1, 1, Err(AlreadyHolds { tablet: 1, node: 1 }));
    check(2, 2, 7, Err(TabletBusy { tablet: 2 }));
    check(
        1,
        1,
        8,
        Err(NodeNotUp {
            node: 8,
            state: NodeState::Dead,
        }),
    );
    check(
        1,
        1,
        4,
        Err(WouldBreakPlacement {
            tablet: 1,
            reason: "node 4 and voter 3 are both in zone \"z1\"".to_owned(),
        }),
    );
}

#[test]
fn errors_name_the_ids() {
    let cases = [
        (
            PlacementError::UnknownNode { node: 7 },
            "node 7 is not in the cell",
        ),
        (
            PlacementError::NodeNotUp {
                node: 7,
                state: NodeState::Draining,
            },
            "node 7 is Draining, not Up: it cannot receive a replica",
        ),
        (
            PlacementError::AlreadyHolds { tablet: 3, node: 7 },
            "tablet 3 already has a voter on node 7",
        ),
        (
            PlacementError::NotAVoter { tablet: 3, node: 7 },
            "node 7 is not a voter of tablet 3",
        ),
        (
            PlacementError::UnknownTablet { tablet: 3 },
            "tablet 3 is not in the cell",
        ),
        (
            PlacementError::NotEnoughUpNodes { need: 3, have: 2 },
            "replication 3 needs 3 Up nodes, the cell has 2",
        ),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
    assert!(
        PlacementError::TabletBusy { tablet: 3 }
            .to_string()
            .starts_with("tablet 3 ")
    );
}

#[test]
fn check_drain_refuses_the_last_up_node_of_one_of_three_zones() {
    // z0: 1,2  z1: 3,4  z2: 5,6, and 6 is already dead.
    let mut nodes = cell(3, 1, 2);
    set_state(&mut nodes, 6, NodeState::Dead);
    let tablets = vec![tablet(1, &[1, 3, 5]), tablet(2, &[2, 4, 5])];
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    assert_eq!(
        cluster.check_drain(5),
        Err(PlacementError::NotEnoughDomains { need: 3, have: 2 })
    );
    // Node 1 has a zone-mate, so it can go.
    assert_eq!(
        cluster.check_drain(1),
        Ok(vec![Move {
            tablet: 1,
            from: Some(1),
            to: 2
        }])
    );
    assert_eq!(
        cluster.check_drain(42),
        Err(PlacementError::UnknownNode { node: 42 })
    );
}

#[test]
fn check_drain_refuses_a_tablet_with_nowhere_to_go() {
    // Tablet 1 is over-replicated across all four zones; draining its voter
    // in z3 leaves three zones for new tablets, but this one needs a fifth.
    let nodes = cell(4, 1, 1);
    let tablets = vec![tablet(1, &[1, 2, 3, 4])];
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    match cluster.check_drain(4) {
        Err(PlacementError::WouldBreakPlacement { tablet: 1, reason }) => {
            assert!(reason.contains("draining node 4"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn check_drain_in_four_zones_returns_moves() {
    // One node per zone: draining node 4 empties z3 entirely, which is fine
    // with three zones left for replication 3.
    let nodes = cell(4, 1, 1);
    let mut tablets = tablets_from(
        Cluster {
            nodes: &nodes,
            tablets: &[],
            replication: 3,
        }
        .place_new(8)
        .unwrap(),
    );
    tablets[0].busy = true;
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    let holding: Vec<TabletId> = tablets
        .iter()
        .filter(|t| t.voters.contains(&4) && !t.busy)
        .map(|t| t.id)
        .collect();
    assert!(!holding.is_empty());
    let moves = cluster.check_drain(4).unwrap();
    assert_eq!(moves.iter().map(|m| m.tablet).collect::<Vec<_>>(), holding);
    for m in &moves {
        assert_eq!(m.from, Some(4));
        assert_eq!(cluster.check_move(m.tablet, 4, m.to), Ok(()), "{m:?}");
    }
    // What the drain implies is what repair does once the node is Draining.
    let mut draining = nodes.clone();
    set_state(&mut draining, 4, NodeState::Draining);
    let repair = Cluster {
        nodes: &draining,
        tablets: &tablets,
        replication: 3,
    }
    .repair_plan();
    assert_eq!(repair, moves);
    apply_moves(&mut tablets, &moves);
    tablets[0].busy = false;
    let rest = Cluster {
        nodes: &draining,
        tablets: &tablets,
        replication: 3,
    }
    .repair_plan();
    apply_moves(&mut tablets, &rest);
    assert!(tablets.iter().all(|t| !t.voters.contains(&4)));
}

#[test]
fn balance_moves_replicas_to_new_nodes_and_converges() {
    let mut nodes = cell(5, 4, 4);
    let sets = Cluster {
        nodes: &nodes,
        tablets: &[],
        replication: 3,
    }
    .place_new(2_000)
    .unwrap();
    let mut tablets = tablets_from(sets);
    // Leaders as a scheduler would have them, to see balance keep them.
    for t in &mut tablets {
        t.leader = Some(t.voters[0]);
    }
    // Twenty empty nodes arrive: a new rack of four in every zone.
    let mut added = BTreeSet::new();
    for z in 0..5 {
        for _ in 0..4 {
            let id = nodes.len() as NodeId + 1;
            nodes.push(NodeInfo::new(id, format!("z{z}"), "new"));
            added.insert(id);
        }
    }
    let first = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .balance_plan(0.05, 100);
    assert_eq!(first.len(), 100, "bounded by max_moves");
    assert!(
        first
            .iter()
            .all(|m| added.contains(&m.to) && !added.contains(&m.from.unwrap()))
    );
    let mut plans = 0;
    let mut plan = first;
    while !plan.is_empty() {
        plans += 1;
        assert!(plans <= 50, "balance did not converge");
        apply_moves(&mut tablets, &plan);
        assert_well_placed(&nodes, &tablets, 3);
        plan = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication: 3,
        }
        .balance_plan(0.05, 100);
    }
    assert_within(
        &nodes,
        &replica_counts(&tablets),
        0.05,
        "replicas after balancing",
    );
}

#[test]
fn balance_leaves_busy_and_unhealthy_tablets_alone() {
    // Two zones of one node each hold everything; z2 is empty.
    let mut nodes = cell(3, 1, 1);
    nodes.push(NodeInfo::new(4, "z0", "r1"));
    nodes.push(NodeInfo::new(5, "z1", "r1"));
    nodes.push(NodeInfo::new(6, "z2", "r1"));
    let mut tablets = vec![
        tablet(1, &[1, 2, 3]),
        tablet(2, &[1, 2, 3]),
        tablet(3, &[1, 2]),
    ];
    tablets[0].busy = true;
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    let plan = cluster.balance_plan(0.0, 10);
    assert!(plan.iter().all(|m| m.tablet == 2), "{plan:?}");
    assert!(!plan.is_empty());
}

#[test]
fn repair_leaves_tablets_that_lost_their_majority() {
    // cell(3, 1, 2): nodes 1-6, zone z0 = {1, 2}, z1 = {3, 4}, z2 = {5, 6}.
    let mut nodes = cell(3, 1, 2);
    set_state(&mut nodes, 3, NodeState::Dead);
    set_state(&mut nodes, 5, NodeState::Decommissioned);
    set_state(&mut nodes, 2, NodeState::Suspect);
    let tablets = vec![
        tablet(1, &[1, 3, 5]),    // two of three gone: lost
        tablet(2, &[1, 3, 6]),    // one gone: repaired
        tablet(3, &[2, 3, 6]),    // a suspect voter still counts as alive
        tablet(4, &[1, 3, 5, 6]), // two of four (mid-change): lost
        tablet(5, &[3]),          // its only voter: lost
        tablet(6, &[1, 99, 3]),   // 99 is not in the cell: gone, so lost
    ];
    let plan = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .repair();
    assert_eq!(plan.lost_majority, vec![1, 4, 5, 6]);
    let moved: Vec<TabletId> = plan.moves.iter().map(|m| m.tablet).collect();
    assert_eq!(moved, vec![2, 3], "{plan:?}");
    assert!(plan.moves.iter().all(|m| m.from == Some(3)), "{plan:?}");
}

#[test]
fn repair_adds_voters_to_under_replicated_tablets() {
    let nodes = cell(3, 1, 2);
    let tablets = vec![tablet(1, &[1, 3]), tablet(2, &[2]), tablet(3, &[1, 3, 5])];
    let plan = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .repair_plan();
    assert_eq!(plan.len(), 2, "{plan:?}");
    assert_eq!(plan[0].tablet, 1);
    assert_eq!(plan[0].from, None);
    assert!(
        [5, 6].contains(&plan[0].to),
        "{plan:?}: z2 is the only zone free"
    );
    assert_eq!(plan[1].tablet, 2);
    assert_eq!(plan[1].from, None);
    assert!(![1, 2].contains(&plan[1].to), "{plan:?}: not in z0");
}

#[test]
fn repair_prefers_dead_voters_skips_busy_and_reports_the_stranded() {
    // z0: 1,2  z1: 3,4  z2: 5,6  z3: 7
    let mut nodes = cell(3, 1, 2);
    nodes.push(NodeInfo::new(7, "z3", "r0"));
    set_state(&mut nodes, 1, NodeState::Draining);
    set_state(&mut nodes, 3, NodeState::Dead);
    set_state(&mut nodes, 4, NodeState::Dead);
    set_state(&mut nodes, 6, NodeState::Suspect);
    let mut tablets = vec![
        tablet(1, &[1, 3, 5]),  // Draining and Dead: the dead one goes first
        tablet(2, &[1, 3, 5]),  // busy
        tablet(3, &[2, 4, 5]),  // z1 has no Up node left, but z3 does
        tablet(4, &[2, 5, 99]), // 99 is not in the cell: treated as gone
        tablet(5, &[2, 5, 6]),  // Suspect voters stay
    ];
    tablets[1].busy = true;
    let cluster = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    };
    let plan = cluster.repair();
    assert_eq!(
        plan.moves,
        vec![
            Move {
                tablet: 1,
                from: Some(3),
                to: 7
            },
            Move {
                tablet: 3,
                from: Some(4),
                to: 7
            },
            Move {
                tablet: 4,
                from: Some(99),
                to: 7
            },
        ]
    );
    assert!(plan.unplaceable.is_empty());

    // With z3 gone too, those tablets are stranded rather than doubled up.
    let mut nodes = nodes.clone();
    set_state(&mut nodes, 7, NodeState::Dead);
    let plan = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .repair();
    assert!(plan.moves.is_empty(), "{plan:?}");
    let stranded: Vec<TabletId> = plan
        .unplaceable
        .iter()
        .map(|e| match e {
            PlacementError::WouldBreakPlacement { tablet, .. } => *tablet,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(stranded, vec![1, 3, 4]);
    assert_eq!(
        plan.unplaceable[0].to_string(),
        "tablet 1: no Up node can replace voter 3 in a zone that voters [1, 5] do not already use"
    );
}

#[test]
fn leader_plan_moves_leaders_off_draining_nodes_and_only_to_up_voters() {
    let mut nodes = cell(3, 1, 1);
    set_state(&mut nodes, 1, NodeState::Draining);
    set_state(&mut nodes, 2, NodeState::Suspect);
    let mut tablets = vec![
        tablet(1, &[1, 2, 3]),
        tablet(2, &[1, 2, 3]),
        tablet(3, &[1, 2, 3]),
    ];
    for t in &mut tablets {
        t.leader = Some(1);
    }
    tablets[2].busy = true;
    let plan = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .leader_plan(0.10);
    assert_eq!(
        plan,
        vec![
            Transfer {
                tablet: 1,
                from: 1,
                to: 3
            },
            Transfer {
                tablet: 2,
                from: 1,
                to: 3
            }
        ]
    );
}

#[test]
fn leader_plan_evens_out_and_skips_leaderless_tablets() {
    let nodes = cell(3, 1, 1);
    let mut tablets: Vec<TabletInfo> = (1..=9).map(|i| tablet(i, &[1, 2, 3])).collect();
    for t in &mut tablets[..8] {
        t.leader = Some(1);
    }
    let plan = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: 3,
    }
    .leader_plan(0.0);
    assert!(plan.iter().all(|x| x.tablet != 9));
    apply_transfers(&mut tablets, &plan);
    let counts = leader_counts(&tablets);
    let mut per_node: Vec<u64> = (1..=3)
        .map(|n| counts.get(&n).copied().unwrap_or(0))
        .collect();
    per_node.sort();
    assert_eq!(per_node, vec![2, 3, 3]);
}

#[test]
fn band_is_the_tolerance_widened_to_whole_numbers() {
    assert_eq!(band(60_000, 400, 1, 0.05), (143, 157));
    assert_eq!(band(60_000, 420, 1, 0.05), (136, 150));
    assert_eq!(band(5, 2, 1, 0.05), (2, 3));
    assert_eq!(band(6, 6, 2, 0.0), (2, 2));
    assert_eq!(band(0, 0, 1, f64::NAN), (0, 0));
}

/// A small random cell: up to 10 nodes in up to 4 zones of up to 3 racks,
/// random states and capacities; up to 15 tablets whose voters may repeat
/// zones, be too few or too many, or name nodes that are not in the cell.
fn small_cell() -> impl Strategy<Value = (Vec<NodeInfo>, Vec<TabletInfo>, usize)> {
    let node = (0..4u8, 0..3u8, 0..6u8, 0..4u32);
    let tablet_parts = (
        proptest::collection::vec(1..13u64, 0..5),
        any::<bool>(),
        0..4usize,
    );
    (
        proptest::collection::vec(node, 1..11),
        proptest::collection::vec(tablet_parts, 0..16),
        1..4usize,
    )
        .prop_map(|(nodes, tablets, replication)| {
            let states = [
                NodeState::Up,
                NodeState::Suspect,
                NodeState::Dead,
                NodeState::Draining,
                NodeState::Decommissioned,
            ];
            let nodes = nodes
                .into_iter()
                .enumerate()
                .map(|(i, (zone, rack, state, capacity))| NodeInfo {
                    // Up twice as often as any other state.
                    state: states[usize::from(state).saturating_sub(1)],
                    capacity,
                    ..NodeInfo::new(i as NodeId + 1, format!("z{zone}"), format!("r{rack}"))
                })
                .collect();
            let tablets = tablets
                .into_iter()
                .enumerate()
                .map(|(i, (mut voters, busy, leader))| {
                    voters.sort();
                    voters.dedup();
                    TabletInfo {
                        leader: voters.get(leader).copied(),
                        busy,
                        ..tablet(i as TabletId + 1, &voters)
                    }
                })
                .collect();
            (nodes, tablets, replication)
        })
}

proptest! {
    // Cheap cases, and some invariants (a balance move onto a tablet whose
    // voters already share a zone) need a few hundred to come up.
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn plans_keep_the_invariants((nodes, tablets, replication) in small_cell()) {
        let cluster = Cluster { nodes: &nodes, tablets: &tablets, replication };
        let by_id: HashMap<NodeId, &NodeInfo> = nodes.iter().map(|n| (n.id, n)).collect();
        let tablet = |id: TabletId| tablets.iter().find(|t| t.id == id).unwrap();

        match cluster.place_new(5) {
            Ok(sets) => {
                prop_assert_eq!(sets.len(), 5);
                for set in sets {
                    prop_assert_eq!(set.len(), replication);
                    if cluster.domain_level() == DomainLevel::Zone {
                        let zones: BTreeSet<&str> = set.iter().map(|v| by_id[v].zone.as_str()).collect();
                        prop_assert_eq!(zones.len(), replication, "two voters in one zone: {:?}", set);
                    }
                    prop_assert_eq!(set.iter().collect::<BTreeSet<_>>().len(), replication, "two voters on one node: {:?}", set);
                    for v in &set {
                        prop_assert_eq!(by_id[v].state, NodeState::Up, "voter {} of {:?} not Up", v, set);
                    }
                }
            }
            Err(e) => prop_assert!(
                matches!(e, PlacementError::NotEnoughUpNodes { .. } | PlacementError::NotEnoughDomains { .. }),
                "{e:?}"
            ),
        }

        let gone = |v: NodeId| {
            by_id.get(&v).is_none_or(|n| matches!(n.state, NodeState::Dead | NodeState::Decommissioned))
        };
        let repair = cluster.repair();
        for id in &repair.lost_majority {
            prop_assert!(majority_lost(&tablet(*id).voters, gone), "{:?} kept its majority", tablet(*id));
        }
        let mut moved = BTreeSet::new();
        for m in repair.moves {
            let t = tablet(m.tablet);
            prop_assert!(!majority_lost(&t.voters, gone), "{:?} moves a tablet without a majority", m);
            prop_assert!(!t.voters.contains(&m.to), "{:?} targets a node holding {:?}", m, t);
            prop_assert!(moved.insert(m.tablet), "two moves for {}", m.tablet);
            prop_assert!(!t.busy);
            prop_assert_eq!(by_id[&m.to].state, NodeState::Up);
            if let Some(from) = m.from {
                prop_assert_eq!(cluster.check_move(m.tablet, from, m.to), Ok(()), "{:?}", m);
            }
        }

        let mut moved = BTreeSet::new();
        for m in cluster.balance_plan(0.05, 20) {
            prop_assert!(moved.insert(m.tablet), "two moves for {}", m.tablet);
            prop_assert_eq!(cluster.check_move(m.tablet, m.from.unwrap(), m.to), Ok(()), "{:?}", m);
        }

        let mut moved = BTreeSet::new();
        for x in cluster.leader_plan(0.10) {
            let t = tablet(x.tablet);
            prop_assert!(moved.insert(x.tablet), "two transfers for {}", x.tablet);
            prop_assert!(!t.busy);
            prop_assert_eq!(t.leader, Some(x.from));
            prop_assert!(t.voters.contains(&x.to));
            prop_assert_eq!(by_id[&x.to].state, NodeState::Up);
        }

        for n in &nodes {
            if let Ok(moves) = cluster.check_drain(n.id) {
                for m in moves {
                    prop_assert_eq!(m.from, Some(n.id));
                    prop_assert!(!tablet(m.tablet).voters.contains(&m.to), "{:?}", m);
                    prop_assert_eq!(by_id[&m.to].state, NodeState::Up);
                }
            }
        }
    }
}
