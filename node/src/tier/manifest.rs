//! Tablet manifests: `manifests/<generation:020>.cbor`, each published with
//! create-if-absent, never renamed or replaced. The highest generation is
//! the current one. Two writers racing on a generation: exactly one PUT
//! succeeds; the other sees `AlreadyExists`, re-reads and moves on.

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::{Result, keys};
use crate::catalog::SegmentRef;

pub const MANIFEST_V: u16 = 1;

/// What a tablet's bucket state is at one generation: enough to rebuild the
/// tablet from the bucket alone (losing at most the unsealed tail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub v: u16,
    pub cell: String,
    pub tablet: u64,
    /// This manifest's generation (its key).
    pub generation: u64,
    /// The tablet's range generation and range.
    pub tablet_generation: u64,
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    /// Highest log index whose rows are all in `segments`.
    pub checkpoint: u64,
    /// Every segment of the tablet, oldest first; all uploaded.
    pub segments: Vec<SegmentRef>,
    /// Receipts (encoded key, CBOR receipt) as of the checkpoint, and the
    /// window they are kept for: a restored tablet still deduplicates
    /// retried batches.
    pub receipt_window_us: u64,
    pub receipts: Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>,
}

/// Result of one publish attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    Won,
    /// Another writer published this generation first.
    Lost,
}

/// Publishes `m` at `m.generation` with create-if-absent.
pub async fn publish(store: &dyn ObjectStore, prefix: &Path, m: &Manifest) -> Result<Publish> {
    let key = keys::manifest(prefix, &m.cell, m.tablet, m.generation);
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let body = crate::catalog::to_cbor(m);
    match store.put_opts(&key, PutPayload::from(body), opts).await {
        Ok(_) => Ok(Publish::Won),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(Publish::Lost),
        Err(e) => Err(e.into()),
    }
}

/// The highest published generation of a tablet, if any.
pub async fn latest_generation(
    store: &dyn ObjectStore,
    prefix: &Path,
    cell: &str,
    tablet: u64,
) -> Result<Option<u64>> {
    use futures::TryStreamExt;
    let dir = keys::manifests(prefix, cell, tablet);
    let metas: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    Ok(metas
        .iter()
        .filter_map(|m| keys::manifest_generation(&m.location))
        .max())
}

/// Reads one manifest.
pub async fn read(
    store: &dyn ObjectStore,
    prefix: &Path,
    cell: &str,
    tablet: u64,
    generation: u64,
) -> Result<Manifest> {
    let key = keys::manifest(prefix, cell, tablet, generation);
    let body = store.get(&key).await?.bytes().await?;
    crate::catalog::from_cbor("manifest", &body).map_err(|e| super::Error::Mismatch {
        key: key.to_string(),
        what: e.to_string(),
    })
}

/// Publishes the tablet state built by `build(generation)` at the next
/// generation. On a lost race it re-reads the winner: if the winner already
/// names the same segments and checkpoint there is nothing to do; otherwise
/// it tries the next generation, at most `attempts` times.
pub async fn publish_next(
    store: &dyn ObjectStore,
    prefix: &Path,
    cell: &str,
    tablet: u64,
    attempts: u32,
    build: impl Fn(u64) -> Manifest,
) -> Result<(Publish, u64)> {
    let mut lost = 0;
    for _ in 0..attempts.max(1) {
        let generation = latest_generation(store, prefix, cell, tablet)
            .await?
            .map_or(1, |g| g + 1);
        let m = build(generation);
        match publish(store, prefix, &m).await? {
            Publish::Won => return Ok((Publish::Won, generation)),
            Publish::Lost => {
                lost += 1;
                let winner = read(store, prefix, cell, tablet, generation).await?;
                if winner.segments == m.segments && winner.checkpoint == m.checkpoint {
                    return Ok((Publish::Lost, generation));
                }
            }
        }
    }
    Err(super::Error::Other(format!(
        "manifest of tablet {tablet}: lost {lost} races in a row"
    )))
}
