//! Cold-tier throughput, all phases in one run against one store:
//! upload (create-if-absent, `uploads_max` in flight), then a full scan of
//! every segment read from the bucket with a cold cache, the same scan with
//! a warm cache, and the same scan from the local files.
//!
//! ```text
//! cargo run -p stele-node --example tier_bench -- [SEGMENTS] [ROWS_PER_SEGMENT]
//! STELE_BENCH_S3_ENDPOINT=http://127.0.0.1:PORT   (else a file:// store in a temp dir)
//! ```
//! Prints one JSON line per phase.

use std::sync::Arc;
use std::time::Instant;

use stele_node::catalog::SegmentRef;
use stele_node::segment::{self, Row, SegmentHeader, SegmentReader, WriteOptions};
use stele_node::tier::{Tier, TierOptions, cold, upload};

fn rows(seg: u64, n: u64) -> Vec<Row> {
    let mut x = seg.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| Row {
            namespace: "bench/ns".into(),
            key: format!("key-{i:08}").into_bytes(),
            ts: i,
            index: seg * n + i + 1,
            slot: 0,
            value: (0..1000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Half-entropy values: zstd compresses them about 2x.
                    (x as u8) & 0x0f
                })
                .collect(),
            vshard: 0,
            tablet: 0,
        })
        .collect()
}

fn line(phase: &str, bytes: u64, rows: u64, secs: f64, extra: &str) {
    println!(
        "{{\"phase\":\"{phase}\",\"bytes\":{bytes},\"rows\":{rows},\"secs\":{secs:.3},\"mib_per_s\":{:.1}{extra}}}",
        bytes as f64 / secs / (1 << 20) as f64
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let segments = args.first().copied().unwrap_or(16);
    let per = args.get(1).copied().unwrap_or(4000);
    let local = tempfile::tempdir().unwrap();
    let bucket = tempfile::tempdir().unwrap();
    let mut opts = match std::env::var("STELE_BENCH_S3_ENDPOINT") {
        Ok(endpoint) => {
            let mut o = TierOptions::new(
                format!("s3://stele-test/bench-{}", std::process::id()),
                "bench",
            );
            o.s3_endpoint = Some(endpoint);
            o.s3_region = Some("us-east-1".into());
            o.s3_allow_http = true;
            o.s3_access_key_id = Some("testing".into());
            o.s3_secret_access_key = Some("testing".into());
            o
        }
        Err(_) => TierOptions::new(format!("file://{}", bucket.path().display()), "bench"),
    };
    opts.cache_bytes_max = 1 << 30;
    let store_url = opts.url.clone();
    let tier = Tier::open(opts).expect("tier");

    let mut refs = Vec::new();
    for s in 0..segments {
        let header = SegmentHeader {
            tablet: 1,
            vshard_lo: 0,
            vshard_hi: 1 << 32,
            log_first: s * per + 1,
            log_last: (s + 1) * per,
        };
        let info = segment::write(
            local.path(),
            &header,
            &rows(s, per),
            &WriteOptions::default(),
        )
        .expect("write segment");
        refs.push(SegmentRef {
            id: info.id,
            bytes: info.bytes,
            rows: info.rows,
            log_first: info.log_first,
            log_last: info.log_last,
            ts_min: info.ts_min,
            ts_max: info.ts_max,
            cold: None,
            origin: 0,
            shared: false,
            keep: None,
        });
    }
    let total: u64 = refs.iter().map(|r| r.bytes).sum();
    let total_rows = segments * per;
    let extra = format!(
        ",\"store\":\"{}\",\"segments\":{segments}",
        store_url.split('/').take(3).collect::<Vec<_>>().join("/")
    );

    // Upload, uploads_max in flight.
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(tier.options.uploads_max));
    let mut tasks = Vec::new();
    for r in &refs {
        let (tier, r, dir, sem) = (
            tier.clone(),
            r.clone(),
            local.path().to_owned(),
            sem.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            let key = tier.segment_key(1, &r.id);
            let path = dir.join(segment::file_name(&r.id));
            upload::upload(tier.store.as_ref(), &key, &path, &r.id, &tier.options)
                .await
                .expect("upload")
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    line(
        "upload",
        total,
        total_rows,
        t.elapsed().as_secs_f64(),
        &extra,
    );

    // Scans: every row of every segment.
    let scan_all = |readers: Arc<Vec<SegmentReader>>| async move {
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            let (n, read) = cold::counted(|| {
                readers
                    .iter()
                    .map(|r| r.scan("bench/ns", b"", 0, u64::MAX).unwrap().len() as u64)
                    .sum::<u64>()
            });
            (n, read, t.elapsed().as_secs_f64())
        })
        .await
        .unwrap()
    };
    let (tier2, refs2) = (tier.clone(), refs.clone());
    let stubs = tempfile::tempdir().unwrap();
    let stub_dir = stubs.path().to_owned();
    let cold_readers: Vec<SegmentReader> = tokio::task::spawn_blocking(move || {
        refs2
            .iter()
            .map(|r| cold::open_reader(&tier2, 1, r, &stub_dir).expect("open cold"))
            .collect()
    })
    .await
    .unwrap();
    let cold_readers = Arc::new(cold_readers);
    tier.cache.clear();
    let (n, read, secs) = scan_all(cold_readers.clone()).await;
    assert_eq!(n, total_rows);
    line(
        "scan_cold_cache",
        total,
        n,
        secs,
        &format!(
            "{extra},\"fetched\":{},\"cached\":{}",
            read.fetched, read.cached
        ),
    );
    let (n, read, secs) = scan_all(cold_readers).await;
    line(
        "scan_warm_cache",
        total,
        n,
        secs,
        &format!(
            "{extra},\"fetched\":{},\"cached\":{}",
            read.fetched, read.cached
        ),
    );
    let local_readers: Vec<SegmentReader> = refs
        .iter()
        .map(|r| {
            SegmentReader::open_with_id(&local.path().join(segment::file_name(&r.id)), &r.id)
                .unwrap()
        })
        .collect();
    let (n, _, secs) = scan_all(Arc::new(local_readers)).await;
    line("scan_local", total, n, secs, &extra);
}
