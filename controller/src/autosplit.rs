//! Automatic split and merge decisions: pure, from load samples a leader
//! collects from heartbeats, unit-tested without I/O.
//!
//! A tablet splits when, over a whole window, its sealed bytes stay at or
//! above the size mark, or its write or read rate stays at or above the
//! rate mark, and no topology change touched it for a cooldown. Two
//! adjacent tablets merge when, over a whole window, their bytes and rates
//! added up stay below the low marks (`merge_below_percent` of each high
//! mark), both past their cooldowns.
//!
//! Hysteresis: a split leaves two halves of about half the mark each,
//! whose sum (the mark) is far above the low mark, so they do not merge
//! back; a merge leaves a tablet below the low mark, far below the high
//! one, so it does not split back. The cooldown keeps a burst from
//! changing the same tablet again at once.

use std::collections::VecDeque;
use std::time::Duration;

/// Thresholds; 0 turns a mark off.
#[derive(Debug, Clone)]
pub struct SplitPolicy {
    /// Split at this many bytes of sealed segments (default 1 GiB).
    pub bytes: u64,
    /// Split at this many records applied per second, over the window.
    pub writes_per_s: u64,
    /// Split at this many reads served per second, over the window.
    pub reads_per_s: u64,
    /// How long a mark must hold.
    pub window: Duration,
    /// No automatic split or merge of a tablet this soon after its last
    /// change.
    pub cooldown: Duration,
    /// Merge adjacent tablets whose combined load stays below this percent
    /// of every high mark that is on (0: no automatic merges; at most 50,
    /// so a merge can never produce a tablet that splits).
    pub merge_below_percent: u64,
}

impl Default for SplitPolicy {
    fn default() -> Self {
        SplitPolicy {
            bytes: 1 << 30,
            writes_per_s: 0,
            reads_per_s: 0,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(300),
            merge_below_percent: 0,
        }
    }
}

/// One heartbeat's numbers for a tablet, from its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSample {
    /// Seconds on the controller leader's monotonic clock.
    pub at: Duration,
    pub segment_bytes: u64,
    /// Counters since the replica started (they reset when it restarts).
    pub records_applied: u64,
    pub reads_served: u64,
}

/// The samples of one tablet over the last window, and its last change.
#[derive(Debug, Clone, Default)]
pub struct TabletLoad {
    samples: VecDeque<LoadSample>,
    /// When the tablet last split or was created by a split (or the
    /// leader first saw it).
    pub changed_at: Option<Duration>,
}

impl TabletLoad {
    /// Adds a sample, keeping just over one window of them.
    pub fn push(&mut self, s: LoadSample, window: Duration) {
        if let Some(last) = self.samples.back()
            && (s.records_applied < last.records_applied || s.reads_served < last.reads_served)
        {
            // The counters went back: the leader changed or restarted.
            self.samples.clear();
        }
        self.samples.push_back(s);
        while self.samples.len() > 2 && s.at.saturating_sub(self.samples[1].at) >= window {
            self.samples.pop_front();
        }
        self.changed_at.get_or_insert(s.at);
    }

    /// Forgets the samples (the tablet's range changed).
    pub fn reset(&mut self, at: Duration) {
        self.samples.clear();
        self.changed_at = Some(at);
    }
}

/// What one tablet's samples say over a full window.
struct Window {
    span: Duration,
    /// Smallest, largest and latest segment bytes of the window.
    bytes_min: u64,
    bytes_max: u64,
    bytes_last: u64,
    writes_per_s: f64,
    reads_per_s: f64,
}

/// The window of `load`, once it is full and the cooldown is over.
fn settled(load: &TabletLoad, policy: &SplitPolicy, now: Duration) -> Option<Window> {
    let changed = load.changed_at?;
    if now.saturating_sub(changed) < policy.cooldown {
        return None;
    }
    let (first, last) = (load.samples.front()?, load.samples.back()?);
    let span = last.at.saturating_sub(first.at);
    if span < policy.window {
        return None;
    }
    let rate = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / span.as_secs_f64();
    let bytes = load.samples.iter().map(|s| s.segment_bytes);
    Some(Window {
        span,
        bytes_min: bytes.clone().min().unwrap_or(0),
        bytes_max: bytes.max().unwrap_or(0),
        bytes_last: last.segment_bytes,
        writes_per_s: rate(first.records_applied, last.records_applied),
        reads_per_s: rate(first.reads_served, last.reads_served),
    })
}

