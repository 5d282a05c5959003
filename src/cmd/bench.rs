//! `stele bench`: durable-append load against a cell, or with
//! `--fsync-probe DIR` the device's raw 4 KiB write + fdatasync rate. The
//! work is in functions that return data (`bench`, `fsync_probe`), the
//! printing in `run_bench`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use stele_client::{Client, ClientOptions, record};

use super::client::{DEFAULT_ENDPOINT, now_us};

/// `stele bench`: durable-append load against a cell, or `--fsync-probe DIR`
/// to measure the device's 4 KiB write + fdatasync rate.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Worker tasks, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Bytes per record, key included.
    #[arg(long, default_value_t = 256)]
    pub record_bytes: usize,
    /// Records per request.
    #[arg(long, default_value_t = 16)]
    pub batch_records: usize,
    /// How long to run: `10s`, `500ms`, `2m` (default 10s; 5s with --fsync-probe).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Namespaces `bench/ns0` .. `bench/ns{N-1}` to spread records over.
    #[arg(long, default_value_t = 16)]
    pub namespaces: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Measure the device under DIR instead of a cell.
    #[arg(long, value_name = "DIR")]
    pub fsync_probe: Option<PathBuf>,
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: want e.g. 10s, 500ms, 2m"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" | "secs" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "m" | "min" | "mins" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "bad duration unit {other:?} in {s:?}: want ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("bad duration {s:?}: {e}"))
}

/// The result of a bench run; `--json` prints exactly these fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub records_per_s: f64,
    /// Record bytes (key + value) acknowledged per second, in 10^6 bytes.
    pub mb_per_s: f64,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Journal fsyncs of the node (its `Status`) during the run, per second.
    pub fsyncs_per_s: f64,
    pub records_per_fsync: f64,
    pub records_acked: u64,
    pub errors: u64,
    pub concurrency: usize,
    pub record_bytes: usize,
    pub batch_records: usize,
    pub duration_s: f64,
}

impl BenchReport {
    pub fn human(&self) -> String {
        format!(
            "{:.0} records/s, {:.2} MB/s, {:.0} requests/s over {:.1} s\n\
             latency per request: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms\n\
             node fsyncs: {:.0}/s, {:.1} records per fsync\n\
             {} records acked, {} errors (concurrency {}, {} records x {} bytes per request)",
            self.records_per_s,
            self.mb_per_s,
            self.requests_per_s,
            self.duration_s,
            self.p50_ms,
            self.p99_ms,
            self.p999_ms,
            self.fsyncs_per_s,
            self.records_per_fsync,
            self.records_acked,
            self.errors,
            self.concurrency,
            self.batch_records,
            self.record_bytes,
        )
    }
}

struct WorkerResult {
    hist: Histogram<u64>,
    records: u64,
    requests: u64,
    errors: u64,
}

