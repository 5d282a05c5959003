//! Rebuilding the replicas of a whole managed cell from the bucket: the
//! controller state (restored from its backup by the caller) says which
//! replica of which tablet lives on which node; each node's new data
//! directory gets, per replica, the tablet's latest manifest's segments
//! (downloaded and checked as by [`super::restore`]) and a catalog record at
//! the manifest's checkpoint whose Raft membership is the tablet's voters,
//! the same on every voter ([`crate::raft::restored_group_state`]). Started,
//! each group elects a leader by itself; the node registers with the
//! controllers, which already know the replica.
//!
//! A tablet without a manifest (it never uploaded a segment) is restored
//! empty on its voters. Rows not sealed and uploaded are lost.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::manifest::{self, Manifest};
use super::restore::{Progress, fetch_segment, tablet_ids};
use super::{Error, Result, Tier, keys};
use crate::catalog::{Catalog, ReceiptRow, TabletRecord};

/// One replica to rebuild on a node, as the controller state has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPlan {
    pub tablet: u64,
    pub replica_id: u64,
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    /// The range generation nodes check requests against.
    pub range_generation: u64,
    /// Replica ids of the group's voters (this one among them).
    pub voters: Vec<u64>,
}

/// What one node's restore did.
#[derive(Debug, Default, Clone)]
pub struct NodeReport {
    /// (tablet, manifest generation or 0, segments, rows, checkpoint)
    pub replicas: Vec<(u64, u64, usize, u64, u64)>,
    pub bytes: u64,
}

/// The latest manifest of every tablet with objects under the cell, each
/// checked to describe its own key.
pub async fn latest_manifests(tier: &Tier) -> Result<BTreeMap<u64, Manifest>> {
    let cell = &tier.options.cell;
    let mut out = BTreeMap::new();
    for id in tablet_ids(tier).await? {
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
        out.insert(id, m);
    }
    Ok(out)
}

/// The bytes [`restore_node`] fetches for `plans`: the segments of each
/// planned replica's latest manifest.
pub fn bytes_to_fetch(plans: &[ReplicaPlan], manifests: &BTreeMap<u64, Manifest>) -> u64 {
    plans
        .iter()
        .filter_map(|p| manifests.get(&p.tablet))
        .flat_map(|m| &m.segments)
        .map(|s| s.bytes)
        .sum()
}

/// Rebuilds `plans` (one node's replicas) into `data_dir`, which must not
/// hold a catalog yet, from `manifests` ([`latest_manifests`]). Each fetched
/// segment is reported to `progress` (its total is [`bytes_to_fetch`]).
pub async fn restore_node(
    tier: &Arc<Tier>,
    data_dir: &Path,
    plans: &[ReplicaPlan],
    manifests: &BTreeMap<u64, Manifest>,
    progress: &dyn Progress,
) -> Result<NodeReport> {
    let catalog_path = data_dir.join("catalog.redb");
    if catalog_path.exists() {
        return Err(Error::Config(format!(
            "{} already holds a catalog: restore into a new data directory",
            data_dir.display()
        )));
    }
    crate::fsutil::create_dir_durable(data_dir).map_err(|e| Error::Io {
        context: format!("create {}", data_dir.display()),
        source: e,
    })?;
    let catalog = Catalog::open(&catalog_path).map_err(|e| Error::Other(e.to_string()))?;
    catalog
        .bind_cell(&tier.options.cell)
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut report = NodeReport::default();
    for p in plans {
        if !p.voters.contains(&p.replica_id) {
            return Err(Error::Config(format!(
                "replica {} of tablet {} is not among its voters {:?}",
                p.replica_id, p.tablet, p.voters
            )));
        }
        let m = manifests.get(&p.tablet);
        let (segments, checkpoint, receipts) = match m {
            Some(m) => (m.segments.clone(), m.checkpoint, m.receipts.clone()),
            None => (Vec::new(), 0, Vec::new()),
        };
        let dir = data_dir.join("segments").join(p.tablet.to_string());
        crate::fsutil::create_dir_durable(&dir).map_err(|e| Error::Io {
            context: format!("create {}", dir.display()),
            source: e,
        })?;
        let mut rows = 0;
        for seg in &segments {
            let bytes = fetch_segment(tier, p.tablet, seg, &dir).await?;
            progress.fetched(bytes);
            report.bytes += bytes;
            rows += seg.rows;
        }
        let (applied_state, purged) = crate::raft::restored_group_state(&p.voters, checkpoint);
        let record = TabletRecord {
            v: 1,
            id: p.tablet,
            vshard_lo: p.vshard_lo,
            vshard_hi: p.vshard_hi,
            generation: p.range_generation,
            checkpoint,
            applied_state,
            segments: segments.clone(),
            replica_id: p.replica_id,
            init_voters: Vec::new(),
            frozen: false,
        };
        let receipts: Vec<ReceiptRow> = receipts
            .iter()
            .map(|(k, v)| ReceiptRow {
                key: k.to_vec(),
                value: v.to_vec(),
            })
            .collect();
        catalog
            .publish(&record, &receipts, &[])
            .and_then(|()| catalog.put_raft(p.tablet, "purged", &purged))
            .map_err(|e| Error::Other(e.to_string()))?;
        report.replicas.push((
            p.tablet,
            m.map_or(0, |m| m.generation),
            segments.len(),
            rows,
            checkpoint,
        ));
    }
    Ok(report)
}
