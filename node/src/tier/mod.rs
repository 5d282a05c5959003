//! The cold tier: sealed segments in object storage.
//!
//! ```text
//! leader:  sealed segment ──upload (create-if-absent, verify)──► <prefix>/cells/<cell>/tablets/<t>/segments/<id>.seg
//!                         ──propose Uploaded{segment}──► every replica's catalog (SegmentRef.cold)
//!          all uploaded   ──manifest (create-if-absent)──► .../tablets/<t>/manifests/<generation:020>.cbor
//! replica: Uploaded applied + object confirmed (size, trailer checksum) + old / disk full
//!          ──► reader swapped to the cold source, local file deleted
//! reads:   SegmentReader over ColdSource: byte-range GETs into a bounded LRU cache,
//!          every block crc-checked by the reader as for a local file
//! ```
//!
//! Keys are pure functions of opaque ids (cell, tablet, segment id,
//! generation): no namespace or other label ever reaches the bucket. No
//! rename is used anywhere: segments are immutable and content-addressed,
//! manifests are new keys published with create-if-absent.
//!
//! The read path is synchronous (segment readers run in `spawn_blocking` or
//! inside apply), so cold GETs run on the tier's own small runtime and the
//! caller's thread waits for them ([`Tier::block_on`]).

pub mod cold;
pub mod evict;
pub mod keys;
pub mod manifest;
pub mod restore;
pub mod restore_cell;
pub mod retention;
pub mod stub;
pub mod upload;
pub mod worker;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

/// Errors of the cold tier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("cold tier configuration: {0}")]
    Config(String),
    /// The object exists but is not the segment it should be.
    #[error("object {key} does not match: {what}")]
    Mismatch { key: String, what: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of the cold tier (plain data; validated by [`TierOptions::validate`]).
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// `file:///abs/dir`, `s3://bucket[/prefix]` or `memory:///` (tests).
    pub url: String,
    /// Opaque cell id, the second key component.
    pub cell: String,
    /// S3 endpoint override (`http://127.0.0.1:9000`); path-style requests.
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    /// Allow plain http to the endpoint (loopback test servers).
    pub s3_allow_http: bool,
    /// Static credentials; when `None` the standard AWS environment
    /// variables (`AWS_ACCESS_KEY_ID`, ...) are used.
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    /// A replica keeps a confirmed segment locally at least this long
    /// (default 24 h) unless the disk passes the high watermark.
    pub hot_age: Duration,
    /// Disk usage fractions: above `evict_watermark` the oldest confirmed
    /// segments are evicted until usage is back under it; above
    /// `evict_aggressive_watermark` every confirmed segment is evicted.
    pub evict_watermark: f64,
    pub evict_aggressive_watermark: f64,
    /// Bytes of cold blocks kept in memory (LRU).
    pub cache_bytes_max: u64,
    /// Segments larger than this are uploaded in parts.
    pub multipart_bytes_min: u64,
    /// Part size of a multipart upload.
    pub part_bytes: usize,
    /// Uploads in flight per node.
    pub uploads_max: usize,
    /// Attempts per upload before the worker gives up until its next round.
    pub upload_attempts_max: u32,
    /// First backoff between attempts (doubles, capped at 8x).
    pub upload_backoff: Duration,
    /// Time limit of one cold read (GET) made by the synchronous read path.
    pub read_timeout: Duration,
    /// How often the worker looks for work.
    pub interval: Duration,
    /// Namespace retention: segments whose rows all belong to one of these
    /// namespaces and are older (by row ts, microseconds) than its period
    /// are dropped, locally and in the bucket.
    pub retention: std::collections::BTreeMap<String, Duration>,
}