/// Runs the append load for `duration` and measures it.
pub async fn bench(args: &BenchArgs, duration: Duration) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.batch_records > 0, "--batch-records must be at least 1");
    anyhow::ensure!(args.namespaces > 0, "--namespaces must be at least 1");
    let client = Client::connect(&args.endpoint, ClientOptions::default())
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    let namespaces: Arc<Vec<String>> = Arc::new(
        (0..args.namespaces)
            .map(|i| format!("bench/ns{i}"))
            .collect(),
    );
    let fsyncs_before = fsyncs(&client).await;
    let started = Instant::now();
    let deadline = started + duration;
    let first_error = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..args.concurrency {
        let client = client.clone();
        let namespaces = namespaces.clone();
        let first_error = first_error.clone();
        let (record_bytes, batch_records) = (args.record_bytes, args.batch_records);
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::from_os_rng();
            let mut out = WorkerResult {
                hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
                records: 0,
                requests: 0,
                errors: 0,
            };
            while Instant::now() < deadline {
                let ns = &namespaces[rng.random_range(0..namespaces.len())];
                let ts = now_us();
                let records = (0..batch_records)
                    .map(|_| {
                        let key = format!("w{w}-{:016x}", rng.random::<u64>());
                        let mut value = vec![0u8; record_bytes.saturating_sub(key.len())];
                        rng.fill_bytes(&mut value);
                        record(key, ts, value)
                    })
                    .collect();
                let t = Instant::now();
                let result = client.append(ns, records).await;
                out.requests += 1;
                match result {
                    Ok(_) => {
                        out.records += batch_records as u64;
                        let us = t.elapsed().as_micros().max(1) as u64;
                        out.hist.saturating_record(us);
                    }
                    Err(e) => {
                        if !first_error.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            eprintln!(
                                "warning: append failed (further errors are only counted): {e}"
                            );
                        }
                        out.errors += 1;
                    }
                }
            }
            out
        });
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let (mut records, mut requests, mut errors) = (0u64, 0u64, 0u64);
    while let Some(res) = workers.join_next().await {
        let w = res.context("bench worker panicked")?;
        hist.add(&w.hist)?;
        records += w.records;
        requests += w.requests;
        errors += w.errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let fsyncs_after = fsyncs(&client).await;
    let fsync_count = match (fsyncs_before, fsyncs_after) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let ms = |q: f64| {
        if hist.is_empty() {
            0.0
        } else {
            hist.value_at_quantile(q) as f64 / 1000.0
        }
    };
    Ok(BenchReport {
        records_per_s: records as f64 / elapsed,
        mb_per_s: (records as f64 * args.record_bytes as f64) / elapsed / 1e6,
        requests_per_s: requests as f64 / elapsed,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        fsyncs_per_s: fsync_count as f64 / elapsed,
        records_per_fsync: if fsync_count == 0 {
            0.0
        } else {
            records as f64 / fsync_count as f64
        },
        records_acked: records,
        errors,
        concurrency: args.concurrency,
        record_bytes: args.record_bytes,
        batch_records: args.batch_records,
        duration_s: elapsed,
    })
}

async fn fsyncs(client: &Client) -> Option<u64> {
    match client.status().await {
        Ok(s) => Some(s.journal_fsyncs),
        Err(e) => {
            eprintln!("warning: node status unavailable, fsyncs not measured: {e}");
            None
        }
    }
}

/// Writes 4 KiB and fdatasyncs it, in a loop, for `duration`, in a temporary
/// file under `dir` (removed afterwards). Returns fsyncs per second. The
/// file grows to at most 64 MiB, then is overwritten from the start, so
/// later syncs measure in-place overwrites as a preallocated journal would.
pub fn fsync_probe(dir: &Path, duration: Duration) -> anyhow::Result<f64> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4096;
    const FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
    let path = dir.join(format!(
        ".stele-fsync-probe-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let result = (|| -> anyhow::Result<f64> {
        let mut block = vec![0u8; BLOCK];
        rand::rng().fill_bytes(&mut block);
        let started = Instant::now();
        let (mut syncs, mut offset) = (0u64, 0u64);
        while started.elapsed() < duration || syncs == 0 {
            file.write_all_at(&block, offset)?;
            file.sync_data()?;
            syncs += 1;
            offset = (offset + BLOCK as u64) % FILE_BYTES_MAX;
        }
        Ok(syncs as f64 / started.elapsed().as_secs_f64())
    })();
    drop(file);
    let removed = std::fs::remove_file(&path);
    let rate = result.with_context(|| format!("probing {}", path.display()))?;
    removed.with_context(|| format!("removing {}", path.display()))?;
    Ok(rate)
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(dir) = args.fsync_probe.clone() {
        let duration = args.duration.unwrap_or(Duration::from_secs(5));
        let rate = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || fsync_probe(&dir, duration)
        })
        .await??;
        if args.json {
            println!("{}", serde_json::json!({ "fsyncs_per_s": rate }));
        } else {
            println!(
                "{}: {rate:.0} fsyncs/s (4 KiB write + fdatasync)",
                dir.display()
            );
        }
        return Ok(());
    }
    let duration = args.duration.unwrap_or(Duration::from_secs(10));
    let report = bench(&args, duration).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.human());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
