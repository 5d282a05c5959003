//! Online tablet split in a controller-managed cell of real processes
//! (one controller, three storage nodes on loopback).
//!
//! - Five splits in a row under continuous appends, one of them with the
//!   tablet's leader SIGKILLed right after the intent, then two merges
//!   back: every acknowledged record is readable exactly once by `Scan`
//!   and by `ScanKey`, and the client follows the route changes by itself.
//! - Exactly-once across a split: a batch whose response was dropped is
//!   retried after the split and applied once, in both halves.
//! - Bad input: a split at the range's edge or outside it, of an unknown
//!   tablet, or of a tablet mid-move is refused with a reason and nothing
//!   changes; a dry run changes nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stele_client::{Client, ReadOptions};
use stele_proto::vshard::{namespace_range, vshard};
use stele_tests::cell::{client_options, try_local_rows, value_counts};
use stele_tests::controlled::{ControlledCell, Writer, voter_nodes};

const NS: &str = "split/ns";

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

/// `stele tablet split ID --at AT --wait`, retried while another intent
/// (a leader balance) holds the tablet.
fn split(cell: &ControlledCell, id: u64, at: u32) -> serde_json::Value {
    let (id, at) = (id.to_string(), at.to_string());
    let i = cell.json_retrying_busy(&["tablet", "split", &id, "--at", &at, "--wait"]);
    assert_eq!(i["state"], "done", "{i}");
    i
}

