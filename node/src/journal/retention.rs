//! Which journal files are still needed: pure bookkeeping, no I/O.
//!
//! For every file the journal keeps, per tablet, the largest `index` among
//! that tablet's frames in the file. A file may go once every tablet's trim
//! point (its checkpoint) has reached that maximum. Files go strictly oldest
//! first: a newer file may hold a Truncate frame that voids entries of an
//! older one, so deleting it while the older one stays would resurrect them.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub(crate) struct FileMeta {
    pub(crate) bytes: u64,
    /// tablet -> largest frame index of that tablet in this file.
    pub(crate) tablet_index_max: HashMap<u64, u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Retention {
    pub(crate) files: BTreeMap<u64, FileMeta>,
    /// The file the committer appends to; never deleted.
    pub(crate) active_seq: u64,
    trim_points: HashMap<u64, u64>,
}

impl Retention {
    pub(crate) fn add_file(&mut self, seq: u64, bytes: u64) {
        self.files.entry(seq).or_default().bytes = bytes;
    }

    pub(crate) fn set_active(&mut self, seq: u64) {
        debug_assert!(seq >= self.active_seq);
        self.active_seq = seq;
    }

    /// Records one durable frame of `frame_bytes` bytes in file `seq`.
    pub(crate) fn record(&mut self, seq: u64, tablet: u64, index: u64, frame_bytes: u64) {
        let meta = self.files.entry(seq).or_default();
        meta.bytes += frame_bytes;
        let max = meta.tablet_index_max.entry(tablet).or_insert(index);
        *max = (*max).max(index);
    }

    /// Trim points only move forward: a checkpoint never goes back.
    pub(crate) fn set_trim_point(&mut self, tablet: u64, index: u64) {
        let point = self.trim_points.entry(tablet).or_insert(index);
        *point = (*point).max(index);
    }

    pub(crate) fn forget_tablet(&mut self, tablet: u64) {
        self.trim_points.remove(&tablet);
        for meta in self.files.values_mut() {
            meta.tablet_index_max.remove(&tablet);
        }
    }

    /// Tablets in `meta` whose frames are not all at or below their trim point, sorted.
    fn holders(&self, meta: &FileMeta) -> Vec<u64> {
        let mut holders: Vec<u64> = meta
            .tablet_index_max
            .iter()
            .filter(|&(tablet, &max)| self.trim_points.get(tablet).is_none_or(|&p| p < max))
            .map(|(&tablet, _)| tablet)
            .collect();
        holders.sort_unstable();
        holders
    }

    /// The oldest files that may be deleted now, oldest first, a contiguous prefix.
    pub(crate) fn trimmable(&self) -> Vec<u64> {
        self.files
            .iter()
            .take_while(|&(&seq, meta)| seq != self.active_seq && self.holders(meta).is_empty())
            .map(|(&seq, _)| seq)
            .collect()
    }

    pub(crate) fn remove(&mut self, seq: u64) {
        self.files.remove(&seq);
    }

    pub(crate) fn retained_bytes(&self) -> u64 {
        self.files.values().map(|m| m.bytes).sum()
    }

    /// When more than `bytes_max` is retained: the tablets that block the
    /// oldest files from being deleted, walking files oldest first until
    /// deleting them would bring the journal under `bytes_max`.
    pub(crate) fn laggards(&self, bytes_max: u64) -> Vec<u64> {
        let mut excess_bytes = self.retained_bytes().saturating_sub(bytes_max);
        let mut laggards = Vec::new();
        for (&seq, meta) in &self.files {
            if excess_bytes == 0 || seq == self.active_seq {
                break;
            }
            for tablet in self.holders(meta) {
                if !laggards.contains(&tablet) {
                    laggards.push(tablet);
                }
            }
            excess_bytes = excess_bytes.saturating_sub(meta.bytes);
        }
        laggards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_files() -> Retention {
        let mut r = Retention::default();
        // file 1: tablet 1 up to 10, tablet 2 up to 5
        r.record(1, 1, 10, 100);
        r.record(1, 2, 5, 100);
        // file 2: tablet 1 up to 20
        r.record(2, 1, 20, 100);
        // file 3 (active): tablet 2 up to 9
        r.record(3, 2, 9, 100);
        r.set_active(3);
        r
    }

    #[test]
    fn nothing_trimmable_without_trim_points() {
        assert!(three_files().trimmable().is_empty());
    }

    #[test]
    fn trims_oldest_prefix_only_never_active() {
        let mut r = three_files();
        r.set_trim_point(1, 20);
        // File 1 is held by tablet 2; file 2 alone is clear but not a prefix.
        assert!(r.trimmable().is_empty());
        r.set_trim_point(2, 100);
        // File 3 is active, so it stays.
        assert_eq!(r.trimmable(), vec![1, 2]);
    }

    #[test]
    fn trim_points_never_go_back() {
        let mut r = three_files();
        r.set_trim_point(1, 20);
        r.set_trim_point(1, 3);
        r.set_trim_point(2, 5);
        assert_eq!(r.trimmable(), vec![1, 2]);
    }

    #[test]
    fn forgotten_tablet_holds_nothing() {
        let mut r = three_files();
        r.set_trim_point(1, 10);
        r.forget_tablet(2);
        assert_eq!(r.trimmable(), vec![1]);
    }

    #[test]
    fn laggards_name_holders_of_oldest_files() {
        let mut r = three_files();
        r.set_trim_point(2, 5);
        assert!(r.laggards(400).is_empty());
        // 100 bytes over: only file 1 needs to go; tablet 1 holds it.
        assert_eq!(r.laggards(300), vec![1]);
        r.set_trim_point(1, 10);
        // File 1 is free now but not yet deleted; file 2's holder comes next.
        assert_eq!(r.laggards(100), vec![1]);
        r.set_trim_point(1, 20);
        assert!(r.laggards(0).is_empty());
    }
}
