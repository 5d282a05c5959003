//! User and operator subcommands built on `stele-client`: `append`, `scan`
//! and `bench` (with the device probe `bench --fsync-probe DIR`). Each is an
//! `Args` struct plus a `run_*` function; `main.rs` wires them into clap.
//! The work is in functions that return data (`scan_rows`, `bench`,
//! `fsync_probe`), the printing in small pure formatters, so both are tested.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use stele_client::{Client, ClientOptions, Position, ReadOptions, Row, record};

/// Where a local node listens by default.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7450";

/// `stele append`: append one record and print its position.
#[derive(Debug, Clone, Args)]
pub struct AppendArgs {
    /// A node of the cell.
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Route through the global directory instead (`URL,...`): the
    /// namespace's cell is looked up there (`--endpoint` is ignored).
    #[arg(long, value_delimiter = ',', env = "STELE_DIRECTORY")]
    pub directory: Vec<String>,
    /// `workspace/project`.
    #[arg(long)]
    pub namespace: String,
    #[arg(long)]
    pub key: String,
    #[arg(long)]
    pub value: String,
    /// Microseconds since the Unix epoch; default now.
    #[arg(long)]
    pub ts: Option<u64>,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// `stele scan`: print records of a key (`--key`) or of a namespace.
#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Route through the global directory instead (`URL,...`).
    #[arg(long, value_delimiter = ',', env = "STELE_DIRECTORY")]
    pub directory: Vec<String>,
    #[arg(long)]
    pub namespace: String,
    /// Scan one key's timeline (ScanKey); without it, the whole namespace (Scan).
    #[arg(long)]
    pub key: Option<String>,
    /// Only keys starting with this (namespace scans).
    #[arg(long, conflicts_with = "key")]
    pub prefix: Option<String>,
    /// Lowest ts, microseconds, inclusive.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Highest ts, microseconds, exclusive; 0 for no bound.
    #[arg(long, default_value_t = 0)]
    pub to: u64,
    /// Most rows to print.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

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

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn position_json(p: &Position) -> serde_json::Value {
    serde_json::json!({ "tablet": p.tablet, "index": p.index, "slot": p.slot })
}

fn position_text(p: Option<&Position>) -> String {
    p.map_or_else(
        || "-".into(),
        |p| format!("{}:{}:{}", p.tablet, p.index, p.slot),
    )
}

/// Appends one record; returns its position.
/// A client of the cell that holds `namespace`: through the directory when
/// one is given (which may create the namespace on first use, if it allows
/// that), else through the node at `endpoint`.
async fn client_for(
    endpoint: &str,
    directory: &[String],
    namespace: &str,
) -> anyhow::Result<Client> {
    if directory.is_empty() {
        return Client::connect(endpoint, ClientOptions::default())
            .await
            .with_context(|| format!("connecting to {endpoint}"));
    }
    let global = stele_client::GlobalClient::new(directory, ClientOptions::default())?
        .create_if_missing(true);
    global
        .cell(namespace)
        .await
        .with_context(|| format!("resolving {namespace} through the directory"))
}

pub async fn append_one(args: &AppendArgs) -> anyhow::Result<(u64, Position)> {
    let client = client_for(&args.endpoint, &args.directory, &args.namespace).await?;
    let ts = args.ts.unwrap_or_else(now_us);
    let positions = client
        .append(
            &args.namespace,
            vec![record(args.key.as_bytes(), ts, args.value.as_bytes())],
        )
        .await?;
    let pos = positions
        .into_iter()
        .next()
        .context("no position returned")?;
    Ok((ts, pos))
}

pub async fn run_append(args: AppendArgs) -> anyhow::Result<()> {
    let (ts, pos) = append_one(&args).await?;
    if args.json {
        let mut v = position_json(&pos);
        v["ts"] = ts.into();
        println!("{v}");
    } else {
        println!(
            "appended {}/{} ts {ts} at position {}",
            args.namespace,
            args.key,
            position_text(Some(&pos))
        );
    }
    Ok(())
}

/// Reads up to `args.limit` rows, following cursors.
pub async fn scan_rows(args: &ScanArgs) -> anyhow::Result<Vec<Row>> {
    let client = client_for(&args.endpoint, &args.directory, &args.namespace).await?;
    let read = ReadOptions::default();
    let prefix = args.prefix.as_deref().unwrap_or("").as_bytes();
    let mut rows = Vec::new();
    let mut cursor = None;
    while rows.len() < args.limit {
        let want = (args.limit - rows.len()).min(1000) as u32;
        let page = match &args.key {
            Some(key) => {
                client
                    .scan_key(
                        &args.namespace,
                        key.as_bytes(),
                        args.from,
                        args.to,
                        want,
                        cursor,
                        read,
                    )
                    .await?
            }
            None => {
                client
                    .scan(
                        &args.namespace,
                        args.from,
                        args.to,
                        prefix,
                        want,
                        cursor,
                        read,
                    )
                    .await?
            }
        };
        if !page.missing_tablets.is_empty() {
            eprintln!(
                "warning: tablets {:?} could not be read",
                page.missing_tablets
            );
        }
        rows.extend(page.rows);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    rows.truncate(args.limit);
    Ok(rows)
}

/// One JSON line per row: ts, key and value as UTF-8 (lossy), position.
pub fn row_json(row: &Row) -> serde_json::Value {
    serde_json::json!({
        "ts": row.ts,
        "key": String::from_utf8_lossy(&row.key),
        "value": String::from_utf8_lossy(&row.value),
        "position": row.position.as_ref().map(position_json),
    })
}

/// A table for people; control characters in keys and values are escaped.
pub fn format_table(rows: &[Row]) -> String {
    let clean = |b: &[u8]| String::from_utf8_lossy(b).escape_debug().to_string();
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.ts.to_string(),
                clean(&r.key),
                clean(&r.value),
                position_text(r.position.as_ref()),
            ]
        })
        .collect();
    let header = ["TS", "KEY", "VALUE", "POSITION"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub async fn run_scan(args: ScanArgs) -> anyhow::Result<()> {
    let rows = scan_rows(&args).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        for row in &rows {
            writeln!(out, "{}", row_json(row))?;
        }
    } else {
        write!(out, "{}", format_table(&rows))?;
        writeln!(out, "({} rows)", rows.len())?;
    }
    Ok(())
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

pub async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
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

/// `stele status`: one node's counters (the Status RPC), for people or, with
/// `--json`, for scripts.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Print one JSON object instead of `name value` lines.
    #[arg(long)]
    pub json: bool,
}

