//! Storage and cold-tier settings shared by `stele dev` and `stele server`:
//! the flags, the same flags again for child processes (`to_args`), and the
//! node options they make (`node_options`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stele_node::NodeOptions;

/// Storage tuning shared by `dev` and `server`.
#[derive(clap::Args)]
pub struct Tuning {
    /// Graceful stop (SIGTERM, Ctrl-C): the longest the hand-off of this
    /// node's leaderships and its in-flight calls may take before it
    /// stops anyway, ms.
    #[arg(long, default_value_t = 10_000)]
    pub shutdown_deadline_ms: u64,
    /// Seal a tablet's memtable at this many bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub memtable_bytes_max: usize,
    /// Seal a tablet's memtable once its oldest row is this old, so a quiet
    /// tablet's data reaches a segment (and the cold tier) in bounded time.
    #[arg(long, default_value_t = 300)]
    pub memtable_age_max_s: u64,
    /// Compact runs of (at least 4) segments smaller than a quarter of this
    /// into segments of up to this many bytes; 0 turns compaction off.
    #[arg(long, default_value_t = 64 << 20)]
    pub compact_target_bytes: u64,
    /// Roll journal files at this size.
    #[arg(long, default_value_t = 64 << 20)]
    pub journal_file_bytes_max: u64,
    /// Force-seal tablets holding back journal trim past this many retained bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub journal_retained_bytes_max: u64,
    /// Refuse appends with StorageFull below this much free space.
    #[arg(long, default_value_t = 256 << 20)]
    pub disk_reserve_bytes: u64,
    /// The journal's own last-resort reserve (must be at most disk-reserve-bytes).
    #[arg(long, default_value_t = 64 << 20)]
    pub journal_reserve_bytes: u64,
    /// Group-commit linger, in microseconds.
    #[arg(long, default_value_t = 2000)]
    pub linger_us: u64,
    /// Largest batch (keys + values) one append may carry.
    #[arg(long, default_value_t = stele_proto::limits::BATCH_BYTES_MAX_DEFAULT)]
    pub batch_bytes_max: usize,
    /// Most records one append may carry.
    #[arg(long, default_value_t = stele_proto::limits::BATCH_RECORDS_MAX_DEFAULT)]
    pub batch_records_max: usize,
    /// Tablet election timeout T, in ms: a follower that has not heard from
    /// its leader for a random time in [T, 2T) campaigns; heartbeats every T/3.
    #[arg(long, default_value_t = 3000)]
    pub election_timeout_ms: u64,
    /// A tablet with no request for this long, every voter holding its
    /// whole log, stops heartbeating (hibernates) until the next request
    /// or Raft message; its leader's node beats the followers' nodes
    /// instead, once per heartbeat for all of its sleeping tablets. 0:
    /// never.
    #[arg(long, default_value_t = stele_node::raft::HIBERNATE_AFTER_MS)]
    pub hibernate_after_ms: u64,
    /// Per-tablet series on /metrics (`stele_tablet_hot_*`) for this many
    /// of the tablets this node leads, the busiest since the previous
    /// scrape; 0: none. Bounds the series a scrape carries.
    #[arg(long, default_value_t = 10)]
    pub metrics_hot_tablets: usize,
    /// Proposals of one tablet a leader keeps out at a time; appends
    /// that arrive meanwhile wait and go together as one log entry when
    /// one comes back (needs the cell's log format 2). 1 coalesces most,
    /// more overlaps more proposals.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub append_in_flight: u16,
    /// The tablet log format of a node without a controller (1, or 2 to
    /// coalesce concurrent appends into one entry); a node of a cell takes
    /// the cell's (`stele cell formats enable log 2`). Default: 2 for a
    /// one-node `stele dev`, else 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=stele_proto::formats::LOG_MAX as i64))]
    pub tablet_log_format: Option<u32>,
    #[command(flatten)]
    pub cold: ColdTierArgs,
}

