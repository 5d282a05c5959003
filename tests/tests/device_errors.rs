//! A write the device refuses stops the journal: later appends are refused
//! with the reason, reads go on, and after a restart every acknowledged
//! record is there (DESIGN.md 5; seeds/002 section 5, "a refused write
//! stops the log"). The fault is real I/O failure injected by the journal's
//! fail point in a real process.

use std::time::Duration;

use stele_client::retry::RetryPolicy;
use stele_client::{Client, ClientOptions};
use stele_proto::pb;
use stele_tests::Proc;

fn opts() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 2,
            deadline: Duration::from_millis(300),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        },
        ..ClientOptions::default()
    }
}

fn bounded() -> pb::ReadOptions {
    pb::ReadOptions {
        consistency: pb::Consistency::Bounded as i32,
        max_staleness_ms: 600_000,
        partial: false,
    }
}

async fn eio_stops_the_journal(failpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = [
        "dev",
        "--data-dir",
        d,
        "--listen",
        "127.0.0.1:0",
        "--tablets",
        "2",
        "--disk-reserve-bytes",
        "0",
        "--journal-reserve-bytes",
        "0",
    ];
    let proc = Proc::start(&args, &[("STELE_FAILPOINTS", failpoint)]).unwrap();
    let client = Client::connect(&proc.endpoint, opts()).await.unwrap();
    let mut acked = Vec::new();
    let mut failed_at = None;
    for i in 0..400u64 {
        let key = format!("k{i}");
        match client
            .append(
                "dev/err",
                vec![stele_client::record(key.clone(), i, b"v".to_vec())],
            )
            .await
        {
            Ok(_) => acked.push(key),
            Err(_) => {
                failed_at = Some(i);
                break;
            }
        }
    }
    assert!(failed_at.is_some(), "the injected fault never fired");
    assert!(
        !acked.is_empty(),
        "the fault fired before anything was acknowledged"
    );
    let status = client.status().await.unwrap();
    assert!(
        status.journal_stopped.contains("Input/output error"),
        "journal not reported stopped: {:?}",
        status.journal_stopped
    );
    // Every later append is refused, to every tablet.
    for i in 0..10u64 {
        let r = client
            .append(
                "dev/err",
                vec![stele_client::record(format!("late{i}"), i, b"v".to_vec())],
            )
            .await;
        assert!(
            r.is_err(),
            "an append was accepted after the journal stopped"
        );
    }
    // Reads go on.
    let rows = client
        .scan_all("dev/err", 0, 0, b"", bounded())
        .await
        .unwrap();
    assert!(rows.len() >= acked.len());
    proc.kill9();

    let proc = Proc::start(&args[..], &[]).unwrap();
    let client = Client::connect(&proc.endpoint, opts()).await.unwrap();
    let rows = client
        .scan_all("dev/err", 0, 0, b"", pb::ReadOptions::default())
        .await
        .unwrap();
    let keys: Vec<String> = rows
        .iter()
        .map(|r| String::from_utf8(r.key.clone()).unwrap())
        .collect();
    for k in &acked {
        assert_eq!(
            keys.iter().filter(|x| *x == k).count(),
            1,
            "acknowledged {k} lost or doubled"
        );
    }
    assert!(
        !keys.iter().any(|k| k.starts_with("late")),
        "a refused append was applied"
    );
    // And the node takes writes again.
    client
        .append(
            "dev/err",
            vec![stele_client::record("after", 1, b"v".to_vec())],
        )
        .await
        .unwrap();
    assert!(proc.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_eio_stops_the_journal_and_loses_nothing_acknowledged() {
    eio_stops_the_journal("journal-sync-eio=40").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_eio_stops_the_journal_and_loses_nothing_acknowledged() {
    eio_stops_the_journal("journal-write-eio=40").await;
}
