//! Moving a replica whose segments are in the bucket: the controller adds a
//! learner on a new node, which installs the leader's snapshot and opens
//! the snapshot's segments from the bucket; only the snapshot's state, the
//! log after it and heartbeats cross the node transport. The test measures
//! those bytes against the sealed bytes (issue 6).

use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::{client_options, status, try_local_rows, value_counts};
use stele_tests::controlled::{ControlledCell, voter_nodes};

const NS: &str = "cold/move";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_replica_reads_sealed_segments_from_the_bucket() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let mut cell = ControlledCell::new(1, 4);
    cell.node_flags = [
        "--object-store",
        &url,
        "--cell-id",
        "mv",
        "--hot-age-s",
        "0",
        "--memtable-age-max-s",
        "1",
        // Seals are counted against uploads below, and bytes against the
        // sealed bytes: a segment compacted away before its upload never
        // is, and a compaction's output may cross the transport.
        "--compact-target-bytes",
        "0",
    ]
    .map(String::from)
    .to_vec();
    // Each replica seals its own segments and only the leader uploads
    // them: a leader moved by the balancer between the wait below and the
    // move would send a snapshot of segments not yet in the bucket.
    cell.controller_flags
        .extend(["--leader-balance-ms", "0"].map(String::from));
    let (_ctl, _nodes) = cell.start(1);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let value = |i: u64| stele_tests::noise_value(i, 4000);
    let mut acked = Vec::new();
    for i in 0..300u64 {
        let v = value(i);
        let rec = stele_client::record(format!("k{}", i % 40), i, v.clone().into_bytes());
        client.append(NS, vec![rec]).await.unwrap();
        acked.push(v);
    }
    // Everything sealed (by age) and uploaded by the tablet's current
    // leader before the move.
    let started = Instant::now();
    let (id, voters, leader) = loop {
        let tablet = cell.tablets().remove(0);
        let id = tablet["id"].as_u64().unwrap().to_string();
        let voters = voter_nodes(&tablet);
        let leader = tablet["leader_node"].as_u64().unwrap_or(0);
        if leader == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let l = cell.node_endpoint(leader as usize);
        let s = status(&l).await;
        let t = Client::connect(&l, client_options())
            .await
            .unwrap()
            .list_tablets()
            .await
            .unwrap();
        if t.iter().all(|t| t.memtable_bytes == 0)
            && s.segments_sealed > 0
            && s.segments_uploaded >= s.segments_sealed
            // The counter above also counts a segment uploaded again
            // before its first upload was applied: count the objects.
            && stele_tests::bucket_segment_count(bucket.path()) >= s.segments_sealed
            // And the leader applied each upload (its `Uploaded` entry):
            // only then does its snapshot name the segment as cold, and
            // it evicts the local copy (`--hot-age-s 0`). An upload done
            // but not yet applied is sent by the snapshot as a local file.
            && t.iter().all(|t| s.segments_evicted >= u64::from(t.segments))
        {
            break (id, voters, leader);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not sealed and uploaded: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let target = (1..=4u64).find(|n| !voters.contains(n)).unwrap();
    let from = *voters.iter().find(|n| **n != leader).unwrap();
    let before = status(&cell.node_endpoint(target as usize)).await;
    let moved_at = Instant::now();
    cell.move_tablet(id.parse().unwrap(), from, target);
    let t_ep = cell.node_endpoint(target as usize);
    let after = loop {
        let s = status(&t_ep).await;
        if let Ok(rows) = try_local_rows(&t_ep, NS).await {
            let seen = value_counts(&rows);
            assert!(
                seen.values().all(|c| *c == 1),
                "duplicates on the new replica"
            );
            if acked.iter().all(|v| seen.contains_key(v.as_bytes())) {
                break s;
            }
        }
        assert!(
            moved_at.elapsed() < Duration::from_secs(60),
            "the new replica on node {target} never held every record"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = after.peer_bytes_in - before.peer_bytes_in;
    let sealed = stele_tests::bucket_segment_bytes(bucket.path());
    eprintln!(
        "move of tablet {id} from node {from} to node {target}: {:?}; {moved} bytes over the transport, \
         {} segments fetched from peers, {sealed} sealed bytes in the bucket, {} cold bytes read",
        moved_at.elapsed(),
        after.segments_fetched,
        after.cold_bytes_fetched
    );
    assert_eq!(after.segments_fetched, 0, "segments crossed the transport");
    assert!(
        moved < sealed / 4,
        "{moved} bytes crossed the transport for {sealed} sealed bytes"
    );
    let voters = voter_nodes(&cell.tablets().remove(0));
    assert!(
        voters.contains(&target) && !voters.contains(&from),
        "{voters:?}"
    );
}
