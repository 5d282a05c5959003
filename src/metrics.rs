//! The process's metrics recorder and what a scrape runs before it renders
//! (docs/OPERATIONS.md "Metrics"). Library crates record through the
//! `metrics` facade; this binary installs the one Prometheus recorder,
//! gives histograms their buckets, and at each scrape runs the roles'
//! observers (gauges mirrored from their stats) and reads `/proc/self`.
//!
//! ```text
//! GET /metrics ─▶ render(): process gauges ─▶ each role's hook ─▶ upkeep ─▶ text
//! ```

use std::sync::{Mutex, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

/// Latency buckets (seconds): 100 µs to 10 s.
const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Journal frames per fsync.
const RECORDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Journal bytes per fsync: 256 B to 16 MiB.
const BYTES: &[f64] = &[
    256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
];

/// How long a gauge nobody sets stays in the output.
const GAUGE_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// What a scrape runs before rendering: each role's observer.
type Hook = Box<dyn Fn() + Send + Sync>;

fn hooks() -> &'static Mutex<Vec<Hook>> {
    static HOOKS: OnceLock<Mutex<Vec<Hook>>> = OnceLock::new();
    HOOKS.get_or_init(Default::default)
}

/// Runs `hook` before every render from now on (a role's gauges).
pub fn on_scrape(hook: impl Fn() + Send + Sync + 'static) {
    hooks().lock().expect("lock poisoned").push(Box::new(hook));
}

/// The process's recorder, installed on first use (anything recorded
/// before that is not kept: servers install it at start).
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Every gauge is set at each scrape by the roles' observers;
            // one nobody sets any more (a tablet that left the node's
            // hottest, a peer no longer followed) leaves the output.
            let builder = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("stele_journal_group_records".into()),
                        RECORDS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("stele_tablet_append_entry_batches".into()),
                        RECORDS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("stele_journal_group_bytes".into()),
                        BYTES,
                    )
                })
                .expect("bucket lists are not empty");
            builder
                .install_recorder()
                .expect("the first and only metrics recorder")
        })
        .clone()
}

/// How often histogram samples are folded into their buckets when nobody
/// scrapes: the recorder keeps each sample until then, so without this a
/// busy node that nobody scrapes would grow without bound.
const UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts the periodic upkeep (once per process; on the current runtime,
/// for the life of the process like the recorder itself).
pub fn spawn_upkeep() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let handle = install();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
    });
}

/// The Prometheus text of every metric, after the hooks ran.
pub fn render() -> String {
    let handle = install();
    observe_process();
    for hook in hooks().lock().expect("lock poisoned").iter() {
        hook();
    }
    handle.run_upkeep();
    handle.render()
}

/// CPU, memory and file descriptors of this process, from `/proc/self`
/// (absent where there is no `/proc`).
fn observe_process() {
    ::metrics::gauge!("stele_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some(ticks) = cpu_ticks(&stat)
    {
        // USER_HZ: 100 on every Linux this runs on (sysconf would need unsafe).
        ::metrics::counter!("stele_process_cpu_seconds_total").absolute(ticks / 100);
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(kib) = status_kib(&status, "VmRSS:")
    {
        ::metrics::gauge!("stele_process_resident_memory_bytes").set((kib * 1024) as f64);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        ::metrics::gauge!("stele_process_open_fds").set(fds.count() as f64);
    }
    if let Ok(limits) = std::fs::read_to_string("/proc/self/limits")
        && let Some(max) = max_open_files(&limits)
    {
        ::metrics::gauge!("stele_process_max_fds").set(max as f64);
    }
}

/// User plus system CPU time in clock ticks, from `/proc/self/stat` (the
/// fields after the parenthesised command name, which may hold spaces).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of the whole line, utime 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` value of `/proc/self/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// The soft limit of open files, from `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (stele (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 40 0 0 20 0 9 0";
        assert_eq!(cpu_ticks(stat), Some(290));
        assert_eq!(cpu_ticks("garbage"), None);
        let status = "Name:\tstele\nVmRSS:\t   12345 kB\nThreads:\t9\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(12345));
        let limits = "Limit Soft Hard Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }
}
