//! A follower stopped (SIGSTOP) long enough for the leader to purge its log
//! past what the follower holds catches up by snapshot and segment fetch,
//! not by replaying the log from index 1 (which no longer exists): Raft's
//! InstallSnapshot (Ongaro & Ousterhout, section 7), with Stele's snapshot
//! naming segments that the follower fetches (DESIGN section 8).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::{Cell, client_options, status, tablet_of, try_local_rows, value_counts};

const NS: &str = "catchup/cell";

/// Sends SIGCONT when dropped, so a failing test never leaves a stopped
/// process behind.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        stele_tests::signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        stele_tests::signal(self.0, libc::SIGCONT);
    }
}

/// Segment files (`*.seg`) in `dir` by name, with their bytes.
fn segments(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
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
async fn stopped_follower_catches_up_by_snapshot_after_purge() {
    let started = Instant::now();
    // One tablet, sealed every 64 KiB of rows.
    let cell = Cell::new().flag("--tablets", "1");
    let procs = cell.start(&[1, 2, 3]);
    let tablet = tablet_of(&cell.endpoint(1), NS).await;
    let leader = tablet.leader_node as usize;
    assert!((1..=3).contains(&leader), "no leader: {tablet:?}");
    let follower = (1..=3).find(|n| *n != leader).unwrap();
    let client = Client::connect(&cell.endpoint(leader), client_options())
        .await
        .unwrap();
    let value = |i: u64| format!("v{i:05}-{}", "x".repeat(1000));
    let mut acked = Vec::new();
    for i in 0..20u64 {
        append_acked(&client, i, &value(i)).await;
        acked.push(value(i));
    }
    // Wait until the follower holds those, so "behind" below is measured
    // from a settled point.
    let f_before = loop {
        let t = tablet_of(&cell.endpoint(follower), NS).await;
        if t.applied_index >= tablet_of(&cell.endpoint(leader), NS).await.applied_index {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let f_status = status(&cell.endpoint(follower)).await;
    assert_eq!(f_status.snapshots_installed, 0);

    let in_before = f_status.peer_bytes_in;
    let stopped = Stopped::stop(procs[&follower].child.id());
    let stopped_at = Instant::now();
    // ~400 KiB of rows: several seals, each followed by a snapshot and a
    // purge of the leader's log up to the seal.
    for i in 20..420u64 {
        append_acked(&client, i, &value(i)).await;
        acked.push(value(i));
    }
    let appended = stopped_at.elapsed();
    let purged = loop {
        let t = tablet_of(&cell.endpoint(leader), NS).await;
        if t.purged_index > f_before.last_log_index {
            break t;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(90),
            "the leader never purged past the stopped follower's last index {} (now purged to {}, checkpoint {})",
            f_before.last_log_index,
            t.purged_index,
            t.checkpoint_index
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let l_status = status(&cell.endpoint(leader)).await;
    assert!(
        l_status.segments_sealed >= 3,
        "only {} seals",
        l_status.segments_sealed
    );
    let purge_seen = stopped_at.elapsed();
    drop(stopped);
    let resumed_at = Instant::now();

    // The follower installs a snapshot, fetching the segments it names,
    // and ends up with every acknowledged record exactly once.
    let f_status = loop {
        let last;
        let s = status(&cell.endpoint(follower)).await;
        if s.snapshots_installed > 0 && s.segments_fetched > 0 {
            match try_local_rows(&cell.endpoint(follower), NS).await {
                Ok(rows) => {
                    let seen = value_counts(&rows);
                    if let Some((v, c)) = seen.iter().find(|(_, c)| **c > 1) {
                        panic!(
                            "the follower holds {} {c} times",
                            String::from_utf8_lossy(&v[..6])
                        );
                    }
                    let missing = acked
                        .iter()
                        .filter(|v| !seen.contains_key(v.as_bytes()))
                        .count();
                    if missing == 0 {
                        break s;
                    }
                    last = format!("{missing} acknowledged records missing");
                }
                Err(e) => last = format!("read refused: {}", e.message()),
            }
        } else {
            last = format!(
                "snapshots_installed {}, segments_fetched {}",
                s.snapshots_installed, s.segments_fetched
            );
        }
        assert!(
            resumed_at.elapsed() < Duration::from_secs(60),
            "follower {follower} did not catch up 60 s after SIGCONT: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let caught_up = resumed_at.elapsed();
    // Without a cold tier the sealed bytes cross the node transport.
    let moved = f_status.peer_bytes_in - in_before;
    let fetched_bytes: u64 = segments(&cell.segment_dir(follower, tablet.id))
        .values()
        .map(|b| b.len() as u64)
        .sum();
    eprintln!(
        "follower {follower}: {moved} bytes over the transport while catching up, {fetched_bytes} bytes of segments on disk"
    );
    let f_tablet = tablet_of(&cell.endpoint(follower), NS).await;
    assert!(
        f_tablet.purged_index >= purged.purged_index.min(f_tablet.checkpoint_index),
        "the follower replayed instead of installing: {f_tablet:?}"
    );

    // Sealing is deterministic and the snapshot is of the state at the
    // leader's checkpoint, so once the follower has replayed the log after
    // it, both hold the same segment files, byte for byte (the name is the
    // content hash; the bytes are compared too). Seal once more so the
    // unsealed tail is compared as well.
    let sealed_before = status(&cell.endpoint(leader)).await.segments_sealed;
    for i in 420..500u64 {
        append_acked(&client, i, &value(i)).await;
        acked.push(value(i));
    }
    let settle = Instant::now();
    let (l_segs, f_segs) = loop {
        let l_status = status(&cell.endpoint(leader)).await;
        let l_segs = segments(&cell.segment_dir(leader, tablet.id));
        let f_segs = segments(&cell.segment_dir(follower, tablet.id));
        let l_t = tablet_of(&cell.endpoint(leader), NS).await;
        let f_t = tablet_of(&cell.endpoint(follower), NS).await;
        if l_status.segments_sealed > sealed_before
            && l_t.checkpoint_index == f_t.checkpoint_index
            && l_segs.keys().eq(f_segs.keys())
        {
            break (l_segs, f_segs);
        }
        assert!(
            settle.elapsed() < Duration::from_secs(30),
            "segments differ: leader {:?} (checkpoint {}), follower {:?} (checkpoint {})",
            l_segs.keys().collect::<Vec<_>>(),
            l_t.checkpoint_index,
            f_segs.keys().collect::<Vec<_>>(),
            f_t.checkpoint_index
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (name, bytes) in &l_segs {
        assert!(
            f_segs[name] == *bytes,
            "segment {name} differs between leader and follower"
        );
    }
    let rows = value_counts(&try_local_rows(&cell.endpoint(follower), NS).await.unwrap());
    assert!(rows.values().all(|c| *c == 1));
    assert!(acked.iter().all(|v| rows.contains_key(v.as_bytes())));

    eprintln!(
        "follower {follower} stopped {purge_seen:?} ({appended:?} of appends; leader purged to {} past follower's {}), \
         caught up {caught_up:?} after SIGCONT: {} snapshot(s), {} segment(s) fetched; {} identical segments; test took {:?}",
        purged.purged_index,
        f_before.last_log_index,
        f_status.snapshots_installed,
        f_status.segments_fetched,
        l_segs.len(),
        started.elapsed()
    );
    for (_, p) in procs {
        p.terminate();
    }
}
