//! The one retry loop of the data path: every append, read and scan page
//! runs through [`Client::drive`].
//!
//! ```text
//! drive(route, send, classify)
//!   loop ─▶ route(&RouteTable) ─▶ Target{tablet, endpoint} ─▶ send one attempt (request_timeout)
//!        │                    └─▶ or a verdict at once (no route, the batch split)
//!        └─ classify(reply) ─▶ Done ─▶ return it
//!                             Fatal ─▶ return the error as is
//!                             Moved ─▶ repair the routes, return the error (the caller starts over)
//!                             Failed ─▶ Budget::after (pure): RetryPolicy::decide + which Repair
//!                                        ├─ GiveUp ─▶ return (Refuse as is, else Exhausted)
//!                                        └─ Again ─▶ repair the route cache, sleep, loop
//! ```
//!
//! The per-call code says only where an attempt goes, how to send it and
//! what its reply means; which errors are retried, how hints are followed
//! and when to give up are decided here, the same for every call.

use std::future::Future;
use std::time::{Duration, Instant};

use stele_proto::ErrorKind;
use stele_proto::pb::TabletDescriptor;

use crate::retry::{Decision, RetryPolicy};
use crate::{Client, Error, Result, RouteTable};

/// Where one attempt goes.
#[derive(Debug, Clone)]
pub(crate) struct Target<P> {
    /// The tablet the attempt addresses, when known: route repairs need it.
    pub tablet: Option<u64>,
    pub endpoint: String,
    /// What the call needs to build its request (an append's part).
    pub payload: P,
}

/// What one attempt came to, as the per-call code reads its reply.
#[derive(Debug)]
pub(crate) enum Verdict<T> {
    /// Success: the call returns this.
    Done(T),
    /// Failed; the retry policy decides what happens next.
    Failed(Error),
    /// Failed in a way no retry can help (a protocol violation, an atomic
    /// batch that now spans tablets): returned as is.
    Fatal(Error),
    /// The tablet moved or split under the call: the routes are repaired
    /// and the error returned as is, for the caller to start over.
    Moved(Error),
}

impl<T> From<Result<T>> for Verdict<T> {
    fn from(r: Result<T>) -> Self {
        match r {
            Ok(v) => Verdict::Done(v),
            Err(e) => Verdict::Failed(e),
        }
    }
}

/// How the route cache is fixed after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Repair {
    /// A typed answer that needs no route change (the node is there).
    Nothing,
    /// The endpoint did not answer (or said it cannot serve): stop
    /// trusting the tablet's leader, so the next attempt goes to the seed,
    /// and reload the routes.
    Unreachable { tablet: Option<u64> },
    /// `StaleRoute`: the node sent the tablet's current descriptor.
    Apply(TabletDescriptor),
    /// `NotLeader` for a known tablet: point it at the hinted leader, and
    /// reload the routes when that is not enough.
    SetLeader {
        tablet: u64,
        node: Option<u64>,
        endpoint: String,
    },
    /// `TabletNotFound`: drop the route and reload.
    Remove(u64),
    /// Reload the routes (no route, or a hint without a tablet).
    Refresh,
}

impl Repair {
    /// The attempt reached a node that is not the tablet's leader, or
    /// whose range moved on: a round trip a current route would have
    /// saved.
    fn redirected(&self) -> bool {
        matches!(
            self,
            Repair::Apply(_) | Repair::SetLeader { .. } | Repair::Remove(_)
        )
    }
}

/// What the driver does after a failed attempt.
#[derive(Debug)]
pub(crate) enum Action {
    /// Repair the routes, wait, and send again.
    Again {
        err: Error,
        repair: Repair,
        wait: Duration,
    },
    /// Return this error.
    GiveUp(Error),
}

/// The attempts of one call against the retry policy. An append's batch
/// shares one across the parts a split leaves, so the whole batch has one
/// budget.
#[derive(Debug)]
pub(crate) struct Budget {
    started: Instant,
    attempts: u32,
    redirects: u32,
}

