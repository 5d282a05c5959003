//! `stele node restart-safe N` as an operator runs it against a
//! controller-managed cell of real processes: it moves every leadership
//! off N and says when N leads nothing; it refuses, changing nothing, when
//! N is the only voter of a tablet, when another voter is already down,
//! and for a node the cell does not know.

use std::time::{Duration, Instant};

use stele_tests::controlled::{ControlledCell, voter_nodes};

/// Per tablet: its leader, open intent and last change, as `tablet list`
/// shows them; equal before and after a refused command.
fn topology(cell: &ControlledCell) -> Vec<(u64, serde_json::Value, serde_json::Value)> {
    cell.tablets()
        .iter()
        .map(|t| {
            (
                t["leader_node"].as_u64().unwrap(),
                t["intent"].clone(),
                t["last_change"].clone(),
            )
        })
        .collect()
}

fn leads(cell: &ControlledCell, node: u64) -> usize {
    cell.tablets()
        .iter()
        .filter(|t| t["leader_node"].as_u64() == Some(node))
        .count()
}

/// Runs `node restart-safe` and expects a refusal naming `want`, with
/// nothing changed in the cell.
fn assert_refused(cell: &ControlledCell, node: &str, want: &str) {
    let before = topology(cell);
    let (ok, out, err) = cell.cli(&["node", "restart-safe", node, "--wait", "--timeout", "5s"]);
    assert!(!ok, "restart-safe {node} was not refused: {out}{err}");
    assert!(err.contains(want), "restart-safe {node}: {err}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        topology(cell),
        before,
        "a refused restart-safe {node} changed the cell"
    );
}

#[test]
fn restart_safe_moves_leaders_off_and_refuses_without_a_quorum() {
    let mut cell = ControlledCell::new(1, 3);
    // Leaders are balanced every second, so a node left leading nothing
    // would get leaderships back at once but for restart-safe's hold.
    cell.controller_flags
        .extend(["--leader-balance-ms".into(), "1000".into()]);
    let (_controllers, mut nodes) = cell.start(4);
    // Node 1 must lead something for the hand-off to mean anything.
    if leads(&cell, 1) == 0 {
        let t = &cell.tablets()[0];
        assert!(voter_nodes(t).contains(&1));
        let id = t["id"].as_u64().unwrap().to_string();
        cell.json_retrying_busy(&["tablet", "transfer-leader", &id, "--to", "1", "--wait"]);
    }
    assert!(leads(&cell, 1) > 0);

    // Hostile: a node the cell does not know.
    assert_refused(&cell, "9", "unknown node 9");

    let started = Instant::now();
    let r: serde_json::Value =
        cell.json(&["node", "restart-safe", "1", "--wait", "--timeout", "30s"]);
    assert_eq!(r["safe"], true, "{r}");
    assert!(r["transfers"].as_u64().unwrap() > 0, "{r}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(leads(&cell, 1), 0, "{:?}", cell.tablets());
    let n1 = cell.node_list().into_iter().find(|n| n["id"] == 1).unwrap();
    assert_eq!(n1["leaders"], 0, "{n1}");
    // The hold: balancing gives node 1 nothing back while it restarts.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(leads(&cell, 1), 0, "balancing gave node 1 leaderships back");

    // Another voter goes down: restarting node 2 as well would leave every
    // tablet with one healthy voter of three.
    nodes.remove(&3).unwrap().kill9();
    let waited = Instant::now();
    loop {
        let n3 = cell.node_list().into_iter().find(|n| n["id"] == 3).unwrap();
        let led = cell
            .tablets()
            .iter()
            .all(|t| matches!(t["leader_node"].as_u64(), Some(1 | 2)));
        if n3["state"] != "up" && led {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "node 3 still up or tablets unled: {n3} {:?}",
            cell.tablets()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_refused(&cell, "2", "fewer than a majority (2); not up: node 3");
}

#[test]
fn restart_safe_refuses_the_only_voter() {
    let cell = ControlledCell::new(1, 1);
    let (_controllers, _nodes) = cell.start(2);
    assert_eq!(leads(&cell, 1), 2);
    assert_refused(&cell, "1", "node 1 is the only voter of tablet");
    assert_eq!(leads(&cell, 1), 2);
}
