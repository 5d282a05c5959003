//! A controller-managed cell of real processes: three controllers and five
//! storage nodes on loopback, clients routing by the controllers' route
//! map while writing throughout.
//!
//! - SIGKILL a storage node: once its lease and the repair grace pass,
//!   every tablet it held has three live voters again; nothing
//!   acknowledged is lost.
//! - SIGKILL the controller leader: writes go on; topology operations
//!   resume under the new leader.
//! - Operator commands under load: move, transfer-leader, drain; bad
//!   input refused with a reason and nothing changed.

use std::time::{Duration, Instant};

use stele_client::Client;
use stele_proto::pb;
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer, voter_nodes};

fn leader_controller(cell: &ControlledCell) -> usize {
    let s: serde_json::Value = cell.json(&["cell", "status"]);
    s["leader_id"].as_u64().unwrap() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_node_is_repaired_and_lost_controller_stops_no_writes() {
    let cell = ControlledCell::new(3, 5);
    let (mut controllers, mut nodes) = cell.start(6);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "ctl/repair", 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Kill the node holding the most replicas.
    let victim = cell
        .node_list()
        .iter()
        .max_by_key(|n| n["replicas"].as_u64().unwrap())
        .map(|n| n["id"].as_u64().unwrap() as usize)
        .unwrap();
    let held: Vec<u64> = cell
        .tablets()
        .iter()
        .filter(|t| voter_nodes(t).contains(&(victim as u64)))
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert!(!held.is_empty());
    nodes.remove(&victim).unwrap().kill9();
    let killed = Instant::now();
    // Lease 3 s + grace 1 s, then at most 30 s to repair.
    let bound = Duration::from_secs(3 + 1 + 30);
    loop {
        let tablets = cell.tablets();
        let repaired = held.iter().all(|id| {
            let t = tablets.iter().find(|t| t["id"] == *id).unwrap();
            let voters = voter_nodes(t);
            voters.len() == 3
                && !voters.contains(&(victim as u64))
                && t["replicas"].as_array().unwrap().len() == 3
                && t["intent"] == 0
        });
        if repaired {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "tablets {held:?} not repaired after {bound:?}: {tablets:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let repair_took = killed.elapsed();
    eprintln!("repair of {} tablets took {repair_took:?}", held.len());
    let dead: Vec<serde_json::Value> = cell.node_list();
    let v = dead.iter().find(|n| n["id"] == victim as u64).unwrap();
    assert_eq!(v["state"], "dead");
    assert_eq!(v["replicas"], 0);

    // Kill the controller leader: writes continue meanwhile.
    let leader = leader_controller(&cell);
    let before = writer.acked_count();
    controllers.remove(&leader).unwrap().kill9();
    // Reads go on too, straight to the tablets' leaders.
    let read_at = Instant::now();
    let rows = client
        .scan_all(
            "ctl/repair",
            0,
            0,
            b"",
            stele_client::ReadOptions::default(),
        )
        .await
        .expect("read without the controller leader");
    assert!(
        rows.len() >= before,
        "{} rows, {before} acknowledged",
        rows.len()
    );
    let left = Duration::from_secs(3).saturating_sub(read_at.elapsed());
    tokio::time::sleep(left).await;
    let during = writer.acked_count();
    assert!(
        during > before + 50,
        "writes stalled without the controller leader: {before} -> {during}"
    );
    // Topology operations resume under the new leader.
    let new_leader = leader_controller(&cell);
    assert_ne!(new_leader, leader);
    // The new leader hears from every live node within a few heartbeats.
    let up_at = Instant::now();
    loop {
        let s: serde_json::Value = cell.json(&["cell", "status"]);
        if s["nodes_up"] == 4 {
            break;
        }
        assert!(
            up_at.elapsed() < Duration::from_secs(20),
            "nodes not up: {s}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // (A leader-balance transfer may hold a tablet busy for a moment; an
    // operator retries, so does the test.)
    let retry_at = Instant::now();
    let (t, i) = loop {
        let t = cell.tablets()[0].clone();
        let id = t["id"].as_u64().unwrap();
        let voters = voter_nodes(&t);
        let to = (1..=5u64)
            .find(|n| *n != victim as u64 && !voters.contains(n))
            .unwrap();
        let (ok, out, err) = cell.cli(&[
            "tablet",
            "move",
            &id.to_string(),
            "--from",
            &voters[0].to_string(),
            "--to",
            &to.to_string(),
            "--wait",
        ]);
        if ok {
            break (t, serde_json::from_str::<serde_json::Value>(&out).unwrap());
        }
        assert!(
            err.contains("in progress") && retry_at.elapsed() < Duration::from_secs(20),
            "move refused: {err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(i["state"], "done", "{i}");
    assert!(i["generation"].as_u64().unwrap() > t["generation"].as_u64().unwrap());
    cell.wait_settled(Duration::from_secs(30));
    // The killed controller comes back from its redb log and catches up.
    let _back = cell.start_controller(leader);
    let back_at = Instant::now();
    loop {
        let want: serde_json::Value = cell.json(&["cell", "status"]);
        let ep = cell.controller_endpoint(leader);
        let (ok, out, _) =
            stele_tests::run(&["cell", "status", "--local", "--controllers", &ep, "--json"]);
        if ok {
            let s: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(s["controller_id"], leader as u64, "{s}");
            if s["route_generation"] == want["route_generation"] && s["leader_id"] != 0 {
                break;
            }
        }
        assert!(
            back_at.elapsed() < Duration::from_secs(20),
            "restarted controller {leader} did not catch up: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let acked = writer.stop_and_check(&client).await;
    assert!(acked > 200, "only {acked} appends acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_under_load_and_bad_input_refused() {
    let mut cell = ControlledCell::new(1, 5);
    // Three zones; z2 and z3 hold two nodes each, z1 one.
    cell.zones = ["z1", "z2", "z3", "z3", "z2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Keep a killed node's replicas in place, and leaders where the
    // operator puts them, for this test.
    cell.controller_flags = vec![
        "--lease-ms".into(),
        "3000".into(),
        "--repair-grace-ms".into(),
        "600000".into(),
        "--leader-balance-ms".into(),
        "0".into(),
    ];
    let (_controllers, mut nodes) = cell.start(4);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "ctl/ops", 2).await;

    // A move under load of the writers' own tablet, from its leader's node
    // when the zone rule allows: the generation moves, the group elects a
    // leader elsewhere, and the client follows by itself.
    let (ns_lo, _) = stele_proto::vshard::namespace_range("ctl/ops");
    let t = cell
        .tablets()
        .into_iter()
        .find(|t| {
            t["vshard_lo"].as_u64().unwrap() <= u64::from(ns_lo)
                && u64::from(ns_lo) < t["vshard_hi"].as_u64().unwrap()
        })
        .unwrap();
    let id = t["id"].as_u64().unwrap().to_string();
    let voters = voter_nodes(&t);
    let zone_of = |n: u64| cell.zones[n as usize - 1].clone();
    let leader = t["leader_node"].as_u64().unwrap();
    // Same zone as the target, so the zone rule holds; the leader first.
    let mut froms = voters.clone();
    froms.sort_by_key(|v| *v != leader);
    let (from, to) = froms
        .iter()
        .find_map(|f| {
            (1..=5u64)
                .find(|n| !voters.contains(n) && zone_of(*n) == zone_of(*f))
                .map(|to| (*f, to))
        })
        .expect("a same-zone target");
    eprintln!("moving tablet {id} from node {from} (leader {leader}) to node {to}");
    let acked_before = writer.acked_count();
    cell.move_tablet(id.parse().unwrap(), from, to);
    let moved: serde_json::Value = cell.json(&["tablet", "show", &id]);
    assert!(moved["generation"].as_u64() > t["generation"].as_u64());
    assert!(voter_nodes(&moved).contains(&to));
    assert!(!voter_nodes(&moved).contains(&from));
    // The writers go on, through whichever node leads now.
    let after_move = writer.acked_count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        writer.acked_count() > after_move + 20,
        "writes stalled after the move ({acked_before} before, {after_move} at its end)"
    );
    if from == leader {
        let route = client
            .routes()
            .get(t["id"].as_u64().unwrap())
            .cloned()
            .unwrap();
        assert_ne!(
            route.leader_node, from,
            "the client still routes to the removed replica"
        );
    }

    // Leadership transfer.
    let other = voter_nodes(&moved)
        .into_iter()
        .find(|n| Some(*n) != moved["leader_node"].as_u64())
        .unwrap();
    let i: serde_json::Value = cell.json_retrying_busy(&[
        "tablet",
        "transfer-leader",
        &id,
        "--to",
        &other.to_string(),
        "--wait",
    ]);
    assert_eq!(i["state"], "done", "{i}");
    let shown: serde_json::Value = cell.json(&["tablet", "show", &id]);
    assert_eq!(shown["leader_node"].as_u64(), Some(other));

    // Bad input: refused with a reason, nothing changed. A node dies
    // first: one that some tablet has no voter on (placement and the move
    // above decide which; every tablet holds one node of z2 and one of z3).
    let placed = cell.tablets();
    let dead = [5u64, 2, 4, 3]
        .into_iter()
        .find(|n| placed.iter().any(|t| !voter_nodes(t).contains(n)))
        .expect("a node some tablet has no voter on");
    let dead_id = dead.to_string();
    nodes.remove(&(dead as usize)).unwrap().kill9();
    let dead_at = Instant::now();
    while !cell
        .node_list()
        .iter()
        .any(|n| n["id"] == dead && n["state"] == "dead")
    {
        assert!(
            dead_at.elapsed() < Duration::from_secs(20),
            "node {dead} not dead"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = cell.tablets();
    // A tablet without a voter on the dead node.
    let t = before
        .iter()
        .find(|t| !voter_nodes(t).contains(&dead))
        .expect("a tablet without the dead node");
    let id = t["id"].as_u64().unwrap().to_string();
    let voters = voter_nodes(t);
    let holder = voters[1].to_string();
    let from = voters[0].to_string();
    let non_voter = (1..=5u64)
        .find(|n| !voters.contains(n) && *n != dead)
        .unwrap()
        .to_string();
    let stale = (t["generation"].as_u64().unwrap() - 1).to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["tablet", "move", &id, "--from", &from, "--to", "99"],
            "not in the cell",
        ),
        (
            vec!["tablet", "move", &id, "--from", &from, "--to", &dead_id],
            "not Up",
        ),
        (
            vec!["tablet", "move", &id, "--from", &from, "--to", &holder],
            "already has a voter",
        ),
        (
            vec!["tablet", "move", &id, "--from", &non_voter, "--to", &holder],
            "not a voter",
        ),
        (
            vec![
                "tablet",
                "move",
                &id,
                "--from",
                &from,
                "--to",
                &non_voter,
                "--expect-generation",
                &stale,
            ],
            "generation",
        ),
        (
            vec!["tablet", "move", "999", "--from", "1", "--to", "2"],
            "999",
        ),
        (vec!["node", "drain", "1"], "distinct failure domains"),
        (vec!["node", "drain", "77"], "not in the cell"),
        (
            vec!["tablet", "transfer-leader", &id, "--to", &dead_id],
            "not an up node",
        ),
    ];
    for (args, reason) in &cases {
        let (ok, out, err) = cell.cli(args);
        assert!(!ok, "{args:?} accepted: {out}");
        assert!(
            err.contains(reason),
            "{args:?}: refusal does not say {reason:?}: {err}"
        );
    }
    // Leaders may move on their own (a node died); the placement may not.
    let shape = |ts: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        ts.into_iter()
            .map(|mut t| {
                t["leader_node"] = serde_json::Value::Null;
                t
            })
            .collect()
    };
    // Hostile calls on the controller's own ports: a heartbeat that lies
    // about its id or leaves out its endpoints, garbage on the quorum's
    // Raft port, a re-init with another shape, an unknown node state.
    let ep = cell.controller_endpoint(1);
    // As node 1 (a heartbeat needs a node's certificate): its lies about
    // the registration are refused by the controller's own checks.
    let as_node = stele_tests::tls::identity(&cell.dir.path().join("certs1"));
    let mut hb = pb::controller_client::ControllerClient::new(stele_tests::tls::channel(
        &ep,
        &as_node,
        stele_tls::Kind::Controller,
    ));
    let mut ctl = pb::controller_client::ControllerClient::new(stele_tests::tls::channel(
        &ep,
        &stele_tests::tls::client_tls(),
        stele_tls::Kind::Controller,
    ));
    let reg = |id: u64, client: &str| pb::HeartbeatRequest {
        node: Some(pb::NodeRegistration {
            id,
            client_endpoint: client.into(),
            peer_endpoint: "127.0.0.1:1".into(),
            ..Default::default()
        }),
        replicas: Vec::new(),
        token_epoch: None,
        load: None,
        ..Default::default()
    };
    for (req, why) in [
        (pb::HeartbeatRequest::default(), "missing registration"),
        (reg(0, "http://x"), "node id 0"),
        (reg(1 << 16, "http://x"), "node id past 65535"),
        (reg(1, ""), "no client endpoint"),
    ] {
        let err = hb.heartbeat(req).await.expect_err(why);
        assert!(
            matches!(
                stele_proto::Error::from_status(&err),
                stele_proto::Error::InvalidArgument { .. }
            ),
            "{why}: {err:?}"
        );
    }
    // As a controller (the quorum takes Raft only from members).
    let as_member = stele_tests::tls::identity(&cell.dir.path().join("certs-ctl1"));
    let mut quorum = pb::quorum_client::QuorumClient::new(stele_tests::tls::channel(
        &ep,
        &as_member,
        stele_tls::Kind::Controller,
    ));
    for body in [vec![], vec![0xff; 64], b"\xa2av\x01cmsg\x00".to_vec()] {
        let reply = quorum
            .raft(pb::RaftMessage { body })
            .await
            .expect("a malformed Raft message is answered, not dropped")
            .into_inner();
        assert!(!reply.body.is_empty());
    }
    let reinit = ctl
        .init(pb::InitRequest {
            controllers: vec![pb::ControllerPeer {
                id: 1,
                endpoint: cell.controller_endpoint(1),
            }],
            tablets: 9,
            replication: 3,
            cell_id: "cell".into(),
        })
        .await
        .expect_err("a second init with another shape");
    assert!(reinit.message().contains("exists already"), "{reinit:?}");
    let bad_state = ctl
        .set_node_state(pb::SetNodeStateRequest {
            node: 1,
            state: "asleep".into(),
        })
        .await
        .expect_err("unknown node state");
    assert!(bad_state.message().contains("asleep"), "{bad_state:?}");
    let nodes: Vec<serde_json::Value> = cell.node_list();
    assert_eq!(
        nodes.len(),
        5,
        "a refused heartbeat registered a node: {nodes:?}"
    );
    assert_eq!(
        shape(cell.tablets()),
        shape(before.clone()),
        "a refused command changed the cell"
    );

    // Drain a node under load: every replica and leadership leaves it.
    // The dead node is within its grace, so its replicas stay: drain a
    // node of the other two-node zone (z2 = {2, 5}, z3 = {3, 4}), whose
    // partner is up to take its replicas.
    let drained: u64 = if dead == 3 || dead == 4 { 2 } else { 3 };
    let (ok, out, err) = cell.cli(&["node", "drain", &drained.to_string(), "--wait"]);
    assert!(ok, "drain: {out}{err}");
    let n = cell
        .node_list()
        .into_iter()
        .find(|n| n["id"] == drained)
        .unwrap();
    assert_eq!(n["replicas"], 0, "{n}");
    assert_eq!(n["leaders"], 0, "{n}");
    assert_eq!(n["state"], "draining");
    let acked = writer.stop_and_check(&client).await;
    assert!(acked > 100, "only {acked} appends acknowledged");
}

/// Runs an operator command for people (no `--json`): (ok, stdout, stderr).
fn for_people(cell: &ControlledCell, args: &[&str]) -> (bool, String, String) {
    let ctl = cell.controllers_arg();
    let mut a = args.to_vec();
    a.extend(["--controllers", &ctl]);
    stele_tests::run(&a)
}

/// The operator CLI for people (docs/OPERATIONS.md "The command line"):
/// `node list` is a table (a header, a rule, aligned columns); a
/// decommissioned node is gone from it (still there with `--all`);
/// `--wait --timeout` that runs out exits nonzero naming what it waited
/// for and how far it got, while the split goes on in the cell; a wait
/// into a pipe shows plain lines, not a redrawn bar.
#[test]
fn cli_tables_decommissioned_nodes_and_wait_timeouts() {
    let cell = ControlledCell::new(1, 4);
    let (_controllers, _nodes) = cell.start(1);

    let (ok, out, err) = for_people(&cell, &["node", "list"]);
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 + 4, "a header, a rule, four nodes:\n{out}");
    assert!(
        lines[0]
            .split_whitespace()
            .take(3)
            .eq(["node", "state", "zone"]),
        "{out}"
    );
    assert!(lines[1].chars().all(|c| c == '-'), "{out}");
    let state_at = lines[0].find("state").unwrap();
    for l in &lines[2..] {
        assert!(l.get(state_at..).unwrap_or("").starts_with("up "), "{out}");
    }

    // Decommission the node without a replica (one tablet, three voters).
    let empty = cell
        .node_list()
        .into_iter()
        .find(|n| n["replicas"] == 0)
        .expect("a node without a replica");
    let empty = empty["id"].as_u64().unwrap();
    let n: serde_json::Value = cell.json(&[
        "node",
        "decommission",
        &empty.to_string(),
        "--wait",
        "--timeout",
        "30s",
    ]);
    assert_eq!(n["state"], "decommissioned", "{n}");
    let listed = cell.node_list();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(!listed.iter().any(|n| n["id"] == empty), "{listed:?}");
    let all: Vec<serde_json::Value> = cell.json(&["node", "list", "--all"]);
    assert!(
        all.iter()
            .any(|n| n["id"] == empty && n["state"] == "decommissioned"),
        "{all:?}"
    );
    let (ok, out, _) = for_people(&cell, &["node", "list"]);
    assert!(ok && !out.contains("decommissioned"), "{out}");
    let (ok, out, _) = for_people(&cell, &["node", "list", "--all"]);
    assert!(ok && out.contains("decommissioned"), "{out}");

    // A split cannot finish in a millisecond: the wait gives up, the split
    // does not. (A leader-balance transfer may hold the tablet: retry.)
    let id = cell.tablets()[0]["id"].as_u64().unwrap().to_string();
    let started = Instant::now();
    let err = loop {
        let (ok, out, err) = for_people(
            &cell,
            &["tablet", "split", &id, "--wait", "--timeout", "1ms"],
        );
        assert!(!ok, "a split finished within 1ms: {out}");
        if !err.contains("in progress") {
            break err;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{err}");
        std::thread::sleep(Duration::from_millis(300));
    };
    for want in [
        "gave up waiting for intent",
        "split",
        "(--timeout 1ms)",
        "still ",
        "goes on in the cell",
    ] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    let intent = err
        .split("waiting for intent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the intent's id")
        .to_string();
    let (ok, out, err) = for_people(
        &cell,
        &["intent", "show", &intent, "--wait", "--timeout", "60s"],
    );
    assert!(ok && out.contains("done"), "{out}{err}");
    assert!(!err.contains('\r'), "a redrawn bar in a pipe: {err:?}");
    assert_eq!(
        cell.tablets().len(),
        2,
        "the split went on after the timeout"
    );
}
