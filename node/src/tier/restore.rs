//! Rebuilding a cell's tablets from the bucket alone: the latest manifest of
//! each tablet names its segments; each is downloaded, checked (size and
//! content hash = segment id, then every block and the trailer by the
//! reader) and written under the new data directory; the catalog gets a
//! record at the manifest's checkpoint with this node as the only voter.
//! Rows that were never sealed and uploaded are lost; nothing else is.
//!
//! Ranges with no manifest (tablets that never uploaded a segment) become
//! new empty tablets, so the restored cell covers every vshard.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStoreExt;

use super::manifest::{self, Manifest};
use super::{Error, Result, Tier, keys};
use crate::catalog::{Catalog, ReceiptRow, TabletRecord};

/// What a restore did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// (tablet, manifest generation, segments, rows, checkpoint)
    pub tablets: Vec<(u64, u64, usize, u64, u64)>,
    /// Empty tablets created for ranges without a manifest.
    pub empty_tablets: Vec<u64>,
    pub bytes: u64,
}

/// Told how a restore goes, for a progress display (`stele restore`'s
/// bar); `()` ignores it. Called from the restoring task, between fetches.
pub trait Progress: Sync {
    /// The bytes of every segment this restore fetches, once they are known.
    fn planned(&self, _bytes: u64) {}
    /// One segment of `bytes` fetched, checked and written.
    fn fetched(&self, _bytes: u64) {}
}

impl Progress for () {}

/// Tablet ids with objects under the cell.
pub(crate) async fn tablet_ids(tier: &Tier) -> Result<Vec<u64>> {
    let dir = tier
        .prefix
        .clone()
        .join("cells")
        .join(tier.options.cell.as_str())
        .join("tablets");
    let listing = tier.store.list_with_delimiter(Some(&dir)).await?;
    let mut ids: Vec<u64> = listing
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().and_then(|f| f.parse().ok()))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Restores the tablets of `tier`'s cell (or only `only`) into `data_dir`
/// for node `node_id`. The data directory must not hold a catalog yet.
pub async fn restore(
    tier: &Arc<Tier>,
    data_dir: &Path,
    node_id: u64,
    only: Option<u64>,
    progress: &dyn Progress,
) -> Result<Report> {
    let catalog_path = data_dir.join("catalog.redb");
    if catalog_path.exists() {
        return Err(Error::Config(format!(
            "{} already holds a catalog: restore into a new data directory",
            data_dir.display()
        )));
    }
    let mut manifests: Vec<Manifest> = Vec::new();
    for id in tablet_ids(tier).await? {
        if only.is_some_and(|t| t != id) {
            continue;
        }
        let cell = &tier.options.cell;
        let Some(g) =
            manifest::latest_generation(tier.store.as_ref(), &tier.prefix, cell, id).await?
        else {
            continue;
        };
        let m = manifest::read(tier.store.as_ref(), &tier.prefix, cell, id, g).await?;
        if m.v != manifest::MANIFEST_V || m.tablet != id || m.generation != g {
            return Err(Error::Mismatch {
                key: keys::manifest(&tier.prefix, cell, id, g).to_string(),
                what: "manifest does not describe its own key".into(),
            });
        }
        manifests.push(m);
    }
    if manifests.is_empty() {
        // Nothing to restore is almost always the wrong cell id or URL.
        return Err(Error::Other(match only {
            Some(t) => format!("tablet {t} has no manifest in the bucket"),
            None => format!(
                "no manifest of cell {} under {}",
                tier.options.cell, tier.options.url
            ),
        }));
    }
    let manifests = if only.is_none() {
        latest_ranges(manifests)?
    } else {
        manifests
    };
    progress.planned(
        manifests
            .iter()
            .flat_map(|m| &m.segments)
            .map(|s| s.bytes)
            .sum(),
    );
    std::fs::create_dir_all(data_dir).map_err(|e| Error::Io {
        context: format!("create {}", data_dir.display()),
        source: e,
    })?;
    let catalog = Catalog::open(&catalog_path).map_err(|e| Error::Other(e.to_string()))?;
    catalog
        .bind_cell(&tier.options.cell)
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut report = Report::default();
    for m in &manifests {
        let dir = data_dir.join("segments").join(m.tablet.to_string());
        crate::fsutil::create_dir_durable(&dir).map_err(|e| Error::Io {
            context: format!("create {}", dir.display()),
            source: e,
        })?;
        let mut rows = 0;
        for seg in &m.segments {
            let bytes = fetch_segment(tier, m.tablet, seg, &dir).await?;
            progress.fetched(bytes);
            report.bytes += bytes;
            rows += seg.rows;
        }
        let replica = crate::raft::router::replica_id(m.tablet, node_id);
        let (applied_state, purged) = crate::raft::restored_state(replica, m.checkpoint);
        let record = TabletRecord {
            v: 1,
            id: m.tablet,
            vshard_lo: m.vshard_lo,
            vshard_hi: m.vshard_hi,
            generation: m.tablet_generation,
            checkpoint: m.checkpoint,
            applied_state,
            segments: m.segments.clone(),
            replica_id: replica,
            init_voters: Vec::new(),
            frozen: false,
        };
        let receipts: Vec<ReceiptRow> = m
            .receipts
            .iter()
            .map(|(k, v)| ReceiptRow {
                key: k.to_vec(),
                value: v.to_vec(),
            })
            .collect();
        catalog
            .publish(&record, &receipts, &[])
            .and_then(|()| catalog.put_raft(m.tablet, "purged", &purged))
            .map_err(|e| Error::Other(e.to_string()))?;
        report
            .tablets
            .push((m.tablet, m.generation, m.segments.len(), rows, m.checkpoint));
    }
    if only.is_none() {
        let first = manifests.iter().map(|m| m.tablet).max().unwrap_or(0) + 1;
        // (Ids past every restored tablet: one merged away had a smaller
        // id than its survivor, so it is never reused here.)
        for (next, (lo, hi)) in (first..).zip(gaps(&manifests)) {
            let record = TabletRecord {
                v: 1,
                id: next,
                vshard_lo: lo,
                vshard_hi: hi,
                generation: 1,
                checkpoint: 0,
                applied_state: Vec::new(),
                segments: Vec::new(),
                replica_id: crate::raft::router::replica_id(next, node_id),
                init_voters: Vec::new(),
                frozen: false,
            };
            catalog
                .put_tablet(&record)
                .map_err(|e| Error::Other(e.to_string()))?;
            report.empty_tablets.push(next);
        }
    }
    Ok(report)
}

