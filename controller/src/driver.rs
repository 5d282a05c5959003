//! The scheduler's driver: on each tick, while this controller leads, it
//! reads the clock, brings the health view up to the pass
//! ([`HealthView::observe`](crate::health::HealthView::observe)), asks
//! [`scheduler::plan`] what to do, and does it: proposes, records notes,
//! logs. It decides nothing itself.
//!
//! A pass stops at the first proposal that fails (this controller lost the
//! leadership, or the quorum cannot commit): the plan's later steps were
//! decided on the assumption that the earlier ones went through, as the
//! old single loop awaited each proposal before the next. The next tick
//! plans afresh.
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
    let mut reply = None;
    while let Some(action) = plan.next(reply.take()) {
        match action {
            Action::Propose(cmd) => reply = Some(c.propose(cmd).await?),
            Action::Note(n) => c.health().note(n),
            Action::Log(l) => l.emit(),
        }
    }
    Ok(())
}
