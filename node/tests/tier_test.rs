//! The cold tier end to end on one in-process node: ingest, seal, upload,
//! evict, then Scan / ScanKey / Get answer identically from the bucket — on
//! the local-filesystem store and on a real S3 server (moto, started by
//! `scripts/test`, which exports `STELE_TEST_S3_ENDPOINT`).
//!
//! The S3 cases are `#[ignore]`d, so a plain `cargo test` counts them as
//! ignored rather than passing them unseen; `scripts/test` runs them with
//! moto up. Run without a server, they fail.

mod common;
use common::open_when_released;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::TryStreamExt;
use stele_node::tier::{Tier, TierOptions};
use stele_node::{Node, NodeOptions};
use stele_proto::pb;
use stele_proto::pb::data_client::DataClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const NS: &str = "tenant-label-visible/orders";

fn options(dir: &std::path::Path, tier: Arc<Tier>) -> NodeOptions {
    let mut o = NodeOptions::new(dir.to_path_buf());
    o.initial_tablets = 2;
    o.journal.frame_payload_bytes_max = 2 << 20;
    o.journal.file_bytes_max = 4 << 20;
    o.batch_bytes_max = 3 << 19;
    o.batch_records_max = 1000;
    o.journal.reserve_bytes = 0;
    o.disk_reserve_bytes = 0;
    o.policy_interval = Duration::from_millis(50);
    o.raft = stele_node::raft::RaftTiming::for_election_timeout(300);
    o.tier = Some(tier);
    o
}

fn tier_options(url: &str) -> TierOptions {
    let mut t = TierOptions::new(url, "cell-7");
    t.hot_age = Duration::ZERO;
    t.interval = Duration::from_millis(100);
    t
}

/// What to do when an S3 test runs without its server.
const NEEDS_S3: &str = "run it through scripts/test, which starts moto, or by hand as in docs/OPERATIONS.md \"Tests and the S3 server\"";

/// The S3 endpoint of the test server. An S3 test that runs without one
/// fails: it was asked for, and a pass would claim S3 was tested.
fn s3_endpoint() -> String {
    match std::env::var("STELE_TEST_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            panic!("STELE_TEST_S3_ENDPOINT is not set and this test needs an S3 server: {NEEDS_S3}")
        }
    }
}

/// The `moto_server` program, for tests that stop and restart their own.
fn moto_server() -> String {
    match std::env::var("STELE_TEST_MOTO_SERVER") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            panic!("STELE_TEST_MOTO_SERVER is not set and this test needs moto_server: {NEEDS_S3}")
        }
    }
}

fn s3_tier_options(endpoint: &str, prefix: &str) -> TierOptions {
    let bucket = std::env::var("STELE_TEST_S3_BUCKET").unwrap_or_else(|_| "stele-test".into());
    let mut t = tier_options(&format!("s3://{bucket}/{prefix}"));
    t.s3_endpoint = Some(endpoint.to_string());
    t.s3_region = Some("us-east-1".into());
    t.s3_allow_http = true;
    t.s3_access_key_id = Some("testing".into());
    t.s3_secret_access_key = Some("testing".into());
    t
}

struct Running {
    node: Arc<Node>,
    client: DataClient<Channel>,
    cancel: CancellationToken,
    server: tokio::task::JoinHandle<stele_node::Result<()>>,
    /// Batch ids already used (each ingest continues after them).
    batches: u128,
    /// The namespace `ingest` and `read_all` use.
    ns: String,
}

