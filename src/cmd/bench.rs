//! `stele bench`: durable-append load against a cell (or reads, or both:
//! `--workload`, in `workload`), or with `--fsync-probe DIR` the device's
//! raw 4 KiB write + fdatasync rate. The
//! work is in functions that return data (`bench`, `fsync_probe`), the
//! printing in `run`. With `--verify` every acknowledged record is read
//! back after the load (`verify`). SIGTERM or SIGINT ends the load early;
//! the report (and verification) still follows.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use stele_client::{Client, RetryPolicy, record};
use tokio_util::sync::CancellationToken;

use self::workload::{ReadConsistency, Workload};
use super::client::{DEFAULT_ENDPOINT, now_us};
use super::duration::parse_duration;

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
    /// After the load, read back every acknowledged record; fail if one is
    /// lost or duplicated.
    #[arg(long)]
    pub verify: bool,
    /// How long one append keeps retrying (elections, leader transfers)
    /// before it counts as an error: `30s`, `500ms` (default 30s).
    #[arg(long, value_parser = parse_duration)]
    pub retry_budget: Option<Duration>,
    /// What each request does: `append`, `get` or `scan-key` of a key
    /// written before the load, or `mixed` (half appends, half gets).
    #[arg(long, value_enum, default_value = "append")]
    pub workload: Workload,
    /// Reads: `linearizable` (the leader, after a read index) or `bounded`
    /// (any replica at most --max-staleness behind).
    #[arg(long, value_enum, default_value = "linearizable")]
    pub consistency: ReadConsistency,
    /// Bounded reads: the oldest acceptable data (default 1s).
    #[arg(long, value_parser = parse_duration)]
    pub max_staleness: Option<Duration>,
    /// Reads: how many records are written before the load for them to
    /// look up (`--record-bytes` each).
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// Appends through this gateway's HTTP API (`http://host:port`, one
    /// keep-alive connection per worker) instead of gRPC; --endpoint still
    /// reads the node's counters and, with --verify, the records back.
    #[arg(long, value_name = "URL")]
    pub gateway: Option<String>,
}

/// The result of a bench run; `--json` prints exactly these fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// Records acknowledged (appends) plus rows returned (reads) per second.
    pub records_per_s: f64,
    /// Record bytes (key + value) acknowledged or read per second, in 10^6 bytes.
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
    /// The longest time without any acknowledgement (or read answer)
    /// during the load.
    pub max_stall_ms: f64,
    /// The load was ended early by SIGTERM or SIGINT.
    pub interrupted: bool,
    /// The read-back, with `--verify`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<verify::VerifyReport>,
    /// The reads, for a workload that reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads: Option<ReadReport>,
}

/// The reads of a `--workload` that reads. Their rows count in the
/// report's `records_per_s`; their latencies in its quantiles and here.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadReport {
    pub workload: Workload,
    pub consistency: ReadConsistency,
    pub reads_per_s: f64,
    /// Reads that answered.
    pub reads: u64,
    /// Reads that answered without the preloaded row: must be 0.
    pub misses: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

