//! The node's metrics, recorded through the `metrics` facade; the binary
//! installs the Prometheus recorder and serves them on `--http-listen`
//! (docs/OPERATIONS.md "Metrics" lists every series).
//!
//! ```text
//! hot paths ── record_* (counters, histograms) ──▶ recorder
//! scrape ── Observer::observe (gauges, counters mirrored from stats) ──▶ recorder ──▶ /metrics
//! ```
//!
//! Without a recorder (no `--http-listen`) every call is a no-op. Labels
//! are bounded: request kinds, results, peer node ids, and a tablet id
//! only on the `stele_tablet_hot_*` gauges of the few tablets this node
//! leads with the most load since the previous scrape ([`hottest`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};

use crate::Node;

/// A latency histogram of the data path with its labels as literals: the
/// `metrics` macros then build the key once, statically, instead of
/// allocating labels on every call.
macro_rules! latency {
    ($name:literal, $ok:expr $(, $k:literal => $v:literal)*) => {
        if $ok {
            histogram!($name $(, $k => $v)*, "result" => "ok")
        } else {
            histogram!($name $(, $k => $v)*, "result" => "error")
        }
    };
}

/// One Append call: its latency, and on success its records and bytes.
pub fn record_append(elapsed: Duration, ok: bool, records: u64, bytes: u64) {
    latency!("stele_node_append_seconds", ok).record(elapsed);
    if ok {
        counter!("stele_node_appended_records_total").increment(records);
        counter!("stele_node_appended_bytes_total").increment(bytes);
    }
}

/// One append entry proposed by a tablet leader, carrying `batches`
/// batches (1: an `Append`; more: appends coalesced into an `AppendMany`).
pub fn record_append_entry(batches: usize) {
    histogram!("stele_tablet_append_entry_batches").record(batches as f64);
}

/// The read calls, the `kind` label of read latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    Get,
    ScanKey,
    Scan,
}

/// One read call of `kind`.
pub fn record_read(kind: ReadKind, elapsed: Duration, ok: bool) {
    let h = match kind {
        ReadKind::Get => latency!("stele_node_read_seconds", ok, "kind" => "get"),
        ReadKind::ScanKey => latency!("stele_node_read_seconds", ok, "kind" => "scan_key"),
        ReadKind::Scan => latency!("stele_node_read_seconds", ok, "kind" => "scan"),
    };
    h.record(elapsed);
}

/// One journal group: written and fdatasynced together.
pub(crate) fn record_journal_group(fsync: Duration, records: usize, bytes: usize) {
    histogram!("stele_journal_fsync_seconds").record(fsync);
    histogram!("stele_journal_group_records").record(records as f64);
    histogram!("stele_journal_group_bytes").record(bytes as f64);
}

/// A segment built from a frozen memtable.
pub(crate) fn record_seal(elapsed: Duration, bytes: u64) {
    histogram!("stele_tablet_seal_seconds").record(elapsed);
    counter!("stele_tablet_sealed_bytes_total").increment(bytes);
}

/// A compaction's output segment built.
pub(crate) fn record_compaction(elapsed: Duration, bytes: u64) {
    histogram!("stele_tablet_compaction_seconds").record(elapsed);
    counter!("stele_tablet_compacted_bytes_total").increment(bytes);
}

/// Cold-read chunks found in the node's cache (`hits`) and fetched (`misses`).
pub(crate) fn record_cold_chunks(hits: u64, misses: u64) {
    counter!("stele_tier_cold_cache_hits_total").increment(hits);
    counter!("stele_tier_cold_cache_misses_total").increment(misses);
}

/// One heartbeat answered: `full` (everything listed, as a controller
/// or node before delta heartbeats does), `delta` (only what changed), or
/// `resync` (the controller did not hold the delta's base; the full
/// reports follow at once). `reports_delta`: the heartbeat's reports were
/// a delta.
pub(crate) fn record_heartbeat(answer: &'static str, reports_delta: bool) {
    counter!("stele_node_heartbeats_total", "answer" => answer).increment(1);
    if reports_delta {
        counter!("stele_node_heartbeat_delta_reports_total").increment(1);
    }
}