/// Why the adjacent tablets of `a` and `b` should merge now under
/// `policy`, if they should: both settled, and every mark that is on
/// (bytes, writes, reads) above their combined load by the low-mark
/// factor. With no mark on at all, nothing merges.
pub fn should_merge(
    a: &TabletLoad,
    b: &TabletLoad,
    policy: &SplitPolicy,
    now: Duration,
) -> Option<String> {
    let pct = policy.merge_below_percent.min(50);
    if pct == 0 {
        return None;
    }
    let (wa, wb) = (settled(a, policy, now)?, settled(b, policy, now)?);
    let low = |mark: u64| mark as f64 * pct as f64 / 100.0;
    let marks = [
        (policy.bytes, (wa.bytes_max + wb.bytes_max) as f64, "bytes"),
        (
            policy.writes_per_s,
            wa.writes_per_s + wb.writes_per_s,
            "writes/s",
        ),
        (
            policy.reads_per_s,
            wa.reads_per_s + wb.reads_per_s,
            "reads/s",
        ),
    ];
    let on: Vec<_> = marks.iter().filter(|(mark, _, _)| *mark > 0).collect();
    if on.is_empty() || on.iter().any(|(mark, load, _)| *load >= low(*mark)) {
        return None;
    }
    let why: Vec<String> = on
        .iter()
        .map(|(mark, load, what)| format!("{load:.0} {what} < {:.0}", low(*mark)))
        .collect();
    Some(format!(
        "auto: merged load {} over {}s",
        why.join(", "),
        wa.span.min(wb.span).as_secs()
    ))
}