/// Resolves manifests whose ranges overlap: each vshard belongs to the
/// manifest of the highest range generation that covers it. A tablet a
/// merge absorbed (its last manifest from before the merge) is dropped; a
/// split parent whose last manifest predates the split is cut back to the
/// part its child does not hold (its segments hold both halves' rows, and
/// a tablet reads only its range). A remainder in two pieces cannot come
/// from splits and merges and is refused.
fn latest_ranges(mut manifests: Vec<Manifest>) -> Result<Vec<Manifest>> {
    manifests.sort_by(|a, b| {
        b.tablet_generation
            .cmp(&a.tablet_generation)
            .then(b.tablet.cmp(&a.tablet))
    });
    let mut claimed: Vec<(u64, u64)> = Vec::new();
    let mut out = Vec::new();
    for mut m in manifests {
        let mut free = vec![(u64::from(m.vshard_lo), m.vshard_hi)];
        for &(clo, chi) in &claimed {
            free = free
                .into_iter()
                .flat_map(|(lo, hi)| {
                    if chi <= lo || clo >= hi {
                        vec![(lo, hi)]
                    } else {
                        [(lo, clo.max(lo)), (chi.min(hi), hi)]
                            .into_iter()
                            .filter(|(a, b)| a < b)
                            .collect()
                    }
                })
                .collect();
        }
        match free.as_slice() {
            [] => {
                tracing::info!(
                    tablet = m.tablet,
                    "restore: a tablet of a later generation holds this tablet's whole range (merged away)"
                );
            }
            [(lo, hi)] => {
                claimed.push((u64::from(m.vshard_lo), m.vshard_hi));
                m.vshard_lo = *lo as u32;
                m.vshard_hi = *hi;
                out.push(m);
            }
            _ => {
                return Err(Error::Other(format!(
                    "tablet {}'s manifest range [{}, {}) is split in pieces by later tablets",
                    m.tablet, m.vshard_lo, m.vshard_hi
                )));
            }
        }
    }
    out.sort_by_key(|m| m.tablet);
    Ok(out)
}

/// vshard ranges `[lo, hi)` no manifest covers.
fn gaps(manifests: &[Manifest]) -> Vec<(u32, u64)> {
    let mut ranges: Vec<(u64, u64)> = manifests
        .iter()
        .map(|m| (u64::from(m.vshard_lo), m.vshard_hi))
        .collect();
    ranges.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0u64;
    for (lo, hi) in ranges {
        if lo > at {
            out.push((at as u32, lo));
        }
        at = at.max(hi);
    }
    if at < 1 << 32 {
        out.push((at as u32, 1 << 32));
    }
    out
}

