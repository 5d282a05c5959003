//! The node's seal worker: builds and publishes sealed memtables, one at a
//! time in seal order, opens the split children and removes the absorbed
//! replicas those seals create and retire, then lets openraft snapshot and
//! purge the log up to the new checkpoint.
//!
//! ```text
//! apply (Effect::Seal) ──(tablet, index)──► run ──spawn_blocking──► tablet::seal::run_seal
//!                                             ├─ child ──► ReplicaSet::open_split_child
//!                                             ├─ absorbed ──► ReplicaSet::remove_replica
//!                                             └─ purge task (snapshot, then purge the log)
//! ```

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::replicas::ReplicaSet;
use crate::tablet::{Tablet, seal};

/// Runs until the node shuts down (or every sender is gone). Purges run as
/// tasks of `tasks`, which the node waits for on shutdown.
pub async fn run(
    replicas: ReplicaSet,
    mut rx: mpsc::UnboundedReceiver<(Arc<Tablet>, u64)>,
    tasks: TaskTracker,
) {
    let cancel = replicas.shutdown_token();
    loop {
        let job = tokio::select! {
            _ = cancel.cancelled() => return,
            job = rx.recv() => job,
        };
        let Some((tablet, seal_index)) = job else {
            return;
        };
        let span = tracing::info_span!(
            "seal",
            tablet = tablet.id,
            replica = tablet.replica_id,
            index = seal_index
        );
        seal_one(&replicas, tablet, seal_index, &tasks, &cancel)
            .instrument(span)
            .await;
    }
}

/// One seal job, in its `seal` span (`crate::trace`): every line it logs
/// names the tablet, the replica and the seal index.
async fn seal_one(
    replicas: &ReplicaSet,
    tablet: Arc<Tablet>,
    seal_index: u64,
    tasks: &TaskTracker,
    cancel: &tokio_util::sync::CancellationToken,
) {
    let t = tablet.clone();
    let span = tracing::Span::current();
    let result =
        tokio::task::spawn_blocking(move || span.in_scope(|| seal::run_seal(&t, seal_index))).await;
    match result {
        Ok(Ok(Some(done))) => {
            let checkpoint = done.checkpoint;
            if let Some(child) = done.child {
                let (id, parent) = (child.id, tablet.id);
                match replicas.open_split_child(child).await {
                    Ok(()) => {
                        tracing::info!(tablet = parent, child = id, "split: child replica opened")
                    }
                    Err(e) => {
                        tracing::error!(tablet = parent, child = id, error = %e, "split: child replica not opened; it opens at the next start")
                    }
                }
            }
            if let Some((absorbed, replica)) = done.absorbed {
                // Its catalog rows went with the seal's publish.
                match replicas.remove_replica(absorbed, replica).await {
                    Ok(_) => tracing::info!(
                        tablet = tablet.id,
                        absorbed,
                        "merge: absorbed replica adopted and removed"
                    ),
                    Err(e) => {
                        tracing::error!(tablet = tablet.id, absorbed, error = %e, "merge: absorbed replica not removed; its files go at the next start")
                    }
                }
            }
            if let Some(r) = replicas.replica(tablet.id) {
                let cancel = cancel.clone();
                tasks.spawn(async move {
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = r.purge_after_snapshot(checkpoint) => {}
                    }
                });
            }
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::error!(tablet = tablet.id, seal_index, error = %e, "seal failed; rows kept in memory and journal")
        }
        Err(e) => tracing::error!(tablet = tablet.id, error = %e, "seal task panicked"),
    }
}
