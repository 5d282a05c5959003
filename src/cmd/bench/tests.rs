//! `stele bench`, against the client's in-memory fake node.

use std::time::Duration;

use stele_client::fake::{FakeNode, Fault};

use super::*;

#[test]
fn bench_json_has_exactly_the_documented_fields() {
    let report = BenchReport {
        records_per_s: 1.0,
        mb_per_s: 1.0,
        requests_per_s: 1.0,
        p50_ms: 1.0,
        p99_ms: 1.0,
        p999_ms: 1.0,
        fsyncs_per_s: 1.0,
        records_per_fsync: 1.0,
        records_acked: 1,
        errors: 0,
        concurrency: 1,
        record_bytes: 1,
        batch_records: 1,
        duration_s: 1.0,
        max_stall_ms: 1.0,
        interrupted: false,
        verify: None,
        reads: None,
    };
    let v = serde_json::to_value(&report).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    let mut want = vec![
        "records_per_s",
        "mb_per_s",
        "requests_per_s",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "fsyncs_per_s",
        "records_per_fsync",
        "records_acked",
        "errors",
        "concurrency",
        "record_bytes",
        "batch_records",
        "duration_s",
        "max_stall_ms",
        "interrupted",
    ];
    want.sort();
    assert_eq!(keys, want);
    let verified = BenchReport {
        verify: Some(verify::VerifyReport::default()),
        ..report
    };
    let v = serde_json::to_value(&verified).unwrap();
    let mut keys: Vec<&str> = v["verify"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "acked",
            "duplicated",
            "duplicated_examples",
            "found_once",
            "lost",
            "lost_examples",
            "unacked_found"
        ]
    );
}

fn bench_args(endpoint: &str) -> BenchArgs {
    BenchArgs {
        endpoint: endpoint.into(),
        concurrency: 4,
        record_bytes: 64,
        batch_records: 8,
        duration: None,
        namespaces: 3,
        json: true,
        fsync_probe: None,
        verify: false,
        retry_budget: None,
        workload: Workload::Append,
        consistency: ReadConsistency::Linearizable,
        max_staleness: None,
        keys: 100,
        gateway: None,
    }
}

#[tokio::test]
async fn bench_against_a_fake_node() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let report = bench(&bench_args(&endpoint), Duration::from_millis(300))
        .await
        .unwrap();
    let s = node.lock();
    assert_eq!(report.records_acked, s.rows.len() as u64);
    assert_eq!(report.records_acked % 8, 0);
    assert!(report.records_acked > 0);
    assert_eq!(report.errors, 0);
    assert!(s.batch_sizes.iter().all(|&n| n == 8));
    assert!(
        s.rows
            .iter()
            .all(|(ns, r)| ns.starts_with("bench/ns") && r.key.len() + r.value.len() == 64)
    );
    // The fake counts one fsync per applied batch.
    assert!((report.records_per_fsync - 8.0).abs() < 1e-9, "{report:?}");
    assert!(report.p50_ms > 0.0 && report.p50_ms <= report.p999_ms);
    assert!(report.duration_s >= 0.3);
}

#[tokio::test]
async fn bench_counts_errors_without_stopping() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let mut args = bench_args(&endpoint);
    // Over the value limit: every request is refused before sending.
    args.record_bytes = 2 * 1024 * 1024;
    args.concurrency = 1;
    args.batch_records = 1;
    let report = bench(&args, Duration::from_millis(100)).await.unwrap();
    assert!(report.errors > 0);
    assert_eq!(report.records_acked, 0);
    assert_eq!(report.p50_ms, 0.0);
    assert_eq!(node.lock().append_requests, 0);
}

#[test]
fn fsync_probe_measures_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let rate = fsync_probe(dir.path(), Duration::from_millis(200)).unwrap();
    assert!(rate > 0.0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "probe file removed"
    );
    assert!(fsync_probe(&dir.path().join("missing"), Duration::from_millis(10)).is_err());
}

