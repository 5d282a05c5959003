//! What one `stele bench` request does (`--workload`): an append of
//! `--batch-records` records, a Get or a ScanKey of one of the `--keys`
//! records written before the timed load (`preload`), or, for `mixed`,
//! an append or a Get by a coin toss. Reads are linearizable (read index
//! on the leader) or bounded (`--max-staleness`; a follower may answer).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stele_client::{Client, Consistency, ReadOptions, record};

/// `--workload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Durable appends (the default).
    Append,
    /// Get of one preloaded key.
    Get,
    /// ScanKey of one preloaded key (its one row).
    ScanKey,
    /// Half appends, half Gets.
    Mixed,
}

impl Workload {
    /// Whether requests of this workload read the preloaded keys.
    pub fn reads(self) -> bool {
        self != Workload::Append
    }
}

/// `--consistency` of the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadConsistency {
    Linearizable,
    Bounded,
}

impl ReadConsistency {
    pub fn options(self, max_staleness: Duration) -> ReadOptions {
        match self {
            ReadConsistency::Linearizable => ReadOptions {
                consistency: Consistency::Linearizable as i32,
                ..ReadOptions::default()
            },
            ReadConsistency::Bounded => ReadOptions {
                consistency: Consistency::Bounded as i32,
                max_staleness_ms: max_staleness.as_millis() as u64,
                ..ReadOptions::default()
            },
        }
    }
}

/// The preloaded keys' namespace and key: key `i` lives in namespace
/// `i mod N`, so the reads spread over the namespaces as appends do.
pub fn preloaded(namespaces: &[String], prefix: &str, i: usize) -> (usize, String) {
    (i % namespaces.len(), format!("{prefix}k{i:010}"))
}

/// Preload requests in flight at once.
const PRELOAD_CONCURRENCY: usize = 16;
/// Records per preload request.
const PRELOAD_BATCH: usize = 64;

/// Appends the `keys` records the reads will look up, `record_bytes`
/// each, before the timed load; fails if any is refused.
pub async fn preload(
    client: &Client,
    namespaces: &Arc<Vec<String>>,
    prefix: &str,
    keys: usize,
    record_bytes: usize,
) -> anyhow::Result<()> {
    // Per namespace, its keys in batches.
    let mut batches: Vec<(usize, Vec<String>)> = Vec::new();
    for ns in 0..namespaces.len() {
        let mine: Vec<String> = (ns..keys)
            .step_by(namespaces.len())
            .map(|i| preloaded(namespaces, prefix, i).1)
            .collect();
        for chunk in mine.chunks(PRELOAD_BATCH) {
            batches.push((ns, chunk.to_vec()));
        }
    }
    let sem = Arc::new(tokio::sync::Semaphore::new(PRELOAD_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for (ns, keys) in batches {
        let permit = sem.clone().acquire_owned().await?;
        let (client, namespaces) = (client.clone(), namespaces.clone());
        tasks.spawn(async move {
            let ts = super::now_us();
            let records = keys
                .into_iter()
                .map(|k| {
                    let value = vec![b'v'; record_bytes.saturating_sub(k.len())];
                    record(k, ts, value)
                })
                .collect();
            let r = client.append(&namespaces[ns], records).await;
            drop(permit);
            r.with_context(|| format!("preloading the read keys into {}", namespaces[ns]))
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("preload task panicked")??;
    }
    Ok(())
}

/// One read of a preloaded key: the rows it returned (0: the key was
/// not found, which a read after its acknowledged append must not see).
pub async fn read_one(
    client: &Client,
    workload: Workload,
    namespace: &str,
    key: &str,
    read: ReadOptions,
) -> stele_client::Result<u64> {
    if workload == Workload::ScanKey {
        let page = client
            .scan_key(namespace, key.as_bytes(), 0, u64::MAX, 16, None, read)
            .await?;
        Ok(page.rows.len() as u64)
    } else {
        let row = client.get(namespace, key.as_bytes(), read).await?;
        Ok(u64::from(row.is_some()))
    }
}
