//! Retry policy: exponential backoff with full jitter, bounded by a time
//! budget (and, only if a caller asks, by a count of attempts). Pure: the
//! caller supplies the clock reading and the random draw, so the policy is
//! tested without sleeping.
//!
//! The budget is time, not attempts, because what a call waits out is a
//! leader election or transfer, which takes time whatever the backoff: a
//! follower campaigns after `[T, 2T)` without a leader (`T` the election
//! timeout, 3 s by default), so a budget must cover at least two election
//! timeouts. Ten attempts of a 10 ms backoff gave up after ~370 ms while a
//! fresh cell was still electing (issue 18).
//!
//! We keep this small pure policy rather than `backon`: the driver's
//! decision also depends on the error kind (a first redirect is free, a
//! refusal ends the call), which `backon`'s iterator of delays does not see,
//! and a pure function is tested with a fake clock.

use std::time::Duration;

use stele_proto::ErrorKind;

/// How hard to try before giving up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included. Unbounded (`u32::MAX`) by
    /// default: the budget is `deadline`; tests that want a call to fail
    /// fast set a small count.
    pub attempts_max: u32,
    /// The retry budget: time from the first attempt after which no new
    /// attempt starts. At least two election timeouts of the cell.
    pub deadline: Duration,
    /// Upper bound of the first backoff.
    pub backoff_initial: Duration,
    /// Upper bound of any backoff.
    pub backoff_max: Duration,
}

/// The default retry budget: ten default election timeouts (3 s), so a
/// call outlives an election that needs several rounds, or a leader
/// transfer followed by an election.
pub const BUDGET_DEFAULT: Duration = Duration::from_secs(30);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts_max: u32::MAX,
            deadline: BUDGET_DEFAULT,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Wait, then send again to the same place.
    Backoff(Duration),
    /// Fix the routes, then send again at once (after `delay`, which is
    /// nonzero only for repeated redirects, so a flapping leader is not hammered).
    Redirect(Duration),
    /// Return the error.
    GiveUp,
}

impl RetryPolicy {
    /// The default policy with a retry budget of `budget`.
    pub fn with_budget(budget: Duration) -> RetryPolicy {
        RetryPolicy {
            deadline: budget,
            ..RetryPolicy::default()
        }
    }

