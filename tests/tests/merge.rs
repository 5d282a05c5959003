//! Online tablet merge in a controller-managed cell of real processes.
//!
//! - Split twice, then merge back twice under continuous appends, one merge
//!   with the surviving tablet's leader SIGKILLed right after the intent:
//!   every acknowledged record is readable exactly once by `Scan` and by
//!   `ScanKey`, on every node, and the client follows the routes itself.
//! - Exactly-once across a merge: batches whose responses were dropped,
//!   one in each tablet, are retried after the merges and applied once.
//! - Co-location: in a four-node cell, tablets on different node sets
//!   merge after the controller moved the absorbed tablet's replicas.
//! - Bad input: a merge of a tablet with itself, of tablets that are not
//!   adjacent, of an unknown tablet, or of a tablet mid-move is refused
//!   with a reason and nothing changes; a dry run changes nothing.

use std::time::{Duration, Instant};

use stele_client::{Client, ReadOptions};
use stele_proto::vshard::{namespace_range, vshard};
use stele_tests::cell::{client_options, try_local_rows, value_counts};
use stele_tests::controlled::{ControlledCell, Writer, voter_nodes};

const NS: &str = "merge/ns";

/// The tablet (id, lo, hi) holding `v`.
fn tablet_at(cell: &ControlledCell, v: u32) -> (u64, u32, u64) {
    cell.tablets()
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["vshard_lo"].as_u64().unwrap() as u32,
                t["vshard_hi"].as_u64().unwrap(),
            )
        })
        .find(|(_, lo, hi)| v >= *lo && u64::from(v) < *hi)
        .unwrap()
}

fn split(cell: &ControlledCell, id: u64, at: u32) {
    let (id, at) = (id.to_string(), at.to_string());
    let i = cell.json_retrying_busy(&["tablet", "split", &id, "--at", &at, "--wait"]);
    assert_eq!(i["state"], "done", "{i}");
}

/// `stele tablet merge A B --wait`, retried while a tablet is busy.
fn merge(cell: &ControlledCell, a: u64, b: u64) -> serde_json::Value {
    let (a, b) = (a.to_string(), b.to_string());
    let i = cell.json_retrying_busy(&["tablet", "merge", &a, &b, "--wait"]);
    assert_eq!(i["state"], "done", "{i}");
    i
}