impl Budget {
    pub fn start() -> Budget {
        Budget {
            started: Instant::now(),
            attempts: 0,
            redirects: 0,
        }
    }

    /// Counts a failed attempt against `tablet` and decides, `jitter`
    /// being a uniform draw in `[0, 1)`.
    pub fn after(
        &mut self,
        policy: &RetryPolicy,
        err: Error,
        tablet: Option<u64>,
        jitter: f64,
    ) -> Action {
        let elapsed = self.started.elapsed();
        self.after_at(policy, err, tablet, elapsed, jitter)
    }

    /// [`Budget::after`] with the time since the first attempt given.
    fn after_at(
        &mut self,
        policy: &RetryPolicy,
        err: Error,
        tablet: Option<u64>,
        elapsed: Duration,
        jitter: f64,
    ) -> Action {
        self.attempts += 1;
        let kind = err.kind();
        if kind == ErrorKind::Redirect {
            self.redirects += 1;
        }
        match policy.decide(kind, self.attempts, self.redirects, elapsed, jitter) {
            Decision::GiveUp => Action::GiveUp(give_up(err, self.attempts, elapsed)),
            Decision::Backoff(wait) => Action::Again {
                repair: unreachable_repair(&err, tablet),
                err,
                wait,
            },
            Decision::Redirect(wait) => Action::Again {
                repair: redirect_repair(&err, tablet),
                err,
                wait,
            },
        }
    }
}

/// The repair after a Redirect-kind error.
fn redirect_repair(err: &Error, tablet: Option<u64>) -> Repair {
    match (err.api(), tablet) {
        (Some(stele_proto::Error::StaleRoute { descriptor }), _) => {
            Repair::Apply(descriptor.clone())
        }
        (
            Some(stele_proto::Error::NotLeader {
                leader_node,
                leader_endpoint,
            }),
            Some(tablet),
        ) => Repair::SetLeader {
            tablet,
            node: *leader_node,
            endpoint: leader_endpoint.clone(),
        },
        (Some(stele_proto::Error::TabletNotFound { tablet }), _) => Repair::Remove(*tablet),
        _ => Repair::Refresh,
    }
}

/// The repair after a Retry-kind error: only a failure that is not a
/// node's typed answer (the leader's endpoint did not answer at all, or
/// answered `Unavailable`) makes the client stop trusting that leader.
fn unreachable_repair(err: &Error, tablet: Option<u64>) -> Repair {
    match err.api() {
        Some(stele_proto::Error::Unavailable { .. }) | None => Repair::Unreachable { tablet },
        Some(_) => Repair::Nothing,
    }
}

/// The error to return when the policy gives up: Refuse-kind errors as they
/// are, anything else wrapped to say the budget ran out.
pub(crate) fn give_up(err: Error, attempts: u32, elapsed: Duration) -> Error {
    if err.kind() == ErrorKind::Refuse {
        return err;
    }
    Error::Exhausted {
        attempts,
        elapsed,
        last: Box::new(err),
    }
}

fn jitter() -> f64 {
    rand::random::<f64>()
}

