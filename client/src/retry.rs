//! Retry policy: exponential backoff with full jitter, bounded by attempts
//! and by a deadline. Pure: the caller supplies the clock reading and the
//! random draw, so the policy is tested without sleeping.

use std::time::Duration;

use stele_proto::ErrorKind;

/// How hard to try before giving up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub attempts_max: u32,
    /// Time from the first attempt after which no new attempt starts.
    pub deadline: Duration,
    /// Upper bound of the first backoff.
    pub backoff_initial: Duration,
    /// Upper bound of any backoff.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts_max: 10,
            deadline: Duration::from_secs(30),
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
}
