//! `WatchNamespaces`: the namespace map pushed to clients as the leader
//! applies changes, so a client's cached placements (a namespace's policy,
//! its cell's controllers) follow the directory without asking it.
//!
//! ```text
//! open(since) ─▶ leader? else NotLeader ─▶ the map since `since` (whole
//!   when 0 or ahead) ─▶ loop: wait for an applied entry (or a recheck
//!   period) ─▶ still leading? else end ─▶ namespaces whose own or whose
//!   cell's generation is past the last sent ─▶ send, if any
//! ```
//!
//! Each change is found by a pass over the namespaces: the directory
//! changes rarely (namespaces created, policies, cells registered), so a
//! pass per applied entry per watch is cheap at tens of thousands of
//! namespaces; an index by generation would replace it past that.

use std::sync::Arc;
use std::time::Duration;

use stele_proto::pb;
use tonic::Status;

use crate::server::{Directory, namespace_pb};
use crate::state::DirectoryState;

/// The stream of one `WatchNamespaces` call.
pub type NamespaceWatch = tokio_stream::wrappers::ReceiverStream<Result<pb::NamespaceMap, Status>>;

/// Messages a slow reader may have waiting before the watch waits for it.
const WATCH_BUFFER: usize = 4;

/// How often an idle watch checks that this member still leads.
const RECHECK: Duration = Duration::from_millis(500);

/// The namespaces changed after generation `since` (every one when
/// `full`), as of state `s`.
pub fn map_since(s: &DirectoryState, since: u64, full: bool) -> pb::NamespaceMap {
    let namespaces = s
        .namespaces
        .values()
        .filter(|n| {
            full || n.generation > since
                || s.cells.get(&n.cell).is_some_and(|c| c.generation > since)
        })
        .map(|n| namespace_pb(n, s))
        .collect();
    pb::NamespaceMap {
        generation: s.generation,
        namespaces,
        full,
    }
}

/// Opens a watch from generation `since` at this member, which must lead.
pub(crate) fn watch(d: Arc<Directory>, since: u64) -> Result<NamespaceWatch, Status> {
    let term = d.quorum.leading_term().ok_or_else(|| not_leader(&d))?;
    let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
    tokio::spawn(async move {
        let mut applied = d.quorum.applied_index().unwrap_or(0);
        let first = {
            let s = d.quorum.state();
            map_since(&s, since, since == 0 || since > s.generation)
        };
        let mut sent = first.generation;
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                now = d.quorum.wait_applied_past(applied, RECHECK) => {
                    if let Some(now) = now {
                        applied = now;
                    }
                }
            }
            if d.quorum.leading_term() != Some(term) {
                let _ = tx.send(Err(not_leader(&d))).await;
                return;
            }
            let next = {
                let s = d.quorum.state();
                (s.generation > sent).then(|| map_since(&s, sent, false))
            };
            if let Some(msg) = next {
                sent = msg.generation;
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(NamespaceWatch::new(rx))
}

fn not_leader(d: &Directory) -> Status {
    let (leader, endpoint) = match d.quorum.leader() {
        Some((id, ep)) => (Some(id), Some(ep)),
        None => (None, None),
    };
    stele_quorum::Error::NotLeader { leader, endpoint }.into()
}
