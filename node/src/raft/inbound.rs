//! Raft messages from peer nodes, delivered to the replica they name.
//!
//! ```text
//! transport ─► peering::RaftHandler (filter, replica lookup)
//!          ─► Inbound::deliver: contact for the pacer, leader contact for
//!             bounded reads, a snapshot's missing segments fetched
//!          ─► router::dispatch ─► openraft
//! ```

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::router::{self, Peers};
use super::{NodeStats, Replica};
use crate::catalog::SegmentRef;

/// Why a peer's Raft message was not delivered (the transport refuses the
/// call with this reason; the sender retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tablet {group} is not on this node")]
    UnknownGroup { group: u64 },
    #[error("replica {target} of tablet {group} is not here (this node holds replica {here})")]
    WrongReplica { group: u64, target: u64, here: u64 },
    #[error("no peers to fetch segments from")]
    NoPeers,
    #[error("snapshot of tablet {tablet}: {reason}")]
    Snapshot { tablet: u64, reason: String },
    #[error("open the cold copy of a snapshot's segment {segment}: {reason}")]
    ColdOpen { segment: String, reason: String },
    #[error("fetch segment {segment} of tablet {tablet}: {reason}")]
    Fetch {
        tablet: u64,
        segment: String,
        reason: String,
    },
}

/// The future of one segment fetch: the published file's path.
pub type FetchFuture<'a> =
    Pin<Box<dyn std::future::Future<Output = Result<PathBuf, Error>> + Send + 'a>>;

/// Object-safe access to the peers, for fetching segments.
pub trait SegmentSource: Send + Sync {
    /// Fetches segment `seg` of `group` from `replica` on `node` into `dir`
    /// ([`router::fetch_segment`]).
    fn fetch<'a>(
        &'a self,
        node: u64,
        group: u64,
        replica: u64,
        seg: &'a SegmentRef,
        dir: &'a Path,
    ) -> FetchFuture<'a>;
}

impl<P: Peers> SegmentSource for P {
    fn fetch<'a>(
        &'a self,
        node: u64,
        group: u64,
        replica: u64,
        seg: &'a SegmentRef,
        dir: &'a Path,
    ) -> FetchFuture<'a> {
        Box::pin(async move {
            router::fetch_segment(self, node, group, replica, &seg.id, seg.bytes, dir)
                .await
                .map_err(|e| Error::Fetch {
                    tablet: group,
                    segment: seg.id.clone(),
                    reason: e.to_string(),
                })
        })
    }
}

/// What delivering a message needs besides the replica: the peers to fetch
/// a snapshot's segments from, the cold tier to read them from instead,
/// and the counters.
pub struct Inbound {
    peers: Option<Arc<dyn SegmentSource>>,
    tier: Option<Arc<crate::tier::Tier>>,
    stats: Arc<NodeStats>,
}

impl Inbound {
    pub fn new(
        peers: Option<Arc<dyn SegmentSource>>,
        tier: Option<Arc<crate::tier::Tier>>,
        stats: Arc<NodeStats>,
    ) -> Inbound {
        Inbound { peers, tier, stats }
    }

    /// Delivers a Raft message from a peer node to `r`, which must be
    /// `target_replica`.
    pub async fn deliver(
        &self,
        r: &Replica,
        target_replica: u64,
        body: &[u8],
    ) -> Result<Bytes, Error> {
        if r.replica_id != target_replica {
            return Err(Error::WrongReplica {
                group: r.tablet.id,
                target: target_replica,
                here: r.replica_id,
            });
        }
        let rpc = router::decode_msg::<router::RaftRpc>("raft rpc", body);
        if let Ok(router::RaftRpc::Sleep(req)) = &rpc {
            let agreed = r.agree_to_sleep(req);
            return Ok(router::encode_msg(router::RaftReply::Sleep(agreed)));
        }
        if rpc.is_ok() {
            // Any other message for the group wakes it.
            r.hibernation.wake();
        }
        if matches!(
            &rpc,
            Ok(router::RaftRpc::Append(_)
                | router::RaftRpc::Vote(_)
                | router::RaftRpc::Snapshot { .. })
        ) {
            r.contact.touch();
        }
        if let Ok(router::RaftRpc::Append(req)) = &rpc {
            let commit = req.leader_commit.as_ref().map_or(0, |l| l.index());
            *r.tablet.leader_contact.lock().expect("lock poisoned") =
                Some((std::time::Instant::now(), commit));
        }
        if let Ok(router::RaftRpc::Snapshot { vote, data, .. }) = rpc {
            // A snapshot names segments; fetch the ones this replica lacks
            // from the leader that sent it before openraft installs it.
            self.fetch_missing_segments(r, vote.leader_id.node_id, &data)
                .await?;
        }
        Ok(router::dispatch(&r.raft, &r.tablet.segment_dir, body).await)
    }

    async fn fetch_missing_segments(
        &self,
        r: &Replica,
        leader_replica: u64,
        snapshot: &[u8],
    ) -> Result<(), Error> {
        let Some(peers) = &self.peers else {
            return Err(Error::NoPeers);
        };
        let tablet = r.tablet.id;
        let segments =
            super::state_machine::snapshot_segments(snapshot).map_err(|e| Error::Snapshot {
                tablet,
                reason: e.to_string(),
            })?;
        for seg in segments {
            let path = r
                .tablet
                .segment_dir
                .join(crate::segment::file_name(&seg.id));
            // A segment in the bucket is read from there instead (the
            // install opens it remotely): only the rest crosses the node
            // transport (node::tier).
            if path.exists() {
                continue;
            }
            if let Some(tier) = &self.tier
                && crate::tier::in_bucket(Some(tier), tablet, &seg).await
            {
                // Opened here first, which keeps its stub: the install then
                // opens it with no request, and a failing bucket fails this
                // delivery (the leader sends the snapshot again) rather
                // than the install, which openraft takes as fatal.
                let segment = seg.id.clone();
                let (tier, dir) = (tier.clone(), r.tablet.segment_dir.clone());
                tokio::task::spawn_blocking(move || {
                    crate::tier::cold::open_reader(&tier, tablet, &seg, &dir).map(drop)
                })
                .await
                .map_err(|e| Error::ColdOpen {
                    segment: segment.clone(),
                    reason: e.to_string(),
                })?
                .map_err(|e| Error::ColdOpen {
                    segment,
                    reason: e.to_string(),
                })?;
                continue;
            }
            // Streamed to a part file, verified, then renamed into place:
            // never more than one chunk in memory.
            peers
                .fetch(
                    router::node_of(leader_replica),
                    tablet,
                    leader_replica,
                    &seg,
                    &r.tablet.segment_dir,
                )
                .await?;
            self.stats.segments_fetched.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