/// Every series recorded only on events, at zero, so a scrape lists it
/// from the start (a dashboard's query finds a series, not nothing).
pub fn register() {
    for r in ["ok", "error"] {
        let _ = histogram!("stele_node_append_seconds", "result" => r);
        for k in ["get", "scan_key", "scan"] {
            let _ = histogram!("stele_node_read_seconds", "kind" => k, "result" => r);
        }
    }
    for c in [
        "stele_node_appended_records_total",
        "stele_node_appended_bytes_total",
        "stele_tablet_sealed_bytes_total",
        "stele_tablet_compacted_bytes_total",
        "stele_tier_cold_cache_hits_total",
        "stele_tier_cold_cache_misses_total",
        "stele_raft_leader_changes_total",
        "stele_node_heartbeat_delta_reports_total",
    ] {
        counter!(c).increment(0);
    }
    for a in ["full", "delta", "resync"] {
        counter!("stele_node_heartbeats_total", "answer" => a).increment(0);
    }
    for h in [
        "stele_journal_fsync_seconds",
        "stele_journal_group_records",
        "stele_journal_group_bytes",
        "stele_tablet_append_entry_batches",
        "stele_tablet_seal_seconds",
        "stele_tablet_compaction_seconds",
    ] {
        let _ = histogram!(h);
    }
}

/// Sets the node's gauges and mirrored counters from its stats; run by
/// the binary before each render. Keeps the leader each tablet had at the
/// last scrape, to count leader changes.
pub struct Observer {
    node: Arc<Node>,
    leaders: Mutex<HashMap<u64, u64>>,
    /// Peers whose lag the last scrape reported: set to 0 when this node
    /// no longer leads a tablet with a follower there.
    peers: Mutex<std::collections::BTreeSet<u64>>,
    /// How many tablets get `stele_tablet_hot_*` series (0: none).
    hot_tablets_max: usize,
    /// The led tablets' load counters at the previous scrape, and when.
    loads: Mutex<(Option<Instant>, HashMap<u64, Load>)>,
}

/// A tablet's load counters since its replica started: records applied
/// and reads served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub records: u64,
    pub reads: u64,
}

/// The at most `n` tablets of `now` with the most records applied plus
/// reads served since `last` (a tablet absent from `last`, or whose
/// counters went back because its replica restarted, counts from zero),
/// busiest first, ties by tablet id; tablets without load are left out,
/// so an idle node exports no per-tablet series.
pub fn hottest(now: &HashMap<u64, Load>, last: &HashMap<u64, Load>, n: usize) -> Vec<(u64, Load)> {
    let mut moved: Vec<(u64, Load)> = now
        .iter()
        .map(|(tablet, l)| {
            let before = last
                .get(tablet)
                .filter(|b| b.records <= l.records && b.reads <= l.reads)
                .copied()
                .unwrap_or_default();
            let delta = Load {
                records: l.records - before.records,
                reads: l.reads - before.reads,
            };
            (*tablet, delta)
        })
        .filter(|(_, d)| d.records + d.reads > 0)
        .collect();
    moved.sort_by_key(|(tablet, d)| (std::cmp::Reverse(d.records + d.reads), *tablet));
    moved.truncate(n);
    moved
}

impl Observer {
    pub fn new(node: Arc<Node>) -> Observer {
        register();
        Observer {
            hot_tablets_max: node.options.metrics_hot_tablets,
            node,
            leaders: Mutex::new(HashMap::new()),
            peers: Mutex::default(),
            loads: Mutex::default(),
        }
    }

    pub fn observe(&self) {
        let node = &self.node;
        let js = node.journal.stats();
        counter!("stele_journal_fsyncs_total").absolute(js.fsyncs);
        counter!("stele_journal_frames_total").absolute(js.frames);
        counter!("stele_journal_written_bytes_total").absolute(js.bytes);
        gauge!("stele_journal_files").set(js.files as f64);
        gauge!("stele_journal_retained_bytes").set(js.retained_bytes as f64);
        gauge!("stele_journal_retained_bytes_max")
            .set(node.options.journal_retained_bytes_max as f64);
        gauge!("stele_journal_stopped").set(if js.stopped.is_some() { 1.0 } else { 0.0 });
        gauge!("stele_disk_free_bytes").set(node.free_bytes() as f64);
        gauge!("stele_disk_reserve_bytes").set(node.options.disk_reserve_bytes as f64);
        let stats = &node.stats;
        counter!("stele_node_requests_refused_total")
            .absolute(stats.requests_refused.load(Relaxed));
        counter!("stele_raft_segments_fetched_total")
            .absolute(stats.segments_fetched.load(Relaxed));
        let pacer = &node.pacer_stats;
        counter!("stele_raft_campaigns_total").absolute(pacer.campaigns.load(Relaxed));
        counter!("stele_raft_campaigns_deferred_total")
            .absolute(pacer.campaigns_deferred.load(Relaxed));
        counter!("stele_raft_heartbeat_rounds_total")
            .absolute(pacer.heartbeat_rounds.load(Relaxed));
        counter!("stele_raft_group_sleeps_total").absolute(pacer.sleeps.load(Relaxed));
        counter!("stele_raft_node_beats_total").absolute(pacer.beats.load(Relaxed));
        self.observe_replicas();
        observe_transport(node);
        observe_tier(node);
    }

