//! Restart cost follows the unsealed tail, not history: after ingesting a
//! few hundred MiB that seal into many segments, a restart replays only the
//! journal frames past each tablet's checkpoint, and the journal itself has
//! been trimmed behind the checkpoints.

use stele_client::{Client, ClientOptions};
use stele_proto::pb;
use stele_tests::Proc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_only_the_unsealed_tail() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = [
        "dev",
        "--data-dir",
        d,
        "--listen",
        "127.0.0.1:0",
        "--tablets",
        "4",
        "--memtable-bytes-max",
        "4194304",
        "--journal-file-bytes-max",
        "16777216",
        "--journal-retained-bytes-max",
        "33554432",
        "--disk-reserve-bytes",
        "0",
        "--journal-reserve-bytes",
        "0",
    ];
    let proc = Proc::start(&args, &[]).unwrap();
    let client = Client::connect(&proc.endpoint, ClientOptions::default())
        .await
        .unwrap();
    let value = vec![0xabu8; 64 * 1024];
    // 4 writers x 50 calls x 16 records x 64 KiB = 200 MiB.
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let client = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..50u64 {
                let records: Vec<pb::Record> = (0..16)
                    .map(|i| stele_client::record(format!("t{t}-b{b}-{i}"), b, value.clone()))
                    .collect();
                client.append("restart/ns", records).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Seals trail the writes a little: give the seal policy time to catch up.
    let mut before = client.status().await.unwrap();
    for _ in 0..100 {
        if before.segments_sealed >= 8 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        before = client.status().await.unwrap();
    }
    assert!(
        before.journal_frames > 100,
        "too few frames: {}",
        before.journal_frames
    );
    assert!(
        before.segments_sealed >= 8,
        "too few seals: {}",
        before.segments_sealed
    );
    let rows_before = client
        .scan_all("restart/ns", 0, 0, b"", pb::ReadOptions::default())
        .await
        .unwrap()
        .len();
    assert!(proc.terminate().success());

    let proc = Proc::start(&args, &[]).unwrap();
    let client = Client::connect(&proc.endpoint, ClientOptions::default())
        .await
        .unwrap();
    let after = client.status().await.unwrap();
    eprintln!(
        "frames written {}, seals {}, journal files {} -> replayed {} frames at restart",
        before.journal_frames, before.segments_sealed, after.journal_files, after.replayed_frames
    );
    // Each tablet's unsealed tail is at most one memtable (4 MiB = 4 batch
    // parts of 1 MiB) plus commit/blank frames: far below the history.
    assert!(
        after.replayed_frames * 4 < before.journal_frames,
        "replayed {} of {} frames: restart follows history, not the tail",
        after.replayed_frames,
        before.journal_frames
    );
    let rows_after = client
        .scan_all("restart/ns", 0, 0, b"", pb::ReadOptions::default())
        .await
        .unwrap()
        .len();
    assert_eq!(rows_after, rows_before);
    assert!(proc.terminate().success());
}
