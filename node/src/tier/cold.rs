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

/// (segment id, chunk index).
type Key = (String, u64);

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

    /// Drops the cached chunks of one segment.
    pub fn remove_segment(&self, id: &str) {
        let mut g = self.inner.lock().expect("cache lock poisoned");
        let keys: Vec<Key> = g.map.keys().filter(|k| k.0 == id).cloned().collect();
        for k in keys {
            if let Some((v, t)) = g.map.remove(&k) {
                g.bytes -= v.len() as u64;
                g.lru.remove(&t);
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

/// Cold bytes are fetched and cached in aligned chunks of this size: a
/// scan reads consecutive blocks, so one GET serves several (a 64 KiB block
/// per GET ran at 3 MiB/s against moto; see docs/BENCHMARKS.md), while a
/// point read fetches at most two chunks.
pub const CHUNK_BYTES: u64 = 512 << 10;

fn add_read(fetched: u64, cached: u64) {
    READ.with(|c| {
        let (a, b) = c.get();
        c.set((a + fetched, b + cached));
    });
}

impl ColdSource {
    /// GETs chunks `first..=last` in one ranged request and caches them.
    fn fetch_chunks(&self, first: u64, last: u64) -> std::io::Result<Vec<Arc<Vec<u8>>>> {
        let from = first * CHUNK_BYTES;
        let to = ((last + 1) * CHUNK_BYTES).min(self.len);
        let store = self.tier.store.clone();
        let key = self.key.clone();
        let bytes = self
            .tier
            .block_on(async move { Ok(store.get_range(&key, from..to).await?) })
            .map_err(std::io::Error::other)?;
        if bytes.len() as u64 != to - from {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{}: {} bytes for range {from}..{to}", self.key, bytes.len()),
            ));
        }
        self.tier
            .stats
            .cold_bytes_fetched
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        add_read(bytes.len() as u64, 0);
        let mut out = Vec::new();
        for (i, chunk) in bytes.chunks(CHUNK_BYTES as usize).enumerate() {
            let chunk = Arc::new(chunk.to_vec());
            self.tier
                .cache
                .insert((self.id.clone(), first + i as u64), chunk.clone());
            out.push(chunk);
        }
        Ok(out)
    }
}

impl RangeRead for ColdSource {
    fn byte_len(&self) -> u64 {
        self.len
    }

    fn invalidate(&self) {
        self.tier.stats.cold_corrupt.fetch_add(1, Ordering::Relaxed);
        self.tier.cache.remove_segment(&self.id);
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let end = offset + len as u64;
        if end > self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end of the object",
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let first = offset / CHUNK_BYTES;
        let last = (end - 1) / CHUNK_BYTES;
        let mut chunks: Vec<Option<Arc<Vec<u8>>>> = (first..=last)
            .map(|i| self.tier.cache.get(&(self.id.clone(), i)))
            .collect();
        let hits: Vec<bool> = chunks.iter().map(Option::is_some).collect();
        let hit_count = hits.iter().filter(|h| **h).count() as u64;
        crate::metrics::record_cold_chunks(hit_count, hits.len() as u64 - hit_count);
        // Fetch each run of missing chunks with one GET.
        let mut i = 0;
        while i < chunks.len() {
            if chunks[i].is_some() {
                i += 1;
                continue;
            }
            let mut j = i;
            while j + 1 < chunks.len() && chunks[j + 1].is_none() {
                j += 1;
            }
            let got = self.fetch_chunks(first + i as u64, first + j as u64)?;
            for (k, c) in got.into_iter().enumerate() {
                chunks[i + k] = Some(c);
            }
            i = j + 1;
        }
        let mut out = Vec::with_capacity(len);
        let mut cached = 0u64;
        for (n, c) in chunks.into_iter().enumerate() {
            let c = c.expect("every chunk fetched");
            let base = (first + n as u64) * CHUNK_BYTES;
            let lo = offset.max(base) - base;
            let hi = end.min(base + c.len() as u64) - base;
            out.extend_from_slice(&c[lo as usize..hi as usize]);
            if hits[n] {
                cached += hi - lo;
            }
        }
        if cached > 0 {
            self.tier
                .stats
                .cold_bytes_cached
                .fetch_add(cached, Ordering::Relaxed);
            add_read(0, cached);
        }
        Ok(out)
    }
}

/// Opens the cold copy of `seg` of `tablet`, whose local files live in
/// `dir`. With a stub there ([`super::stub`]) the open makes no request;
/// without one it GETs the prologue, header, footer and trailer, then
/// keeps them as the stub, so the next open (a restart while the bucket
/// fails) needs no request. Blocking: call from a blocking context.
pub fn open_reader(
    tier: &Arc<Tier>,
    tablet: u64,
    seg: &SegmentRef,
    dir: &std::path::Path,
) -> crate::segment::Result<SegmentReader> {
    let key = tier.segment_key(seg.owner(tablet), &seg.id);
    let name = format!("{}/{key}", tier.options.url.trim_end_matches('/'));
    let source = Arc::new(ColdSource {
        tier: tier.clone(),
        key,
        id: seg.id.clone(),
        len: seg.bytes,
    });
    match super::stub::read(dir, &seg.id, seg.bytes) {
        Ok(Some(stub)) => {
            let stubbed = Arc::new(super::stub::Stubbed {
                stub,
                inner: source.clone(),
            });
            match SegmentReader::open_remote(&name, &seg.id, stubbed) {
                Ok(reader) => return Ok(reader),
                Err(e @ crate::segment::Error::Io { .. }) => return Err(e),
                Err(e) => {
                    tier.stats.stubs_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(segment = %seg.id, error = %e, "segment stub fails its checks; removed, reading the object");
                    super::stub::remove(dir, &seg.id);
                }
            }
        }
        Ok(None) => {}
        Err(e) => {
            tier.stats.stubs_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(segment = %seg.id, error = %e, "segment stub unusable; removed, reading the object");
            super::stub::remove(dir, &seg.id);
        }
    }
    let reader = SegmentReader::open_remote(&name, &seg.id, source);
    if let Err(crate::segment::Error::Corrupt { .. }) = &reader {
        tier.stats.cold_corrupt.fetch_add(1, Ordering::Relaxed);
    }
    let reader = reader?;
    keep_stub(dir, &seg.id, &reader);
    Ok(reader)
}

/// Writes the stub of an open segment into `dir`; a failure only costs the
/// next open its GETs, so it is logged, not returned.
pub fn keep_stub(dir: &std::path::Path, id: &str, reader: &SegmentReader) {
    let written = super::stub::Stub::of(reader)
        .map_err(|e| e.to_string())
        .and_then(|stub| super::stub::write(dir, id, &stub).map_err(|e| e.to_string()));
    if let Err(e) = written {
        tracing::warn!(segment = id, dir = %dir.display(), error = %e, "segment stub not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_evicts_least_recently_used_within_its_bound() {
        let c = Cache::new(10);
        let k = |n: u64| ("s".to_string(), n);
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