    fn observe_replicas(&self) {
        let replicas = self.node.replicas();
        let (mut led, mut behind_max, mut changes, mut asleep) = (0u64, 0u64, 0u64, 0u64);
        let (mut records, mut seals, mut seal_failures, mut compactions, mut snapshots) =
            (0, 0, 0, 0, 0);
        // Per follower node: the most entries behind and the longest
        // silence over the tablets this node leads.
        let mut lag: HashMap<u64, (u64, f64)> = HashMap::new();
        let mut leaders = self.leaders.lock().expect("lock poisoned");
        let mut seen = HashMap::with_capacity(replicas.len());
        let mut loads = HashMap::new();
        for r in &replicas {
            let s = &r.tablet.stats;
            records += s.records_applied.load(Relaxed);
            seals += s.seals_published.load(Relaxed);
            seal_failures += s.seal_failures.load(Relaxed);
            compactions += s.compactions.load(Relaxed);
            snapshots += s.snapshots_installed.load(Relaxed);
            let v = r.raft_view();
            behind_max = behind_max.max(v.committed.saturating_sub(v.applied));
            if let Some(leader) = v.leader {
                if leaders.get(&r.tablet.id).is_some_and(|l| *l != leader) {
                    changes += 1;
                }
                seen.insert(r.tablet.id, leader);
            }
            if v.leader == Some(r.replica_id) {
                led += 1;
                let load = Load {
                    records: s.records_applied.load(Relaxed),
                    reads: s.reads_served.load(Relaxed),
                };
                loads.insert(r.tablet.id, load);
            }
            if r.hibernation.is_asleep() {
                // A sleeping group's followers send no acknowledgements:
                // they are not lagging (the group is quiet by definition).
                asleep += 1;
                continue;
            }
            for (peer, entries, secs) in v.followers {
                let e = lag.entry(peer).or_default();
                e.0 = e.0.max(entries);
                e.1 = e.1.max(secs.unwrap_or(0.0));
            }
        }
        *leaders = seen;
        drop(leaders);
        counter!("stele_raft_leader_changes_total").increment(changes);
        gauge!("stele_raft_tablets_hosted").set(replicas.len() as f64);
        gauge!("stele_raft_tablets_led").set(led as f64);
        gauge!("stele_raft_replicas_asleep").set(asleep as f64);
        gauge!("stele_raft_applied_behind_committed_entries").set(behind_max as f64);
        let mut peers = self.peers.lock().expect("lock poisoned");
        for gone in peers.iter().filter(|p| !lag.contains_key(p)) {
            lag_gauges(*gone, 0, 0.0);
        }
        *peers = lag.keys().copied().collect();
        drop(peers);
        for (peer, (entries, secs)) in lag {
            lag_gauges(peer, entries, secs);
        }
        counter!("stele_tablet_records_applied_total").absolute(records);
        counter!("stele_tablet_seals_total").absolute(seals);
        counter!("stele_tablet_seal_failures_total").absolute(seal_failures);
        counter!("stele_tablet_compactions_total").absolute(compactions);
        counter!("stele_raft_snapshots_installed_total").absolute(snapshots);
        self.observe_hot(&replicas, loads);
    }

    /// The `stele_tablet_hot_*` gauges: rates over the time since the
    /// previous scrape (none at the first). A tablet that leaves the top
    /// is no longer set, and the recorder drops its series once idle
    /// (the binary's gauge idle timeout), so the series stay bounded.
    fn observe_hot(&self, replicas: &[Arc<crate::raft::Replica>], now: HashMap<u64, Load>) {
        let mut guard = self.loads.lock().expect("lock poisoned");
        let (at, last) = &mut *guard;
        let t = Instant::now();
        let elapsed = at.map(|a| t.duration_since(a).as_secs_f64());
        if let Some(secs) = elapsed.filter(|s| *s > 0.0) {
            for (tablet, d) in hottest(&now, last, self.hot_tablets_max) {
                let label = tablet.to_string();
                gauge!("stele_tablet_hot_records_per_second", "tablet" => label.clone())
                    .set(d.records as f64 / secs);
                gauge!("stele_tablet_hot_reads_per_second", "tablet" => label.clone())
                    .set(d.reads as f64 / secs);
                if let Some(r) = replicas.iter().find(|r| r.tablet.id == tablet) {
                    gauge!("stele_tablet_hot_segment_bytes", "tablet" => label)
                        .set(r.tablet.read_bytes() as f64);
                }
            }
        }
        *at = Some(t);
        *last = now;
    }
}