/// Polls an intent until it is done or failed.
async fn wait_intent(cell: &ControlledCell, id: u64, limit: Duration) -> serde_json::Value {
    let started = Instant::now();
    let id = id.to_string();
    let mut phase = String::new();
    loop {
        let i: serde_json::Value = cell.json(&["intent", "show", &id]);
        if i["state"].as_str() != Some(phase.as_str()) {
            phase = i["state"].as_str().unwrap_or_default().to_string();
            eprintln!("intent {id}: {phase} at {:?}", started.elapsed());
        }
        if i["done"] == true {
            return i;
        }
        assert!(started.elapsed() < limit, "intent stuck: {i}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every node's own replicas hold exactly `want` (each value once).
async fn converged(cell: &ControlledCell, nodes: impl IntoIterator<Item = usize>, all: usize) {
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let rows = client
        .scan_all(NS, 0, 0, b"", ReadOptions::default())
        .await
        .unwrap();
    let want = value_counts(&rows);
    assert!(want.values().all(|n| *n == 1), "a value twice");
    assert!(rows.len() >= all, "{} rows, {all} acknowledged", rows.len());
    for node in nodes {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = try_local_rows(&cell.node_endpoint(node), NS).await;
            if let Ok(rows) = &got
                && value_counts(rows) == want
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} never converged: {} rows (want {}): {:?}",
                got.as_ref().map_or(0, |r| r.len()),
                rows.len(),
                got.err()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_under_writes_with_a_leader_killed_lose_and_double_nothing() {
    let cell = ControlledCell::new(1, 3);
    let (_controllers, mut nodes) = cell.start(1);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let (ns_lo, _) = namespace_range(NS);
    let (q1, q2) = (ns_lo + 0x4000, ns_lo + 0x8000);
    let writer = Writer::start(client.clone(), NS, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Three tablets inside the namespace: [.., q1), [q1, q2), [q2, ..).
    let (t1, _, _) = tablet_at(&cell, q1);
    split(&cell, t1, q1);
    let (t2, _, _) = tablet_at(&cell, q2);
    split(&cell, t2, q2);
    let (left, middle, right) = (
        tablet_at(&cell, ns_lo).0,
        tablet_at(&cell, q1).0,
        tablet_at(&cell, q2).0,
    );
    assert!(left != middle && middle != right);

    // Batches whose responses are dropped, one in each of the three
    // tablets (their retries come after both merges).
    let key_in = |lo: u32, hi: u64, tag: &str| {
        (0..)
            .map(|i| format!("once-{tag}-{i}"))
            .find(|k| {
                let v = vshard(NS, k.as_bytes());
                v >= lo && u64::from(v) < hi
            })
            .unwrap()
    };
    let keys = [
        key_in(ns_lo, u64::from(q1), "l"),
        key_in(q1, u64::from(q2), "m"),
        key_in(q2, u64::from(ns_lo) + 0x10000, "r"),
    ];
    let batch = |key: &str| {
        vec![stele_client::record(
            key.to_string(),
            1,
            key.as_bytes().to_vec(),
        )]
    };
    let mut first = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        let id = [n as u8 + 1; 16];
        let r = client
            .append_batch(NS, batch(key), None, Some(id))
            .await
            .unwrap();
        first.push((id, r));
    }

    // Merge 1: the middle into the right one, with the survivor's leader
    // killed right after the intent is recorded.
    let before = writer.acked_count();
    writer.take_longest();
    let started = Instant::now();
    let i = cell.json_retrying_busy(&["tablet", "merge", &middle.to_string(), &right.to_string()]);
    let survivor = i["tablet"].as_u64().unwrap();
    assert_eq!(survivor, middle.max(right), "{i}");
    assert_eq!(i["absorbed"].as_u64().unwrap(), middle.min(right), "{i}");
    let leader = cell.tablets().iter().find(|t| t["id"] == survivor).unwrap()["leader_node"]
        .as_u64()
        .unwrap() as usize;
    nodes.remove(&leader).unwrap().kill9();
    // The node comes back (as a supervisor would restart it): a merge
    // waits for every voter of the absorbed tablet to freeze.
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes.insert(leader, cell.start_node(leader));
    let done = wait_intent(&cell, i["id"].as_u64().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(done["state"], "done", "{done}");
    let killed_took = started.elapsed();
    let (m, lo, _) = tablet_at(&cell, q1);
    assert_eq!((m, lo), (survivor, q1), "the merged tablet starts at q1");
    assert_eq!(tablet_at(&cell, q2).0, survivor);
    let deadline = Instant::now() + Duration::from_secs(30);
    while writer.acked_count() < before + 20 {
        assert!(Instant::now() < deadline, "writes stalled after merge 1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_stall = writer.take_longest();

    // Merge 2: the left one into the merged one.
    cell.wait_settled(Duration::from_secs(60));
    let before = writer.acked_count();
    let started = Instant::now();
    let i = cell.json_retrying_busy(&["tablet", "merge", &left.to_string(), &survivor.to_string()]);
    let i = wait_intent(&cell, i["id"].as_u64().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(i["state"], "done", "{i}");
    let took = started.elapsed();
    let last = i["tablet"].as_u64().unwrap();
    assert_eq!(tablet_at(&cell, ns_lo).0, last);
    assert_eq!(tablet_at(&cell, q2).0, last);
    let deadline = Instant::now() + Duration::from_secs(30);
    while writer.acked_count() < before + 20 {
        assert!(Instant::now() < deadline, "writes stalled after merge 2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stall = writer.take_longest();
    eprintln!(
        "merge command to route published, longest append: {took:?} {stall:?}; with the leader killed: {killed_took:?} {killed_stall:?}"
    );
    assert_eq!(cell.tablets().len(), 1);
    cell.wait_settled(Duration::from_secs(60));
    for t in cell.tablets() {
        assert_eq!(voter_nodes(&t).len(), 3, "{t}");
    }

    // The dropped batches, retried after the merges: applied once, with
    // their original positions.
    for ((id, r), key) in first.iter().zip(&keys) {
        let again = client
            .append_batch(NS, batch(key), None, Some(*id))
            .await
            .unwrap();
        assert!(again.duplicate, "{key}: applied again");
        assert_eq!(again.positions, r.positions, "{key}");
        let rows = client
            .scan_key_all(NS, key.as_bytes(), 0, 0, ReadOptions::default())
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{key}: {rows:?}");
    }
    writer.acked.lock().unwrap().extend(keys.iter().cloned());
    let acked = writer.acked.lock().unwrap().clone();
    let n = writer.stop_and_check(&client).await;
    // ScanKey of every key the writer wrote.
    let mut by_value = std::collections::HashMap::<String, usize>::new();
    for w in 0..2 {
        for k in 0..64 {
            let key = format!("k{w}-{k}");
            for r in client
                .scan_key_all(NS, key.as_bytes(), 0, 0, ReadOptions::default())
                .await
                .unwrap()
            {
                *by_value
                    .entry(String::from_utf8_lossy(&r.value).into_owned())
                    .or_default() += 1;
            }
        }
    }
    for v in acked.iter().filter(|v| !v.starts_with("once-")) {
        assert_eq!(
            by_value.get(v),
            Some(&1),
            "ScanKey sees {v} {:?}",
            by_value.get(v)
        );
    }
    converged(&cell, 1..=3, n).await;
    eprintln!("{n} acknowledged appends checked across 2 splits and 2 merges");
}

/// Tablets on different node sets (four nodes, three voters each) merge
/// after the controller moved the absorbed tablet's replicas onto the
/// survivor's nodes; then bad merges are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_colocates_first_and_bad_merges_change_nothing() {
    let mut cell = ControlledCell::new(1, 4);
    // No leader-balance transfers: a refusal below must be for its reason,
    // not for a transfer in progress.
    cell.controller_flags
        .extend(["--leader-balance-ms", "0"].map(String::from));
    let (_controllers, _nodes) = cell.start(2);
    cell.wait_settled(Duration::from_secs(60));
    let ts = cell.tablets();
    let (a, b) = (ts[0]["id"].as_u64().unwrap(), ts[1]["id"].as_u64().unwrap());
    let sa = a.to_string();
    let sb = b.to_string();
    // Make their node sets differ: move one voter of `a` to the node `b`
    // lacks, or of `b` to the node `a` lacks.
    // (As sets: the replica lists come in no particular order.)
    let (mut na, mut nb) = (voter_nodes(&ts[0]), voter_nodes(&ts[1]));
    na.sort_unstable();
    nb.sort_unstable();
    if na == nb {
        let to = (1..=4u64).find(|n| !na.contains(n)).unwrap();
        let i = cell.json_retrying_busy(&[
            "tablet",
            "move",
            &sa,
            "--from",
            &na[0].to_string(),
            "--to",
            &to.to_string(),
            "--wait",
        ]);
        assert_eq!(i["state"], "done", "{i}");
    }
    cell.wait_settled(Duration::from_secs(60));

    let refused = |args: &[&str], why: &str| {
        let (ok, out, err) = cell.cli(args);
        assert!(!ok, "{args:?} was accepted: {out}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    refused(&["tablet", "merge", &sa, &sa], "itself");
    refused(&["tablet", "merge", &sa, "99"], "unknown tablet");
    let stale = (ts[0]["generation"].as_u64().unwrap() + 1000).to_string();
    refused(
        &["tablet", "merge", &sa, &sb, "--expect-generation-a", &stale],
        "generation",
    );
    // A dry run prints the plan (co-location first) and records nothing.
    let plan: serde_json::Value = cell.json(&["tablet", "merge", &sa, &sb, "--dry-run"]);
    assert_eq!(plan["state"], "plan", "{plan}");
    assert_eq!(plan["detail"], "colocating", "{plan}");
    assert_eq!(plan["tablet"].as_u64().unwrap(), a.max(b));
    assert_eq!(plan["absorbed"].as_u64().unwrap(), a.min(b));
    assert_eq!(cell.tablets().len(), 2);

    // Data in both, then the merge.
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), NS, 2).await;
    let more = Writer::start(client.clone(), "merge/other", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let i = merge(&cell, a, b);
    eprintln!("co-located merge: {i}");
    let ts = cell.tablets();
    assert_eq!(ts.len(), 1, "{ts:?}");
    assert_eq!(ts[0]["id"].as_u64().unwrap(), a.max(b));
    assert_eq!(ts[0]["vshard_lo"].as_u64().unwrap(), 0);
    assert_eq!(ts[0]["vshard_hi"].as_u64().unwrap(), 1 << 32);
    let n = writer.stop_and_check(&client).await + more.stop_and_check(&client).await;
    eprintln!("{n} acknowledged appends checked across a co-locating merge");
    cell.wait_settled(Duration::from_secs(60));

    // Now a single tablet: a merge needs a neighbour; mid-move is busy.
    let id = ts[0]["id"].as_u64().unwrap();
    let half = (1u64 << 31) as u32;
    split(&cell, id, half);
    let ts = cell.tablets();
    let (x, y) = (ts[0]["id"].as_u64().unwrap(), ts[1]["id"].as_u64().unwrap());
    let (sx, sy) = (x.to_string(), y.to_string());
    split(&cell, y, half + (1 << 30));
    let z = tablet_at(&cell, half + (1 << 30)).0;
    // x = [0, half) and z = [half + 2^30, 2^32) are not adjacent.
    refused(&["tablet", "merge", &sx, &z.to_string()], "not adjacent");
    let t = cell.tablets().into_iter().find(|t| t["id"] == x).unwrap();
    let from = voter_nodes(&t)[0];
    let to = (1..=4u64).find(|n| !voter_nodes(&t).contains(n)).unwrap();
    let _ = cell.cli(&[
        "tablet",
        "move",
        &sx,
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ]);
    refused(&["tablet", "merge", &sx, &sy], "in progress");
    assert_eq!(cell.tablets().len(), 3);
}

/// Two cold adjacent tablets merge by themselves once their cooldowns and
/// a window have passed; the decision's reason is in the intent and in
/// `stele tablet show`; nothing merges or splits after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_pair_merges_by_itself() {
    let mut cell = ControlledCell::new(1, 3);
    cell.controller_flags.extend(
        [
            "--split-writes-per-s",
            "1000",
            "--merge-below-percent",
            "25",
            "--split-window-ms",
            "2000",
            "--split-cooldown-ms",
            "3000",
            "--leader-balance-ms",
            "0",
        ]
        .map(String::from),
    );
    let (_controllers, _nodes) = cell.start(2);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    // A few records, which must survive the merge.
    let writer = Writer::start(client.clone(), NS, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = writer.stop_and_check(&client).await;
    let started = Instant::now();
    while cell.tablets().len() > 1 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no automatic merge after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("automatic merge after {:?}", started.elapsed());
    let t = &cell.tablets()[0];
    let id = t["id"].as_u64().unwrap().to_string();
    let shown: serde_json::Value = cell.json(&["tablet", "show", &id]);
    let reason = shown["last_change"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("auto: merged load"), "{shown}");
    let (ok, text, _) = {
        let ctl = cell.controllers_arg();
        stele_tests::run(&["tablet", "show", &id, "--controllers", &ctl])
    };
    assert!(ok && text.contains("auto: merged load"), "{text}");
    let rows = client
        .scan_all(NS, 0, 0, b"", ReadOptions::default())
        .await
        .unwrap();
    assert_eq!(rows.len(), n, "the merge kept every record once");
    cell.wait_settled(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(cell.tablets().len(), 1, "a quiet cell changed again");
}