/// Downloads one segment, checks it completely and publishes it durably.
pub(crate) async fn fetch_segment(
    tier: &Tier,
    tablet: u64,
    seg: &crate::catalog::SegmentRef,
    dir: &Path,
) -> Result<u64> {
    // A segment shared since a split or adopted by a merge keeps its
    // object under the tablet that sealed it.
    let key = tier.segment_key(seg.owner(tablet), &seg.id);
    let body = match tier.store.get(&key).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Error::Mismatch {
                key: key.to_string(),
                what: "missing: the manifest names it".into(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    if body.len() as u64 != seg.bytes || crate::segment::segment_id(&body) != seg.id {
        return Err(Error::Mismatch {
            key: key.to_string(),
            what: format!(
                "{} bytes hashing to {}, expected {} bytes of {}",
                body.len(),
                crate::segment::segment_id(&body),
                seg.bytes,
                seg.id
            ),
        });
    }
    let path: PathBuf = dir.join(crate::segment::file_name(&seg.id));
    crate::fsutil::durable_write(&path, &body).map_err(|e| Error::Io {
        context: format!("write {}", path.display()),
        source: e,
    })?;
    let reader = crate::segment::SegmentReader::open(&path).map_err(|e| Error::Mismatch {
        key: key.to_string(),
        what: e.to_string(),
    })?;
    reader.verify_all().map_err(|e| Error::Mismatch {
        key: key.to_string(),
        what: e.to_string(),
    })?;
    Ok(seg.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tablet: u64, lo: u32, hi: u64) -> Manifest {
        Manifest {
            v: 1,
            cell: "c".into(),
            tablet,
            generation: 1,
            tablet_generation: 1,
            vshard_lo: lo,
            vshard_hi: hi,
            checkpoint: 1,
            segments: vec![],
            receipt_window_us: 0,
            receipts: vec![],
        }
    }

    #[test]
    fn gaps_cover_what_no_manifest_does() {
        assert_eq!(gaps(&[]), vec![(0, 1 << 32)]);
        assert_eq!(gaps(&[m(1, 0, 1 << 31)]), vec![(1 << 31, 1 << 32)]);
        assert_eq!(
            gaps(&[m(2, 100, 200), m(1, 0, 50)]),
            vec![(50, 100), (200, 1 << 32)]
        );
        assert_eq!(gaps(&[m(1, 0, 1 << 32)]), vec![]);
    }
}

#[cfg(test)]
mod resolve_tests {
    use super::*;

    fn m(tablet: u64, tablet_generation: u64, lo: u32, hi: u64) -> Manifest {
        Manifest {
            v: manifest::MANIFEST_V,
            cell: "c".into(),
            tablet,
            generation: 1,
            tablet_generation,
            vshard_lo: lo,
            vshard_hi: hi,
            checkpoint: 0,
            segments: Vec::new(),
            receipt_window_us: 0,
            receipts: Vec::new(),
        }
    }

    fn ranges(ms: &[Manifest]) -> Vec<(u64, u32, u64)> {
        ms.iter()
            .map(|m| (m.tablet, m.vshard_lo, m.vshard_hi))
            .collect()
    }

    #[test]
    fn a_merged_away_tablet_is_dropped_and_a_stale_parent_cut_back() {
        // Tablet 1 [0, 100) split into 1 and 2 [50, 100) at generation 5,
        // but 1's last manifest predates it; 3 absorbed 4 at generation 9.
        let got = latest_ranges(vec![
            m(1, 1, 0, 100),
            m(2, 5, 50, 100),
            m(4, 3, 100, 200),
            m(3, 9, 100, 300),
        ])
        .unwrap();
        assert_eq!(ranges(&got), vec![(1, 0, 50), (2, 50, 100), (3, 100, 300)]);
        // Disjoint ranges are left alone.
        let got = latest_ranges(vec![m(1, 1, 0, 10), m(2, 1, 10, 20)]).unwrap();
        assert_eq!(ranges(&got), vec![(1, 0, 10), (2, 10, 20)]);
        // A remainder in two pieces is refused.
        assert!(latest_ranges(vec![m(1, 1, 0, 100), m(2, 5, 40, 60)]).is_err());
    }
}
