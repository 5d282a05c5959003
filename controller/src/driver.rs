//! The scheduler's driver: on each tick, while this controller leads, it
//! reads the clock, brings the health view up to the pass
//! ([`HealthView::observe`](crate::health::HealthView::observe)), asks
//! [`scheduler::plan`] what to do, and does it: proposes (each batch the
//! plan gives as one append), records notes, logs. It decides nothing
//! itself.
//!
//! A pass stops at the first proposal that fails (this controller lost the
//! leadership, or the quorum cannot commit): the plan's later steps were
//! decided on the assumption that the earlier ones went through. The
//! proposals of one batch go to the log together and in order, so a later
//! one may be in the log when an earlier one failed, but it can only
//! commit after it: the assumption holds for whatever commits. The next
//! tick plans afresh.
//!
//! The health view is read once, under its lock, while the plan is made
//! (planning is synchronous and takes no longer than the old loop held the
//! same lock for its load bookkeeping). A heartbeat that lands while the
//! pass proposes is seen by the next pass, where the old loop could read
//! it halfway through: one of the interleavings the old loop allowed too.
//! The pass's one clock reading also dates what the old loop timed with a
//! second reading a few milliseconds later (a merge phase's first sight,
//! the restart of samples after an automatic split or merge).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::scheduler::{self, Action};
use crate::server::Controller;

/// A plan slower than this is logged: heartbeats wait for it.
const SLOW_PLAN: Duration = Duration::from_millis(500);

/// Most proposals a pass sends as one append. A repair pass proposes up
/// to `max_intents` moves and as many finishes; one commit round each
/// held repair at about 35 tablets a second at 100,000 tablets
/// (docs/BENCHMARKS.md, "Controller at full size").
const MAX_BATCH: usize = 256;

pub(crate) async fn run(c: Arc<Controller>) {
    let mut tick = tokio::time::interval(c.opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let policy = c.opts.policy();
    loop {
        tokio::select! {
            _ = c.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !c.quorum.is_leader() {
            c.health().leading = None;
            continue;
        }
        // Applied everything committed before acting on it.
        if c.quorum.linearizable().await.is_err() {
            continue;
        }
        if let Err(e) = pass(&c, &policy).await {
            tracing::debug!(error = %e, "scheduler pass stopped");
        }
    }
}

/// One scheduler pass.
async fn pass(c: &Controller, policy: &scheduler::Policy) -> Result<()> {
    let now = Instant::now();
    let term = c.quorum.term();
    let mut plan = Controller::blocking(|| {
        let s = c.snapshot();
        let mut h = c.health();
        let planning = Instant::now();
        h.observe(&s, term, now, policy.lease);
        let plan = scheduler::plan(&s, &h, now, policy);
        let took = planning.elapsed();
        crate::metrics::record_plan(took);
        if took > SLOW_PLAN {
            tracing::warn!(
                ms = took.as_millis() as u64,
                tablets = s.tablets.len(),
                "a scheduler plan took long (heartbeats wait for it)"
            );
        }
        plan
    });
    loop {
        let batch = plan.batch(MAX_BATCH);
        if batch.is_empty() {
            return Ok(());
        }
        let cmds: Vec<_> = batch
            .iter()
            .filter_map(|a| match a {
                Action::Propose(cmd) => Some(cmd.clone()),
                _ => None,
            })
            .collect();
        let mut results = c.propose_many(cmds).await?.into_iter();
        let mut replies = Vec::new();
        let mut failed = None;
        for action in batch {
            match action {
                Action::Propose(_) => match results.next() {
                    Some(Ok(reply)) => replies.push(reply),
                    Some(Err(e)) => {
                        failed = Some(e);
                        break;
                    }
                    None => unreachable!("one result per proposal"),
                },
                Action::Note(n) => c.health().note(n),
                Action::Log(l) => l.emit(),
            }
        }
        for action in plan.replied(replies) {
            match action {
                Action::Note(n) => c.health().note(n),
                Action::Log(l) => l.emit(),
                Action::Propose(_) => unreachable!("replies only log and note"),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
}
