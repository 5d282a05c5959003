//! The node's cold-tier worker: each round, on every replica,
//! - leader: upload sealed segments without a cold copy, propose
//!   `Uploaded{segment}` for each, then publish a manifest when every
//!   segment is uploaded and the set changed;
//! - any replica: confirm cold copies (size and trailer checksum), then
//!   evict by age and disk watermarks ([`super::evict::plan`]).
//!
//! Everything is recomputed from the tablet's state each round, so uploads
//! resume after a restart or a leader change without any extra bookkeeping.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use object_store::ObjectStoreExt;
use stele_proto::command::TabletCommand;

use super::evict::{self, Candidate, Policy};
use super::manifest::{self, Manifest, Publish};
use super::upload::{self, Outcome};
use super::{Error, Result, Tier};
use crate::catalog::SegmentRef;
use crate::disk::Disk;
use crate::raft::Replica;
use crate::replicas::ReplicaSet;
use crate::segment::format::{TRAILER_FILE_XXH3_OFFSET, TRAILER_LEN};

#[derive(Default)]
struct State {
    /// Segment ids whose object this replica checked against its copy.
    confirmed: HashSet<String>,
    /// Per tablet: the segment ids and checkpoint of the last manifest seen.
    published: HashMap<u64, (Vec<String>, u64)>,
    /// Segments dropped by retention whose objects go once a manifest
    /// without them is published: (tablet, segment id).
    to_delete: Vec<(u64, String)>,
}

/// Runs until the node shuts down, over the node's replicas; `disk` is
/// what the eviction watermarks measure.
pub async fn run(replicas: ReplicaSet, disk: Disk, tier: Arc<Tier>) {
    let mut state = State::default();
    let mut tick = tokio::time::interval(tier.options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = replicas.cancelled() => return,
            _ = tick.tick() => {}
        }
        round(&replicas, &disk, &tier, &mut state).await;
    }
}

/// One pass over every replica (public for tests that drive it by hand).
async fn round(set: &ReplicaSet, disk: &Disk, tier: &Arc<Tier>, state: &mut State) {
    let replicas: Vec<Arc<Replica>> = set.replicas();
    let leaders: Vec<&Arc<Replica>> = replicas.iter().filter(|r| r.is_leader()).collect();
    if !tier.options.retention.is_empty() {
        for r in &leaders {
            apply_retention(tier, r, state).await;
        }
    }
    upload_pending(tier, &leaders).await;
    for r in &leaders {
        if let Err(e) = publish_manifest(tier, r, state).await {
            tracing::warn!(tablet = r.tablet.id, error = %e, "manifest publish failed; retried next round");
        }
    }
    delete_dropped(tier, state).await;
    for r in &replicas {
        if let Err(e) = evict_replica(disk, tier, r, state).await {
            tracing::warn!(tablet = r.tablet.id, error = %e, "eviction round failed");
        }
    }
}