pub async fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.endpoint, ClientOptions::default())
        .await
        .with_context(|| format!("connect {}", args.endpoint))?;
    let s = client.status_at(&args.endpoint).await?;
    let numbers = [
        ("node_id", s.node_id),
        ("tablets", s.tablets),
        ("journal_fsyncs", s.journal_fsyncs),
        ("journal_frames", s.journal_frames),
        ("journal_bytes", s.journal_bytes),
        ("journal_files", s.journal_files),
        ("records_appended", s.records_appended),
        ("segments_sealed", s.segments_sealed),
        ("compactions", s.compactions),
        ("replayed_frames", s.replayed_frames),
        ("free_bytes", s.free_bytes),
        ("peer_connections", s.peer_connections),
        (
            "peers_with_extra_connections",
            s.peers_with_extra_connections,
        ),
        ("peer_rejected_frames", s.peer_rejected_frames),
        ("peer_connections_refused", s.peer_connections_refused),
        ("peer_messages_filtered", s.peer_messages_filtered),
        ("peer_control_messages", s.peer_control_messages),
        ("peer_control_batches", s.peer_control_batches),
        ("segments_fetched", s.segments_fetched),
        ("snapshots_installed", s.snapshots_installed),
        ("heartbeat_rounds", s.heartbeat_rounds),
        ("campaigns", s.campaigns),
        ("segments_uploaded", s.segments_uploaded),
        ("segments_evicted", s.segments_evicted),
        ("manifests_published", s.manifests_published),
        ("cold_bytes_fetched", s.cold_bytes_fetched),
        ("cold_bytes_cached", s.cold_bytes_cached),
    ];
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut obj = serde_json::Map::new();
        obj.insert("version".into(), s.version.clone().into());
        obj.insert("journal_stopped".into(), s.journal_stopped.clone().into());
        for (k, v) in numbers {
            obj.insert(k.into(), v.into());
        }
        obj.insert(
            "peer_filter_blocked".into(),
            s.peer_filter_blocked.clone().into(),
        );
        writeln!(out, "{}", serde_json::Value::Object(obj))?;
    } else {
        writeln!(out, "{:<30} {}", "version", s.version)?;
        for (k, v) in numbers {
            writeln!(out, "{k:<30} {v}")?;
        }
        if !s.journal_stopped.is_empty() {
            writeln!(out, "{:<30} {}", "journal_stopped", s.journal_stopped)?;
        }
    }
    Ok(())
}