/// The cold tier (object storage). `stele dev` defaults to
/// `file://<data-dir>/bucket`; `stele server` has none unless given.
#[derive(clap::Args, Clone)]
pub struct ColdTierArgs {
    /// Object store for sealed segments: `file:///abs/dir` or
    /// `s3://bucket/prefix`. S3 credentials come from STELE_S3_ACCESS_KEY_ID
    /// / STELE_S3_SECRET_ACCESS_KEY, files named by --s3-access-key-id-file
    /// / --s3-secret-access-key-file, or the standard AWS_* environment
    /// variables.
    #[arg(long)]
    pub object_store: Option<String>,
    /// Opaque cell id, part of every object key ([a-z0-9-], at most 64).
    /// A data directory is bound to the first one it runs with a cold tier
    /// (or is restored under) and refuses another.
    #[arg(long, default_value = "dev")]
    pub cell_id: String,
    /// S3 endpoint override (path-style requests); http is allowed for
    /// loopback endpoints, elsewhere only with --s3-allow-http.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    #[arg(long)]
    pub s3_region: Option<String>,
    #[arg(long)]
    pub s3_allow_http: bool,
    /// A secret: from the environment only (a flag is refused, see
    /// `crate::config`).
    #[arg(long, env = "STELE_S3_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// A secret: from the environment only (a flag is refused).
    #[arg(long, env = "STELE_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,
    /// File holding the S3 access key id (instead of STELE_S3_ACCESS_KEY_ID).
    #[arg(long)]
    pub s3_access_key_id_file: Option<PathBuf>,
    /// File holding the S3 secret access key (instead of
    /// STELE_S3_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub s3_secret_access_key_file: Option<PathBuf>,
    /// Keep an uploaded segment locally at least this long (seconds) unless
    /// the disk passes 70% used.
    #[arg(long, default_value_t = 24 * 3600)]
    pub hot_age_s: u64,
    /// Bytes of cold blocks cached in memory.
    #[arg(long, default_value_t = 256 << 20)]
    pub cold_cache_bytes_max: u64,
    /// Namespace retention, `NAMESPACE=SECONDS` (repeatable): whole
    /// segments of that namespace older than the period are dropped, locally
    /// and in the bucket. Needs --object-store.
    #[arg(long)]
    pub retention: Vec<String>,
}

impl ColdTierArgs {
    /// The settings as flags for a child process; the S3 keys are not
    /// among them (secrets never go on a command line): the child gets
    /// them from [`ColdTierArgs::secret_env`].
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            "--cell-id".to_string(),
            self.cell_id.clone(),
            "--hot-age-s".into(),
            self.hot_age_s.to_string(),
            "--cold-cache-bytes-max".into(),
            self.cold_cache_bytes_max.to_string(),
        ];
        for (flag, v) in [
            ("--object-store", &self.object_store),
            ("--s3-endpoint", &self.s3_endpoint),
            ("--s3-region", &self.s3_region),
        ] {
            if let Some(v) = v {
                out.extend([flag.to_string(), v.clone()]);
            }
        }
        if self.s3_allow_http {
            out.push("--s3-allow-http".into());
        }
        for r in &self.retention {
            out.extend(["--retention".to_string(), r.clone()]);
        }
        out
    }

    /// The S3 keys (access key id, secret access key), from the
    /// environment or their files.
    pub fn credentials(&self) -> anyhow::Result<(Option<String>, Option<String>)> {
        let id = crate::config::secret(
            "s3_access_key_id",
            self.s3_access_key_id.as_deref(),
            self.s3_access_key_id_file.as_deref(),
        )?;
        let key = crate::config::secret(
            "s3_secret_access_key",
            self.s3_secret_access_key.as_deref(),
            self.s3_secret_access_key_file.as_deref(),
        )?;
        Ok((id, key))
    }

    /// The S3 keys as the environment variables a child process reads them
    /// from.
    pub fn secret_env(&self) -> anyhow::Result<Vec<(String, String)>> {
        let (id, key) = self.credentials()?;
        Ok([("s3_access_key_id", id), ("s3_secret_access_key", key)]
            .into_iter()
            .filter_map(|(k, v)| Some((crate::config::env_of(k), v?)))
            .collect())
    }

    /// The node's cold tier, if one is configured.
    pub fn open(&self) -> anyhow::Result<Option<Arc<stele_node::tier::Tier>>> {
        let Some(url) = &self.object_store else {
            // Retention drops segments in the cold tier: without one it
            // would do nothing, which must not pass for working.
            if let Some(r) = self.retention.first() {
                anyhow::bail!(
                    "--retention {r} needs --object-store: retention drops whole segments uploaded to the bucket"
                );
            }
            return Ok(None);
        };
        let o = self.tier_options(url)?;
        let tier =
            stele_node::tier::Tier::open(o).with_context(|| format!("object store {url}"))?;
        Ok(Some(tier))
    }

    /// The bucket alone (the tier's store and key prefix), for the control
    /// plane's state backups; `None` without `--object-store`.
    pub fn bucket(&self) -> anyhow::Result<Option<crate::cmd::restore_cell::Bucket>> {
        let Some(url) = &self.object_store else {
            return Ok(None);
        };
        let o = self.tier_options(url)?;
        crate::cmd::restore_cell::Bucket::open(&o).map(Some)
    }

    fn tier_options(&self, url: &str) -> anyhow::Result<stele_node::tier::TierOptions> {
        let mut o = stele_node::tier::TierOptions::new(url, self.cell_id.clone());
        o.s3_endpoint = self.s3_endpoint.clone();
        o.s3_region = self.s3_region.clone();
        let loopback = self.s3_endpoint.as_deref().is_some_and(|e| {
            ["http://127.", "http://localhost", "http://[::1]"]
                .iter()
                .any(|p| e.starts_with(p))
        });
        o.s3_allow_http = self.s3_allow_http || loopback;
        (o.s3_access_key_id, o.s3_secret_access_key) = self.credentials()?;
        o.hot_age = Duration::from_secs(self.hot_age_s);
        o.cache_bytes_max = self.cold_cache_bytes_max;
        for r in &self.retention {
            let (ns, secs) = r
                .rsplit_once('=')
                .with_context(|| format!("--retention {r:?}: want NAMESPACE=SECONDS"))?;
            let secs: u64 = secs
                .parse()
                .with_context(|| format!("--retention {r:?}: {secs:?} is not seconds"))?;
            o.retention
                .insert(ns.to_string(), Duration::from_secs(secs));
        }
        Ok(o)
    }
}