/// Every acked value of the writer read by `ScanKey`, key by key: each
/// exactly once.
async fn check_by_key(client: &Client, acked: &[String]) {
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for w in 0..2 {
        for k in 0..64 {
            let key = format!("k{w}-{k}");
            let rows = client
                .scan_key_all(NS, key.as_bytes(), 0, 0, ReadOptions::default())
                .await
                .unwrap();
            for r in rows {
                *by_key
                    .entry(String::from_utf8_lossy(&r.value).into_owned())
                    .or_default() += 1;
            }
        }
    }
    for v in acked {
        assert_eq!(
            by_key.get(v),
            Some(&1),
            "ScanKey sees {v} {:?} times",
            by_key.get(v)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_splits_under_writes_with_a_leader_killed_lose_and_double_nothing() {
    let cell = ControlledCell::new(1, 3);
    let (_controllers, mut nodes) = cell.start(1);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let (ns_lo, _) = namespace_range(NS);

    // Two batches whose responses are dropped: one on each side of the
    // first split point.
    let key_hi = (0..)
        .map(|i| format!("once-hi-{i}"))
        .find(|k| vshard(NS, k.as_bytes()) >= ns_lo + 0x8000)
        .unwrap();
    let key_lo = (0..)
        .map(|i| format!("once-lo-{i}"))
        .find(|k| vshard(NS, k.as_bytes()) < ns_lo + 0x8000)
        .unwrap();
    let batch = |key: &str| {
        vec![stele_client::record(
            key.to_string(),
            1,
            key.as_bytes().to_vec(),
        )]
    };
    let (id_hi, id_lo) = ([7u8; 16], [9u8; 16]);
    let first_hi = client
        .append_batch(NS, batch(&key_hi), None, Some(id_hi))
        .await
        .unwrap();
    let first_lo = client
        .append_batch(NS, batch(&key_lo), None, Some(id_lo))
        .await
        .unwrap();

    let writer = Writer::start(client.clone(), NS, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Split points inside the namespace: halves, then quarters.
    let points = [
        ns_lo + 0x8000,
        ns_lo + 0x4000,
        ns_lo + 0xc000,
        ns_lo + 0x2000,
        ns_lo + 0xe000,
    ];
    let mut stalls = Vec::new();
    for (n, at) in points.into_iter().enumerate() {
        let (id, lo, hi) = tablet_at(&cell, at);
        assert!(lo < at && u64::from(at) < hi);
        let before = writer.acked_count();
        writer.take_longest();
        let started = Instant::now();
        if n == 2 {
            // Kill the tablet's leader right after the intent is recorded.
            let (sid, sat) = (id.to_string(), at.to_string());
            let i = cell.json_retrying_busy(&["tablet", "split", &sid, "--at", &sat]);
            let leader = cell.tablets().iter().find(|t| t["id"] == id).unwrap()["leader_node"]
                .as_u64()
                .unwrap() as usize;
            nodes.remove(&leader).unwrap().kill9();
            let iid = i["id"].as_u64().unwrap().to_string();
            let done = loop {
                let i: serde_json::Value = cell.json(&["intent", "show", &iid]);
                if i["done"] == true {
                    break i;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(90),
                    "split stuck: {i}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            eprintln!("split {n} with the leader killed: {done}");
            nodes.insert(leader, cell.start_node(leader));
            if done["state"] != "done" {
                // Rolled back: the split runs again, now with every node.
                split(&cell, id, at);
            }
        } else {
            split(&cell, id, at);
        }
        let took = started.elapsed();
        let (child, clo, chi) = tablet_at(&cell, at);
        assert_ne!(child, id, "split {n}: no new tablet at {at}");
        assert_eq!((clo, chi), (at, hi));
        assert_eq!(tablet_at(&cell, lo).0, id);
        // Writes resume on both halves.
        let deadline = Instant::now() + Duration::from_secs(30);
        while writer.acked_count() < before + 20 {
            assert!(Instant::now() < deadline, "writes stalled after split {n}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The intent is done once the controller published both halves.
        stalls.push((took, writer.take_longest()));
    }
    eprintln!("split command to route published, longest append meanwhile: {stalls:?}");
    assert_eq!(cell.tablets().len(), 6);
    cell.wait_settled(Duration::from_secs(60));
    for t in cell.tablets() {
        assert_eq!(voter_nodes(&t).len(), 3, "{t}");
    }

    // And merged back twice, still under the writers: the quarters on
    // either side of the first cut rejoin their neighbours.
    for v in [ns_lo + 0x2000, ns_lo + 0xc000] {
        let (a, _, _) = tablet_at(&cell, v - 1);
        let (b, _, _) = tablet_at(&cell, v);
        assert_ne!(a, b);
        let (sa, sb) = (a.to_string(), b.to_string());
        let i = cell.json_retrying_busy(&["tablet", "merge", &sa, &sb, "--wait"]);
        assert_eq!(i["state"], "done", "{i}");
        assert_eq!(tablet_at(&cell, v - 1).0, tablet_at(&cell, v).0);
    }
    assert_eq!(cell.tablets().len(), 4);
    cell.wait_settled(Duration::from_secs(60));

    // The dropped batches, retried after the splits and merges: applied
    // once.
    let again_hi = client
        .append_batch(NS, batch(&key_hi), None, Some(id_hi))
        .await
        .unwrap();
    let again_lo = client
        .append_batch(NS, batch(&key_lo), None, Some(id_lo))
        .await
        .unwrap();
    assert!(again_hi.duplicate && again_lo.duplicate);
    assert_eq!(again_hi.positions, first_hi.positions);
    assert_eq!(again_lo.positions, first_lo.positions);
    for key in [&key_hi, &key_lo] {
        let rows = client
            .scan_key_all(NS, key.as_bytes(), 0, 0, ReadOptions::default())
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{key}: {rows:?}");
    }

    let acked = writer.acked.lock().unwrap().clone();
    // The retried batches were acknowledged too: the scan must hold them
    // exactly once, like every other acknowledged record.
    writer
        .acked
        .lock()
        .unwrap()
        .extend([key_hi.clone(), key_lo.clone()]);
    let n = writer.stop_and_check(&client).await;
    check_by_key(&client, &acked).await;

    // Every node's own replicas converge on the same records, each once:
    // a replica that joined a child with nothing (the restarted node's,
    // from an assignment) holds the rows the child began with too.
    let all = client
        .scan_all(NS, 0, 0, b"", ReadOptions::default())
        .await
        .unwrap();
    let want = value_counts(&all);
    assert!(want.values().all(|n| *n == 1));
    for node in 1..=3 {
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
                all.len(),
                got.err()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    eprintln!("{n} acknowledged appends checked across 5 splits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_splits_are_refused_and_change_nothing() {
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(2);
    let before = cell.tablets();
    // The second tablet: its low edge is not vshard 0 (`--at 0` means the
    // middle).
    let t = &before[1];
    let (id, lo, hi) = (
        t["id"].as_u64().unwrap(),
        t["vshard_lo"].as_u64().unwrap(),
        t["vshard_hi"].as_u64().unwrap(),
    );
    let sid = id.to_string();
    let refused = |args: &[&str], why: &str| {
        let (ok, out, err) = cell.cli(args);
        assert!(!ok, "{args:?} was accepted: {out}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    // At the low edge, at the high edge, past the range.
    refused(
        &["tablet", "split", &sid, "--at", &lo.to_string()],
        "strictly inside",
    );
    if hi < 1 << 32 {
        refused(
            &["tablet", "split", &sid, "--at", &hi.to_string()],
            "strictly inside",
        );
    }
    let other = &before[0];
    let outside = other["vshard_lo"].as_u64().unwrap() + 1;
    refused(
        &["tablet", "split", &sid, "--at", &outside.to_string()],
        "strictly inside",
    );
    refused(&["tablet", "split", "99"], "unknown tablet");
    // Routed by a generation that is not the tablet's.
    let stale = (t["generation"].as_u64().unwrap() + 1000).to_string();
    refused(
        &["tablet", "split", &sid, "--expect-generation", &stale],
        "generation",
    );
    refused(&["intent", "abort", "999"], "no intent 999");
    // A dry run prints the plan and records nothing.
    let plan: serde_json::Value = cell.json(&["tablet", "split", &sid, "--dry-run"]);
    assert_eq!(plan["state"], "plan");
    assert_eq!(plan["at"].as_u64().unwrap(), (lo + hi) / 2);
    assert_eq!(plan["child"].as_u64().unwrap(), 3);
    // Mid-move: busy.
    let from = voter_nodes(t)[0];
    let to = (1..=3u64).find(|n| !voter_nodes(t).contains(n));
    if let Some(to) = to {
        let _ = cell.cli(&[
            "tablet",
            "move",
            &sid,
            "--from",
            &from.to_string(),
            "--to",
            &to.to_string(),
        ]);
        refused(&["tablet", "split", &sid], "in progress");
    }
    let after = cell.tablets();
    assert_eq!(after.len(), before.len());
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(
            (
                a["id"].clone(),
                a["vshard_lo"].clone(),
                a["vshard_hi"].clone()
            ),
            (
                b["id"].clone(),
                b["vshard_lo"].clone(),
                b["vshard_hi"].clone()
            )
        );
    }
    // A finished split cannot be aborted.
    let first = before[0]["id"].as_u64().unwrap();
    let half = (before[0]["vshard_hi"].as_u64().unwrap() / 2) as u32;
    let done = split(&cell, first, half);
    let iid = done["id"].as_u64().unwrap().to_string();
    refused(&["intent", "abort", &iid], "has finished");
    assert_eq!(cell.tablets().len(), before.len() + 1);
}

/// A tablet written at more than the write mark for a whole window splits
/// by itself once its cooldown has passed, with the reason in its intent;
/// nothing is lost or doubled; and once the writes stop, nothing more
/// splits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_tablet_splits_by_itself_and_a_quiet_one_does_not() {
    let mut cell = ControlledCell::new(1, 3);
    cell.controller_flags.extend(
        [
            "--split-writes-per-s",
            "20",
            "--split-window-ms",
            "3000",
            "--split-cooldown-ms",
            "4000",
            "--leader-balance-ms",
            "0",
        ]
        .map(String::from),
    );
    let (_controllers, _nodes) = cell.start(2);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let before = cell.tablets().len();
    let writer = Writer::start(client.clone(), NS, 2).await;
    let started = Instant::now();
    while cell.tablets().len() == before {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no automatic split after 60 s ({} appends)",
            writer.acked_count()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "automatic split {:?} after the writes began",
        started.elapsed()
    );
    // The split's intent says why.
    let reasons: Vec<String> = (1..=8)
        .filter_map(|id| {
            let (ok, out, _) = cell.cli(&["intent", "show", &id.to_string()]);
            ok.then(|| serde_json::from_str::<serde_json::Value>(&out).ok())
                .flatten()
        })
        .filter(|i| i["kind"].as_str().is_some_and(|k| k.starts_with("split")))
        .map(|i| i["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("auto: ") && r.contains("writes/s")),
        "{reasons:?}"
    );
    let n = writer.stop_and_check(&client).await;
    eprintln!("{n} acknowledged appends checked");
    // Quiet now: no more splits past a window and a cooldown.
    cell.wait_settled(Duration::from_secs(60));
    let settled = cell.tablets().len();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(cell.tablets().len(), settled, "a quiet cell kept splitting");
}
