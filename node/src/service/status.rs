//! The node's `Status` RPC (`stele status`): counters of the journal,
//! the replicas, the transport, the cold tier and TLS, read at the call.

use std::sync::atomic::Ordering::Relaxed;

use stele_proto::pb;

use super::DataParts;

/// The node's counters now.
pub(super) fn of(node: &DataParts) -> pb::StatusResponse {
    let js = node.journal.stats();
    let ts = node.endpoints.transport_stats();
    let (mut records, mut sealed, mut snapshots, mut compactions) = (0, 0, 0, 0);
    let (mut asleep, mut led) = (0, 0);
    for r in node.replicas.replicas() {
        asleep += u64::from(r.hibernation.is_asleep());
        led += u64::from(r.is_leader());
        snapshots += r.tablet.stats.snapshots_installed.load(Relaxed);
        records += r.tablet.stats.records_applied.load(Relaxed);
        sealed += r.tablet.stats.seals_published.load(Relaxed);
        compactions += r.tablet.stats.compactions.load(Relaxed);
    }
    let tier = node.options.tier.clone();
    let tls = &node.options.tls;
    let tier_stat = |f: fn(&crate::tier::TierStats) -> &std::sync::atomic::AtomicU64| {
        tier.as_ref().map_or(0, |t| f(&t.stats).load(Relaxed))
    };
    pb::StatusResponse {
        node_id: node.options.node_id,
        version: env!("CARGO_PKG_VERSION").to_string(),
        tablets: node.replicas.replica_count() as u64,
        journal_fsyncs: js.fsyncs,
        journal_frames: js.frames,
        journal_bytes: js.bytes,
        journal_files: js.files as u64,
        journal_stopped: js.stopped.unwrap_or_default(),
        records_appended: records,
        segments_sealed: sealed,
        compactions,
        replayed_frames: node.stats.replayed_frames.load(Relaxed),
        free_bytes: node.disk.free_bytes(),
        peer_connections: ts.as_ref().map_or(0, |t| t.connections_open),
        peers_with_extra_connections: ts.as_ref().map_or(0, |t| {
            t.open_per_peer.values().filter(|n| **n > 1).count() as u64
        }),
        peer_rejected_frames: ts.as_ref().map_or(0, |t| t.rejected_frames),
        peer_connections_refused: ts.as_ref().map_or(0, |t| t.connections_refused),
        peer_messages_filtered: node.options.peer_filter.filtered(),
        bad_peer_endpoints: node.endpoints.bad_peer_endpoints(),
        requests_refused: node.stats.requests_refused.load(Relaxed),
        token_epoch: node.tokens.epoch(),
        peer_control_messages: ts.as_ref().map_or(0, |t| t.control_messages),
        peer_control_batches: ts.as_ref().map_or(0, |t| t.control_batches),
        heartbeat_rounds: node.pacer_stats.heartbeat_rounds.load(Relaxed),
        campaigns: node.pacer_stats.campaigns.load(Relaxed),
        replicas_asleep: asleep,
        group_sleeps: node.pacer_stats.sleeps.load(Relaxed),
        node_beats: node.pacer_stats.beats.load(Relaxed),
        tablets_led: led,
        campaigns_deferred: node.pacer_stats.campaigns_deferred.load(Relaxed),
        peer_filter_blocked: node.options.peer_filter.blocked().into_iter().collect(),
        segments_fetched: node.stats.segments_fetched.load(Relaxed),
        snapshots_installed: snapshots,
        segments_uploaded: tier_stat(|s| &s.segments_uploaded),
        segments_evicted: tier_stat(|s| &s.segments_evicted),
        manifests_published: tier_stat(|s| &s.manifests_published),
        cold_bytes_fetched: tier_stat(|s| &s.cold_bytes_fetched),
        cold_bytes_cached: tier_stat(|s| &s.cold_bytes_cached),
        peer_bytes_in: ts.as_ref().map_or(0, |t| t.bytes_in),
        peer_bytes_out: ts.as_ref().map_or(0, |t| t.bytes_out),
        tls_serial: tls.as_ref().and_then(|c| c.serial()).unwrap_or_default(),
        tls_not_after_unix: tls
            .as_ref()
            .and_then(|c| c.not_after())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
    }
}
