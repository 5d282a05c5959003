//! Regression test for a bug the one-hour jepsen soak found: a tablet's
//! leader compacted segments and deleted the inputs' objects from the
//! bucket while a follower was down. The follower's catalog still named
//! those inputs, their local files long evicted, so the node could not
//! start again ("open node: segment ... not found"): with two of three
//! nodes in that state, the tablet never had a leader again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::{client_options, status, try_local_rows, value_counts};
use stele_tests::controlled::{ControlledCell, voter_nodes};

const NS: &str = "cold/compact";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_down_across_compactions_restarts_and_holds_every_row() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let mut cell = ControlledCell::new(1, 3);
    cell.node_flags = [
        "--object-store",
        &url,
        "--cell-id",
        "cc",
        "--hot-age-s",
        "0",
        "--memtable-age-max-s",
        "1",
        "--compact-target-bytes",
        "4000000",
    ]
    .map(String::from)
    .to_vec();
    let (_ctl, mut nodes) = cell.start(1);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let mut acked = Vec::new();
    let write = async |from: u64, to: u64, acked: &mut Vec<String>| {
        for i in from..to {
            let v = stele_tests::noise_value(i, 2000);
            let rec = stele_client::record(format!("k{}", i % 20), i, v.clone().into_bytes());
            client.append(NS, vec![rec]).await.unwrap();
            acked.push(v);
            if i % 20 == 19 {
                // Small segments: sealed by age, uploaded, evicted.
                tokio::time::sleep(Duration::from_millis(1200)).await;
            }
        }
    };
    write(0, 80, &mut acked).await;
    let tablet = cell.tablets().remove(0);
    let leader = tablet["leader_node"].as_u64().unwrap() as usize;
    let voters = voter_nodes(&tablet);
    let down = *voters.iter().find(|n| **n as usize != leader).unwrap() as usize;
    // The follower's segments are in the bucket and gone locally.
    let started = Instant::now();
    loop {
        let s = status(&cell.node_endpoint(down)).await;
        if s.segments_sealed >= 3 && s.segments_evicted >= 3 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(nodes.remove(&down));
    // The leader compacts while the follower is down.
    let started = Instant::now();
    let mut next = 80;
    while status(&cell.node_endpoint(leader)).await.compactions < 2 {
        write(next, next + 20, &mut acked).await;
        next += 20;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no compaction on the leader"
        );
    }
    // Time for the leader's tier worker to publish a manifest without the
    // inputs and act on them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    nodes.insert(down, cell.start_node(down));
    let ep = cell.node_endpoint(down);
    let started = Instant::now();
    loop {
        if let Ok(rows) = try_local_rows(&ep, NS).await {
            let seen: HashMap<Vec<u8>, usize> = value_counts(&rows);
            assert!(seen.values().all(|c| *c == 1), "duplicates on node {down}");
            if acked.iter().all(|v| seen.contains_key(v.as_bytes())) {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node {down} did not come back with every row (see its log)"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
