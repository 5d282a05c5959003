//! The memtable: a tablet's applied, unsealed rows, ordered as a segment
//! orders them, so sealing is a straight walk.

use std::collections::BTreeMap;
use std::ops::Bound;

use rustc_hash::FxHashMap;

use crate::segment::Row;

/// Ordering key of a row within its namespace: `(key, ts, index, slot)`.
type RowKey = (Vec<u8>, u64, u64, u32);

/// Position of a row inside its tablet: `(index, slot)`.
pub type LocalPos = (u64, u32);

/// A memtable's rows, namespace by namespace (in namespace order, so the
/// whole is in `(namespace, key, ts, index, slot)` order). Each row stores
/// no copy of its namespace, and an insert compares keys, not namespaces.
#[derive(Debug, Default)]
pub struct Memtable {
    spaces: BTreeMap<String, Space>,
    rows: usize,
    bytes: usize,
    first_index: Option<u64>,
    last_index: u64,
    /// Proposal time of the oldest batch in the memtable (for age seals).
    oldest_at_us: Option<u64>,
}

#[derive(Debug, Default)]
struct Space {
    /// Row -> (vshard, value).
    rows: BTreeMap<RowKey, (u32, Vec<u8>)>,
    /// Latest record per key, by position: `(ts, index, slot)`. Keys are
    /// client bytes, but a client choosing colliding keys only slows its
    /// own tablet's memtable, so a fast hash is fine.
    latest: FxHashMap<Vec<u8>, (u64, u64, u32)>,
}

/// Fixed per-row overhead counted in [`Memtable::bytes`], so a flood of
/// tiny rows still reaches the seal threshold.
const ROW_OVERHEAD_BYTES: usize = 64;

impl Memtable {
    /// Adds one applied row; `at_us` is its batch's proposal time.
    pub fn insert(&mut self, row: Row, at_us: u64) {
        let Row {
            namespace,
            key,
            ts,
            index,
            slot,
            value,
            vshard,
            tablet: _,
        } = row;
        self.insert_in(&namespace, key, (ts, index, slot), vshard, value, at_us);
    }

