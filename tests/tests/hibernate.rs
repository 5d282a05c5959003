//! Hibernation on real `stele server` processes: idle tablets stop
//! heartbeating and stay led (no campaigns while they sleep, the leader's
//! node beats standing in for their heartbeats); a request wakes a tablet
//! and is served, a linearizable read after the wake sees the write; and
//! when the node leading sleeping tablets dies (kill -9), the others elect
//! and take writes within a few election timeouts, as for awake tablets.

use std::time::{Duration, Instant};

use stele_client::Client;
use stele_proto::pb;
use stele_tests::cell::{Cell, client_options, status, tablet_of};

const NS: &str = "hib/cell";
const TABLETS: u32 = 12;
const ELECTION_MS: u64 = 1500;
/// Heartbeat interval the cell derives from `ELECTION_MS` (T/3).
const HEARTBEAT_MS: u64 = ELECTION_MS / 3;

fn record(key: &str, ts: u64, value: &str) -> stele_client::Record {
    stele_client::record(key.to_string(), ts, value.as_bytes().to_vec())
}

/// Waits until every replica of every live node in `nodes` sleeps.
async fn all_asleep(cell: &Cell, nodes: &[usize], within: Duration) {
    let start = Instant::now();
    loop {
        let mut asleep = Vec::new();
        for n in nodes {
            asleep.push(status(&cell.endpoint(*n)).await.replicas_asleep);
        }
        if asleep.iter().all(|a| *a == u64::from(TABLETS)) {
            return;
        }
        assert!(
            start.elapsed() < within,
            "replicas asleep per node {asleep:?}, want {TABLETS} on each"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tablets_sleep_wake_on_a_request_and_fail_over_when_their_leader_node_dies() {
    let cell = Cell::new()
        .flag("--tablets", &TABLETS.to_string())
        .flag("--election-timeout-ms", &ELECTION_MS.to_string())
        .flag("--hibernate-after-ms", "300");
    let mut procs = cell.start(&[1, 2, 3]);
    let client = Client::connect(&cell.endpoint(1), client_options())
        .await
        .unwrap();
    // Every tablet gets a leader and a write, then goes quiet.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0u64;
    while i < 5 {
        match client.append(NS, vec![record("k", i, "before")]).await {
            Ok(_) => i += 1,
            Err(e) => {
                assert!(Instant::now() < deadline, "append never acknowledged: {e}");
                let _ = client.refresh_routes().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    all_asleep(&cell, &[1, 2, 3], Duration::from_secs(20)).await;

    // Asleep for ten heartbeat intervals: nobody campaigns, everything
    // stays asleep, and the nodes exchange beats (at most one per node
    // pair and round), not heartbeats (2 a tablet and round); both ends
    // count each message.
    let before: Vec<pb::StatusResponse> = statuses(&cell, &[1, 2, 3]).await;
    tokio::time::sleep(Duration::from_millis(10 * HEARTBEAT_MS)).await;
    let after: Vec<pb::StatusResponse> = statuses(&cell, &[1, 2, 3]).await;
    let campaigns: u64 = after.iter().map(|s| s.campaigns).sum::<u64>()
        - before.iter().map(|s| s.campaigns).sum::<u64>();
    assert_eq!(campaigns, 0, "campaigns while asleep");
    assert!(
        after
            .iter()
            .all(|s| s.replicas_asleep == u64::from(TABLETS)),
        "{:?}",
        after.iter().map(|s| s.replicas_asleep).collect::<Vec<_>>()
    );
    let messages: u64 = after.iter().map(|s| s.peer_control_messages).sum::<u64>()
        - before.iter().map(|s| s.peer_control_messages).sum::<u64>();
    let heartbeats = u64::from(TABLETS) * 2 * 10 * 2;
    assert!(
        messages < heartbeats / 2,
        "{messages} control messages in 10 rounds; heartbeats alone would be {heartbeats}"
    );
    let beats: u64 = after.iter().map(|s| s.node_beats).sum::<u64>()
        - before.iter().map(|s| s.node_beats).sum::<u64>();
    assert!(beats > 0, "no node beats while the tablets sleep");

    // A write wakes its tablet and is served at once; a linearizable read
    // (through a read index) sees it.
    let woke = Instant::now();
    client
        .append(NS, vec![record("k", 100, "after-sleep")])
        .await
        .unwrap();
    assert!(
        woke.elapsed() < Duration::from_millis(ELECTION_MS),
        "a sleeping tablet took {:?} to take a write",
        woke.elapsed()
    );
    let row = client
        .get(
            NS,
            b"k",
            pb::ReadOptions {
                consistency: pb::Consistency::Linearizable as i32,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .expect("the key reads back");
    assert_eq!(row.value, b"after-sleep");

    // Back to sleep; then the node leading the namespace's tablet dies.
    all_asleep(&cell, &[1, 2, 3], Duration::from_secs(20)).await;
    let leader = tablet_of(&cell.endpoint(1), NS).await.leader_node as usize;
    assert!((1..=3).contains(&leader), "leader node {leader}");
    let campaigns_before: u64 = {
        let mut c = 0;
        for n in (1..=3).filter(|n| *n != leader) {
            c += status(&cell.endpoint(n)).await.campaigns;
        }
        c
    };
    procs.remove(&leader).unwrap().kill9();
    let killed = Instant::now();
    let survivor = (1..=3).find(|n| *n != leader).unwrap();
    let other = Client::connect(&cell.endpoint(survivor), client_options())
        .await
        .unwrap();
    loop {
        match other.append(NS, vec![record("k", 200, "after-kill")]).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    killed.elapsed() < Duration::from_millis(4 * ELECTION_MS),
                    "no new leader {:?} after the sleeping leader's node died: {e}",
                    killed.elapsed()
                );
                let _ = other.refresh_routes().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut campaigns_after = 0;
    for n in (1..=3).filter(|n| *n != leader) {
        campaigns_after += status(&cell.endpoint(n)).await.campaigns;
    }
    assert!(
        campaigns_after > campaigns_before,
        "the survivors took over without campaigning?"
    );
    for (_, p) in procs {
        p.kill9();
    }
}

async fn statuses(cell: &Cell, nodes: &[usize]) -> Vec<pb::StatusResponse> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(status(&cell.endpoint(*n)).await);
    }
    out
}

/// Replicas asleep on each node of a controlled cell (`stele status`).
fn asleep_per_node(cell: &stele_tests::controlled::ControlledCell) -> Vec<u64> {
    cell.node_list()
        .iter()
        .map(|n| {
            let ep = n["client_endpoint"].as_str().unwrap();
            let (ok, out, err) = stele_tests::run(&["status", "--endpoint", ep, "--json"]);
            assert!(ok, "status of {ep}: {err}");
            let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            s["replicas_asleep"].as_u64().unwrap()
        })
        .collect()
}

/// A move of a tablet whose group sleeps: nobody writes to it, so only
/// the move can wake it. A sleeping leader has no lease, and openraft
/// refuses a membership change on a leader without one; the move once
/// waited on a group nothing woke until the controller gave it up (and
/// started it again, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_wakes_a_sleeping_tablet_and_finishes() {
    let mut cell = stele_tests::controlled::ControlledCell::new(1, 4);
    cell.node_flags
        .extend(["--hibernate-after-ms".into(), "300".into()]);
    let (_controllers, _nodes) = cell.start(2);
    // Every replica of both tablets asleep (two tablets, three voters).
    let start = Instant::now();
    loop {
        let asleep = asleep_per_node(&cell);
        if asleep.iter().sum::<u64>() == 6 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "replicas asleep per node: {asleep:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = &cell.tablets()[0];
    let id = t["id"].as_u64().unwrap().to_string();
    let voters = stele_tests::controlled::voter_nodes(t);
    let to = (1..=4u64).find(|n| !voters.contains(n)).unwrap();
    // From a follower: the sleeping leader itself must add the new voter
    // (a leader that moves away hands over first, and its successor
    // starts with a lease).
    let from = *voters.iter().find(|n| t["leader_node"] != **n).unwrap();
    let (ok, out, err) = cell.cli(&[
        "tablet",
        "move",
        &id,
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
        "--wait",
        "--timeout",
        "30s",
    ]);
    assert!(ok, "the move of a sleeping tablet: {out}{err}");
    let i: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(i["state"], "done", "{i}");
    let moved = cell
        .tablets()
        .into_iter()
        .find(|x| x["id"] == t["id"])
        .unwrap();
    let now = stele_tests::controlled::voter_nodes(&moved);
    assert!(
        now.contains(&to) && !now.contains(&from),
        "{voters:?} -> {now:?}"
    );
}