async fn start(opts: NodeOptions) -> Running {
    let node = open_when_released(opts).await;
    node.wait_ready(Duration::from_secs(20))
        .await
        .expect("ready");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(stele_node::service::serve_on(
        node.clone(),
        listener,
        cancel.clone(),
    ));
    let client = loop {
        match DataClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    Running {
        node,
        client,
        cancel,
        server,
        batches: 0,
        ns: NS.to_string(),
    }
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.server.await;
        self.node.shutdown().await;
    }

    async fn ingest(&mut self, keys: usize, per_key: usize) {
        let tablets = self
            .client
            .list_tablets(pb::ListTabletsRequest {})
            .await
            .unwrap()
            .into_inner()
            .tablets;
        for k in 0..keys {
            let key = format!("key-{k:04}").into_bytes();
            let v = stele_proto::vshard::vshard(&self.ns, &key);
            let t = tablets
                .iter()
                .find(|t| v >= t.vshard_lo && u64::from(v) < t.vshard_hi)
                .unwrap();
            self.batches += 1;
            let batch = self.batches;
            let resp = self
                .client
                .append(pb::AppendRequest {
                    tablet: t.id,
                    generation: t.generation,
                    batch_id: batch.to_be_bytes().to_vec(),
                    namespace: self.ns.clone(),
                    records: (0..per_key)
                        .map(|i| pb::Record {
                            key: key.clone(),
                            ts: 1_000 + i as u64,
                            value: format!("value {k} {i} {}", "x".repeat(200)).into_bytes(),
                            routing_key: None,
                        })
                        .collect(),
                    ..Default::default()
                })
                .await;
            resp.expect("append");
        }
    }

    /// Every row of the namespace (paged Scan), every row of three keys
    /// (paged ScanKey) and the latest of one key (Get), with the cold bytes
    /// the reads reported.
    async fn read_all(&mut self) -> (Vec<pb::Row>, Vec<pb::Row>, Option<pb::Row>, u64, u64) {
        let (mut fetched, mut cached) = (0, 0);
        let mut scan = Vec::new();
        let mut cursor = Vec::new();
        loop {
            let r = self
                .client
                .scan(pb::ScanRequest {
                    namespace: self.ns.clone(),
                    limit: 100,
                    cursor: cursor.clone(),
                    ..Default::default()
                })
                .await
                .expect("scan")
                .into_inner();
            fetched += r.cold_bytes_fetched;
            cached += r.cold_bytes_cached;
            scan.extend(r.rows);
            if r.next_cursor.is_empty() {
                break;
            }
            cursor = r.next_cursor;
        }
        let mut by_key = Vec::new();
        for k in [0usize, 7, 19] {
            let mut cursor = Vec::new();
            loop {
                let r = self
                    .client
                    .scan_key(pb::ScanKeyRequest {
                        namespace: self.ns.clone(),
                        key: format!("key-{k:04}").into_bytes(),
                        limit: 4,
                        cursor: cursor.clone(),
                        ..Default::default()
                    })
                    .await
                    .expect("scan_key")
                    .into_inner();
                fetched += r.cold_bytes_fetched;
                cached += r.cold_bytes_cached;
                by_key.extend(r.rows);
                if r.next_cursor.is_empty() {
                    break;
                }
                cursor = r.next_cursor;
            }
        }
        let g = self
            .client
            .get(pb::GetRequest {
                namespace: self.ns.clone(),
                key: b"key-0003".to_vec(),
                ..Default::default()
            })
            .await
            .expect("get")
            .into_inner();
        fetched += g.cold_bytes_fetched;
        cached += g.cold_bytes_cached;
        (scan, by_key, g.row, fetched, cached)
    }

    /// The error of one Scan of the whole namespace, or `None` when it
    /// returned rows.
    async fn scan_error(&mut self) -> Option<tonic::Status> {
        self.client
            .scan(pb::ScanRequest {
                namespace: self.ns.clone(),
                limit: 1000,
                ..Default::default()
            })
            .await
            .err()
    }

    async fn seal_all(&self) {
        for r in self.node.replicas() {
            self.node
                .seal(r.tablet.id, stele_proto::command::SealReason::Operator)
                .await
                .expect("seal");
        }
    }

    /// Waits until every segment of every tablet is read from the bucket.
    async fn wait_all_cold(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut segs = 0;
            let mut cold = 0;
            for r in self.node.replicas() {
                let data = r.tablet.read();
                segs += data.segments.len();
                cold += data
                    .segments
                    .iter()
                    .filter(|(s, reader)| s.cold.is_some() && reader.is_remote())
                    .count();
            }
            if segs > 0 && segs == cold {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "segments not evicted: {cold} of {segs} cold"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn local_segment_files(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for t in std::fs::read_dir(dir.join("segments")).unwrap() {
        for f in std::fs::read_dir(t.unwrap().path()).unwrap() {
            if f.unwrap().file_name().to_string_lossy().ends_with(".seg") {
                n += 1;
            }
        }
    }
    n
}

/// The suite every store runs.
async fn round_trip(tier_opts: TierOptions) {
    let dir = tempfile::tempdir().unwrap();
    let tier = Tier::open(tier_opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    let hot = n.read_all().await;
    assert_eq!(hot.0.len(), 400);
    assert_eq!(
        (hot.3, hot.4),
        (0, 0),
        "memtable reads report no cold bytes"
    );

    n.seal_all().await;
    n.wait_all_cold().await;
    assert_eq!(local_segment_files(dir.path()), 0, "evicted files remain");
    assert!(tier.stats.segments_uploaded.load(Ordering::Relaxed) >= 1);

    tier.cache.clear();
    let cold = n.read_all().await;
    assert_eq!(cold.0, hot.0, "Scan differs from the cold tier");
    assert_eq!(cold.1, hot.1, "ScanKey differs from the cold tier");
    assert_eq!(cold.2, hot.2, "Get differs from the cold tier");
    assert!(cold.3 > 0, "a cold read reports bytes fetched");
    let warm = n.read_all().await;
    assert_eq!(warm.0, hot.0);
    assert_eq!(warm.3, 0, "a warm cache fetches nothing");
    assert!(warm.4 > 0, "a warm read reports cached bytes");

    // Every replica recorded the cold copy durably: a restart opens the
    // evicted segments from the bucket.
    n.stop().await;
    let tier = Tier::open(tier_opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    let again = n.read_all().await;
    assert_eq!(again.0, hot.0, "Scan after restart");
    assert_eq!(again.1, hot.1, "ScanKey after restart");

    // Manifests are published; keys hold only opaque ids.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let keys = loop {
        let keys: Vec<String> = tier
            .store
            .list(Some(&tier.prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        if keys.iter().filter(|k| k.contains("/manifests/")).count() >= 1 {
            break keys;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no manifests: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check_keys_opaque(&tier, &keys);
    n.stop().await;
}

/// Every key is `<prefix>/cells/<cell>/tablets/<n>/(segments/<hex32>.seg |
/// manifests/<20 digits>.cbor)`: no namespace label anywhere.
fn check_keys_opaque(tier: &Tier, keys: &[String]) {
    let prefix = tier.prefix.to_string();
    for key in keys {
        assert!(!key.contains("tenant") && !key.contains("orders"), "{key}");
        let rest = key
            .strip_prefix(&prefix)
            .unwrap_or(key)
            .trim_start_matches('/');
        let parts: Vec<&str> = rest.split('/').collect();
        assert_eq!(parts.len(), 6, "{key}");
        assert_eq!(
            (parts[0], parts[1], parts[2]),
            ("cells", "cell-7", "tablets"),
            "{key}"
        );
        assert!(parts[3].bytes().all(|b| b.is_ascii_digit()), "{key}");
        let ok = match parts[4] {
            "segments" => parts[5].len() == 36 && parts[5].ends_with(".seg"),
            "manifests" => parts[5].len() == 25 && parts[5].ends_with(".cbor"),
            _ => false,
        };
        assert!(ok, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_round_trip_local_filesystem() {
    let bucket = tempfile::tempdir().unwrap();
    round_trip(tier_options(&format!("file://{}", bucket.path().display()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs S3 (moto); scripts/test runs them"]
async fn cold_round_trip_s3() {
    let endpoint = s3_endpoint();
    let prefix = format!("rt-{}", std::process::id());
    round_trip(s3_tier_options(&endpoint, &prefix)).await;
}

/// A segment object damaged in the bucket is detected on read: the read
/// fails with an error, it never returns rows from the damaged block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_cold_object_is_detected_on_read() {
    let bucket = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = tier_options(&format!("file://{}", bucket.path().display()));
    let tier = Tier::open(opts).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    n.seal_all().await;
    n.wait_all_cold().await;
    // Flip a byte inside the first block of every segment object.
    let mut damaged = 0;
    for entry in walk(bucket.path()) {
        if entry.extension().is_some_and(|e| e == "seg") {
            let mut bytes = std::fs::read(&entry).unwrap();
            let r = stele_node::segment::SegmentReader::open(&entry).unwrap();
            let at = r.block_offsets()[0] as usize + 10;
            bytes[at] ^= 0xff;
            std::fs::write(&entry, &bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged >= 1);
    tier.cache.clear();
    let err = n
        .scan_error()
        .await
        .expect("a damaged cold block must not be returned as data");
    assert!(
        err.message().contains("crc32c") || err.message().contains("corrupt"),
        "{}",
        err.message()
    );
    n.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A moto server started by the test itself (so it can stop it), on a
/// fixed port so a restart keeps the endpoint.
struct Moto {
    child: std::process::Child,
    port: u16,
}

impl Moto {
    fn start(port: u16) -> Moto {
        let bin = moto_server();
        let mut child = std::process::Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start moto_server");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            let ok = std::process::Command::new("curl")
                .args(["-sf", "-X", "PUT", &format!("{url}/stele-test")])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Moto { child, port };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("moto did not come up on {url}");
    }

    fn stop(self) {
        drop(self);
    }
}

/// A test that panics still stops its server.
impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The S3 server is down while segments seal: nothing is evicted (no cold
/// copy is confirmed), uploads fail and are retried; once the server is
/// back, uploads resume and the cold tier answers reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs S3 (moto); scripts/test runs them"]
async fn s3_outage_delays_uploads_and_evicts_nothing_early() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let moto = Moto::start(port);
    let endpoint = format!("http://127.0.0.1:{}", moto.port);
    let mut opts = s3_tier_options(&endpoint, "outage");
    opts.upload_attempts_max = 2;
    opts.upload_backoff = Duration::from_millis(50);
    let tier = Tier::open(opts).expect("tier");
    let dir = tempfile::tempdir().unwrap();
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    moto.stop();
    n.seal_all().await;
    // Ingest goes on while the bucket is down.
    n.ingest(40, 2).await;
    let hot = n.read_all().await;
    assert_eq!(hot.0.len(), 480);
    // Give the worker several rounds against the dead server.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while tier.stats.upload_failures.load(Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "no upload failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in n.node.replicas() {
        for (s, reader) in &r.tablet.read().segments {
            assert!(s.cold.is_none(), "Uploaded without a server");
            assert!(!reader.is_remote(), "evicted without a cold copy");
        }
    }
    assert!(local_segment_files(dir.path()) >= 1);
    assert_eq!(tier.stats.segments_evicted.load(Ordering::Relaxed), 0);

    let moto = Moto::start(port);
    n.wait_all_cold().await;
    tier.cache.clear();
    let cold = n.read_all().await;
    assert_eq!(cold.0, hot.0);
    assert_eq!(cold.1, hot.1);
    assert!(cold.3 > 0);
    n.stop().await;
    moto.stop();
}

async fn wait_manifests(tier: &Tier, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let keys: Vec<String> = tier
            .store
            .list(Some(&tier.prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        if keys.iter().filter(|k| k.contains("/manifests/")).count() >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no manifests: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every data directory of the cell is deleted; `restore` rebuilds every
/// sealed and uploaded record from manifests and segments alone, and a
/// damaged object makes it fail loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_rebuilds_sealed_rows_from_the_bucket() {
    let bucket = tempfile::tempdir().unwrap();
    let opts = tier_options(&format!("file://{}", bucket.path().display()));
    let dir = tempfile::tempdir().unwrap();
    let tier = Tier::open(opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    let acked = n.read_all().await;
    n.seal_all().await;
    n.wait_all_cold().await;
    wait_manifests(&tier, 1).await;
    n.stop().await;
    drop(tier);
    std::fs::remove_dir_all(dir.path()).unwrap();

    let restored = tempfile::tempdir().unwrap();
    let tier = Tier::open(opts.clone()).expect("tier");
    let report = stele_node::tier::restore::restore(&tier, restored.path(), 1, None, &())
        .await
        .expect("restore");
    assert!(!report.tablets.is_empty());
    let rows: u64 = report.tablets.iter().map(|t| t.3).sum();
    assert_eq!(rows, 400);
    let mut n = start(options(restored.path(), tier.clone())).await;
    let back = n.read_all().await;
    assert_eq!(back.0, acked.0, "Scan after restore");
    assert_eq!(back.1, acked.1, "ScanKey after restore");
    assert_eq!(back.2, acked.2, "Get after restore");
    // The restored cell takes writes on every range.
    n.ingest(50, 1).await;
    n.stop().await;

    // A damaged segment object: restore refuses.
    for p in walk(bucket.path()) {
        if p.extension().is_some_and(|e| e == "seg") {
            let mut b = std::fs::read(&p).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x55;
            std::fs::write(&p, &b).unwrap();
        }
    }
    let again = tempfile::tempdir().unwrap();
    let err = stele_node::tier::restore::restore(&tier, &again.path().join("d"), 1, None, &())
        .await
        .expect_err("a damaged object must fail the restore");
    assert!(err.to_string().contains("does not match"), "{err}");
}

/// The conditional-PUT semantics the tier relies on, against a real S3
/// server: a manifest generation is created once (the second writer loses
/// and moves to the next generation), and a segment upload retried after
/// success finds its own object and verifies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs S3 (moto); scripts/test runs them"]
async fn s3_create_if_absent_semantics() {
    use stele_node::tier::manifest::{self, Manifest, Publish};
    use stele_node::tier::upload::{self, Outcome};
    let endpoint = s3_endpoint();
    let tier = Tier::open(s3_tier_options(
        &endpoint,
        &format!("sem-{}", std::process::id()),
    ))
    .expect("tier");
    let m = |generation: u64, checkpoint: u64| Manifest {
        v: manifest::MANIFEST_V,
        cell: "cell-7".into(),
        tablet: 9,
        generation,
        tablet_generation: 1,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        checkpoint,
        segments: vec![],
        receipt_window_us: 0,
        receipts: vec![],
    };
    let store = tier.store.as_ref();
    assert_eq!(
        manifest::publish(store, &tier.prefix, &m(1, 10))
            .await
            .unwrap(),
        Publish::Won
    );
    assert_eq!(
        manifest::publish(store, &tier.prefix, &m(1, 11))
            .await
            .unwrap(),
        Publish::Lost
    );
    assert_eq!(
        manifest::read(store, &tier.prefix, "cell-7", 9, 1)
            .await
            .unwrap()
            .checkpoint,
        10,
        "the loser must not have replaced the winner"
    );
    let (o, g) = manifest::publish_next(store, &tier.prefix, "cell-7", 9, 3, |g| m(g, 11))
        .await
        .unwrap();
    assert_eq!((o, g), (Publish::Won, 2));

    let dir = tempfile::tempdir().unwrap();
    let header = stele_node::segment::SegmentHeader {
        tablet: 9,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        log_first: 1,
        log_last: 1,
    };
    let row = stele_node::segment::Row {
        namespace: "n/s".into(),
        key: b"k".to_vec(),
        ts: 1,
        index: 1,
        slot: 0,
        value: b"v".to_vec(),
        vshard: 0,
        tablet: 0,
    };
    let info =
        stele_node::segment::write(dir.path(), &header, &[row], &Default::default()).unwrap();
    let path = dir.path().join(stele_node::segment::file_name(&info.id));
    let key = tier.segment_key(9, &info.id);
    assert_eq!(
        upload::upload(store, &key, &path, &info.id, &tier.options)
            .await
            .unwrap(),
        Outcome::Created
    );
    assert_eq!(
        upload::upload(store, &key, &path, &info.id, &tier.options)
            .await
            .unwrap(),
        Outcome::AlreadyPresent
    );
}

/// Namespace retention drops whole segments of an expired namespace,
/// locally and in the bucket (after a manifest without them is published),
/// here after they were uploaded and evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_expired_segments_locally_and_in_the_bucket() {
    let bucket = tempfile::tempdir().unwrap();
    let opts = tier_options(&format!("file://{}", bucket.path().display()));
    let dir = tempfile::tempdir().unwrap();
    let tier = Tier::open(opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    n.seal_all().await;
    n.wait_all_cold().await;
    wait_manifests(&tier, 1).await;
    n.stop().await;
    drop(tier);

    // Restart with a retention period: rows were written with ts about
    // 1 ms after the epoch, long expired.
    let mut opts = opts;
    opts.retention
        .insert(NS.to_string(), Duration::from_secs(3600));
    let tier = Tier::open(opts).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let segs: usize = n
            .node
            .replicas()
            .iter()
            .map(|r| r.tablet.read().segments.len())
            .sum();
        let rows = n.read_all().await.0.len();
        let objects: Vec<String> = tier
            .store
            .list(Some(&tier.prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        let seg_objects = objects.iter().filter(|k| k.ends_with(".seg")).count();
        if segs == 0 && rows == 0 && seg_objects == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retention did not drop: {segs} segments, {rows} rows, {seg_objects} objects"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every tablet's latest manifest names no segment.
    for id in n.node.replicas().iter().map(|r| r.tablet.id) {
        let store = tier.store.as_ref();
        if let Some(g) =
            stele_node::tier::manifest::latest_generation(store, &tier.prefix, "cell-7", id)
                .await
                .unwrap()
        {
            let m = stele_node::tier::manifest::read(store, &tier.prefix, "cell-7", id, g)
                .await
                .unwrap();
            assert!(m.segments.is_empty(), "{m:?}");
        }
    }
    assert_eq!(local_segment_files(dir.path()), 0);
    n.stop().await;
}

/// Retention never touches a namespace without a period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_namespaces_without_a_period() {
    let bucket = tempfile::tempdir().unwrap();
    let mut opts = tier_options(&format!("file://{}", bucket.path().display()));
    opts.retention
        .insert("some/other".to_string(), Duration::from_secs(1));
    let tier = Tier::open(opts).expect("tier");
    let dir = tempfile::tempdir().unwrap();
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    let hot = n.read_all().await;
    n.seal_all().await;
    n.wait_all_cold().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = n.read_all().await;
    assert_eq!(after.0, hot.0);
    n.stop().await;
}

/// A TCP proxy in front of the S3 server that can make it unreachable: on
/// `cut_after(n)` it forwards `n` more request bytes, then drops every
/// connection mid-stream and refuses new ones until `restore()`.
struct CutProxy {
    port: u16,
    up: tokio::sync::watch::Sender<bool>,
    /// Request bytes still forwarded before the cut (negative: not armed).
    budget: Arc<std::sync::atomic::AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    async fn start(upstream: u16) -> CutProxy {
        use std::sync::atomic::AtomicI64;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, _) = tokio::sync::watch::channel(true);
        let budget = Arc::new(AtomicI64::new(-1));
        let (up2, budget2) = (up.clone(), budget.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                if !*up2.borrow() {
                    continue; // dropped: connection reset
                }
                let (up3, budget3) = (up2.clone(), budget2.clone());
                let mut watch = up2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut upstream) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut dr, mut dw) = down.split();
                    let (mut ur, mut uw) = upstream.split();
                    let requests = async {
                        let mut buf = vec![0u8; 16 << 10];
                        loop {
                            let n = dr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<(), std::io::Error>(());
                            }
                            let mut n_fwd = n;
                            let left = budget3.load(Ordering::SeqCst);
                            if left >= 0 {
                                let after = left - n as i64;
                                budget3.store(after.max(-2), Ordering::SeqCst);
                                if after <= 0 {
                                    // Forward what the budget allows, then cut.
                                    n_fwd = left as usize;
                                    uw.write_all(&buf[..n_fwd]).await?;
                                    up3.send_replace(false);
                                    return Ok(());
                                }
                            }
                            uw.write_all(&buf[..n_fwd]).await?;
                        }
                    };
                    let replies = tokio::io::copy(&mut ur, &mut dw);
                    tokio::select! {
                        _ = requests => {}
                        _ = replies => {}
                        _ = watch.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        CutProxy {
            port,
            up,
            budget,
            task,
        }
    }

    fn cut_after(&self, bytes: i64) {
        self.budget.store(bytes, Ordering::SeqCst);
    }

    fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    fn restore(&self) {
        self.budget.store(-1, Ordering::SeqCst);
        self.up.send_replace(true);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The S3 server becomes unreachable in the middle of a segment upload and
/// stays so for two minutes while ingest goes on. Nothing is evicted
/// without a confirmed cold copy, so the node's (simulated) disk fills to
/// its reserve and appends are refused with `StorageFull` (reads go on),
/// losing nothing.
/// Once S3 is back, uploads resume, eviction frees the disk, appends are
/// accepted again, and every acknowledged record reads back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs S3 (moto); scripts/test runs them"]
async fn s3_unreachable_for_minutes_fills_the_disk_to_its_reserve_and_loses_nothing() {
    let outage = Duration::from_secs(
        std::env::var("STELE_TEST_S3_OUTAGE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let moto_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let moto = Moto::start(moto_port);
    let proxy = CutProxy::start(moto_port).await;
    let mut topts = s3_tier_options(&format!("http://127.0.0.1:{}", proxy.port), "fill");
    // Eviction by the disk watermarks only, not by age.
    topts.hot_age = Duration::from_secs(3600);
    topts.upload_attempts_max = 2;
    topts.upload_backoff = Duration::from_millis(100);
    let tier = Tier::open(topts).expect("tier");
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path(), tier.clone());
    o.tablet.memtable_bytes_max = 512 << 10;
    o.disk_reserve_bytes = 4 << 20;
    let faults = o.journal.faults.clone();
    let mut n = start(o).await;
    // A 40 MiB disk, of which the data directory holds what it holds now.
    let used = stele_node::fsutil::tree_bytes(dir.path()).unwrap();
    faults.set_disk_bytes(Some(used + (40 << 20)));

    // Incompressible, so segments are as large as their rows and the cut
    // lands inside a segment's PUT body.
    let value = |b: u64, i: usize| {
        let mut v = format!("b{b:06} r{i:03} ").into_bytes();
        let mut x = (b << 8 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        while v.len() < 4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(4096);
        v
    };
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let mut batch = 0u64;
    let tablets = n
        .client
        .list_tablets(pb::ListTabletsRequest {})
        .await
        .unwrap()
        .into_inner()
        .tablets;
    // One batch of 32 records of 4 KiB to one tablet; Ok(()) when acked.
    let data = n.client.clone();
    let append = |batch: u64| {
        let key = format!("fill-{batch:06}").into_bytes();
        let v = stele_proto::vshard::vshard(NS, &key);
        let t = tablets
            .iter()
            .find(|t| v >= t.vshard_lo && u64::from(v) < t.vshard_hi)
            .unwrap();
        let records: Vec<pb::Record> = (0..32)
            .map(|i| pb::Record {
                key: key.clone(),
                ts: 1 + i as u64,
                value: value(batch, i),
                routing_key: None,
            })
            .collect();
        let req = pb::AppendRequest {
            tablet: t.id,
            generation: t.generation,
            batch_id: (1u128 << 64 | u128::from(batch)).to_be_bytes().to_vec(),
            namespace: NS.into(),
            records,
            ..Default::default()
        };
        let mut c = data.clone();
        async move { c.append(req).await.map(|_| ()) }
    };

    // Before the outage: a few MiB, uploaded normally.
    for _ in 0..40 {
        batch += 1;
        append(batch).await.expect("append before the outage");
        acked.extend((0..32).map(|i| value(batch, i)));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while tier.stats.segments_uploaded.load(Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing uploaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Cut the connection 100 KiB into the next upload.
    proxy.cut_after(100 << 10);
    let outage_began = std::time::Instant::now();
    let evicted_at_cut = tier.stats.segments_evicted.load(Ordering::Relaxed);
    let mut refused = 0u64;
    let mut full_at = None;
    while outage_began.elapsed() < outage {
        batch += 1;
        match append(batch).await {
            Ok(()) => acked.extend((0..32).map(|i| value(batch, i))),
            Err(status) => match stele_proto::Error::from_status(&status) {
                stele_proto::Error::StorageFull { .. } => {
                    refused += 1;
                    if full_at.is_none() {
                        full_at = Some(outage_began.elapsed());
                        // A full disk refuses ingest, not reads.
                        let (rows, ..) = n.read_all().await;
                        assert_eq!(rows.len(), acked.len(), "reads while the disk is full");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => panic!("append during the outage: {other}"),
            },
        }
    }
    assert!(!proxy.is_up(), "the upload was never cut");
    let full_at = full_at.expect("the disk never filled to its reserve");
    assert!(refused > 0);
    assert!(tier.stats.upload_failures.load(Ordering::Relaxed) > 0);
    // Nothing without a confirmed cold copy was evicted.
    assert_eq!(
        tier.stats.segments_evicted.load(Ordering::Relaxed),
        evicted_at_cut,
        "evicted during the outage"
    );
    for r in n.node.replicas() {
        for (s, reader) in &r.tablet.read().segments {
            assert!(
                !reader.is_remote() || s.cold.is_some(),
                "evicted without a cold copy"
            );
        }
    }
    eprintln!(
        "outage of {outage:?}: disk full after {full_at:?}, {refused} appends refused with StorageFull, {} acknowledged",
        acked.len() / 32
    );

    // S3 is back: uploads resume, eviction frees the disk, appends resume.
    proxy.restore();
    let back = std::time::Instant::now();
    loop {
        batch += 1;
        match append(batch).await {
            Ok(()) => {
                acked.extend((0..32).map(|i| value(batch, i)));
                break;
            }
            Err(status) => {
                assert!(
                    matches!(
                        stele_proto::Error::from_status(&status),
                        stele_proto::Error::StorageFull { .. }
                    ),
                    "{status}"
                );
                assert!(
                    back.elapsed() < Duration::from_secs(90),
                    "appends still refused {:?} after S3 came back",
                    back.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // Eviction counts a segment after removing its file and syncing the
    // directory: an append may be accepted on the freed space just before.
    let counted = std::time::Instant::now();
    while tier.stats.segments_evicted.load(Ordering::Relaxed) <= evicted_at_cut
        && counted.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tier.stats.segments_evicted.load(Ordering::Relaxed) > evicted_at_cut);
    eprintln!(
        "appends accepted again {:?} after S3 came back",
        back.elapsed()
    );

    // Every acknowledged record, exactly once.
    tier.cache.clear();
    let (rows, ..) = n.read_all().await;
    let mut seen: std::collections::HashMap<Vec<u8>, usize> = Default::default();
    for r in rows {
        *seen.entry(r.value).or_default() += 1;
    }
    assert!(seen.values().all(|c| *c == 1), "a record read twice");
    let missing = acked.iter().filter(|v| !seen.contains_key(*v)).count();
    assert_eq!(missing, 0, "acknowledged records missing");
    n.stop().await;
    drop(proxy);
    moto.stop();
}

/// A merge in a cell with a cold tier: the survivor adopts the absorbed
/// tablet's evicted segments by reference (their objects stay under the
/// absorbed tablet), publishes a manifest over the merged range, and a
/// restore from the bucket alone takes the survivor's range, drops the
/// absorbed tablet's stale manifest and reads every row back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_after_a_merge_takes_the_survivors_range() {
    use stele_proto::command::TabletCommand;
    let bucket = tempfile::tempdir().unwrap();
    let opts = tier_options(&format!("file://{}", bucket.path().display()));
    let dir = tempfile::tempdir().unwrap();
    let tier = Tier::open(opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    // Rows in the tablet to be absorbed (tablet 1, [0, 2^31)).
    n.ns = (0..)
        .map(|i| format!("{NS}-{i}"))
        .find(|ns| stele_proto::vshard::namespace_range(ns).1 < 1 << 31)
        .unwrap();
    n.ingest(40, 10).await;
    let acked = n.read_all().await;
    n.seal_all().await;
    n.wait_all_cold().await;
    wait_manifests(&tier, 1).await;
    let (r1, r2) = (n.node.replica(1).unwrap(), n.node.replica(2).unwrap());
    r1.raft
        .client_write(TabletCommand::Freeze { generation: 0 })
        .await
        .unwrap();
    let (alo, ahi) = r1.tablet.range();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !{
        let d = r1.tablet.read();
        d.published.frozen && d.frozen.is_empty()
    } {
        assert!(std::time::Instant::now() < deadline, "never frozen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r2.raft
        .client_write(TabletCommand::Merge {
            absorbed: 1,
            lo: alo,
            hi: ahi,
            generation: 50,
        })
        .await
        .unwrap();
    drop((r1, r2));
    // The survivor's manifest over the merged range.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let g = stele_node::tier::manifest::latest_generation(
            tier.store.as_ref(),
            &tier.prefix,
            &tier.options.cell,
            2,
        )
        .await
        .unwrap();
        if let Some(g) = g {
            let m = stele_node::tier::manifest::read(
                tier.store.as_ref(),
                &tier.prefix,
                &tier.options.cell,
                2,
                g,
            )
            .await
            .unwrap();
            if m.vshard_lo == 0 {
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "no merged manifest");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(n.read_all().await.0, acked.0, "Scan after the merge");
    let acked_ns = n.ns.clone();
    n.stop().await;
    drop(tier);
    std::fs::remove_dir_all(dir.path()).unwrap();

    let restored = tempfile::tempdir().unwrap();
    let tier = Tier::open(opts).expect("tier");
    let report = stele_node::tier::restore::restore(&tier, restored.path(), 1, None, &())
        .await
        .expect("restore");
    assert_eq!(
        report.tablets.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![2],
        "{report:?}"
    );
    assert!(report.empty_tablets.is_empty(), "{report:?}");
    let mut n = start(options(restored.path(), tier.clone())).await;
    n.ns = acked_ns;
    let back = n.read_all().await;
    assert!(!back.0.is_empty());
    assert_eq!(back.0, acked.0, "Scan after restore");
    assert_eq!(back.1, acked.1, "ScanKey after restore");
    n.ingest(50, 1).await;
    n.stop().await;
}

fn stub_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    walk(&dir.join("segments"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "stub"))
        .collect()
}

/// A node restarted while its bucket is unreachable opens every tablet
/// from local state (evicted segments from their stubs), takes appends and
/// serves what is local; reads that need an evicted block fail with an
/// error, never with partial rows, and answer in full once the bucket is
/// back. A damaged stub is refused and the object read instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarts_while_its_bucket_is_unreachable() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = tier_options(&format!("file://{}", bucket.display()));
    let tier = Tier::open(opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    n.ingest(40, 10).await;
    n.seal_all().await;
    n.wait_all_cold().await;
    let evicted = tier.stats.segments_evicted.load(Ordering::Relaxed) as usize;
    assert!(evicted >= 1);
    assert_eq!(
        stub_files(dir.path()).len(),
        evicted,
        "one stub per evicted segment"
    );
    n.ingest(40, 2).await;
    let hot = n.read_all().await;
    assert_eq!(hot.0.len(), 480);
    n.stop().await;

    // Every segment object is gone for the restart (moved aside: the
    // store creates a missing bucket directory, and the node's manifest
    // writes may go on).
    let objects: Vec<_> = walk(&bucket)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert!(!objects.is_empty());
    for o in &objects {
        std::fs::rename(o, o.with_extension("away")).unwrap();
    }
    let tier = Tier::open(opts.clone()).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    assert_eq!(
        tier.stats.cold_bytes_fetched.load(Ordering::Relaxed),
        0,
        "opening read the bucket"
    );
    for r in n.node.replicas() {
        let data = r.tablet.read();
        assert!(
            data.segments.iter().all(|(_, reader)| reader.is_remote()),
            "tablet {} has a local file for an evicted segment",
            r.tablet.id
        );
    }
    // Appends go on (new batch ids: the old ones are receipted), and a Get
    // answered from memory works.
    n.batches = 1_000;
    n.ingest(40, 1).await;
    let latest = n
        .client
        .get(pb::GetRequest {
            namespace: NS.into(),
            key: b"key-0003".to_vec(),
            ..Default::default()
        })
        .await
        .expect("a Get answered from memory")
        .into_inner();
    assert!(latest.row.is_some());
    // A read that needs an evicted block fails; it returns no partial rows.
    let err = n
        .scan_error()
        .await
        .expect("a scan over evicted blocks without the bucket");
    assert!(err.message().contains("i/o"), "{}", err.message());

    // The objects are back: every row, the 40 new ones included.
    for o in &objects {
        std::fs::rename(o.with_extension("away"), o).unwrap();
    }
    let back = n.read_all().await;
    assert_eq!(back.0.len(), 520);
    for row in &hot.0 {
        assert!(back.0.contains(row), "row lost: {row:?}");
    }
    n.stop().await;

    // A damaged stub is refused, removed and written again from the object.
    let stubs = stub_files(dir.path());
    let mut bytes = std::fs::read(&stubs[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(&stubs[0], &bytes).unwrap();
    let tier = Tier::open(opts).expect("tier");
    let mut n = start(options(dir.path(), tier.clone())).await;
    assert_eq!(tier.stats.stubs_refused.load(Ordering::Relaxed), 1);
    assert_ne!(
        std::fs::read(&stubs[0]).unwrap(),
        bytes,
        "stub not rewritten"
    );
    assert_eq!(n.read_all().await.0, back.0);
    n.stop().await;
}