async fn upload_pending(tier: &Arc<Tier>, leaders: &[&Arc<Replica>]) {
    let mut jobs = Vec::new();
    for r in leaders {
        let data = r.tablet.read();
        for (seg, reader) in &data.segments {
            if seg.cold.is_none() && !reader.is_remote() {
                jobs.push(((*r).clone(), seg.clone(), reader.file_xxh3()));
            }
        }
    }
    futures::stream::iter(jobs)
        .map(|(r, seg, file_xxh3)| async move {
            let key = tier.segment_key(seg.owner(r.tablet.id), &seg.id);
            let path = r
                .tablet
                .segment_dir
                .join(crate::segment::file_name(&seg.id));
            match upload::upload(tier.store.as_ref(), &key, &path, &seg.id, &tier.options).await {
                Ok(outcome) => {
                    tier.stats.segments_uploaded.fetch_add(1, Ordering::Relaxed);
                    if outcome == Outcome::Created {
                        tier.stats
                            .bytes_uploaded
                            .fetch_add(seg.bytes, Ordering::Relaxed);
                    } else {
                        tier.stats
                            .uploads_already_present
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    let cmd = TabletCommand::Uploaded {
                        segment: seg.id.clone(),
                        bytes: seg.bytes,
                        file_xxh3,
                    };
                    if let Err(e) = r.propose(cmd).await {
                        tracing::debug!(tablet = r.tablet.id, error = %e, "Uploaded not proposed; retried next round");
                    }
                }
                Err(e) => {
                    tier.stats.upload_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(tablet = r.tablet.id, segment = %seg.id, error = %e, "segment upload failed; retried next round");
                }
            }
        })
        .buffer_unordered(tier.options.uploads_max)
        .collect::<Vec<()>>()
        .await;
}

/// Proposes `DropSegment` for the leader's segments past their namespace's
/// retention ([`super::retention::plan`]).
async fn apply_retention(tier: &Tier, r: &Replica, state: &mut State) {
    // A tablet frozen for a merge keeps its segments for the merge; one
    // with a compaction pending keeps them until it published.
    if r.tablet.is_frozen() || r.tablet.read().frozen.iter().any(|f| f.compact.is_some()) {
        return;
    }
    let owners: std::collections::HashMap<String, u64> = r
        .tablet
        .read()
        .segments
        .iter()
        .map(|(s, _)| (s.id.clone(), s.origin))
        .collect();
    let segs: Vec<super::retention::Seg> = r
        .tablet
        .read()
        .segments
        .iter()
        .map(|(s, reader)| super::retention::Seg {
            id: s.id.clone(),
            namespace: reader.sole_namespace().map(str::to_owned),
            ts_max: s.ts_max,
        })
        .collect();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    for id in super::retention::plan(&segs, &tier.options.retention, now_us) {
        let cmd = TabletCommand::DropSegment {
            segment: id.clone(),
        };
        match r.propose(cmd).await {
            Ok(_) => {
                tracing::info!(tablet = r.tablet.id, segment = %id, "segment dropped by namespace retention");
                // A segment shared from a split parent keeps its object
                // under the parent, whose own retention deletes it.
                let shared = owners.get(&id).is_some_and(|o| *o != 0);
                if !shared {
                    state.to_delete.push((r.tablet.id, id));
                }
            }
            Err(e) => {
                tracing::debug!(tablet = r.tablet.id, error = %e, "DropSegment not proposed; retried next round")
            }
        }
    }
}

/// Deletes the objects of dropped segments once the tablet's latest
/// manifest no longer names them (a restore must never miss a segment a
/// manifest names). Missing objects are fine (never uploaded).
async fn delete_dropped(tier: &Tier, state: &mut State) {
    let mut keep = Vec::new();
    for (tablet, id) in std::mem::take(&mut state.to_delete) {
        let published = state.published.get(&tablet);
        if published.is_none_or(|(ids, _)| ids.contains(&id)) {
            keep.push((tablet, id));
            continue;
        }
        match tier.store.delete(&tier.segment_key(tablet, &id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(tablet, segment = %id, error = %e, "object of a dropped segment not deleted; retried");
                keep.push((tablet, id));
            }
        }
    }
    state.to_delete = keep;
}

// The entry API does not fit: the bucket is read between the check and the
// insert.
#[allow(clippy::map_entry)]
async fn publish_manifest(tier: &Arc<Tier>, r: &Replica, state: &mut State) -> Result<()> {
    let t = &r.tablet;
    let (segments, checkpoint, range) = {
        let data = t.read();
        if data.segments.iter().any(|(s, _)| s.cold.is_none()) {
            return Ok(());
        }
        let segs: Vec<SegmentRef> = data.segments.iter().map(|(s, _)| s.clone()).collect();
        (segs, data.checkpoint, data.published)
    };
    let ids: Vec<String> = segments.iter().map(|s| s.id.clone()).collect();
    let cell = tier.options.cell.clone();
    if state.published.get(&t.id) == Some(&(ids.clone(), checkpoint)) {
        return Ok(());
    }
    if !state.published.contains_key(&t.id) {
        // Once per tablet (per worker): what the bucket already holds.
        match manifest::latest_generation(tier.store.as_ref(), &tier.prefix, &cell, t.id).await? {
            Some(g) => {
                let m = manifest::read(tier.store.as_ref(), &tier.prefix, &cell, t.id, g).await?;
                let seen: Vec<String> = m.segments.iter().map(|s| s.id.clone()).collect();
                state.published.insert(t.id, (seen, m.checkpoint));
            }
            // No manifest and no segment: nothing to publish until a
            // segment exists (remembered, so idle tablets LIST once).
            None if ids.is_empty() => {
                state.published.insert(t.id, (ids, checkpoint));
                return Ok(());
            }
            None => {}
        }
        if state.published.get(&t.id) == Some(&(ids.clone(), checkpoint)) {
            return Ok(());
        }
    }
    let receipts = t
        .catalog
        .receipts(t.id)
        .map_err(|e| Error::Other(e.to_string()))?
        .into_iter()
        .map(|r| (r.key.into(), r.value.into()))
        .collect::<Vec<_>>();
    let build = |generation| Manifest {
        v: manifest::MANIFEST_V,
        cell: cell.clone(),
        tablet: t.id,
        generation,
        tablet_generation: range.generation,
        vshard_lo: range.lo,
        vshard_hi: range.hi,
        checkpoint,
        segments: segments.clone(),
        receipt_window_us: t.options.receipt_window_us,
        receipts: receipts.clone(),
    };
    let (outcome, generation) =
        manifest::publish_next(tier.store.as_ref(), &tier.prefix, &cell, t.id, 3, build).await?;
    match outcome {
        Publish::Won => {
            tier.stats
                .manifests_published
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(tablet = t.id, generation, "manifest published");
        }
        Publish::Lost => {
            tier.stats
                .manifest_races_lost
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    state.published.insert(t.id, (ids, checkpoint));
    Ok(())
}

/// Checks the object against what `Uploaded` recorded and this replica's
/// own copy: its size, and the whole-file checksum in its trailer.
pub async fn confirm(tier: &Tier, tablet: u64, seg: &SegmentRef, local_xxh3: u64) -> Result<()> {
    let Some(cold) = &seg.cold else {
        return Err(Error::Other("no Uploaded applied".into()));
    };
    let key = tier.segment_key(seg.owner(tablet), &seg.id);
    let mismatch = |what: String| Error::Mismatch {
        key: key.to_string(),
        what,
    };
    if cold.bytes != seg.bytes || cold.file_xxh3 != local_xxh3 {
        return Err(mismatch("Uploaded disagrees with the local segment".into()));
    }
    let meta = tier.store.head(&key).await?;
    if meta.size != seg.bytes {
        return Err(mismatch(format!(
            "{} bytes, expected {}",
            meta.size, seg.bytes
        )));
    }
    let at = seg.bytes - TRAILER_LEN as u64;
    let trailer = tier.store.get_range(&key, at..seg.bytes).await?;
    let xxh3 = u64::from_le_bytes(
        trailer[TRAILER_FILE_XXH3_OFFSET..TRAILER_FILE_XXH3_OFFSET + 8]
            .try_into()
            .expect("8 bytes"),
    );
    if xxh3 != cold.file_xxh3 {
        return Err(mismatch(format!(
            "trailer checksum {xxh3:016x}, expected {:016x}",
            cold.file_xxh3
        )));
    }
    Ok(())
}

async fn evict_replica(
    disk: &Disk,
    tier: &Arc<Tier>,
    r: &Arc<Replica>,
    state: &mut State,
) -> Result<()> {
    let t = &r.tablet;
    let local: Vec<(SegmentRef, Arc<crate::segment::SegmentReader>)> = {
        let data = t.read();
        data.segments
            .iter()
            .filter(|(s, reader)| s.cold.is_some() && !reader.is_remote())
            .map(|(s, reader)| (s.clone(), reader.clone()))
            .collect()
    };
    if local.is_empty() {
        return Ok(());
    }
    let now = std::time::SystemTime::now();
    let mut candidates = Vec::new();
    for (seg, local_reader) in &local {
        if !state.confirmed.contains(&seg.id) {
            match confirm(tier, t.id, seg, local_reader.file_xxh3()).await {
                Ok(()) => {
                    state.confirmed.insert(seg.id.clone());
                }
                Err(e) => {
                    tracing::warn!(tablet = t.id, segment = %seg.id, error = %e, "cold copy not confirmed; kept locally");
                    continue;
                }
            }
        }
        let path = t.segment_dir.join(crate::segment::file_name(&seg.id));
        let age = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        candidates.push(Candidate {
            id: seg.id.clone(),
            bytes: seg.bytes,
            age,
        });
    }
    let (total, avail) = disk.usage().map_err(|e| Error::Io {
        context: format!("disk usage of {}", disk.data_dir().display()),
        source: e,
    })?;
    let policy = Policy {
        hot_age: tier.options.hot_age,
        evict_watermark: tier.options.evict_watermark,
        evict_aggressive_watermark: tier.options.evict_aggressive_watermark,
    };
    let planned = evict::plan(&candidates, total, avail, &policy);
    // Evict only while the store answers: a copy confirmed before an
    // outage would otherwise be evicted during it, and reads of it would
    // fail until the store is back, while the disk fills to its reserve
    // anyway (docs/OPERATIONS.md: nothing is evicted while the store is
    // unreachable). One check of the first copy per pass.
    if let Some((seg, reader)) = planned
        .first()
        .and_then(|id| local.iter().find(|(s, _)| &s.id == id))
        && let Err(e) = confirm(tier, t.id, seg, reader.file_xxh3()).await
    {
        tracing::debug!(tablet = t.id, error = %e, "the store does not answer: nothing evicted this pass");
        return Ok(());
    }
    for id in planned {
        let Some((seg, local_reader)) = local.iter().find(|(s, _)| s.id == id) else {
            continue;
        };
        let (tier2, seg2, tablet) = (tier.clone(), seg.clone(), t.id);
        let (dir, local_reader) = (t.segment_dir.clone(), local_reader.clone());
        let reader = tokio::task::spawn_blocking(move || {
            // The stub first, from the local file: the evicted segment
            // then opens without the bucket, now and after a restart.
            super::cold::keep_stub(&dir, &seg2.id, &local_reader);
            super::cold::open_reader(&tier2, tablet, &seg2, &dir)
        })
        .await
        .map_err(|e| Error::Other(e.to_string()))?
        .map_err(|e| Error::Other(format!("open cold copy of {id}: {e}")))?;
        let swapped = {
            let mut data = t.write();
            match data.segments.iter_mut().find(|(s, _)| s.id == id) {
                Some(entry) => {
                    entry.1 = Arc::new(reader);
                    true
                }
                None => false,
            }
        };
        if !swapped {
            continue;
        }
        let path = t.segment_dir.join(crate::segment::file_name(&id));
        std::fs::remove_file(&path).map_err(|e| Error::Io {
            context: format!("evict {}", path.display()),
            source: e,
        })?;
        let _ = crate::fsutil::fsync_dir(&t.segment_dir);
        tier.stats.segments_evicted.fetch_add(1, Ordering::Relaxed);
        tier.stats
            .bytes_evicted
            .fetch_add(seg.bytes, Ordering::Relaxed);
        tracing::debug!(tablet = t.id, segment = %id, "segment evicted to the cold tier");
    }
    Ok(())
}
