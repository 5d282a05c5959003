//! A warning before a process's certificate expires: at start and then
//! daily, while it expires within the window (30 days unless told), a
//! WARN line names the serial and the days left. A rotated certificate
//! (a reload) ends the warnings at the next check.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::creds::Credentials;

/// Warn when the certificate expires within this.
pub const WARN_WITHIN: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often the warning is repeated while it holds.
pub const CHECK_EVERY: Duration = Duration::from_secs(24 * 3600);

/// How long is left before `not_after` when that is within `window` of
/// `now` (zero once expired); `None` when it is further off.
pub fn expiring(not_after: SystemTime, now: SystemTime, window: Duration) -> Option<Duration> {
    let left = not_after.duration_since(now).unwrap_or(Duration::ZERO);
    (left <= window).then_some(left)
}

/// Checks `creds` now and every `every` until `cancel`, warning while the
/// certificate expires within `window`.
pub fn warn_before_expiry(
    creds: Arc<Credentials>,
    window: Duration,
    every: Duration,
    cancel: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            check(&creds, window);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
}

fn check(creds: &Credentials, window: Duration) {
    let Some(not_after) = creds.not_after() else {
        return;
    };
    let Some(left) = expiring(not_after, SystemTime::now(), window) else {
        return;
    };
    let serial = creds.serial().unwrap_or_default();
    let not_after_unix = not_after
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if left.is_zero() {
        tracing::warn!(
            serial,
            not_after_unix,
            "the TLS certificate has EXPIRED: peers refuse it; issue a new one and write it in place (docs/SECURITY.md \"Rotating\")"
        );
    } else {
        tracing::warn!(
            serial,
            not_after_unix,
            days_left = left.as_secs() / 86_400,
            "the TLS certificate expires in {} days: issue a new one and write it in place (docs/SECURITY.md \"Rotating\")",
            left.as_secs() / 86_400
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_inside_the_window() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let day = Duration::from_secs(86_400);
        let check = |left_days: i64, expect: Option<u64>| {
            let not_after = if left_days >= 0 {
                now + day * left_days as u32
            } else {
                now - day * (-left_days) as u32
            };
            let got = expiring(not_after, now, WARN_WITHIN).map(|d| d.as_secs() / 86_400);
            assert_eq!(got, expect, "{left_days} days left");
        };
        check(365, None);
        check(31, None);
        check(30, Some(30));
        check(10, Some(10));
        check(0, Some(0));
        check(-3, Some(0));
    }
}
