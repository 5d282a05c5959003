//! The node's seal policy driver: every `policy_interval`, gathers what the
//! pure policy ([`crate::tablet::policy::plan`]) decides on, proposes the
//! seals and compactions it returns, and trims the journal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::journal::Journal;
use crate::replicas::ReplicaSet;
use crate::tablet::policy::{self, TabletState};
use crate::tablet::seal;

/// The policy's settings (from `NodeOptions`).
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    pub interval: Duration,
    /// Seal the largest memtables when all of them together pass this.
    pub memtable_budget_bytes: usize,
    /// Force-seal the tablets holding back journal trim past this size.
    pub journal_retained_bytes_max: u64,
    /// Whether a cold tier is on (segments shared since a split are then
    /// never rewritten: [`seal::may_rewrite`]).
    pub cold_tier: bool,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What the policy needs of one replica. Segments are listed only for a
/// leader that could compact (no seal in flight, not frozen for a merge):
/// the policy looks at no others.
fn state_of(r: &crate::raft::Replica, cold_tier: bool) -> TabletState {
    let leader = r.is_leader();
    let merge_frozen = r.tablet.is_frozen();
    let range = r.tablet.range();
    let data = r.tablet.read();
    let seal_in_flight = !data.frozen.is_empty();
    let opts = &r.tablet.options;
    let segments = if leader && !seal_in_flight && !merge_frozen {
        data.segments
            .iter()
            .map(|(s, reader)| {
                let h = reader.header();
                seal::Candidate {
                    id: s.id.clone(),
                    bytes: s.bytes,
                    origin: h.tablet,
                    movable: seal::may_rewrite(s, cold_tier),
                    holds_unread: s.holds_unread((h.vshard_lo, h.vshard_hi), range),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    TabletState {
        id: r.tablet.id,
        leader,
        seal_in_flight,
        merge_frozen,
        memtable_bytes: data.memtable.bytes(),
        oldest_at_us: data.memtable.oldest_at_us(),
        memtable_bytes_max: opts.memtable_bytes_max,
        memtable_age_max_us: opts.memtable_age_max_us,
        segments,
        compact_target_bytes: opts.compact_target_bytes,
        compact_min_inputs: opts.compact_min_inputs,
    }
}

/// Runs until the node shuts down.
pub async fn run(replicas: ReplicaSet, journal: Journal, opts: PolicyOptions) {
    let cancel = replicas.shutdown_token();
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let states: Vec<TabletState> = replicas
            .replicas()
            .iter()
            .map(|r| state_of(r, opts.cold_tier))
            .collect();
        let laggards = journal.laggards(opts.journal_retained_bytes_max);
        let decided = policy::plan(&states, &laggards, opts.memtable_budget_bytes, now_us());
        for (id, reason) in decided.seals {
            if let Err(e) = replicas.seal(id, reason).await {
                tracing::warn!(tablet = id, ?reason, error = %e, "seal proposal failed");
            }
        }
        for (id, inputs) in decided.compactions {
            let n = inputs.len();
            match replicas.compact(id, inputs).await {
                Ok(()) => tracing::info!(tablet = id, inputs = n, "compaction proposed"),
                Err(e) => tracing::warn!(tablet = id, error = %e, "compaction proposal failed"),
            }
        }
        match journal.trim() {
            Ok(deleted) if !deleted.is_empty() => {
                tracing::debug!(files = deleted.len(), "journal trimmed")
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "journal trim failed"),
        }
    }
}