/// Why `load` should split now under `policy`, if it should: the size mark
/// held by every sample of the window, or a rate mark over it.
pub fn should_split(load: &TabletLoad, policy: &SplitPolicy, now: Duration) -> Option<String> {
    let w = settled(load, policy, now)?;
    let secs = w.span.as_secs();
    if policy.bytes > 0 && w.bytes_min >= policy.bytes {
        return Some(format!(
            "auto: {} bytes of segments >= {} for {secs}s",
            w.bytes_last, policy.bytes
        ));
    }
    if policy.writes_per_s > 0 && w.writes_per_s >= policy.writes_per_s as f64 {
        return Some(format!(
            "auto: {:.0} writes/s >= {} over {secs}s",
            w.writes_per_s, policy.writes_per_s
        ));
    }
    if policy.reads_per_s > 0 && w.reads_per_s >= policy.reads_per_s as f64 {
        return Some(format!(
            "auto: {:.0} reads/s >= {} over {secs}s",
            w.reads_per_s, policy.reads_per_s
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SplitPolicy {
        SplitPolicy {
            bytes: 1000,
            writes_per_s: 100,
            reads_per_s: 0,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(300),
            merge_below_percent: 25,
        }
    }

    fn feed(load: &mut TabletLoad, from_s: u64, to_s: u64, writes_per_s: u64, bytes: u64) {
        for t in from_s..to_s {
            load.push(
                LoadSample {
                    at: Duration::from_secs(t),
                    segment_bytes: bytes,
                    records_applied: t * writes_per_s,
                    reads_served: 0,
                },
                policy().window,
            );
        }
    }

    #[test]
    fn a_hot_tablet_splits_within_one_window_after_its_cooldown() {
        let mut load = TabletLoad::default();
        load.reset(Duration::ZERO);
        feed(&mut load, 0, 299, 500, 0);
        assert_eq!(
            should_split(&load, &policy(), Duration::from_secs(298)),
            None,
            "cooldown"
        );
        feed(&mut load, 299, 362, 500, 0);
        let why = should_split(&load, &policy(), Duration::from_secs(361)).unwrap();
        assert!(why.contains("writes/s"), "{why}");
    }

    #[test]
    fn size_must_hold_for_the_whole_window() {
        let mut load = TabletLoad::default();
        load.reset(Duration::ZERO);
        feed(&mut load, 0, 330, 0, 999);
        feed(&mut load, 330, 360, 0, 1000);
        assert_eq!(
            should_split(&load, &policy(), Duration::from_secs(359)),
            None
        );
        feed(&mut load, 360, 400, 0, 1000);
        assert!(
            should_split(&load, &policy(), Duration::from_secs(399))
                .unwrap()
                .contains("bytes")
        );
    }

    #[test]
    fn a_short_burst_or_a_cold_tablet_does_not_split() {
        let mut load = TabletLoad::default();
        load.reset(Duration::ZERO);
        feed(&mut load, 0, 400, 10, 0);
        // A burst of 20 s at 10x inside a 60 s window averages below the mark.
        for t in 400..420u64 {
            load.push(
                LoadSample {
                    at: Duration::from_secs(t),
                    segment_bytes: 0,
                    records_applied: 4000 + (t - 400) * 100,
                    reads_served: 0,
                },
                policy().window,
            );
        }
        assert_eq!(
            should_split(&load, &policy(), Duration::from_secs(419)),
            None
        );
    }

    #[test]
    fn counters_that_go_back_restart_the_window() {
        let mut load = TabletLoad::default();
        load.reset(Duration::ZERO);
        feed(&mut load, 0, 400, 500, 0);
        load.push(
            LoadSample {
                at: Duration::from_secs(400),
                segment_bytes: 0,
                records_applied: 10,
                reads_served: 0,
            },
            policy().window,
        );
        assert_eq!(
            should_split(&load, &policy(), Duration::from_secs(400)),
            None
        );
    }

    /// Ten minutes of simulated time: a namespace's load sits exactly at
    /// the write mark, spread evenly over its tablets, which split whenever
    /// the policy says. It splits once (each half then carries half the
    /// mark) and never again.
    #[test]
    fn a_load_at_the_mark_does_not_oscillate() {
        let p = policy();
        let total = p.writes_per_s; // records/s over the whole namespace
        // (tablet loads, cumulative records) per tablet.
        let mut tablets: Vec<(TabletLoad, u64)> = vec![(TabletLoad::default(), 0)];
        tablets[0].0.reset(Duration::ZERO);
        let mut splits = 0;
        for t in 0..600u64 {
            let now = Duration::from_secs(t);
            let share = total / tablets.len() as u64;
            let mut next = Vec::new();
            for (mut load, mut records) in tablets {
                records += share;
                load.push(
                    LoadSample {
                        at: now,
                        segment_bytes: 0,
                        records_applied: records,
                        reads_served: 0,
                    },
                    p.window,
                );
                if should_split(&load, &p, now).is_some() {
                    splits += 1;
                    for _ in 0..2 {
                        let mut half = TabletLoad::default();
                        half.reset(now);
                        next.push((half, 0));
                    }
                } else {
                    next.push((load, records));
                }
            }
            tablets = next;
        }
        assert_eq!(splits, 1, "a load at the mark splits once, then holds");
    }

    #[test]
    fn a_cold_pair_merges_after_its_cooldown_and_a_warm_one_does_not() {
        let p = policy();
        let (mut a, mut b) = (TabletLoad::default(), TabletLoad::default());
        a.reset(Duration::ZERO);
        b.reset(Duration::from_secs(100));
        feed(&mut a, 0, 399, 10, 100);
        feed(&mut b, 100, 399, 10, 100);
        // b's cooldown runs to 400.
        assert_eq!(should_merge(&a, &b, &p, Duration::from_secs(398)), None);
        feed(&mut a, 399, 420, 10, 100);
        feed(&mut b, 399, 420, 10, 100);
        let why = should_merge(&a, &b, &p, Duration::from_secs(419)).unwrap();
        assert!(why.starts_with("auto: merged load"), "{why}");
        // 20 + 10 writes/s against a low mark of 25: no.
        let mut c = TabletLoad::default();
        c.reset(Duration::ZERO);
        feed(&mut c, 0, 420, 20, 100);
        assert_eq!(should_merge(&a, &c, &p, Duration::from_secs(419)), None);
        // Big together: 2 x 200 bytes against 250.
        let (mut d, mut e) = (TabletLoad::default(), TabletLoad::default());
        d.reset(Duration::ZERO);
        e.reset(Duration::ZERO);
        feed(&mut d, 0, 420, 0, 200);
        feed(&mut e, 0, 420, 0, 200);
        assert_eq!(should_merge(&d, &e, &p, Duration::from_secs(419)), None);
        // Off: no merges at all.
        let off = SplitPolicy {
            merge_below_percent: 0,
            ..p
        };
        assert_eq!(should_merge(&a, &b, &off, Duration::from_secs(419)), None);
    }

    /// Ten minutes of simulated time for loads around both marks: a
    /// namespace's tablets (adjacent, in order) split and merge whenever
    /// the policy says, the load spread evenly over them. A load at the
    /// high mark splits once; one at the low mark never merges; one just
    /// below it merges once; none of them goes back and forth.
    #[test]
    fn loads_at_either_mark_do_not_oscillate() {
        let p = policy();
        // (tablets at the start, namespace writes/s) -> (splits, merges).
        let cases = [
            (1, p.writes_per_s, (1, 0)),
            (2, p.writes_per_s / 4 + 1, (0, 0)),
            (2, p.writes_per_s / 4 - 2, (0, 1)),
            // Cold: two pairs merge after the cooldown; the two results'
            // own cooldowns run past the ten minutes.
            (4, 0, (0, 2)),
        ];
        for (start, total, want) in cases {
            let fresh = |now| {
                let mut l = TabletLoad::default();
                l.reset(now);
                (l, 0u64)
            };
            let mut tablets: Vec<(TabletLoad, u64)> =
                (0..start).map(|_| fresh(Duration::ZERO)).collect();
            let (mut splits, mut merges) = (0, 0);
            for t in 0..600u64 {
                let now = Duration::from_secs(t);
                let share = total / tablets.len() as u64;
                for (load, records) in &mut tablets {
                    *records += share;
                    load.push(
                        LoadSample {
                            at: now,
                            segment_bytes: 0,
                            records_applied: *records,
                            reads_served: 0,
                        },
                        p.window,
                    );
                }
                let mut next = Vec::new();
                let mut i = 0;
                while i < tablets.len() {
                    if should_split(&tablets[i].0, &p, now).is_some() {
                        splits += 1;
                        next.push(fresh(now));
                        next.push(fresh(now));
                        i += 1;
                    } else if i + 1 < tablets.len()
                        && should_merge(&tablets[i].0, &tablets[i + 1].0, &p, now).is_some()
                    {
                        merges += 1;
                        next.push(fresh(now));
                        i += 2;
                    } else {
                        next.push(std::mem::take(&mut tablets[i]));
                        i += 1;
                    }
                }
                tablets = next;
            }
            assert_eq!(
                (splits, merges),
                want,
                "{start} tablets at {total} writes/s"
            );
        }
    }
}
