//! The node's load over one heartbeat window, for the console's charts:
//! data calls counted and Append latency in a small bucketed histogram.
//!
//! ```text
//! service (each call) ── record_append / record_read ──▶ LoadMeter (atomics)
//! agent (each heartbeat) ── take() ──▶ pb::NodeLoad ──▶ controller's ring
//! ```
//!
//! Recording is a handful of relaxed atomic adds: no lock, no allocation,
//! whatever the rate. `take` swaps every counter to zero; a call recorded
//! while it runs lands in this window or the next, never in both. The p99
//! is the top of the bucket the 99th percentile falls in: an upper bound
//! at most 50% above the true value (two buckets per power of two).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use std::sync::Mutex;

use stele_proto::pb;

/// Buckets per power of two of microseconds.
const SUB: usize = 2;
/// Powers of two covered: 1 µs to 2^36 µs (about 19 hours); slower calls
/// go in the last bucket.
const POWERS: usize = 36;
const BUCKETS: usize = POWERS * SUB;

/// Append and read counts and Append latency since the last [`take`].
///
/// [`take`]: LoadMeter::take
pub struct LoadMeter {
    appends: AtomicU64,
    append_records: AtomicU64,
    reads: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
    /// When the current window started.
    since: Mutex<Instant>,
}

impl Default for LoadMeter {
    fn default() -> LoadMeter {
        LoadMeter {
            appends: AtomicU64::new(0),
            append_records: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            since: Mutex::new(Instant::now()),
        }
    }
}

/// The bucket of a latency of `us` microseconds.
fn bucket_of(us: u64) -> usize {
    if us < 2 {
        return 0;
    }
    let power = 63 - us.leading_zeros() as usize;
    // The bit below the leading one picks the half of the power.
    let half = ((us >> (power - 1)) & 1) as usize;
    (power * SUB + half).min(BUCKETS - 1)
}

/// The largest latency (µs) bucket `i` holds.
fn bucket_top(i: usize) -> u64 {
    let (power, half) = (i / SUB, i % SUB);
    if power == 0 {
        return 1;
    }
    // [2^p, 1.5·2^p) and [1.5·2^p, 2^(p+1)).
    let base = 1u64 << power;
    if half == 0 {
        base + (base >> 1) - 1
    } else {
        (base << 1) - 1
    }
}

impl LoadMeter {
    /// A successful Append of `records` records that took `elapsed`.
    pub fn record_append(&self, elapsed: Duration, records: u64) {
        self.appends.fetch_add(1, Relaxed);
        self.append_records.fetch_add(records, Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)].fetch_add(1, Relaxed);
    }

    /// A successful read call (Get, ScanKey or Scan).
    pub fn record_read(&self) {
        self.reads.fetch_add(1, Relaxed);
    }

    /// The window since the previous call, and a new one from now.
    pub fn take(&self) -> pb::NodeLoad {
        let now = Instant::now();
        let window = {
            let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
            let w = now.duration_since(*since);
            *since = now;
            w
        };
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.swap(0, Relaxed)).collect();
        pb::NodeLoad {
            window_ms: window.as_millis() as u64,
            appends: self.appends.swap(0, Relaxed),
            append_records: self.append_records.swap(0, Relaxed),
            reads: self.reads.swap(0, Relaxed),
            append_p99_us: p99(&counts),
        }
    }
}

/// The top of the bucket holding the 99th percentile (0 when empty).
fn p99(counts: &[u64]) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    // The smallest rank r with r >= 0.99 · total (1-based).
    let rank = total - total / 100;
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_top(i);
        }
    }
    bucket_top(counts.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_latency_in_order() {
        let mut last = 0;
        for us in [0u64, 1, 2, 3, 4, 5, 6, 7, 8, 100, 1_000, 1 << 30, u64::MAX] {
            let b = bucket_of(us);
            assert!(b >= last, "{us} µs went back to bucket {b}");
            assert!(b < BUCKETS);
            if us < 1 << POWERS {
                assert!(bucket_top(b) >= us, "{us} µs above its bucket's top");
            }
            last = b;
        }
        assert_eq!(bucket_top(bucket_of(1_000)), 1_023);
        assert_eq!(bucket_top(bucket_of(700)), 767);
    }

    #[test]
    fn take_reports_the_window_and_starts_afresh() {
        let m = LoadMeter::default();
        assert_eq!(m.take().append_p99_us, 0, "no append: no percentile");
        for _ in 0..99 {
            m.record_append(Duration::from_micros(100), 3);
        }
        m.record_append(Duration::from_millis(50), 1);
        m.record_read();
        let w = m.take();
        assert_eq!((w.appends, w.append_records, w.reads), (100, 298, 1));
        assert!(
            (100..=127).contains(&w.append_p99_us),
            "{}",
            w.append_p99_us
        );
        for _ in 0..10 {
            m.record_append(Duration::from_millis(50), 1);
        }
        let w = m.take();
        assert_eq!(w.appends, 10);
        assert!(
            (50_000..=65_535).contains(&w.append_p99_us),
            "{}",
            w.append_p99_us
        );
        assert_eq!(m.take().appends, 0);
    }
}