impl TierOptions {
    pub fn new(url: impl Into<String>, cell: impl Into<String>) -> TierOptions {
        TierOptions {
            url: url.into(),
            cell: cell.into(),
            s3_endpoint: None,
            s3_region: None,
            s3_allow_http: false,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            hot_age: Duration::from_secs(24 * 3600),
            evict_watermark: 0.70,
            evict_aggressive_watermark: 0.85,
            cache_bytes_max: 256 << 20,
            multipart_bytes_min: 64 << 20,
            part_bytes: 16 << 20,
            uploads_max: 4,
            upload_attempts_max: 5,
            upload_backoff: Duration::from_millis(200),
            read_timeout: Duration::from_secs(30),
            interval: Duration::from_secs(1),
            retention: Default::default(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        if !keys::is_opaque_component(&self.cell) {
            return Err(Error::Config(format!(
                "cell id {:?} must be 1..=64 of [a-z0-9-]",
                self.cell
            )));
        }
        if !(0.0..=1.0).contains(&self.evict_watermark)
            || !(self.evict_watermark..=1.0).contains(&self.evict_aggressive_watermark)
        {
            return Err(Error::Config(
                "watermarks must satisfy 0 <= evict <= aggressive <= 1".into(),
            ));
        }
        if self.uploads_max == 0 || self.upload_attempts_max == 0 || self.part_bytes < 5 << 20 {
            return Err(Error::Config(
                "uploads_max and upload_attempts_max must be positive, part_bytes at least 5 MiB"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Counters of the cold tier, read by status, tests and benches.
#[derive(Debug, Default)]
pub struct TierStats {
    pub segments_uploaded: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    /// Create-if-absent PUTs that found the object and verified it as ours.
    pub uploads_already_present: AtomicU64,
    pub upload_failures: AtomicU64,
    pub manifests_published: AtomicU64,
    /// Manifest generations another writer published first.
    pub manifest_races_lost: AtomicU64,
    pub segments_evicted: AtomicU64,
    pub bytes_evicted: AtomicU64,
    /// Bytes fetched from the bucket by reads, and served from the cache.
    pub cold_bytes_fetched: AtomicU64,
    pub cold_bytes_cached: AtomicU64,
    /// Cold reads that found damaged bytes (reported, never returned).
    pub cold_corrupt: AtomicU64,
    /// Segment stubs that failed a check and were removed (the object was
    /// read instead).
    pub stubs_refused: AtomicU64,
}

/// The cold tier of a node: the store, its key prefix and cell, the block
/// cache and the runtime that runs GETs for synchronous readers.
pub struct Tier {
    pub options: TierOptions,
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store (the `/prefix` of `s3://bucket/prefix`).
    pub prefix: ObjectPath,
    pub cache: cold::Cache,
    pub stats: TierStats,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tier({} cell {})", self.options.url, self.options.cell)
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        // Dropping a runtime blocks; this one may be dropped inside another.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Tier {
    /// Builds the store named by `options.url`.
    pub fn open(options: TierOptions) -> Result<Arc<Tier>> {
        options.validate()?;
        let (store, prefix) = open_store(&options)?;
        Tier::with_store(options, store, prefix)
    }

    /// A tier over a given store (tests inject `InMemory` or a wrapper).
    pub fn with_store(
        options: TierOptions,
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
    ) -> Result<Arc<Tier>> {
        options.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stele-tier")
            .enable_all()
            .build()
            .map_err(|e| Error::Io {
                context: "start the cold-tier runtime".into(),
                source: e,
            })?;
        Ok(Arc::new(Tier {
            cache: cold::Cache::new(options.cache_bytes_max),
            options,
            store,
            prefix,
            stats: TierStats::default(),
            runtime: Some(runtime),
        }))
    }

    /// Key of a segment object.
    pub fn segment_key(&self, tablet: u64, id: &str) -> ObjectPath {
        keys::segment(&self.prefix, &self.options.cell, tablet, id)
    }

    /// Runs `fut` on the tier's runtime and blocks this thread until it
    /// finishes or `read_timeout` passes. For synchronous callers only (the
    /// segment read path); never call it from the tier's own runtime.
    pub fn block_on<T, F>(&self, fut: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let rt = self.runtime.as_ref().expect("runtime lives until drop");
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        let timeout = self.options.read_timeout;
        rx.recv_timeout(timeout)
            .map_err(|_| Error::Timeout(timeout))?
    }
}

/// True when `seg` of `tablet` can be read from the bucket: its `Uploaded`
/// has applied, or the object is there with the segment's size (a snapshot
/// built before `Uploaded` applied still names uploaded segments). A
/// replica installing a snapshot then reads it from the bucket instead of
/// fetching it from the leader.
pub async fn in_bucket(
    tier: Option<&Arc<Tier>>,
    tablet: u64,
    seg: &crate::catalog::SegmentRef,
) -> bool {
    use object_store::ObjectStoreExt;
    let Some(tier) = tier else {
        return false;
    };
    if seg.cold.is_some() {
        return true;
    }
    matches!(
        tier.store.head(&tier.segment_key(tablet, &seg.id)).await,
        Ok(meta) if meta.size == seg.bytes
    )
}

/// Parses the store URL into a store and a key prefix.
pub fn open_store(options: &TierOptions) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let url = options.url.as_str();
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(Error::Config(format!(
                "{url}: a file:// store needs an absolute path"
            )));
        }
        std::fs::create_dir_all(path).map_err(|e| Error::Io {
            context: format!("create {path}"),
            source: e,
        })?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(path)?;
        return Ok((Arc::new(store), ObjectPath::default()));
    }
    if url == "memory:///" || url == "memory://" {
        return Ok((
            Arc::new(object_store::memory::InMemory::new()),
            ObjectPath::default(),
        ));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::Config(format!("{url}: no bucket")));
        }
        // from_env reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
        // AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT...; flags override.
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(false);
        if let Some(region) = &options.s3_region {
            b = b.with_region(region);
        }
        if let Some(endpoint) = &options.s3_endpoint {
            b = b.with_endpoint(endpoint);
        }
        if let Some(k) = &options.s3_access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(s) = &options.s3_secret_access_key {
            b = b.with_secret_access_key(s);
        }
        // Conditional PUTs are not retried on timeout by object_store; the
        // uploader verifies an AlreadyExists itself (upload.rs).
        b = b.with_retry(object_store::RetryConfig {
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
            ..Default::default()
        });
        // After any client-option change (it would reset this).
        b = b.with_allow_http(options.s3_allow_http);
        let store = b.build()?;
        return Ok((Arc::new(store), ObjectPath::from(prefix.trim_matches('/'))));
    }
    Err(Error::Config(format!(
        "{url}: unknown object store (file:///dir, s3://bucket/prefix)"
    )))
}
