//! The route cache: which tablet covers a vshard, at which generation, and
//! where its leader is. Pure data, no I/O: the client feeds it listings and
//! typed errors and asks it where to send.
//!
//! ```text
//! vshard ──lookup──▶ Route { tablet, [lo, hi), generation, leader endpoint }
//!          StaleRoute{descriptor} ─▶ apply (replace overlapping routes)
//!          NotLeader{hint}        ─▶ set_leader
//!          TabletNotFound{tablet} ─▶ remove, then refresh by listing
//! ```

use std::collections::{BTreeMap, HashMap};

use stele_proto::pb::TabletDescriptor;
use stele_proto::vshard::VSHARD_END;

/// Where to send requests for one tablet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub tablet: u64,
    pub lo: u32,
    /// Exclusive; up to 2^32.
    pub hi: u64,
    pub generation: u64,
    pub leader_node: u64,
    /// Empty when unknown: the client then uses its seed endpoint.
    pub leader_endpoint: String,
}

impl Route {
    pub fn from_descriptor(d: &TabletDescriptor) -> Self {
        Route {
            tablet: d.id,
            lo: d.vshard_lo,
            hi: d.vshard_hi.min(VSHARD_END),
            generation: d.generation,
            leader_node: d.leader_node,
            leader_endpoint: d.leader_endpoint.clone(),
        }
    }

    /// The route as a descriptor (ids, range, generation, leader).
    pub fn descriptor(&self) -> TabletDescriptor {
        TabletDescriptor {
            id: self.tablet,
            vshard_lo: self.lo,
            vshard_hi: self.hi,
            generation: self.generation,
            leader_node: self.leader_node,
            leader_endpoint: self.leader_endpoint.clone(),
            ..Default::default()
        }
    }

    pub fn contains(&self, vshard: u32) -> bool {
        vshard >= self.lo && u64::from(vshard) < self.hi
    }

    fn overlaps(&self, lo: u32, hi: u64) -> bool {
        u64::from(self.lo) < hi && u64::from(lo) < self.hi
    }
}

/// Non-overlapping routes keyed by their low vshard, with each tablet's
/// low vshard indexed (a map of 100,000 tablets is applied in O(n log n)).
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    by_lo: BTreeMap<u32, Route>,
    lo_of: HashMap<u64, u32>,
}

