//! Placement at full cell size: 400 nodes in 5 zones (racks of 20), 20,000
//! tablets at replication 3. Times each plan a few times and prints min and
//! median in milliseconds; run with
//! `cargo bench -p stele-controller --bench placement`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use stele_controller::placement::{Cluster, Move, NodeId, NodeInfo, NodeState, TabletInfo};

const ZONES: usize = 5;
const RACKS_PER_ZONE: usize = 4;
const NODES_PER_RACK: usize = 20;
const TABLETS: usize = 20_000;
const REPLICATION: usize = 3;
const RUNS: usize = 7;

fn cell() -> Vec<NodeInfo> {
    let mut nodes = Vec::new();
    for z in 0..ZONES {
        for r in 0..RACKS_PER_ZONE {
            for _ in 0..NODES_PER_RACK {
                let id = nodes.len() as NodeId + 1;
                nodes.push(NodeInfo::new(id, format!("z{z}"), format!("r{r}")));
            }
        }
    }
    nodes
}

fn apply(tablets: &mut [TabletInfo], moves: &[Move]) {
    for m in moves {
        // Tablet ids are 1.. in order, as built below.
        let t = &mut tablets[m.tablet as usize - 1];
        match m.from {
            Some(from) => {
                let i = t.voters.iter().position(|&v| v == from).unwrap();
                t.voters[i] = m.to;
            }
            None => t.voters.push(m.to),
        }
    }
}

/// Runs `f` `RUNS` times; returns (min, median) and the last result.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration, T) {
    let mut times = Vec::with_capacity(RUNS);
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let out = black_box(f());
        times.push(started.elapsed());
        last = Some(out);
    }
    times.sort();
    (times[0], times[RUNS / 2], last.unwrap())
}

fn row(what: &str, min: Duration, median: Duration, output: String) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{what:<44} {:>9.2} {:>9.2}  {output}", ms(min), ms(median));
}

fn main() {
    let mut nodes = cell();
    println!(
        "{} nodes in {ZONES} zones, {TABLETS} tablets, replication {REPLICATION}, {RUNS} runs each",
        nodes.len()
    );
    println!("{:<44} {:>9} {:>9}  output", "plan", "min ms", "median ms");

    let (min, median, sets) = time(|| {
        Cluster {
            nodes: &nodes,
            tablets: &[],
            replication: REPLICATION,
        }
        .place_new(TABLETS)
        .unwrap()
    });
    row(
        "place_new(20000)",
        min,
        median,
        format!("{} voter sets", sets.len()),
    );
    let mut tablets: Vec<TabletInfo> = sets
        .into_iter()
        .enumerate()
        .map(|(i, voters)| TabletInfo {
            leader: voters.iter().min().copied(),
            ..TabletInfo::new(i as u64 + 1, voters)
        })
        .collect();

    let (min, median, transfers) = time(|| {
        Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication: REPLICATION,
        }
        .leader_plan(0.10)
    });
    row(
        "leader_plan(0.10), lowest voter id leads",
        min,
        median,
        format!("{} transfers", transfers.len()),
    );

    let mut dead_cell = nodes.clone();
    for rack in 0..ZONES * RACKS_PER_ZONE {
        dead_cell[rack * NODES_PER_RACK + 6].state = NodeState::Dead;
    }
    let (min, median, moves) = time(|| {
        Cluster {
            nodes: &dead_cell,
            tablets: &tablets,
            replication: REPLICATION,
        }
        .repair_plan()
    });
    row(
        "repair_plan, 20 nodes dead",
        min,
        median,
        format!("{} moves", moves.len()),
    );

    // Back to the healthy cell, plus 20 empty nodes: a new rack in each zone.
    for z in 0..ZONES {
        for _ in 0..4 {
            let id = nodes.len() as NodeId + 1;
            nodes.push(NodeInfo::new(id, format!("z{z}"), "new"));
        }
    }
    let (min, median, moves) = time(|| {
        Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication: REPLICATION,
        }
        .balance_plan(0.05, 10_000)
    });
    row(
        "balance_plan(0.05, 10000), 20 nodes added",
        min,
        median,
        format!("{} moves", moves.len()),
    );
    apply(&mut tablets, &moves);
    let again = Cluster {
        nodes: &nodes,
        tablets: &tablets,
        replication: REPLICATION,
    }
    .balance_plan(0.05, 10_000);
    println!(
        "balance_plan after applying that plan: {} moves",
        again.len()
    );
}
