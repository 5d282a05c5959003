//! Which confirmed segments a replica drops locally: a pure function of
//! their ages, the disk usage and the watermarks.
//!
//! ```text
//! usage <  evict (70%)        segments older than hot_age
//! usage >= evict              + oldest first until the projected usage < evict
//! usage >= aggressive (85%)   every confirmed segment
//! ```
//! Refusing ingest at 95% (`StorageFull`) is the node's disk reserve, not
//! this module's.

use std::time::Duration;

/// A segment whose cold copy is confirmed and whose local file exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub bytes: u64,
    /// Time since the local file was written.
    pub age: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub hot_age: Duration,
    pub evict_watermark: f64,
    pub evict_aggressive_watermark: f64,
}

/// The ids to evict, oldest first.
pub fn plan(candidates: &[Candidate], total: u64, avail: u64, policy: &Policy) -> Vec<String> {
    let mut c: Vec<&Candidate> = candidates.iter().collect();
    c.sort_by(|a, b| b.age.cmp(&a.age).then(a.id.cmp(&b.id)));
    let usage = |used: u64| {
        if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        }
    };
    let mut used = total.saturating_sub(avail);
    if usage(used) >= policy.evict_aggressive_watermark {
        return c.into_iter().map(|c| c.id.clone()).collect();
    }
    let mut out = Vec::new();
    for cand in c {
        if cand.age >= policy.hot_age || usage(used) >= policy.evict_watermark {
            out.push(cand.id.clone());
            used = used.saturating_sub(cand.bytes);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, bytes: u64, age_s: u64) -> Candidate {
        Candidate {
            id: id.into(),
            bytes,
            age: Duration::from_secs(age_s),
        }
    }

    fn check(total: u64, avail: u64, hot_s: u64, expected: &[&str]) {
        let cands = [cand("a", 10, 100), cand("b", 10, 50), cand("c", 10, 10)];
        let policy = Policy {
            hot_age: Duration::from_secs(hot_s),
            evict_watermark: 0.70,
            evict_aggressive_watermark: 0.85,
        };
        assert_eq!(
            plan(&cands, total, avail, &policy),
            expected.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "total {total} avail {avail} hot {hot_s}"
        );
    }

    #[test]
    fn eviction_follows_age_and_watermarks() {
        // Plenty of space: by age only.
        check(1000, 900, 60, &["a"]);
        check(1000, 900, 0, &["a", "b", "c"]);
        check(1000, 900, 1000, &[]);
        // 72% used: oldest first until under 70%, then by age.
        check(1000, 285, 1000, &["a", "b"]);
        // 86% used: everything confirmed.
        check(1000, 140, 1000, &["a", "b", "c"]);
    }
}