impl Client {
    /// Runs one call until it is done or the policy gives up. `route` picks
    /// where the next attempt goes from the route cache (or ends the call
    /// with a verdict of its own), `send` makes the request of one attempt,
    /// and `classify` reads its reply. `what` names the call in logs.
    pub(crate) async fn drive<P, R, T, Fut>(
        &self,
        what: &'static str,
        budget: &mut Budget,
        mut route: impl FnMut(&RouteTable) -> std::result::Result<Target<P>, Verdict<T>>,
        mut send: impl FnMut(crate::client::Data, &Target<P>) -> Fut,
        mut classify: impl FnMut(&Target<P>, Result<R>) -> Verdict<T>,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let policy = &self.inner.opts.retry;
        // Whether an attempt went to the wrong node for want of a current
        // route: counted once per call (`RouteStats::redirects`).
        let mut redirected = false;
        let out = loop {
            let routed = route(&self.inner.routes.read().expect("routes lock"));
            let (tablet, verdict) = match routed {
                Err(verdict) => (None, verdict),
                Ok(target) => {
                    let reply = match self.data(&target.endpoint) {
                        Ok(c) => self.timed(&target.endpoint, send(c, &target)).await,
                        Err(e) => Err(e),
                    };
                    (target.tablet, classify(&target, reply))
                }
            };
            let err = match verdict {
                Verdict::Done(v) => break Ok(v),
                Verdict::Fatal(e) => break Err(e),
                Verdict::Moved(e) => {
                    let repair = redirect_repair(&e, tablet);
                    redirected |= repair.redirected();
                    self.repair(repair).await;
                    break Err(e);
                }
                Verdict::Failed(e) => e,
            };
            match budget.after(policy, err, tablet, jitter()) {
                Action::GiveUp(e) => break Err(e),
                Action::Again { err, repair, wait } => {
                    tracing::debug!(call = what, error = %err, ?wait, attempt = budget.attempts, ?repair, "retrying");
                    redirected |= repair.redirected();
                    self.repair(repair).await;
                    tokio::time::sleep(wait).await;
                }
            }
        };
        if redirected {
            self.inner.stats.redirected();
        }
        out
    }