#[tokio::test]
async fn bench_rides_out_transient_failures() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    node.lock()
        .faults
        .extend([Fault::Unavailable, Fault::Unavailable]);
    let report = bench(&bench_args(&endpoint), Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(report.errors, 0, "retried by the client");
    assert_eq!(report.records_acked, node.lock().rows.len() as u64);
}

/// `--verify` against the fake node: every acknowledged record is found
/// once (lost and duplicated ones are counted by `verify::tally`'s tests).
#[tokio::test]
async fn verify_reads_back_every_acknowledged_record() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let mut args = bench_args(&endpoint);
    args.verify = true;
    let report = bench(&args, Duration::from_millis(200)).await.unwrap();
    let v = report.verify.clone().expect("verified");
    assert!(v.ok(), "{v:?}");
    assert_eq!(v.acked, report.records_acked);
    assert_eq!(v.found_once, report.records_acked);
    assert!(report.max_stall_ms < 200.0 + 1000.0, "{report:?}");
    assert!(!report.interrupted);
}

/// A cancelled stop token ends the load early, and the report says so.
#[tokio::test]
async fn a_stop_ends_the_load_early_and_still_verifies() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let mut args = bench_args(&endpoint);
    args.verify = true;
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        stopper.cancel();
    });
    let started = std::time::Instant::now();
    let report = bench_until(&args, Duration::from_secs(60), stop)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(report.interrupted);
    assert!(report.verify.unwrap().ok());
}

/// Each reading workload preloads its keys, then every read finds its
/// row; `mixed` also appends. The reads' figures are in the report.
#[tokio::test]
async fn read_workloads_find_every_preloaded_key() {
    for (workload, consistency) in [
        (Workload::Get, ReadConsistency::Linearizable),
        (Workload::ScanKey, ReadConsistency::Bounded),
        (Workload::Mixed, ReadConsistency::Linearizable),
    ] {
        let node = FakeNode::one_tablet();
        let endpoint = node.serve().await.unwrap();
        let mut args = bench_args(&endpoint);
        (args.workload, args.consistency) = (workload, consistency);
        let report = bench(&args, Duration::from_millis(300)).await.unwrap();
        let r = report.reads.clone().expect("a read report");
        assert_eq!(r.workload, workload);
        assert!(r.reads > 0, "{report:?}");
        assert_eq!(r.misses, 0, "{report:?}");
        assert_eq!(report.errors, 0, "{report:?}");
        assert!(r.p50_ms > 0.0 && r.p50_ms <= r.p999_ms);
        let rows = node.lock().rows.len() as u64;
        assert_eq!(
            rows,
            100 + report.records_acked,
            "preloaded keys and appends"
        );
        if workload == Workload::Mixed {
            assert!(report.records_acked > 0, "{report:?}");
        } else {
            assert_eq!(report.records_acked, 0);
            assert!((report.records_per_s - r.reads_per_s).abs() < 1e-6);
        }
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["reads"]["misses"].is_u64(), "{json}");
    }
}

/// A read of a key that was never written counts as a miss, not a row.
#[tokio::test]
async fn a_read_without_its_row_is_a_miss() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let client = stele_client::Client::connect(&endpoint, Default::default())
        .await
        .unwrap();
    let read = ReadConsistency::Linearizable.options(Duration::from_secs(1));
    for kind in [Workload::Get, Workload::ScanKey] {
        let rows = workload::read_one(&client, kind, "bench/ns0", "absent", read)
            .await
            .unwrap();
        assert_eq!(rows, 0);
    }
}

#[tokio::test]
async fn reading_workloads_refuse_zero_keys_and_zero_staleness() {
    let node = FakeNode::one_tablet();
    let endpoint = node.serve().await.unwrap();
    let mut args = bench_args(&endpoint);
    args.workload = Workload::Get;
    args.keys = 0;
    let e = bench(&args, Duration::from_millis(50)).await.unwrap_err();
    assert!(e.to_string().contains("--keys"), "{e}");
    args.keys = 10;
    args.max_staleness = Some(Duration::ZERO);
    let e = bench(&args, Duration::from_millis(50)).await.unwrap_err();
    assert!(e.to_string().contains("--max-staleness"), "{e}");
}