    /// The backoff ceiling before attempt `attempt + 1` (attempt counts from 1).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(20);
        self.backoff_initial
            .saturating_mul(1 << shift)
            .min(self.backoff_max)
    }

    /// Decides after the `attempt`-th failed attempt (counting from 1), made
    /// `elapsed` after the first one started. `jitter` is a uniform draw in
    /// `[0, 1)`; the backoff is `jitter * ceiling` (full jitter).
    pub fn decide(
        &self,
        kind: ErrorKind,
        attempt: u32,
        redirects: u32,
        elapsed: Duration,
        jitter: f64,
    ) -> Decision {
        if kind == ErrorKind::Refuse || attempt >= self.attempts_max {
            return Decision::GiveUp;
        }
        let wait = match kind {
            ErrorKind::Retry => self.ceiling(attempt).mul_f64(jitter.clamp(0.0, 1.0)),
            // The first redirect is free; later ones back off like retries.
            _ if redirects <= 1 => Duration::ZERO,
            _ => self.ceiling(redirects - 1).mul_f64(jitter.clamp(0.0, 1.0)),
        };
        if elapsed + wait >= self.deadline {
            return Decision::GiveUp;
        }
        match kind {
            ErrorKind::Retry => Decision::Backoff(wait),
            _ => Decision::Redirect(wait),
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

    #[test]
    fn ceilings_grow_and_cap() {
        let p = policy();
        let got: Vec<u64> = (1..=6).map(|a| p.ceiling(a).as_millis() as u64).collect();
        assert_eq!(got, [10, 20, 40, 50, 50, 50]);
        assert_eq!(p.ceiling(1000), Duration::from_millis(50));
    }

    #[test]
    fn decisions() {
        let p = policy();
        let ms = Duration::from_millis;
        let cases = [
            // (kind, attempt, redirects, elapsed, jitter) -> decision
            (
                (ErrorKind::Retry, 1, 0, ms(0), 0.5),
                Decision::Backoff(ms(5)),
            ),
            (
                (ErrorKind::Retry, 3, 0, ms(0), 1.0),
                Decision::Backoff(ms(40)),
            ),
            ((ErrorKind::Retry, 5, 0, ms(0), 0.5), Decision::GiveUp),
            ((ErrorKind::Retry, 2, 0, ms(995), 0.5), Decision::GiveUp),
            ((ErrorKind::Refuse, 1, 0, ms(0), 0.5), Decision::GiveUp),
            (
                (ErrorKind::Redirect, 1, 1, ms(0), 0.5),
                Decision::Redirect(ms(0)),
            ),
            (
                (ErrorKind::Redirect, 2, 2, ms(0), 0.5),
                Decision::Redirect(ms(5)),
            ),
            ((ErrorKind::Redirect, 5, 5, ms(0), 0.5), Decision::GiveUp),
        ];
        for ((kind, attempt, redirects, elapsed, jitter), want) in cases {
            assert_eq!(
                p.decide(kind, attempt, redirects, elapsed, jitter),
                want,
                "{kind:?} attempt {attempt}"
            );
        }
    }

    /// The waits of a call that fails with `kind` on every attempt, each
    /// attempt taking `attempt_time`, on a fake clock, with jitter draws
    /// from `draws`: (waits, attempts, elapsed when it gave up).
    fn schedule(
        p: &RetryPolicy,
        kind: ErrorKind,
        attempt_time: Duration,
        mut draws: impl FnMut() -> f64,
    ) -> (Vec<Duration>, u32, Duration) {
        let (mut waits, mut elapsed, mut attempt, mut redirects) = (vec![], Duration::ZERO, 0, 0);
        loop {
            elapsed += attempt_time;
            attempt += 1;
            if kind == ErrorKind::Redirect {
                redirects += 1;
            }
            match p.decide(kind, attempt, redirects, elapsed, draws()) {
                Decision::GiveUp => return (waits, attempt, elapsed),
                Decision::Backoff(w) | Decision::Redirect(w) => {
                    waits.push(w);
                    elapsed += w;
                }
            }
        }
    }

    /// A tiny deterministic generator, so the schedule test needs no seed
    /// plumbing: draws spread over `[0, 1)`.
    fn draws(mut x: u64) -> impl FnMut() -> f64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The default policy keeps retrying until its time budget is spent,
    /// not after a count of attempts: a call that meets "not the leader"
    /// with no hint on every attempt (a cell still electing) keeps going
    /// for the whole budget, each wait bounded by `backoff_max`.
    #[test]
    fn the_default_budget_is_time_and_is_reached() {
        let p = RetryPolicy::default();
        assert_eq!(p.deadline, BUDGET_DEFAULT);
        // Two default election timeouts (3 s) fit many times over.
        assert!(p.deadline >= 2 * Duration::from_millis(3000));
        for kind in [ErrorKind::Retry, ErrorKind::Redirect] {
            let (waits, attempts, elapsed) = schedule(&p, kind, Duration::from_millis(1), draws(7));
            assert!(
                elapsed + p.backoff_max >= p.deadline,
                "{kind:?}: gave up after {elapsed:?}, before the budget"
            );
            assert!(elapsed <= p.deadline, "{kind:?}: ran past the budget");
            assert!(attempts > 10, "{kind:?}: {attempts} attempts");
            assert!(
                waits.iter().all(|w| *w <= p.backoff_max),
                "{kind:?}: unbounded"
            );
        }
    }

    /// The waits are jittered (full jitter under a growing ceiling), so
    /// many clients retrying together spread out; and an always-zero or
    /// always-one draw still gives a bounded schedule that reaches the
    /// budget.
    #[test]
    fn the_schedule_is_jittered_and_bounded() {
        let p = RetryPolicy::with_budget(Duration::from_secs(5));
        let (a, _, _) = schedule(&p, ErrorKind::Retry, Duration::ZERO, draws(1));
        let (b, _, _) = schedule(&p, ErrorKind::Retry, Duration::ZERO, draws(2));
        assert_ne!(a, b, "two clients draw the same waits");
        for (i, w) in a.iter().enumerate() {
            assert!(*w <= p.ceiling(i as u32 + 1), "wait {i} above its ceiling");
        }
        let (top, _, elapsed) = schedule(&p, ErrorKind::Retry, Duration::ZERO, || 0.999_999);
        assert!(elapsed + p.backoff_max >= p.deadline && elapsed <= p.deadline);
        assert!(top.iter().all(|w| *w <= p.backoff_max));
        // Zero waits make no progress on a fake clock that only the
        // attempts move: the budget is still what ends the call.
        let (_, attempts, elapsed) =
            schedule(&p, ErrorKind::Retry, Duration::from_millis(100), || 0.0);
        assert!(
            elapsed + Duration::from_millis(100) >= p.deadline,
            "{elapsed:?}"
        );
        assert!(attempts >= 49, "{attempts}");
    }

    /// A caller can still cap the attempts (tests that want a fast failure).
    #[test]
    fn an_attempt_cap_still_applies() {
        let p = RetryPolicy {
            attempts_max: 3,
            ..RetryPolicy::default()
        };
        let (_, attempts, _) = schedule(&p, ErrorKind::Retry, Duration::ZERO, draws(3));
        assert_eq!(attempts, 3);
    }
}
