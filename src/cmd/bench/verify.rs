//! `stele bench --verify`: after the load, every acknowledged record is
//! read back and counted. An acknowledged record found zero times is lost,
//! one found twice or more is duplicated (a retried batch applied twice);
//! either makes the bench fail. Records of a request that failed are
//! indeterminate: found or not, they are only counted.
//!
//! ```text
//! workers ─▶ Acks{at, ns, first seq} per acknowledged request
//!   after the load: scan_all(ns, key prefix of this run) per namespace
//!   tally(acked keys, keys found) ─▶ lost, duplicated, unacked found
//!   max_stall(ack times, load end) ─▶ longest write stall
//! ```
//!
//! The counting is pure ([`tally`], [`max_stall`]); the read-back is the
//! client's linearizable namespace scan.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use stele_client::{Client, ReadOptions};

/// Lost and duplicated keys named in the report, at most.
const EXAMPLES_MAX: usize = 5;

/// What the read-back found; `--json` prints it under `verify`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Acknowledged records looked for.
    pub acked: u64,
    /// Acknowledged records found exactly once.
    pub found_once: u64,
    /// Acknowledged records not found.
    pub lost: u64,
    /// Acknowledged records found more than once.
    pub duplicated: u64,
    /// Records of failed (indeterminate) requests that are there anyway.
    pub unacked_found: u64,
    /// A few lost keys, for the person reading the report.
    pub lost_examples: Vec<String>,
    /// A few duplicated keys.
    pub duplicated_examples: Vec<String>,
}

impl VerifyReport {
    /// True if every acknowledged record is there exactly once.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicated == 0
    }

    pub fn human(&self) -> String {
        let mut s = format!(
            "verify: {} acked records read back: {} once, {} lost, {} duplicated; {} records of failed requests present",
            self.acked, self.found_once, self.lost, self.duplicated, self.unacked_found
        );
        if !self.lost_examples.is_empty() {
            s += &format!("\n  lost e.g. {}", self.lost_examples.join(", "));
        }
        if !self.duplicated_examples.is_empty() {
            s += &format!(
                "\n  duplicated e.g. {}",
                self.duplicated_examples.join(", ")
            );
        }
        s
    }
}

/// Counts `found` (every key the read-back returned, repeats included)
/// against the acknowledged keys.
pub fn tally<'a>(
    acked: impl IntoIterator<Item = String>,
    found: impl IntoIterator<Item = &'a [u8]>,
) -> VerifyReport {
    let mut seen: HashMap<&[u8], u64> = HashMap::new();
    for key in found {
        *seen.entry(key).or_default() += 1;
    }
    let mut r = VerifyReport::default();
    let mut acked_seen = 0u64;
    for key in acked {
        r.acked += 1;
        match seen.get(key.as_bytes()).copied().unwrap_or(0) {
            0 => {
                r.lost += 1;
                if r.lost_examples.len() < EXAMPLES_MAX {
                    r.lost_examples.push(key);
                }
            }
            1 => {
                r.found_once += 1;
                acked_seen += 1;
            }
            _ => {
                r.duplicated += 1;
                acked_seen += 1;
                if r.duplicated_examples.len() < EXAMPLES_MAX {
                    r.duplicated_examples.push(key);
                }
            }
        }
    }
    r.unacked_found = (seen.len() as u64).saturating_sub(acked_seen);
    r
}

/// The longest time without an acknowledgement during a load that ran
/// from zero to `load_end`: the largest gap between consecutive
/// acknowledgements, counting the start and the end of the load as
/// bounds (a load that never got an acknowledgement stalled throughout).
pub fn max_stall(acks: &mut [Duration], load_end: Duration) -> Duration {
    acks.sort_unstable();
    let mut last = Duration::ZERO;
    let mut stall = Duration::ZERO;
    for &at in acks.iter() {
        stall = stall.max(at.saturating_sub(last));
        last = last.max(at);
    }
    stall.max(load_end.saturating_sub(last))
}

/// Every key under `prefix` in each of `namespaces`, read back with
/// linearizable scans.
pub async fn read_back(
    client: &Client,
    namespaces: &[String],
    prefix: &str,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut keys = Vec::new();
    for ns in namespaces {
        let rows = client
            .scan_all(ns, 0, 0, prefix.as_bytes(), ReadOptions::default())
            .await
            .with_context(|| format!("reading back {ns}"))?;
        keys.extend(rows.into_iter().map(|r| r.key));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_lost_duplicated_and_unacked() {
        let acked = ["a", "b", "c", "d"].map(String::from);
        let found: Vec<&[u8]> = vec![b"a", b"b", b"b", b"x", b"d", b"y", b"y"];
        let r = tally(acked, found);
        assert_eq!(
            r,
            VerifyReport {
                acked: 4,
                found_once: 2,
                lost: 1,
                duplicated: 1,
                unacked_found: 2,
                lost_examples: vec!["c".into()],
                duplicated_examples: vec!["b".into()],
            }
        );
        assert!(!r.ok());
        assert!(tally(["a".to_string()], [b"a".as_slice()]).ok());
    }

    #[test]
    fn stalls() {
        let ms = Duration::from_millis;
        let check = |acks: &[u64], end: u64, want: u64| {
            let mut a: Vec<Duration> = acks.iter().map(|&x| ms(x)).collect();
            assert_eq!(max_stall(&mut a, ms(end)), ms(want), "{acks:?} end {end}");
        };
        check(&[10, 20, 30], 40, 10);
        check(&[30, 10, 500, 20], 510, 470);
        check(&[], 1000, 1000);
        check(&[100, 200], 900, 700);
        check(&[5, 5, 5], 5, 5);
    }
}