impl RouteTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_descriptors<'a>(
        descriptors: impl IntoIterator<Item = &'a TabletDescriptor>,
    ) -> Self {
        let mut table = Self::new();
        table.merge(descriptors);
        table
    }

    pub fn len(&self) -> usize {
        self.by_lo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_lo.is_empty()
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.by_lo.values()
    }

    /// The route covering `vshard`, if known.
    pub fn lookup(&self, vshard: u32) -> Option<&Route> {
        self.by_lo
            .range(..=vshard)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.contains(vshard))
    }

    pub fn get(&self, tablet: u64) -> Option<&Route> {
        self.lo_of.get(&tablet).and_then(|lo| self.by_lo.get(lo))
    }

    /// Applies an authoritative descriptor (from `StaleRoute` or a listing).
    /// Ignored when the cache already holds the same tablet at a newer
    /// generation; otherwise every overlapping route is dropped, since the
    /// descriptor's range now belongs to this tablet. Returns whether the
    /// table changed.
    pub fn apply(&mut self, d: &TabletDescriptor) -> bool {
        let new = Route::from_descriptor(d);
        if u64::from(new.lo) >= new.hi {
            return false;
        }
        if let Some(old) = self.get(new.tablet) {
            if old.generation > new.generation || *old == new {
                return false;
            }
            // Same tablet and generation: keep a known leader over an unknown one.
            if old.generation == new.generation
                && new.leader_endpoint.is_empty()
                && !old.leader_endpoint.is_empty()
                && old.lo == new.lo
                && old.hi == new.hi
            {
                return false;
            }
        }
        let mut overlapping: Vec<u32> = self
            .covering(new.lo, new.hi)
            .into_iter()
            .map(|r| r.lo)
            .collect();
        overlapping.extend(self.lo_of.get(&new.tablet));
        for lo in overlapping {
            if let Some(r) = self.by_lo.remove(&lo) {
                self.lo_of.remove(&r.tablet);
            }
        }
        self.lo_of.insert(new.tablet, new.lo);
        self.by_lo.insert(new.lo, new);
        true
    }

    /// Applies every descriptor of a listing.
    pub fn merge<'a>(&mut self, descriptors: impl IntoIterator<Item = &'a TabletDescriptor>) {
        for d in descriptors {
            self.apply(d);
        }
    }

    /// Forgets a tablet's leader (its endpoint stopped answering): requests
    /// go to the seed until a refresh or a `NotLeader` hint names one.
    pub fn forget_leader(&mut self, tablet: u64) {
        if let Some(lo) = self.get(tablet).map(|r| r.lo) {
            let route = self.by_lo.get_mut(&lo).expect("found above");
            route.leader_endpoint.clear();
            route.leader_node = 0;
        }
    }

    /// Forgets a tablet (after `TabletNotFound`).
    pub fn remove(&mut self, tablet: u64) -> bool {
        let lo = self.lo_of.remove(&tablet);
        lo.and_then(|lo| self.by_lo.remove(&lo)).is_some()
    }

    /// Follows a `NotLeader` hint. Returns false when there is nothing to
    /// follow (no hint, or the tablet is unknown): the caller should refresh.
    pub fn set_leader(&mut self, tablet: u64, leader_node: Option<u64>, endpoint: &str) -> bool {
        if endpoint.is_empty() {
            return false;
        }
        let Some(lo) = self.get(tablet).map(|r| r.lo) else {
            return false;
        };
        let route = self.by_lo.get_mut(&lo).expect("found above");
        route.leader_endpoint = endpoint.to_string();
        if let Some(node) = leader_node {
            route.leader_node = node;
        }
        true
    }

    /// The routes overlapping `[lo, hi)`, ascending.
    pub fn covering(&self, lo: u32, hi: u64) -> Vec<&Route> {
        if u64::from(lo) >= hi {
            return Vec::new();
        }
        // The route starting at or before `lo` may reach into the range;
        // every other overlapping route starts inside it.
        let before = self.by_lo.range(..lo).next_back().map(|(_, r)| r);
        let inside = self.by_lo.range(lo..).map(|(_, r)| r);
        before
            .into_iter()
            .chain(inside.take_while(|r| u64::from(r.lo) < hi))
            .filter(|r| r.overlaps(lo, hi))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(id: u64, lo: u32, hi: u64, generation: u64, leader: &str) -> TabletDescriptor {
        TabletDescriptor {
            id,
            vshard_lo: lo,
            vshard_hi: hi,
            generation,
            leader_node: id,
            leader_endpoint: leader.into(),
            ..Default::default()
        }
    }

    fn check(table: &RouteTable, cases: &[(u32, Option<u64>)]) {
        for &(vshard, want) in cases {
            assert_eq!(
                table.lookup(vshard).map(|r| r.tablet),
                want,
                "vshard {vshard}"
            );
        }
    }

    #[test]
    fn lookup_by_range() {
        let t = RouteTable::from_descriptors(&[
            desc(1, 0, 100, 1, "a"),
            desc(2, 100, 1000, 1, "b"),
            desc(3, 2000, VSHARD_END, 1, "c"),
        ]);
        check(
            &t,
            &[
                (0, Some(1)),
                (99, Some(1)),
                (100, Some(2)),
                (999, Some(2)),
                (1000, None),
                (1999, None),
                (2000, Some(3)),
                (u32::MAX, Some(3)),
            ],
        );
        assert_eq!(t.covering(50, 150).len(), 2);
        assert_eq!(t.covering(1000, 2000).len(), 0);
    }

    #[test]
    fn empty_table_routes_nothing() {
        check(&RouteTable::new(), &[(0, None), (u32::MAX, None)]);
    }

    #[test]
    fn stale_route_after_split_replaces_parent() {
        let mut t = RouteTable::from_descriptors(&[desc(1, 0, VSHARD_END, 1, "a")]);
        // The parent split at 1000 into itself (left, new generation) and 7.
        assert!(t.apply(&desc(1, 0, 1000, 2, "a")));
        check(&t, &[(0, Some(1)), (999, Some(1)), (1000, None)]);
        assert!(t.apply(&desc(7, 1000, VSHARD_END, 1, "b")));
        check(&t, &[(999, Some(1)), (1000, Some(7)), (u32::MAX, Some(7))]);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn child_descriptor_evicts_overlapping_parent() {
        let mut t = RouteTable::from_descriptors(&[desc(1, 0, VSHARD_END, 1, "a")]);
        assert!(t.apply(&desc(7, 1000, 2000, 1, "b")));
        // The parent's route overlapped and is gone; the gaps need a refresh.
        check(&t, &[(0, None), (1500, Some(7)), (3000, None)]);
    }

    #[test]
    fn older_generation_is_ignored() {
        let mut t = RouteTable::from_descriptors(&[desc(1, 0, 1000, 5, "a")]);
        assert!(!t.apply(&desc(1, 0, VSHARD_END, 4, "a")));
        check(&t, &[(500, Some(1)), (5000, None)]);
        assert!(
            !t.apply(&desc(1, 0, 1000, 5, "a")),
            "identical is no change"
        );
    }

    #[test]
    fn listing_without_leader_keeps_known_leader() {
        let mut t = RouteTable::from_descriptors(&[desc(1, 0, 1000, 5, "a")]);
        t.set_leader(1, Some(9), "http://b");
        assert!(!t.apply(&desc(1, 0, 1000, 5, "")));
        assert_eq!(t.lookup(1).unwrap().leader_endpoint, "http://b");
    }

    #[test]
    fn not_leader_hint_moves_leader() {
        let mut t = RouteTable::from_descriptors(&[desc(1, 0, 1000, 5, "a")]);
        assert!(t.set_leader(1, Some(9), "http://b"));
        let r = t.lookup(10).unwrap();
        assert_eq!((r.leader_node, r.leader_endpoint.as_str()), (9, "http://b"));
        assert!(!t.set_leader(1, None, ""), "no hint: refresh instead");
        assert!(!t.set_leader(2, None, "http://c"), "unknown tablet");
    }

    #[test]
    fn tablet_not_found_removes() {
        let mut t =
            RouteTable::from_descriptors(&[desc(1, 0, 1000, 5, "a"), desc(2, 1000, 2000, 1, "b")]);
        assert!(t.remove(1));
        assert!(!t.remove(1));
        check(&t, &[(10, None), (1500, Some(2))]);
    }

    #[test]
    fn a_hundred_thousand_routes_apply_and_split_by_index() {
        let n = 100_000u64;
        let width = VSHARD_END / n;
        let ds: Vec<TabletDescriptor> = (0..n)
            .map(|i| desc(i + 1, (i * width) as u32, (i + 1) * width, 1, "a"))
            .collect();
        let mut t = RouteTable::from_descriptors(&ds);
        assert_eq!(t.len(), n as usize);
        // Tablet 500 splits: it keeps its low half, 200,001 takes the rest.
        let (lo, hi) = (499 * width, 500 * width);
        let mid = lo + width / 2;
        assert!(t.apply(&desc(500, lo as u32, mid, 2, "a")));
        assert!(t.apply(&desc(200_001, mid as u32, hi, 2, "b")));
        assert_eq!(t.get(200_001).unwrap().lo, mid as u32);
        check(
            &t,
            &[
                (lo as u32, Some(500)),
                (mid as u32, Some(200_001)),
                (hi as u32, Some(501)),
            ],
        );
        // Merged back: 500 takes the whole range again, 200,001 is evicted.
        assert!(t.apply(&desc(500, lo as u32, hi, 3, "a")));
        assert!(t.get(200_001).is_none());
        assert_eq!(t.len(), n as usize);
    }

    #[test]
    fn empty_range_is_rejected() {
        let mut t = RouteTable::new();
        assert!(!t.apply(&desc(1, 10, 10, 1, "a")));
        assert!(t.is_empty());
    }
}