impl Tuning {
    /// The same settings as command-line flags (for child processes).
    pub fn to_args(&self) -> Vec<String> {
        [
            ("--memtable-bytes-max", self.memtable_bytes_max.to_string()),
            ("--memtable-age-max-s", self.memtable_age_max_s.to_string()),
            (
                "--compact-target-bytes",
                self.compact_target_bytes.to_string(),
            ),
            (
                "--journal-file-bytes-max",
                self.journal_file_bytes_max.to_string(),
            ),
            (
                "--journal-retained-bytes-max",
                self.journal_retained_bytes_max.to_string(),
            ),
            ("--disk-reserve-bytes", self.disk_reserve_bytes.to_string()),
            (
                "--journal-reserve-bytes",
                self.journal_reserve_bytes.to_string(),
            ),
            ("--linger-us", self.linger_us.to_string()),
            ("--batch-bytes-max", self.batch_bytes_max.to_string()),
            ("--batch-records-max", self.batch_records_max.to_string()),
            (
                "--election-timeout-ms",
                self.election_timeout_ms.to_string(),
            ),
            ("--hibernate-after-ms", self.hibernate_after_ms.to_string()),
            (
                "--metrics-hot-tablets",
                self.metrics_hot_tablets.to_string(),
            ),
            ("--append-in-flight", self.append_in_flight.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .chain(self.cold.to_args())
        .collect()
    }
}

pub fn node_options(
    data_dir: PathBuf,
    node_id: u64,
    tablets: u32,
    advertise: String,
    t: &Tuning,
) -> NodeOptions {
    let mut o = NodeOptions::new(data_dir);
    o.node_id = node_id;
    o.initial_tablets = tablets;
    o.advertise = advertise;
    o.drain_deadline = Duration::from_millis(t.shutdown_deadline_ms);
    o.tablet.memtable_bytes_max = t.memtable_bytes_max;
    o.tablet.memtable_age_max_us = t.memtable_age_max_s.saturating_mul(1_000_000);
    o.tablet.compact_target_bytes = t.compact_target_bytes;
    o.journal.file_bytes_max = t.journal_file_bytes_max;
    o.journal.linger = Duration::from_micros(t.linger_us);
    o.journal.reserve_bytes = t.journal_reserve_bytes;
    o.journal_retained_bytes_max = t.journal_retained_bytes_max;
    o.disk_reserve_bytes = t.disk_reserve_bytes;
    o.metrics_hot_tablets = t.metrics_hot_tablets;
    o.batch_bytes_max = t.batch_bytes_max;
    o.batch_records_max = t.batch_records_max;
    o.append_in_flight = usize::from(t.append_in_flight);
    o.log_format = t
        .tablet_log_format
        .unwrap_or(stele_proto::formats::BASELINE);
    // One batch is one journal frame: size the frame limit from the batch.
    o.journal.frame_payload_bytes_max = t.batch_bytes_max + o.batch_records_max * 64 + 64 * 1024;
    o.raft = stele_node::raft::RaftTiming::for_election_timeout(t.election_timeout_ms);
    o.raft.hibernate_after_ms = t.hibernate_after_ms;
    // Fail points and unsafe modes: only in a `fault-injection` build.
    crate::switches::arm(&mut o);
    o
}