    /// Applies a repair to the route cache, reloading the routes when the
    /// cache alone cannot be fixed.
    async fn repair(&self, repair: Repair) {
        let refresh = {
            let mut routes = self.inner.routes.write().expect("routes lock");
            match repair {
                Repair::Nothing => false,
                Repair::Unreachable { tablet } => {
                    if let Some(t) = tablet {
                        routes.forget_leader(t);
                    }
                    true
                }
                Repair::Apply(descriptor) => {
                    routes.apply(&descriptor);
                    false
                }
                Repair::SetLeader {
                    tablet,
                    node,
                    endpoint,
                } => !routes.set_leader(tablet, node, &endpoint),
                Repair::Remove(tablet) => {
                    routes.remove(tablet);
                    true
                }
                Repair::Refresh => true,
            }
        };
        if refresh && let Err(e) = self.refresh_routes().await {
            tracing::debug!(error = %e, "route refresh failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts_max: 5,
            deadline: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        }
    }

    fn api(e: stele_proto::Error) -> Error {
        e.into()
    }

    fn unavailable() -> Error {
        api(stele_proto::Error::Unavailable {
            reason: "injected".into(),
        })
    }

    fn descriptor() -> TabletDescriptor {
        TabletDescriptor {
            id: 7,
            vshard_lo: 0,
            vshard_hi: 100,
            generation: 3,
            ..Default::default()
        }
    }

    /// What an action comes to, for comparing (errors are compared by
    /// their text).
    #[derive(Debug, PartialEq)]
    enum Want {
        Again(Repair, Duration),
        /// The error returned as is.
        Return(String),
        /// Wrapped in `Exhausted`, with this many attempts.
        Exhausted(u32),
    }

    fn seen(action: Action) -> Want {
        match action {
            Action::Again { repair, wait, .. } => Want::Again(repair, wait),
            Action::GiveUp(Error::Exhausted { attempts, .. }) => Want::Exhausted(attempts),
            Action::GiveUp(e) => Want::Return(e.to_string()),
        }
    }

    /// A case: its name, the error of the failed attempt, the tablet it
    /// addressed, the attempts and redirects before it, the time since the
    /// first attempt; and what the driver does.
    type Case = (&'static str, Error, Option<u64>, u32, u32, Duration, Want);

    /// The decisions after a failed attempt, the jitter draw being 0.5.
    #[test]
    fn decisions() {
        let ms = Duration::from_millis;
        let not_leader = api(stele_proto::Error::NotLeader {
            leader_node: Some(2),
            leader_endpoint: "http://n2".into(),
        });
        let refused = api(stele_proto::Error::ConditionFailed { actual: None });
        let cases: Vec<Case> = vec![
            (
                "unavailable: back off, forget the leader, reload",
                unavailable(),
                Some(7),
                0,
                0,
                ms(0),
                Want::Again(Repair::Unreachable { tablet: Some(7) }, ms(5)),
            ),
            (
                "a timeout is an unreachable leader too",
                Error::RequestTimeout {
                    endpoint: "http://n1".into(),
                    elapsed: ms(10),
                },
                Some(7),
                2,
                0,
                ms(0),
                Want::Again(Repair::Unreachable { tablet: Some(7) }, ms(20)),
            ),
            (
                "a typed retry (too stale) keeps the routes",
                api(stele_proto::Error::TooStale {
                    staleness_ms: 10,
                    max_staleness_ms: 1,
                }),
                Some(7),
                0,
                0,
                ms(0),
                Want::Again(Repair::Nothing, ms(5)),
            ),
            (
                "not the leader: follow the hint at once",
                not_leader.clone(),
                Some(7),
                0,
                0,
                ms(0),
                Want::Again(
                    Repair::SetLeader {
                        tablet: 7,
                        node: Some(2),
                        endpoint: "http://n2".into(),
                    },
                    ms(0),
                ),
            ),
            (
                "a second redirect backs off",
                not_leader.clone(),
                Some(7),
                1,
                1,
                ms(0),
                Want::Again(
                    Repair::SetLeader {
                        tablet: 7,
                        node: Some(2),
                        endpoint: "http://n2".into(),
                    },
                    ms(5),
                ),
            ),
            (
                "not the leader of an unknown tablet: reload",
                not_leader.clone(),
                None,
                0,
                0,
                ms(0),
                Want::Again(Repair::Refresh, ms(0)),
            ),
            (
                "stale route: take the descriptor the node sent",
                api(stele_proto::Error::StaleRoute {
                    descriptor: descriptor(),
                }),
                Some(7),
                0,
                0,
                ms(0),
                Want::Again(Repair::Apply(descriptor()), ms(0)),
            ),
            (
                "tablet not found: drop its route",
                api(stele_proto::Error::TabletNotFound { tablet: 7 }),
                Some(7),
                0,
                0,
                ms(0),
                Want::Again(Repair::Remove(7), ms(0)),
            ),
            (
                "no route: reload",
                Error::NoRoute { vshard: 9 },
                None,
                0,
                0,
                ms(0),
                Want::Again(Repair::Refresh, ms(0)),
            ),
            (
                "a refusal returns as is",
                refused.clone(),
                Some(7),
                0,
                0,
                ms(0),
                Want::Return(refused.to_string()),
            ),
            (
                "a refusal returns as is even with the budget spent",
                refused.clone(),
                Some(7),
                9,
                0,
                ms(0),
                Want::Return(refused.to_string()),
            ),
            (
                "out of attempts",
                unavailable(),
                Some(7),
                4,
                0,
                ms(0),
                Want::Exhausted(5),
            ),
            (
                "out of attempts on redirects too",
                not_leader,
                Some(7),
                4,
                4,
                ms(0),
                Want::Exhausted(5),
            ),
            (
                "the wait would pass the deadline",
                unavailable(),
                Some(7),
                1,
                0,
                ms(995),
                Want::Exhausted(2),
            ),
        ];
        for (name, err, tablet, attempts, redirects, elapsed, want) in cases {
            let mut budget = Budget {
                started: Instant::now(),
                attempts,
                redirects,
            };
            let got = seen(budget.after_at(&policy(), err, tablet, elapsed, 0.5));
            assert_eq!(got, want, "{name}");
        }
    }
}