impl BenchReport {
    pub fn human(&self) -> String {
        format!(
            "{:.0} records/s, {:.2} MB/s, {:.0} requests/s over {:.1} s\n\
             latency per request: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms\n\
             node fsyncs: {:.0}/s, {:.1} records per fsync\n\
             {} records acked, {} errors (concurrency {}, {} records x {} bytes per request)\n\
             longest write stall: {:.0} ms{}",
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
            self.max_stall_ms,
            if self.interrupted {
                " (load ended early by a signal)"
            } else {
                ""
            },
        ) + &self
            .verify
            .as_ref()
            .map_or(String::new(), |v| format!("\n{}", v.human()))
            + &self.reads.as_ref().map_or(String::new(), |r| {
                format!(
                    "\nreads ({:?}, {:?}): {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, {} reads, {} without their row",
                    r.workload, r.consistency, r.reads_per_s, r.p50_ms, r.p99_ms, r.p999_ms, r.reads, r.misses
                )
            })
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

struct WorkerResult {
    hist: Histogram<u64>,
    /// Latencies of the reads alone.
    read_hist: Histogram<u64>,
    reads: u64,
    /// Rows the reads returned.
    rows: u64,
    misses: u64,
    records: u64,
    requests: u64,
    errors: u64,
    /// When each acknowledgement came, since the load started.
    acks: Vec<Duration>,
    /// The worker's number, in its keys.
    worker: usize,
    /// With `--verify`: the first sequence number of each acknowledged
    /// request; its records are that many consecutive numbers.
    acked: Vec<u64>,
}

/// The key of record `seq` of worker `w` in run `run`: unique in the run,
/// and all of a run's keys share the prefix [`run_prefix`].
fn bench_key(run: u32, w: usize, seq: u64) -> String {
    format!("{}w{w}-{seq:010}", run_prefix(run))
}

fn run_prefix(run: u32) -> String {
    format!("r{run:08x}-")
}

/// Runs the append load for `duration` and measures it.
#[cfg(test)]
pub async fn bench(args: &BenchArgs, duration: Duration) -> anyhow::Result<BenchReport> {
    bench_until(args, duration, CancellationToken::new()).await
}

/// [`bench`], ended early when `stop` is cancelled (requests in flight
/// finish first).
pub async fn bench_until(
    args: &BenchArgs,
    duration: Duration,
    stop: CancellationToken,
) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.batch_records > 0, "--batch-records must be at least 1");
    anyhow::ensure!(args.namespaces > 0, "--namespaces must be at least 1");
    anyhow::ensure!(
        !args.workload.reads() || args.keys > 0,
        "--keys must be at least 1 for a workload that reads"
    );
    let max_staleness = args.max_staleness.unwrap_or(Duration::from_secs(1));
    anyhow::ensure!(
        !max_staleness.is_zero(),
        "--max-staleness must be more than zero"
    );
    let read_options = args.consistency.options(max_staleness);
    let mut opts = crate::security::cli_options()?;
    if let Some(budget) = args.retry_budget {
        anyhow::ensure!(!budget.is_zero(), "--retry-budget must be positive");
        opts.retry = RetryPolicy::with_budget(budget);
    }
    let client = Client::connect(&args.endpoint, opts)
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    let run: u32 = rand::random();
    let namespaces: Arc<Vec<String>> = Arc::new(
        (0..args.namespaces)
            .map(|i| format!("bench/ns{i}"))
            .collect(),
    );
    let keys = if args.workload.reads() {
        workload::preload(
            &client,
            &namespaces,
            &run_prefix(run),
            args.keys,
            args.record_bytes,
        )
        .await?;
        args.keys
    } else {
        0
    };
    let fsyncs_before = fsyncs(&client).await;
    let started = Instant::now();
    let deadline = started + duration;
    let first_error = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..args.concurrency {
        let client = client.clone();
        let namespaces = namespaces.clone();
        let first_error = first_error.clone();
        let stop = stop.clone();
        let (record_bytes, batch_records, keep) =
            (args.record_bytes, args.batch_records, args.verify);
        let (kind, read) = (args.workload, read_options);
        let mut http = args
            .gateway
            .as_deref()
            .map(http::HttpAppender::new)
            .transpose()?;
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::from_os_rng();
            let mut out = WorkerResult {
                hist: new_hist(),
                read_hist: new_hist(),
                reads: 0,
                rows: 0,
                misses: 0,
                records: 0,
                requests: 0,
                errors: 0,
                acks: Vec::new(),
                worker: w,
                acked: Vec::new(),
            };
            let mut seq = 0u64;
            while Instant::now() < deadline && !stop.is_cancelled() {
                let reading = match kind {
                    Workload::Append => false,
                    Workload::Get | Workload::ScanKey => true,
                    Workload::Mixed => rng.random_bool(0.5),
                };
                if reading {
                    let (ns, key) = workload::preloaded(
                        &namespaces,
                        &run_prefix(run),
                        rng.random_range(0..keys),
                    );
                    let t = Instant::now();
                    let result =
                        workload::read_one(&client, kind, &namespaces[ns], &key, read).await;
                    out.requests += 1;
                    match result {
                        Ok(rows) => {
                            let us = t.elapsed().as_micros().max(1) as u64;
                            out.hist.saturating_record(us);
                            out.read_hist.saturating_record(us);
                            out.acks.push(started.elapsed());
                            out.reads += 1;
                            out.rows += rows;
                            out.misses += u64::from(rows == 0);
                        }
                        Err(e) => {
                            if !first_error.swap(true, std::sync::atomic::Ordering::Relaxed) {
                                eprintln!(
                                    "warning: read failed (further errors are only counted): {e}"
                                );
                            }
                            out.errors += 1;
                        }
                    }
                    continue;
                }
                let ns = &namespaces[rng.random_range(0..namespaces.len())];
                let ts = now_us();
                let first_seq = seq;
                let records = (0..batch_records)
                    .map(|_| {
                        let key = bench_key(run, w, seq);
                        seq += 1;
                        let mut value = vec![0u8; record_bytes.saturating_sub(key.len())];
                        rng.fill_bytes(&mut value);
                        record(key, ts, value)
                    })
                    .collect::<Vec<_>>();
                let t = Instant::now();
                let result = match http.as_mut() {
                    Some(h) => h.append(ns, &records).await,
                    None => client
                        .append(ns, records)
                        .await
                        .map(drop)
                        .map_err(Into::into),
                };
                out.requests += 1;
                match result {
                    Ok(_) => {
                        out.records += batch_records as u64;
                        let us = t.elapsed().as_micros().max(1) as u64;
                        out.hist.saturating_record(us);
                        out.acks.push(started.elapsed());
                        if keep {
                            out.acked.push(first_seq);
                        }
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
    let (mut hist, mut read_hist) = (new_hist(), new_hist());
    let (mut reads, mut rows, mut misses) = (0u64, 0u64, 0u64);
    let (mut records, mut requests, mut errors) = (0u64, 0u64, 0u64);
    let (mut acks, mut acked) = (Vec::new(), Vec::new());
    while let Some(res) = workers.join_next().await {
        let w = res.context("bench worker panicked")?;
        hist.add(&w.hist)?;
        read_hist.add(&w.read_hist)?;
        (reads, rows, misses) = (reads + w.reads, rows + w.rows, misses + w.misses);
        records += w.records;
        requests += w.requests;
        errors += w.errors;
        acks.extend(w.acks);
        acked.push((w.worker, w.acked));
    }
    let load_end = started.elapsed();
    let elapsed = load_end.as_secs_f64();
    let max_stall = verify::max_stall(&mut acks, load_end);
    let fsyncs_after = fsyncs(&client).await;
    let fsync_count = match (fsyncs_before, fsyncs_after) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let verify = if args.verify {
        let found = verify::read_back(&client, &namespaces, &run_prefix(run)).await?;
        let batch = args.batch_records as u64;
        let keys = acked.iter().flat_map(|(w, firsts)| {
            firsts
                .iter()
                .flat_map(move |&first| (first..first + batch).map(move |s| bench_key(run, *w, s)))
        });
        Some(verify::tally(keys, found.iter().map(Vec::as_slice)))
    } else {
        None
    };
    let ms = |q: f64| quantile_ms(&hist, q);
    let read_report = args.workload.reads().then(|| ReadReport {
        workload: args.workload,
        consistency: args.consistency,
        reads_per_s: reads as f64 / elapsed,
        reads,
        misses,
        p50_ms: quantile_ms(&read_hist, 0.5),
        p99_ms: quantile_ms(&read_hist, 0.99),
        p999_ms: quantile_ms(&read_hist, 0.999),
    });
    Ok(BenchReport {
        records_per_s: (records + rows) as f64 / elapsed,
        mb_per_s: ((records + rows) as f64 * args.record_bytes as f64) / elapsed / 1e6,
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
        max_stall_ms: max_stall.as_secs_f64() * 1000.0,
        interrupted: stop.is_cancelled(),
        verify,
        reads: read_report,
    })
}

/// A token cancelled by the first SIGTERM or SIGINT; a second one exits at
/// once (status 130), for a person who does not want to wait for the
/// verification.
fn stop_on_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let stop = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let token = stop.clone();
    tokio::spawn(async move {
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n > 0 {
                eprintln!("second signal: exiting without a report");
                std::process::exit(130);
            }
            eprintln!("signal: ending the load, then reporting");
            token.cancel();
        }
    });
    Ok(stop)
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
    let report = bench_until(&args, duration, stop_on_signal()?).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.human());
    }
    if let Some(v) = &report.verify {
        anyhow::ensure!(
            v.ok(),
            "verify failed: {} acknowledged records lost, {} duplicated",
            v.lost,
            v.duplicated
        );
    }
    Ok(())
}

mod http;
#[cfg(test)]
mod tests;
mod verify;
mod workload;
