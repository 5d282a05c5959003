//! Cold reads: a [`RangeRead`] over a segment object, with byte-range GETs
//! into a bounded LRU cache shared by the node. The segment reader checks
//! every byte it gets (header, footer, trailer and block crc32c), so damage
//! in the bucket or the cache surfaces as `segment::Error::Corrupt`, never
//! as rows.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::Tier;
use crate::catalog::SegmentRef;
use crate::segment::{RangeRead, SegmentReader};

type Key = (String, u64, usize);

#[derive(Default)]
struct Inner {
    map: HashMap<Key, (Arc<Vec<u8>>, u64)>,
    lru: BTreeMap<u64, Key>,
    tick: u64,
    bytes: u64,
}

/// Byte ranges of cold segments, least recently used evicted first, at
/// most `bytes_max` bytes of data.
pub struct Cache {
    bytes_max: u64,
    inner: Mutex<Inner>,
}

impl Cache {
    pub fn new(bytes_max: u64) -> Cache {
        Cache {
            bytes_max,
            inner: Mutex::default(),
        }
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Vec<u8>>> {
        let mut g = self.inner.lock().expect("cache lock poisoned");
        g.tick += 1;
        let tick = g.tick;
        let (value, old) = {
            let entry = g.map.get_mut(key)?;
            let old = std::mem::replace(&mut entry.1, tick);
            (entry.0.clone(), old)
        };
        g.lru.remove(&old);
        g.lru.insert(tick, key.clone());
        Some(value)
    }

    pub fn insert(&self, key: Key, value: Arc<Vec<u8>>) {
        let len = value.len() as u64;
        if len > self.bytes_max {
            return;
        }
        let mut g = self.inner.lock().expect("cache lock poisoned");
        g.tick += 1;
        let tick = g.tick;
        if let Some((old, t)) = g.map.insert(key.clone(), (value, tick)) {
            g.bytes -= old.len() as u64;
            g.lru.remove(&t);
        }
        g.lru.insert(tick, key);
        g.bytes += len;
        while g.bytes > self.bytes_max {
            let Some((_, k)) = g.lru.pop_first() else {
                break;
            };
            if let Some((v, _)) = g.map.remove(&k) {
                g.bytes -= v.len() as u64;
            }
        }
    }

    /// Drops every cached range (benches measure a cold cache with it).
    pub fn clear(&self) {
        *self.inner.lock().expect("cache lock poisoned") = Inner::default();
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().expect("cache lock poisoned").bytes
    }
}

thread_local! {
    static READ: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Bytes a read took from the cold tier: fetched from the bucket, and
/// served from the cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ColdRead {
    pub fetched: u64,
    pub cached: u64,
}

/// Runs a synchronous read and reports the cold bytes it used on this
/// thread (the read path runs each query's segment reads on one thread).
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, ColdRead) {
    let before = READ.with(|c| c.replace((0, 0)));
    let out = f();
    let (fetched, cached) = READ.with(|c| c.replace(before));
    READ.with(|c| {
        let (a, b) = c.get();
        c.set((a + fetched, b + cached));
    });
    (out, ColdRead { fetched, cached })
}

/// One segment object, read by range through the cache.
pub struct ColdSource {
    tier: Arc<Tier>,
    key: Path,
    id: String,
    len: u64,
}

impl std::fmt::Debug for ColdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ColdSource({})", self.key)
    }
}

impl RangeRead for ColdSource {
    fn byte_len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let ckey = (self.id.clone(), offset, len);
        if let Some(hit) = self.tier.cache.get(&ckey) {
            self.tier
                .stats
                .cold_bytes_cached
                .fetch_add(len as u64, Ordering::Relaxed);
            READ.with(|c| {
                let (a, b) = c.get();
                c.set((a, b + len as u64));
            });
            return Ok(hit.as_ref().clone());
        }
        let store = self.tier.store.clone();
        let key = self.key.clone();
        let range = offset..offset + len as u64;
        let bytes = self
            .tier
            .block_on(async move { Ok(store.get_range(&key, range).await?) })
            .map_err(std::io::Error::other)?;
        self.tier
            .stats
            .cold_bytes_fetched
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        READ.with(|c| {
            let (a, b) = c.get();
            c.set((a + bytes.len() as u64, b));
        });
        let bytes = bytes.to_vec();
        if bytes.len() == len {
            self.tier.cache.insert(ckey, Arc::new(bytes.clone()));
        }
        Ok(bytes)
    }
}

/// Opens the cold copy of `seg` of `tablet` (blocking: GETs the prologue,
/// header, footer and trailer). Call from a blocking context.
pub fn open_reader(
    tier: &Arc<Tier>,
    tablet: u64,
    seg: &SegmentRef,
) -> crate::segment::Result<SegmentReader> {
    let key = tier.segment_key(tablet, &seg.id);
    let name = format!("{}/{key}", tier.options.url.trim_end_matches('/'));
    let source = Arc::new(ColdSource {
        tier: tier.clone(),
        key,
        id: seg.id.clone(),
        len: seg.bytes,
    });
    let reader = SegmentReader::open_remote(&name, &seg.id, source);
    if let Err(crate::segment::Error::Corrupt { .. }) = &reader {
        tier.stats.cold_corrupt.fetch_add(1, Ordering::Relaxed);
    }
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_evicts_least_recently_used_within_its_bound() {
        let c = Cache::new(10);
        let k = |n: u64| ("s".to_string(), n, 4);
        c.insert(k(1), Arc::new(vec![1; 4]));
        c.insert(k(2), Arc::new(vec![2; 4]));
        assert!(c.get(&k(1)).is_some()); // 1 is now the most recent
        c.insert(k(3), Arc::new(vec![3; 4]));
        assert_eq!(c.bytes(), 8);
        assert!(c.get(&k(2)).is_none());
        assert!(c.get(&k(1)).is_some() && c.get(&k(3)).is_some());
        c.insert(k(4), Arc::new(vec![0; 11])); // larger than the bound: not kept
        assert_eq!(c.bytes(), 8);
    }
}
