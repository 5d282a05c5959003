//! A follower that fell behind its leader's purged log catches up by
//! snapshot; with a cold tier the snapshot's segments are read from the
//! bucket, so no segment crosses the node transport (issue 6: moving a
//! replica whose segments are in the bucket transfers at most the unsealed
//! tail).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::{Cell, client_options, status, tablet_of, try_local_rows, value_counts};

const NS: &str = "cold/bootstrap";
/// The cell's `--memtable-bytes-max` (set below).
const MEMTABLE_BYTES_MAX: u64 = 65536;

struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        stele_tests::signal(self.0, libc::SIGCONT);
    }
}

async fn append_acked(client: &Client, i: u64, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rec = stele_client::record(format!("k{}", i % 40), i, value.as_bytes().to_vec());
        match client.append(NS, vec![rec]).await {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "append {i} never acknowledged: {e}"
                );
                let _ = client.refresh_routes().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_follower_installs_segments_from_the_bucket() {
    bootstrap(false).await;
}

/// The bucket is unreachable when the snapshot arrives: the follower opens
/// the snapshot's cold segments before openraft installs it, so the
/// delivery fails (and the leader sends it again) instead of the install,
/// which openraft takes as fatal. Once the bucket is back the same
/// follower installs and holds every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_arriving_while_the_bucket_is_unreachable_installs_later() {
    bootstrap(true).await;
}

/// Moves every segment object under `bucket` aside (the bucket answers
/// "not found" for them) and returns where each went.
fn move_objects_aside(bucket: &Path, aside: &Path) -> Vec<(PathBuf, PathBuf)> {
    let moved: Vec<(PathBuf, PathBuf)> = stele_tests::walk(bucket)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .enumerate()
        .map(|(i, p)| (p, aside.join(i.to_string())))
        .collect();
    for (from, to) in &moved {
        std::fs::rename(from, to).unwrap();
    }
    moved
}

async fn bootstrap(bucket_fails_at_install: bool) {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let cell = Cell::new()
        .flag("--tablets", "1")
        .flag("--object-store", &url)
        .flag("--cell-id", "boot")
        .flag("--hot-age-s", "0")
        .flag("--memtable-bytes-max", &MEMTABLE_BYTES_MAX.to_string())
        // Byte counts below assume every sealed segment is uploaded as
        // sealed; a compaction's output is a segment the bucket may not
        // have yet, which would rightly come from the leader.
        .flag("--compact-target-bytes", "0");
    let procs = cell.start(&[1, 2, 3]);
    let tablet = tablet_of(&cell.endpoint(1), NS).await;
    let leader = tablet.leader_node as usize;
    assert!((1..=3).contains(&leader), "no leader: {tablet:?}");
    let follower = (1..=3).find(|n| *n != leader).unwrap();
    let client = Client::connect(&cell.endpoint(leader), client_options())
        .await
        .unwrap();
    // Incompressible values, so bytes on the wire and in segments compare;
    // large enough that the sealed bytes dwarf the per-batch state a
    // snapshot carries (receipts, ~100 bytes a batch).
    let value = |i: u64| stele_tests::noise_value(i, 4000);
    let mut acked = Vec::new();
    for i in 0..20u64 {
        let v = value(i);
        append_acked(&client, i, &v).await;
        acked.push(v);
    }
    let f_before = loop {
        let t = tablet_of(&cell.endpoint(follower), NS).await;
        if t.applied_index >= tablet_of(&cell.endpoint(leader), NS).await.applied_index {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut in_before = status(&cell.endpoint(follower)).await.peer_bytes_in;
    let stopped = Stopped(procs[&follower].child.id());
    stele_tests::signal(stopped.0, libc::SIGSTOP);
    for i in 20..420u64 {
        let v = value(i);
        append_acked(&client, i, &v).await;
        acked.push(v);
    }
    let t0 = Instant::now();
    loop {
        let t = tablet_of(&cell.endpoint(leader), NS).await;
        let s = status(&cell.endpoint(leader)).await;
        // Every sealed segment uploaded: a segment sealed but not yet
        // uploaded when the follower resumes has to come from the leader.
        // The memtable must also be under the size trigger, or the policy
        // seals it after this check and that fresh segment (rightly) crosses
        // the transport.
        if t.purged_index > f_before.last_log_index
            && s.segments_sealed >= 3
            && s.segments_uploaded >= s.segments_sealed
            && t.memtable_bytes < MEMTABLE_BYTES_MAX
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "leader purged to {}, uploaded {}",
            t.purged_index,
            s.segments_uploaded
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tail = tablet_of(&cell.endpoint(leader), NS).await.memtable_bytes;
    let aside = tempfile::tempdir().unwrap();
    let hidden = if bucket_fails_at_install {
        move_objects_aside(bucket.path(), aside.path())
    } else {
        Vec::new()
    };
    drop(stopped);
    if bucket_fails_at_install {
        assert!(!hidden.is_empty(), "no segment objects in the bucket");
        // Long enough for several deliveries of the snapshot; each must
        // fail before the install, and the follower must stay up.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s = status(&cell.endpoint(follower)).await;
        assert_eq!(
            s.snapshots_installed, 0,
            "a snapshot was installed while its segments were unreadable"
        );
        for (from, to) in &hidden {
            std::fs::rename(to, from).unwrap();
        }
        // The failed deliveries each carried the snapshot message; the
        // bytes compared below are those of the delivery that succeeds.
        in_before = s.peer_bytes_in;
    }
    let resumed = Instant::now();
    let s = loop {
        let s = status(&cell.endpoint(follower)).await;
        let mut why = format!("snapshots_installed {}", s.snapshots_installed);
        if s.snapshots_installed > 0 {
            match try_local_rows(&cell.endpoint(follower), NS).await {
                Ok(rows) => {
                    let seen = value_counts(&rows);
                    assert!(seen.values().all(|c| *c == 1), "duplicates on the follower");
                    let missing = acked
                        .iter()
                        .filter(|v| !seen.contains_key(v.as_bytes()))
                        .count();
                    if missing == 0 {
                        break s;
                    }
                    why = format!("{missing} acknowledged records missing");
                }
                Err(e) => why = format!("read refused: {}", e.message()),
            }
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(60),
            "follower {follower} did not catch up: {why}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        s.segments_fetched, 0,
        "segments crossed the node transport instead of coming from the bucket"
    );
    // Bytes that reached the follower over the node transport while it
    // caught up (the snapshot message, the log after it, heartbeats)
    // against the sealed bytes it needed, which came from the bucket.
    let moved = s.peer_bytes_in - in_before;
    let sealed = stele_tests::bucket_segment_bytes(bucket.path());
    eprintln!(
        "follower {follower} caught up in {:?}: {} snapshot(s), 0 segments over the transport; \
         {moved} bytes over the transport (unsealed tail {tail} bytes), {sealed} sealed bytes in the bucket, \
         {} cold bytes fetched",
        resumed.elapsed(),
        s.snapshots_installed,
        s.cold_bytes_fetched
    );
    assert!(
        moved < sealed / 4,
        "{moved} bytes crossed the transport for {sealed} sealed bytes and a {tail}-byte tail"
    );
    for (_, p) in procs {
        p.terminate();
    }
}