    /// [`Memtable::insert`] of a row given by parts: the namespace is
    /// copied only for the first row of a namespace.
    pub fn insert_in(
        &mut self,
        namespace: &str,
        key: Vec<u8>,
        (ts, index, slot): (u64, u64, u32),
        vshard: u32,
        value: Vec<u8>,
        at_us: u64,
    ) {
        self.bytes += namespace.len() + key.len() + value.len() + ROW_OVERHEAD_BYTES;
        self.first_index.get_or_insert(index);
        self.last_index = self.last_index.max(index);
        self.oldest_at_us.get_or_insert(at_us);
        let space = match self.spaces.get_mut(namespace) {
            Some(space) => space,
            None => self.spaces.entry(namespace.to_owned()).or_default(),
        };
        match space.latest.get_mut(&key) {
            Some(latest) => {
                if (index, slot) >= (latest.1, latest.2) {
                    *latest = (ts, index, slot);
                }
            }
            None => {
                space.latest.insert(key.clone(), (ts, index, slot));
            }
        }
        if space
            .rows
            .insert((key, ts, index, slot), (vshard, value))
            .is_none()
        {
            self.rows += 1;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn first_index(&self) -> Option<u64> {
        self.first_index
    }

    pub fn oldest_at_us(&self) -> Option<u64> {
        self.oldest_at_us
    }

    /// The latest record of a key, by position.
    pub fn latest(&self, namespace: &str, key: &[u8]) -> Option<Row> {
        let space = self.spaces.get(namespace)?;
        let (ts, index, slot) = *space.latest.get(key)?;
        let k = (key.to_vec(), ts, index, slot);
        let value = space.rows.get(&k)?;
        Some(to_row(namespace, &k, value))
    }

    /// Rows of one key with `ts_from <= ts < ts_to`, ascending, strictly
    /// after `after = (ts, index, slot)`, at most `limit`.
    pub fn scan_key(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        after: Option<(u64, u64, u32)>,
        limit: usize,
    ) -> Vec<Row> {
        if ts_from >= ts_to {
            return Vec::new();
        }
        let Some(space) = self.spaces.get(namespace) else {
            return Vec::new();
        };
        let lo = match after {
            Some((ts, index, slot)) if ts >= ts_from => {
                Bound::Excluded((key.to_vec(), ts, index, slot))
            }
            _ => Bound::Included((key.to_vec(), ts_from, 0, 0)),
        };
        let hi = Bound::Excluded((key.to_vec(), ts_to, 0, 0));
        space
            .rows
            .range((lo, hi))
            .take(limit)
            .map(|(k, v)| to_row(namespace, k, v))
            .collect()
    }

    /// Rows of a namespace whose key starts with `prefix` and whose ts is in
    /// `[ts_from, ts_to)`, in key order.
    pub fn scan(&self, namespace: &str, prefix: &[u8], ts_from: u64, ts_to: u64) -> Vec<Row> {
        let Some(space) = self.spaces.get(namespace) else {
            return Vec::new();
        };
        let lo = Bound::Included((prefix.to_vec(), 0, 0, 0));
        space
            .rows
            .range((lo, Bound::Unbounded))
            .take_while(|(k, _)| k.0.starts_with(prefix))
            .filter(|(k, _)| k.1 >= ts_from && k.1 < ts_to)
            .map(|(k, v)| to_row(namespace, k, v))
            .collect()
    }

    /// All rows in segment order (for sealing and snapshots).
    pub fn rows(&self) -> Vec<Row> {
        let mut out = Vec::with_capacity(self.rows);
        for (namespace, space) in &self.spaces {
            out.extend(space.rows.iter().map(|(k, v)| to_row(namespace, k, v)));
        }
        out
    }

    /// Moves every row of `other` into `self` (a failed seal puts its rows
    /// back this way).
    pub fn absorb(&mut self, other: Memtable) {
        let at = other.oldest_at_us.unwrap_or(0);
        for (namespace, space) in other.spaces {
            for ((key, ts, index, slot), (vshard, value)) in space.rows {
                self.insert_in(&namespace, key, (ts, index, slot), vshard, value, at);
            }
        }
        if let Some(at) = other.oldest_at_us {
            self.oldest_at_us = Some(self.oldest_at_us.map_or(at, |o| o.min(at)));
        }
        if let Some(first) = other.first_index {
            self.first_index = Some(self.first_index.map_or(first, |f| f.min(first)));
        }
    }
}

fn to_row(namespace: &str, k: &RowKey, (vshard, value): &(u32, Vec<u8>)) -> Row {
    Row {
        namespace: namespace.to_owned(),
        key: k.0.clone(),
        ts: k.1,
        index: k.2,
        slot: k.3,
        value: value.clone(),
        vshard: *vshard,
        tablet: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ns: &str, key: &[u8], ts: u64, index: u64, slot: u32, value: Vec<u8>) -> Row {
        Row {
            namespace: ns.into(),
            key: key.to_vec(),
            ts,
            index,
            slot,
            value,
            vshard: 0,
            tablet: 0,
        }
    }

    #[test]
    fn latest_is_by_position_not_timestamp() {
        let mut m = Memtable::default();
        m.insert(row("a/b", b"k", 100, 5, 0, b"new-pos-old-ts".to_vec()), 1);
        m.insert(row("a/b", b"k", 200, 4, 0, b"old-pos-new-ts".to_vec()), 1);
        assert_eq!(m.latest("a/b", b"k").unwrap().value, b"new-pos-old-ts");
        assert!(m.latest("a/b", b"x").is_none());
    }

    #[test]
    fn scan_key_pages_with_cursor() {
        let mut m = Memtable::default();
        for i in 0..10u64 {
            m.insert(row("a/b", b"k", i * 10, i + 1, 0, vec![i as u8]), 1);
            m.insert(row("a/b", b"j", i * 10, i + 100, 0, vec![]), 1);
        }
        let page = m.scan_key("a/b", b"k", 0, u64::MAX, None, 4);
        assert_eq!(page.len(), 4);
        let last = page.last().unwrap();
        let next = m.scan_key(
            "a/b",
            b"k",
            0,
            u64::MAX,
            Some((last.ts, last.index, last.slot)),
            100,
        );
        assert_eq!(next.len(), 6);
        assert_eq!(next[0].ts, 40);
        assert_eq!(m.scan_key("a/b", b"k", 20, 50, None, 100).len(), 3);
        assert!(m.scan_key("a/b", b"k", 50, 50, None, 100).is_empty());
    }

    #[test]
    fn scan_filters_namespace_prefix_and_time() {
        let mut m = Memtable::default();
        m.insert(row("a/b", b"user-1", 5, 1, 0, vec![]), 1);
        m.insert(row("a/b", b"user-2", 50, 1, 1, vec![]), 1);
        m.insert(row("a/b", b"zzz", 5, 1, 2, vec![]), 1);
        m.insert(row("a/c", b"user-1", 5, 1, 3, vec![]), 1);
        let rows = m.scan("a/b", b"user-", 0, 10);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].key, b"user-1");
        assert_eq!(m.scan("a/b", b"", 0, u64::MAX).len(), 3);
    }

    #[test]
    fn absorb_puts_rows_back() {
        let mut a = Memtable::default();
        a.insert(row("a/b", b"k", 1, 1, 0, vec![1]), 10);
        let mut b = Memtable::default();
        b.insert(row("a/b", b"k", 2, 2, 0, vec![2]), 20);
        b.absorb(a);
        assert_eq!(b.len(), 2);
        assert_eq!(b.first_index(), Some(1));
        assert_eq!(b.oldest_at_us(), Some(10));
        assert_eq!(b.latest("a/b", b"k").unwrap().value, vec![2]);
    }
}
