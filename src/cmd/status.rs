//! `stele status`: one node's counters.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use stele_client::Client;

use super::client::DEFAULT_ENDPOINT;

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

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.endpoint, crate::security::cli_options()?)
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
        ("bad_peer_endpoints", s.bad_peer_endpoints),
        ("requests_refused", s.requests_refused),
        ("token_epoch", s.token_epoch.unwrap_or(0)),
        ("peer_control_messages", s.peer_control_messages),
        ("peer_control_batches", s.peer_control_batches),
        ("segments_fetched", s.segments_fetched),
        ("snapshots_installed", s.snapshots_installed),
        ("heartbeat_rounds", s.heartbeat_rounds),
        ("campaigns", s.campaigns),
        ("campaigns_deferred", s.campaigns_deferred),
        ("tablets_led", s.tablets_led),
        ("replicas_asleep", s.replicas_asleep),
        ("group_sleeps", s.group_sleeps),
        ("node_beats", s.node_beats),
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
        obj.insert("tls_serial".into(), s.tls_serial.clone().into());
        obj.insert("tls_not_after_unix".into(), s.tls_not_after_unix.into());
        for (k, v) in numbers {
            obj.insert(k.into(), v.into());
        }
        obj.insert(
            "peer_filter_blocked".into(),
            s.peer_filter_blocked.clone().into(),
        );
        writeln!(out, "{}", serde_json::Value::Object(obj))?;
    } else {
        let mut t = super::table::pairs();
        t.add_row(vec!["version".to_string(), s.version.clone()]);
        for (k, v) in numbers {
            t.add_row(vec![k.to_string(), v.to_string()]);
        }
        if !s.journal_stopped.is_empty() {
            t.add_row(vec!["journal_stopped".into(), s.journal_stopped.clone()]);
        }
        if !s.tls_serial.is_empty() {
            t.add_row(vec!["tls_serial".into(), s.tls_serial.clone()]);
            t.add_row(vec![
                "tls_not_after_unix".into(),
                format!(
                    "{} ({})",
                    s.tls_not_after_unix,
                    expires_in(s.tls_not_after_unix)
                ),
            ]);
        }
        write!(out, "{}", super::table::render(&t))?;
    }
    Ok(())
}

/// "in 10 days", or "EXPIRED", for a Unix time.
fn expires_in(not_after_unix: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match not_after_unix.checked_sub(now) {
        Some(left) => format!("expires in {} days", left / 86_400),
        None => "EXPIRED".into(),
    }
}
