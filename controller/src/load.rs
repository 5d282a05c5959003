//! Each node's recent load, from the `NodeLoad` of its heartbeats, for the
//! console's charts: append rate, read rate and append p99 over the last
//! ten minutes.
//!
//! Leader soft state like the rest of [`crate::health`]: a new leader
//! starts with empty charts. Memory is bounded: a ring of at most
//! [`SLOTS_MAX`] slots of [`SLOT`] per node (about 6 KiB a node, 2.4 MiB
//! for 400 nodes), and rings only of nodes the cell state names.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use stele_proto::pb;

/// The time one slot of a ring sums: the heartbeats within it add up.
pub const SLOT: Duration = Duration::from_secs(5);
/// Slots kept per node: ten minutes of [`SLOT`].
pub const SLOTS_MAX: usize = 120;

/// The heartbeats of one node within one [`SLOT`], summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSlot {
    /// When its first heartbeat came.
    pub start: Instant,
    /// The node's windows, summed (what the rates divide by).
    pub window_ms: u64,
    pub appends: u64,
    pub append_records: u64,
    pub reads: u64,
    /// The largest of the heartbeats' append p99s: an upper bound of the
    /// slot's p99 (percentiles of windows do not combine exactly).
    pub append_p99_us: u64,
}

impl LoadSlot {
    /// Append calls per second over the slot.
    pub fn appends_per_s(&self) -> f64 {
        per_s(self.appends, self.window_ms)
    }

    /// Records appended per second over the slot.
    pub fn records_per_s(&self) -> f64 {
        per_s(self.append_records, self.window_ms)
    }

    /// Read calls per second over the slot.
    pub fn reads_per_s(&self) -> f64 {
        per_s(self.reads, self.window_ms)
    }
}

fn per_s(n: u64, window_ms: u64) -> f64 {
    if window_ms == 0 {
        0.0
    } else {
        n as f64 * 1000.0 / window_ms as f64
    }
}

/// One node's slots, oldest first; never more than [`SLOTS_MAX`], never
/// older than `SLOTS_MAX · SLOT` behind the newest.
#[derive(Debug, Clone, Default)]
pub struct LoadRing {
    slots: VecDeque<LoadSlot>,
}

impl LoadRing {
    /// Adds a heartbeat's load, received at `now`.
    pub fn push(&mut self, load: &pb::NodeLoad, now: Instant) {
        match self.slots.back_mut() {
            Some(last) if now.saturating_duration_since(last.start) < SLOT => {
                last.window_ms = last.window_ms.saturating_add(load.window_ms);
                last.appends = last.appends.saturating_add(load.appends);
                last.append_records = last.append_records.saturating_add(load.append_records);
                last.reads = last.reads.saturating_add(load.reads);
                last.append_p99_us = last.append_p99_us.max(load.append_p99_us);
            }
            _ => self.slots.push_back(LoadSlot {
                start: now,
                window_ms: load.window_ms,
                appends: load.appends,
                append_records: load.append_records,
                reads: load.reads,
                append_p99_us: load.append_p99_us,
            }),
        }
        let horizon = SLOT * SLOTS_MAX as u32;
        while self.slots.len() > SLOTS_MAX
            || self
                .slots
                .front()
                .is_some_and(|s| now.saturating_duration_since(s.start) > horizon)
        {
            self.slots.pop_front();
        }
    }

    /// The slots, oldest first.
    pub fn slots(&self) -> impl Iterator<Item = &LoadSlot> {
        self.slots.iter()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(appends: u64, p99: u64) -> pb::NodeLoad {
        pb::NodeLoad {
            window_ms: 1000,
            appends,
            append_records: appends * 10,
            reads: 1,
            append_p99_us: p99,
        }
    }

    #[test]
    fn heartbeats_within_a_slot_add_up() {
        let t0 = Instant::now();
        let mut r = LoadRing::default();
        r.push(&load(10, 500), t0);
        r.push(&load(30, 900), t0 + Duration::from_secs(1));
        r.push(&load(5, 100), t0 + SLOT);
        let s: Vec<_> = r.slots().copied().collect();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].appends, s[0].window_ms, s[0].append_p99_us),
            (40, 2000, 900)
        );
        assert_eq!(s[0].appends_per_s(), 20.0);
        assert_eq!(s[0].records_per_s(), 200.0);
        assert_eq!(s[1].appends, 5);
    }

    #[test]
    fn the_ring_stays_bounded_in_count_and_age() {
        let t0 = Instant::now();
        let mut r = LoadRing::default();
        for i in 0..(3 * SLOTS_MAX as u32) {
            r.push(&load(1, 1), t0 + SLOT * i);
            assert!(r.len() <= SLOTS_MAX);
        }
        assert_eq!(r.len(), SLOTS_MAX);
        // A node silent for longer than the horizon keeps only its newest.
        r.push(&load(1, 1), t0 + SLOT * (10 * SLOTS_MAX as u32));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn an_empty_window_is_no_rate() {
        let s = LoadSlot {
            start: Instant::now(),
            window_ms: 0,
            appends: 5,
            append_records: 5,
            reads: 0,
            append_p99_us: 0,
        };
        assert_eq!(s.appends_per_s(), 0.0);
    }
}
