//! Delta heartbeats (docs/ARCHITECTURE.md, "Heartbeat deltas") in a cell
//! of real processes: three controllers, four nodes.
//!
//! - Before the cell's heartbeat format is 2, a delta report is refused,
//!   typed; after it, nodes report only what changed and answers carry
//!   only what changed, and moves still complete.
//! - The controller leader is killed: the new leader holds no node's
//!   reports, refuses their deltas, and each node sends its full reports
//!   at once; moves complete under it.
//! - A forged delta against a base the leader does not hold changes
//!   nothing it knows.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_tests::controlled::{ControlledCell, voter_nodes};
use stele_tests::{Proc, free_port_base, http_get, series};

fn leader_controller(cell: &ControlledCell) -> usize {
    let s: serde_json::Value = cell.json(&["cell", "status"]);
    s["leader_id"].as_u64().unwrap() as usize
}

/// A counter summed over the scrapes of `ports`.
fn total(ports: &[u16], name: &str) -> f64 {
    ports
        .iter()
        .filter_map(|p| series(&http_get(*p, "/metrics"), name))
        .sum()
}

/// Moves tablet `t` off its first voter to a node that holds none of it,
/// waiting for the move to finish (retrying while a leader-balance
/// transfer holds the tablet, as an operator would).
fn move_tablet(cell: &ControlledCell, t: u64, nodes: &[u64]) {
    let started = Instant::now();
    loop {
        let tablet = cell
            .tablets()
            .into_iter()
            .find(|x| x["id"] == t)
            .expect("the tablet");
        let voters = voter_nodes(&tablet);
        let to = nodes.iter().find(|n| !voters.contains(n)).unwrap();
        let (ok, out, err) = cell.cli(&[
            "tablet",
            "move",
            &t.to_string(),
            "--from",
            &voters[0].to_string(),
            "--to",
            &to.to_string(),
            "--wait",
        ]);
        if ok {
            let i: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(i["state"], "done", "{i}");
            return;
        }
        assert!(
            err.contains("in progress") && started.elapsed() < Duration::from_secs(30),
            "move refused: {err}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_carry_only_changes_and_a_new_leader_resyncs() {
    let http = free_port_base(7);
    let mut cell = ControlledCell::new(3, 4);
    cell.heartbeat_deltas = false;
    let base_flags = cell.controller_flags.clone();
    let mut controllers: HashMap<usize, Proc> = HashMap::new();
    for c in 1..=3 {
        cell.controller_flags = base_flags.clone();
        cell.controller_flags.extend([
            "--http-listen".into(),
            format!("127.0.0.1:{}", http + c as u16 - 1),
        ]);
        controllers.insert(c, cell.start_controller(c));
    }
    cell.controller_flags = base_flags;
    let node_ports: Vec<u16> = (1..=4).map(|n| http + 2 + n).collect();
    let _nodes: Vec<Proc> = (1..=4)
        .map(|n| {
            let listen = format!("127.0.0.1:{}", node_ports[n - 1]);
            cell.start_node_with(n, &["--http-listen", &listen])
        })
        .collect();
    let (ok, out, err) = stele_tests::run(&[
        "cell",
        "init",
        "--controllers",
        &cell.controllers_arg(),
        "--tablets",
        "6",
        "--replication",
        "3",
    ]);
    assert!(ok, "cell init: {out}{err}");
    cell.wait_settled(Duration::from_secs(60));
    let ids: Vec<u64> = cell
        .tablets()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    let leader = leader_controller(&cell);

    // Before the format: a delta report is not taken (answered as a
    // delta without its base, so the node resends in full at once, never
    // an error that would fail its every later heartbeat), and the
    // nodes' reports go in full.
    let as_node = stele_tests::tls::identity(&cell.dir.path().join("certs1"));
    let mut hb = pb::controller_client::ControllerClient::new(stele_tests::tls::channel(
        &cell.controller_endpoint(leader),
        &as_node,
        stele_tls::Kind::Controller,
    ));
    let node1 = cell.node_list().into_iter().find(|n| n["id"] == 1).unwrap();
    let forged = |base: u64, gone: Vec<u64>| pb::HeartbeatRequest {
        node: Some(pb::NodeRegistration {
            id: 1,
            client_endpoint: node1["client_endpoint"].as_str().unwrap().into(),
            peer_endpoint: node1["peer_endpoint"].as_str().unwrap().into(),
            zone: "z1".into(),
            capacity: 1,
            version: stele_proto::formats::binary_version().into(),
            formats: stele_proto::formats::supported_pb(),
            ..Default::default()
        }),
        report_seq: 1,
        report_base: base,
        gone,
        assignments_held: Some(0),
        ..Default::default()
    };
    let early = hb
        .heartbeat(forged(7, ids.clone()))
        .await
        .expect("a delta before the format is answered")
        .into_inner();
    let sync = early.sync.expect("a resync answer");
    assert_eq!(sync.reports_acked, 0, "a delta before the format was taken");
    assert!(early.assignments.is_empty());
    let ctl_port = |c: usize| http + c as u16 - 1;
    assert_eq!(
        total(&node_ports, "stele_node_heartbeat_delta_reports_total"),
        0.0
    );

    // The format on: reports become deltas, answers stay deltas.
    let (ok, out, err) = cell.cli(&["cell", "formats", "enable", "heartbeat", "2"]);
    assert!(ok, "{out}{err}");
    let on = Instant::now();
    while total(&node_ports, "stele_node_heartbeat_delta_reports_total") < 8.0 {
        assert!(
            on.elapsed() < Duration::from_secs(15),
            "no delta reports after the format went on"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let answers = |c: usize, kind: &str| {
        series(
            &http_get(ctl_port(c), "/metrics"),
            &format!("stele_controller_heartbeat_answers_total{{kind=\"{kind}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(answers(leader, "delta") > answers(leader, "full"));
    move_tablet(&cell, ids[0], &[1, 2, 3, 4]);
    cell.wait_settled(Duration::from_secs(30));

    // A forged delta against a base the leader does not hold, saying node
    // 1 holds nothing any more: refused whole, nothing taken.
    let led_by_1 = |cell: &ControlledCell| -> Vec<u64> {
        cell.tablets()
            .iter()
            .filter(|t| t["leader_node"] == 1)
            .map(|t| t["id"].as_u64().unwrap())
            .collect()
    };
    let before = led_by_1(&cell);
    let resyncs = series(
        &http_get(ctl_port(leader), "/metrics"),
        "stele_controller_heartbeat_resyncs_total",
    )
    .unwrap();
    let answer = hb
        .heartbeat(forged(7, ids.clone()))
        .await
        .expect("a delta is answered")
        .into_inner();
    let sync = answer.sync.expect("an answer to a delta heartbeat");
    assert_eq!(sync.reports_acked, 0, "a delta without its base was taken");
    assert!(answer.assignments.is_empty() && answer.peers.is_empty());
    assert_eq!(
        led_by_1(&cell),
        before,
        "the refused delta changed the leader's view"
    );
    let after = series(
        &http_get(ctl_port(leader), "/metrics"),
        "stele_controller_heartbeat_resyncs_total",
    )
    .unwrap();
    assert!(after > resyncs, "{resyncs} -> {after}");

    // The leader dies: the new one refuses the nodes' deltas once each,
    // takes their full reports, and moves go on.
    let resync_before = total(
        &node_ports,
        "stele_node_heartbeats_total{answer=\"resync\"}",
    );
    controllers.remove(&leader).unwrap().kill9();
    let killed = Instant::now();
    loop {
        let (ok, out, _) = cell.cli(&["cell", "status"]);
        if ok {
            let s: serde_json::Value = serde_json::from_str(&out).unwrap();
            if s["leader_id"] != 0 && s["leader_id"] != leader as u64 && s["nodes_up"] == 4 {
                break;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no new leader hearing every node"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // (`nodes_up` counts a new leader's grace too: wait for the resyncs.)
    loop {
        let resynced = total(
            &node_ports,
            "stele_node_heartbeats_total{answer=\"resync\"}",
        ) - resync_before;
        if resynced >= 4.0 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "every node resyncs with the new leader: {resynced}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    move_tablet(&cell, ids[1], &[1, 2, 3, 4]);
    cell.wait_settled(Duration::from_secs(30));
    let new_leader = leader_controller(&cell);
    assert!(answers(new_leader, "delta") > 0.0);
}