fn lag_gauges(peer: u64, entries: u64, secs: f64) {
    let peer = peer.to_string();
    gauge!("stele_raft_follower_lag_entries", "peer" => peer.clone()).set(entries as f64);
    gauge!("stele_raft_follower_lag_seconds", "peer" => peer).set(secs);
}

fn observe_transport(node: &Node) {
    let t = node.endpoints().transport_stats().unwrap_or_default();
    gauge!("stele_peer_connections").set(t.connections_open as f64);
    counter!("stele_peer_bytes_total", "direction" => "in").absolute(t.bytes_in);
    counter!("stele_peer_bytes_total", "direction" => "out").absolute(t.bytes_out);
    counter!("stele_peer_connections_refused_total").absolute(t.connections_refused);
    counter!("stele_peer_rejected_frames_total").absolute(t.rejected_frames);
    counter!("stele_peer_control_messages_total").absolute(t.control_messages);
    counter!("stele_peer_control_batches_total").absolute(t.control_batches);
}

fn observe_tier(node: &Node) {
    // Zero without a cold tier, so the series exist either way.
    let tier = node.options.tier.as_ref();
    let load = |f: fn(&crate::tier::TierStats) -> &std::sync::atomic::AtomicU64| {
        tier.map_or(0, |t| f(&t.stats).load(Relaxed))
    };
    counter!("stele_tier_uploads_total").absolute(load(|s| &s.segments_uploaded));
    counter!("stele_tier_uploaded_bytes_total").absolute(load(|s| &s.bytes_uploaded));
    counter!("stele_tier_upload_failures_total").absolute(load(|s| &s.upload_failures));
    counter!("stele_tier_evictions_total").absolute(load(|s| &s.segments_evicted));
    counter!("stele_tier_evicted_bytes_total").absolute(load(|s| &s.bytes_evicted));
    counter!("stele_tier_manifests_total").absolute(load(|s| &s.manifests_published));
    counter!("stele_tier_corrupt_objects_total").absolute(load(|s| &s.cold_corrupt));
    counter!("stele_tier_stubs_refused_total").absolute(load(|s| &s.stubs_refused));
    counter!("stele_tier_cold_read_bytes_total", "source" => "bucket")
        .absolute(load(|s| &s.cold_bytes_fetched));
    counter!("stele_tier_cold_read_bytes_total", "source" => "cache")
        .absolute(load(|s| &s.cold_bytes_cached));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(v: &[(u64, u64, u64)]) -> HashMap<u64, Load> {
        v.iter()
            .map(|(t, records, reads)| {
                let l = Load {
                    records: *records,
                    reads: *reads,
                };
                (*t, l)
            })
            .collect()
    }

    #[test]
    fn the_hottest_tablets_are_the_busiest_since_the_last_scrape() {
        let last = loads(&[(1, 100, 0), (2, 10, 5), (3, 50, 50), (4, 7, 0)]);
        // Tablet 1 was busy before but not since; 5 is new; 4 restarted
        // (its counter went back) and counts from zero.
        let now = loads(&[(1, 100, 0), (2, 40, 5), (3, 60, 70), (4, 3, 0), (5, 25, 0)]);
        let top = hottest(&now, &last, 3);
        let ids: Vec<u64> = top.iter().map(|(t, _)| *t).collect();
        assert_eq!(ids, vec![2, 3, 5], "30 and 30 (tie by id), then 25");
        assert_eq!(
            top[1].1,
            Load {
                records: 10,
                reads: 20
            }
        );
        assert_eq!(hottest(&now, &last, 10).len(), 4, "no series without load");
        assert!(hottest(&now, &last, 0).is_empty());
        assert!(hottest(&last, &last, 5).is_empty(), "an idle node has none");
        assert!(hottest(&HashMap::new(), &last, 5).is_empty());
    }
}
