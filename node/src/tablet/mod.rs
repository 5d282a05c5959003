//! A tablet replica: its applied state (memtable, frozen memtables being
//! sealed, published segments, receipts) and the reads over it.
//!
//! ```text
//!            apply (apply.rs)                      seal worker (seal.rs)
//! Raft log ─────────────► memtable ──Seal{}──► frozen[i] ──build+publish──► segments
//!                             ▲                    │ (failure: rows go back)
//!                             └────────────────────┘
//! reads: memtable ∪ frozen ∪ segments — each row is in exactly one of them
//! ```

pub mod apply;
pub mod memtable;
pub mod policy;
pub mod receipts;
pub mod seal;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use stele_proto::command::Pos;

use self::memtable::Memtable;
use self::receipts::Receipts;
use crate::catalog::{Catalog, SegmentRef, TabletRecord};
use crate::error::Result;
use crate::raft::{LogId, StoredMembership};
use crate::segment::{Row, SegmentReader};

/// Tunables of a tablet's seal and receipt policy.
#[derive(Debug, Clone)]
pub struct TabletOptions {
    /// Seal when the memtable holds this many bytes.
    pub memtable_bytes_max: usize,
    /// Seal when the oldest unsealed row is this old.
    pub memtable_age_max_us: u64,
    /// Receipts older than this (by proposal time) are forgotten.
    pub receipt_window_us: u64,
    /// Compaction rewrites runs of segments smaller than a quarter of this
    /// into segments of up to this many bytes (0: no compaction).
    pub compact_target_bytes: u64,
    /// The fewest small segments a compaction rewrites at once.
    pub compact_min_inputs: usize,
}

impl Default for TabletOptions {
    fn default() -> Self {
        TabletOptions {
            memtable_bytes_max: 32 * 1024 * 1024,
            memtable_age_max_us: 5 * 60 * 1_000_000,
            receipt_window_us: 10 * 60 * 1_000_000,
            compact_target_bytes: 64 << 20,
            compact_min_inputs: 4,
        }
    }
}

/// A tablet's vshard range `[lo, hi)`, the generation it changed at, and
/// whether it is frozen for a merge (no writes; reads go on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeState {
    pub lo: u32,
    pub hi: u64,
    pub generation: u64,
    pub frozen: bool,
}

/// What the seal of a `Merge` adopts from the absorbed tablet's replica on
/// this node once it publishes: its segments (already readable through
/// [`TabletData::adopted`]) and the replica to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeIn {
    pub absorbed: u64,
    pub absorbed_replica: u64,
    /// The absorbed replica's segment directory, to hard-link from.
    pub absorbed_dir: PathBuf,
}

/// The child a `Split` creates once its seal publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitChild {
    pub child: u64,
    pub at: u32,
    pub hi: u64,
    pub generation: u64,
    /// The child group's voter replica ids (one per node of the parent).
    pub replicas: Vec<u64>,
}

/// Rows frozen by an applied `Seal` (or `Split`), waiting for their
/// segment to publish.
#[derive(Debug)]
pub struct Frozen {
    /// Log index of the Seal entry; the new checkpoint once published.
    pub seal_index: u64,
    pub seal_log_id: LogId,
    pub membership: StoredMembership,
    pub memtable: Memtable,
    /// The range the rows were applied under (the segment header's).
    pub rows_range: RangeState,
    /// The tablet's range once this seal's index is applied: what the
    /// catalog records with the new checkpoint.
    pub after: RangeState,
    /// Set on the seal of a `Split`: the child to create with it.
    pub split: Option<SplitChild>,
    /// Set on the seal of a `Merge`: the absorbed replica to adopt.
    pub merge: Option<MergeIn>,
    /// Set on the seal of a `Compact`: the segments to rewrite as one.
    pub compact: Option<Vec<String>>,
    /// Segment format version the seal writes (from its entry).
    pub format: u32,
}

/// A tablet's applied state.
pub struct TabletData {
    pub memtable: Memtable,
    /// Oldest first.
    pub frozen: Vec<Frozen>,
    /// Published segments, oldest first, with their catalog entries.
    pub segments: Vec<(SegmentRef, Arc<SegmentReader>)>,
    pub receipts: Receipts,
    pub applied: Option<LogId>,
    pub membership: StoredMembership,
    /// Highest log index whose rows are all in published segments.
    pub checkpoint: u64,
    /// The log id at `checkpoint` and the membership then: what a snapshot
    /// claims to cover (`None` before the first seal).
    pub checkpoint_log_id: Option<LogId>,
    pub checkpoint_membership: StoredMembership,
    /// Largest proposal time applied (a deterministic clock for receipts).
    pub clock_us: u64,
    /// Cold copies of segments `Uploaded` named before this replica's seal
    /// published them (a follower's seal worker can lag its apply).
    pub cold_early: std::collections::BTreeMap<String, crate::catalog::ColdCopy>,
    /// Segments `DropSegment` named before this replica's seal published
    /// them: the seal drops them instead of publishing.
    pub dropped_early: std::collections::BTreeSet<String>,
    /// The range as of `checkpoint`: what the catalog record says. The live
    /// range ([`Tablet::range`]) runs ahead of it between a `Split` and its
    /// seal's publish.
    pub published: RangeState,
    /// A split whose seal failed to publish, carried to the next seal.
    pub pending_split: Option<SplitChild>,
    /// The absorbed tablet's segments between a `Merge`'s apply and its
    /// seal's publish: read with [`TabletData::segments`] but not yet named
    /// by this tablet's catalog record (oldest first; none shared with
    /// `segments`).
    pub adopted: Vec<(SegmentRef, Arc<SegmentReader>)>,
    /// A merge whose seal failed to publish, carried to the next seal.
    pub pending_merge: Option<MergeIn>,
    /// A compaction whose seal failed to publish, carried to the next seal.
    pub pending_compact: Option<Vec<String>>,
}

impl TabletData {
    /// Whether a compaction applied but not yet published names `segment`
    /// (then a `DropSegment` of it is ignored: every replica compacts it).
    pub fn compacting(&self, segment: &str) -> bool {
        self.frozen
            .iter()
            .filter_map(|f| f.compact.as_ref())
            .chain(self.pending_compact.as_ref())
            .any(|inputs| inputs.iter().any(|i| i == segment))
    }
}

/// Counters of a tablet, read by status and tests.
#[derive(Debug, Default)]
pub struct TabletStats {
    pub records_applied: AtomicU64,
    pub seals_published: AtomicU64,
    pub seal_failures: AtomicU64,
    /// Snapshots installed from a leader (catch-up past its purged log).
    pub snapshots_installed: AtomicU64,
    /// Reads (Get, ScanKey, Scan) this replica served.
    pub reads_served: AtomicU64,
    /// Compactions published.
    pub compactions: AtomicU64,
}

/// Everything of one tablet replica that the state machine, the seal worker
/// and the read path share.
pub struct Tablet {
    pub id: u64,
    pub replica_id: u64,
    /// The live range `[lo, hi)`: changed only by applying `Split` or
    /// `Merge` (under the data write lock), read by admission and apply.
    range: RwLock<(u32, u64)>,
    pub generation: AtomicU64,
    /// Frozen for a merge (live): writes are refused, reads go on.
    frozen: std::sync::atomic::AtomicBool,
    /// A split child's voters ([`TabletRecord::init_voters`]).
    pub init_voters: Vec<u64>,
    pub options: TabletOptions,
    /// Where this tablet's segment files live.
    pub segment_dir: PathBuf,
    pub catalog: Catalog,
    pub stats: TabletStats,
    /// When this replica last heard from its leader, and the leader's
    /// commit index then: a follower's bound on how stale its reads are.
    pub leader_contact: std::sync::Mutex<Option<(Instant, u64)>>,
    /// The node's cold tier, if it has one: segments without a local file
    /// are read from it.
    pub tier: Option<Arc<crate::tier::Tier>>,
    data: RwLock<TabletData>,
}

impl Tablet {
    /// Opens a tablet from its catalog record: segments are opened (and
    /// verified by their readers), receipts loaded, the applied state is the
    /// checkpoint's. The journal tail is replayed by openraft afterwards.
    pub fn open(
        record: &TabletRecord,
        segment_dir: PathBuf,
        catalog: Catalog,
        options: TabletOptions,
    ) -> Result<Arc<Tablet>> {
        Tablet::open_tiered(record, segment_dir, catalog, options, None)
    }

    /// [`Tablet::open`] with a cold tier: a segment whose local file is gone
    /// (evicted) is opened from the bucket.
    pub fn open_tiered(
        record: &TabletRecord,
        segment_dir: PathBuf,
        catalog: Catalog,
        options: TabletOptions,
        tier: Option<Arc<crate::tier::Tier>>,
    ) -> Result<Arc<Tablet>> {
        crate::fsutil::create_dir_durable(&segment_dir)
            .map_err(|e| crate::Error::io(format!("create {}", segment_dir.display()), e))?;
        let mut segments = Vec::new();
        for seg in &record.segments {
            let reader = open_segment(&segment_dir, record.id, seg, tier.as_ref())?;
            segments.push((seg.clone(), reader));
        }
        seal::remove_orphans(&segment_dir, &record.segments)?;
        let (applied, membership) = if record.applied_state.is_empty() {
            (None, StoredMembership::default())
        } else {
            crate::raft::decode::<(Option<LogId>, StoredMembership)>(
                "tablet applied state",
                &record.applied_state,
            )?
        };
        let mut receipts = Receipts::default();
        let mut clock_us = 0;
        for row in catalog.receipts(record.id)? {
            let Some(key) = receipts::decode_key(&row.key) else {
                return Err(crate::Error::Decode {
                    what: format!("receipt key of tablet {}", record.id),
                    reason: "too short or not UTF-8".into(),
                });
            };
            let receipt: receipts::Receipt = crate::catalog::from_cbor("receipt", &row.value)?;
            clock_us = clock_us.max(receipt.at_us);
            receipts.insert(key, receipt);
        }
        let published = RangeState {
            lo: record.vshard_lo,
            hi: record.vshard_hi,
            generation: record.generation,
            frozen: record.frozen,
        };
        Ok(Arc::new(Tablet {
            id: record.id,
            replica_id: record.replica_id,
            range: RwLock::new((record.vshard_lo, record.vshard_hi)),
            init_voters: record.init_voters.clone(),
            generation: AtomicU64::new(record.generation),
            frozen: std::sync::atomic::AtomicBool::new(record.frozen),
            options,
            segment_dir,
            catalog,
            stats: TabletStats::default(),
            leader_contact: std::sync::Mutex::new(None),
            tier,
            data: RwLock::new(TabletData {
                memtable: Memtable::default(),
                frozen: Vec::new(),
                segments,
                receipts,
                applied,
                // The catalog holds the state at the checkpoint; the journal
                // tail after it is replayed by openraft later.
                checkpoint_log_id: applied,
                checkpoint_membership: membership.clone(),
                membership,
                checkpoint: record.checkpoint,
                clock_us,
                cold_early: Default::default(),
                dropped_early: Default::default(),
                published,
                pending_split: None,
                adopted: Vec::new(),
                pending_merge: None,
                pending_compact: None,
            }),
        }))
    }

    pub fn read(&self) -> RwLockReadGuard<'_, TabletData> {
        self.data.read().expect("tablet lock poisoned")
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, TabletData> {
        self.data.write().expect("tablet lock poisoned")
    }

    /// The live range `[lo, hi)`.
    pub fn range(&self) -> (u32, u64) {
        *self.range.read().expect("range lock poisoned")
    }

    /// Whether `vshard` is in the live range (reads).
    pub fn contains(&self, vshard: u32) -> bool {
        let (lo, hi) = self.range();
        vshard >= lo && u64::from(vshard) < hi
    }

    /// Whether a write of `vshard` may be applied here: in the live range
    /// and not frozen for a merge.
    pub fn accepts(&self, vshard: u32) -> bool {
        !self.is_frozen() && self.contains(vshard)
    }

    /// Frozen for a merge (live state).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    /// The live range and generation together.
    pub fn range_state(&self) -> RangeState {
        let (lo, hi) = self.range();
        RangeState {
            lo,
            hi,
            generation: self.generation(),
            frozen: self.is_frozen(),
        }
    }

    /// Moves the live range (apply of `Split`, `Freeze`, `Merge`, snapshot
    /// install).
    pub(crate) fn set_range(&self, r: RangeState) {
        *self.range.write().expect("range lock poisoned") = (r.lo, r.hi);
        self.frozen.store(r.frozen, Ordering::Release);
        self.generation.store(r.generation, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The catalog record at the checkpoint: the published state, with the
    /// applied state as of the checkpoint (a change outside a seal, such
    /// as a cold copy or a dropped segment, is recorded at it).
    pub fn checkpoint_record(&self, data: &TabletData) -> TabletRecord {
        let applied_state =
            crate::catalog::to_cbor(&(data.checkpoint_log_id, data.checkpoint_membership.clone()));
        self.record(data, applied_state)
    }

    /// The catalog record for the current published state.
    pub fn record(&self, data: &TabletData, applied_state: Vec<u8>) -> TabletRecord {
        TabletRecord {
            v: 1,
            id: self.id,
            vshard_lo: data.published.lo,
            vshard_hi: data.published.hi,
            generation: data.published.generation,
            checkpoint: data.checkpoint,
            applied_state,
            segments: data.segments.iter().map(|(r, _)| r.clone()).collect(),
            replica_id: self.replica_id,
            init_voters: self.init_voters.clone(),
            frozen: data.published.frozen,
        }
    }
}

/// Whether `row` lies in `range`: a frozen memtable from before a split
/// holds rows of both tablets, and each reads only its own.
fn in_range(range: (u32, u64), row: &Row) -> bool {
    row.vshard >= range.0 && u64::from(row.vshard) < range.1
}

/// A segment as one read takes it: its reader, and the vshard ranges of
/// its rows the tablet reads (a segment shared since a split holds rows of
/// both halves, and one named by both sides of a merge is read by each
/// for its own `keep`).
#[derive(Clone)]
pub struct Source {
    pub reader: Arc<SegmentReader>,
    pub reads: Vec<(u32, u64)>,
}

impl Source {
    /// Whether the tablet reads `row` of this segment.
    fn reads(&self, row: &Row) -> bool {
        crate::catalog::in_ranges(&self.reads, row.vshard)
    }

    /// Whether the tablet reads every row of this segment.
    fn whole(&self) -> bool {
        let h = self.reader.header();
        self.reads == [(h.vshard_lo, h.vshard_hi)]
    }
}

/// A key-scan cursor `(ts, tablet, index, slot)` in the terms of a source
/// whose rows all belong to tablet `origin` (strictly after `(ts, index,
/// slot)`): a source of an earlier tablet than the cursor's resumes past
/// the cursor's ts, one of a later tablet at it (log indices start at 1).
fn source_cursor(origin: u64, after: Option<(u64, u64, u64, u32)>) -> Option<(u64, u64, u32)> {
    let (ts, tablet, index, slot) = after?;
    Some(match origin.cmp(&tablet) {
        std::cmp::Ordering::Less => (ts, u64::MAX, u32::MAX),
        std::cmp::Ordering::Equal => (ts, index, slot),
        std::cmp::Ordering::Greater => (ts, 0, 0),
    })
}

/// Names the tablet of the rows read from `seg`: its header's.
fn from_segment(seg: &SegmentReader, rows: Vec<Row>) -> Vec<Row> {
    let tablet = seg.header().tablet;
    rows.into_iter()
        .map(|mut r| {
            r.tablet = tablet;
            r
        })
        .collect()
}

/// Names the tablet of a memtable row (segment rows carry their header's).
fn owned(tablet: u64, mut row: Row) -> Row {
    if row.tablet == 0 {
        row.tablet = tablet;
    }
    row
}

/// The latest row of a key among `rows` (one source's rows of the key)
/// that `keep` admits, by position.
fn latest_of(rows: Vec<Row>, keep: impl Fn(&Row) -> bool) -> Option<Row> {
    rows.into_iter()
        .filter(|r| keep(r))
        .max_by_key(|r| (r.index, r.slot))
}

/// The latest row of a key in `range` in one memtable.
fn memtable_latest(m: &Memtable, range: (u32, u64), namespace: &str, key: &[u8]) -> Option<Row> {
    let row = m.latest(namespace, key)?;
    if in_range(range, &row) {
        return Some(row);
    }
    // The key's latest record lies outside the range (another routing key
    // of the same record key, in the other half of a split): look further.
    latest_of(
        m.scan_key(namespace, key, 0, u64::MAX, None, usize::MAX),
        |r| in_range(range, r),
    )
}

/// The latest row of a key the tablet reads in one segment.
fn segment_latest(seg: &Source, namespace: &str, key: &[u8]) -> Result<Option<Row>> {
    let reader = &seg.reader;
    if !reader.may_contain_key(namespace, key) {
        return Ok(None);
    }
    let Some(row) = reader.latest(namespace, key).map_err(crate::Error::from)? else {
        return Ok(None);
    };
    let row = if seg.reads(&row) {
        Some(row)
    } else {
        latest_of(
            reader
                .scan_key(namespace, key, 0, u64::MAX, None, usize::MAX)
                .map_err(crate::Error::from)?,
            |r| seg.reads(r),
        )
    };
    Ok(row.map(|mut r| {
        r.tablet = reader.header().tablet;
        r
    }))
}

/// The read path without holding the tablet lock across segment reads.
///
/// The lock is held only to read the memtables and clone the list of
/// segment readers; segment reads (cold GETs among them, which can take
/// milliseconds each) then run unlocked, so a long cold scan never stalls
/// apply. Each row is still seen exactly once: at the moment of the lock it
/// is in a memtable, a frozen memtable or a published segment, segments are
/// immutable, and a reader swapped out by eviction stays valid (its file
/// handle or its cold source). Every read keeps only the rows of the live
/// range: the rest belong to a split child.
impl Tablet {
    /// Rows of a namespace with keys starting with `prefix` and ts in
    /// `[ts_from, ts_to)`, sorted by `(ts, key, index, slot)`, and the
    /// applied index they reflect.
    pub fn scan_unlocked(
        &self,
        namespace: &str,
        prefix: &[u8],
        ts_from: u64,
        ts_to: u64,
    ) -> Result<(Vec<Row>, u64)> {
        let (rows, segments, applied, range) = {
            let d = self.read();
            let range = self.range();
            let mut rows = d.memtable.scan(namespace, prefix, ts_from, ts_to);
            for f in &d.frozen {
                rows.extend(f.memtable.scan(namespace, prefix, ts_from, ts_to));
            }
            (rows, d.readers(range), d.applied_index(), range)
        };
        let mut rows: Vec<Row> = rows.into_iter().filter(|r| in_range(range, r)).collect();
        for seg in &segments {
            rows.extend(
                from_segment(
                    &seg.reader,
                    seg.reader
                        .scan(namespace, prefix, ts_from, ts_to)
                        .map_err(crate::Error::from)?,
                )
                .into_iter()
                .filter(|r| seg.reads(r)),
            );
        }
        let mut rows: Vec<Row> = rows.into_iter().map(|r| owned(self.id, r)).collect();
        rows.sort_by(|a, b| {
            (a.ts, &a.key, a.tablet, a.index, a.slot)
                .cmp(&(b.ts, &b.key, b.tablet, b.index, b.slot))
        });
        Ok((rows, applied))
    }

    /// Rows of one key in `[ts_from, ts_to)` strictly after the cursor
    /// `(ts, tablet, index, slot)`, ascending by `(ts, position)`, at most
    /// `limit`, and the applied index. Positions order by tablet first: a
    /// key's rows from before a split (the parent's) come before the
    /// child's, whose ids are larger, whatever their log indices.
    pub fn scan_key_unlocked(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        after: Option<(u64, u64, u64, u32)>,
        limit: usize,
    ) -> Result<(Vec<Row>, u64)> {
        // Each source orders its rows by (ts, index, slot) under one
        // tablet: the cursor in its terms, and its first `limit` rows,
        // unless some of them may lie outside the range (a frozen memtable
        // or segment from before a split), which are read to the end.
        let cut = |origin: u64| source_cursor(origin, after);
        let (rows, segments, applied, range) = {
            let d = self.read();
            let range = self.range();
            let mut rows = d
                .memtable
                .scan_key(namespace, key, ts_from, ts_to, cut(self.id), limit);
            for f in &d.frozen {
                rows.extend(f.memtable.scan_key(
                    namespace,
                    key,
                    ts_from,
                    ts_to,
                    cut(self.id),
                    usize::MAX,
                ));
            }
            (rows, d.readers(range), d.applied_index(), range)
        };
        let mut rows: Vec<Row> = rows.into_iter().filter(|r| in_range(range, r)).collect();
        for seg in &segments {
            if !seg.reader.may_contain_key(namespace, key) {
                continue;
            }
            // A shared segment may hold rows the tablet does not read (the
            // other split half's): read past them so `limit` rows it reads
            // come back.
            let n = if seg.whole() { limit } else { usize::MAX };
            rows.extend(
                from_segment(
                    &seg.reader,
                    seg.reader
                        .scan_key(
                            namespace,
                            key,
                            ts_from,
                            ts_to,
                            cut(seg.reader.header().tablet),
                            n,
                        )
                        .map_err(crate::Error::from)?,
                )
                .into_iter()
                .filter(|r| seg.reads(r)),
            );
        }
        let order = |r: &Row| (r.ts, r.tablet, r.index, r.slot);
        let mut rows: Vec<Row> = rows
            .into_iter()
            .map(|r| owned(self.id, r))
            .filter(|r| after.is_none_or(|a| order(r) > a))
            .collect();
        rows.sort_by_key(order);
        rows.truncate(limit);
        Ok((rows, applied))
    }

    /// Bytes of published segments this tablet reads (of a segment shared
    /// since a split, its share): its size, for automatic splits and merges.
    pub fn read_bytes(&self) -> u64 {
        let range = self.range();
        self.read()
            .segments
            .iter()
            .map(|(s, reader)| {
                let h = reader.header();
                s.read_bytes((h.vshard_lo, h.vshard_hi), range)
            })
            .sum()
    }

    /// The latest record of a key in the live range, and the applied index.
    pub fn latest_unlocked(&self, namespace: &str, key: &[u8]) -> Result<(Option<Row>, u64)> {
        let (segments, applied) = {
            let d = self.read();
            let range = self.range();
            if let Some(row) = d.memory_latest(range, namespace, key) {
                return Ok((Some(owned(self.id, row)), d.applied_index()));
            }
            // The segments and the watermark of the same moment as the
            // memtables just read.
            (d.readers(range), d.applied_index())
        };
        for seg in segments.iter().rev() {
            if let Some(row) = segment_latest(seg, namespace, key)? {
                return Ok((Some(owned(self.id, row)), applied));
            }
        }
        Ok((None, applied))
    }
}

impl TabletData {
    /// Every segment a read over `range` covers, oldest first: the
    /// published ones, then those a `Merge` adopted and has not published
    /// yet; each with the vshard ranges of its rows the read takes.
    pub fn readers(&self, range: (u32, u64)) -> Vec<Source> {
        self.segments
            .iter()
            .chain(self.adopted.iter())
            .map(|(s, reader)| {
                let h = reader.header();
                Source {
                    reads: s.reads((h.vshard_lo, h.vshard_hi), range),
                    reader: reader.clone(),
                }
            })
            .collect()
    }

    /// Applied log index (the read watermark).
    pub fn applied_index(&self) -> u64 {
        self.applied.as_ref().map_or(0, |l| l.index())
    }

    /// Unsealed bytes in memory (active and frozen).
    pub fn memtable_bytes(&self) -> usize {
        self.memtable.bytes()
            + self
                .frozen
                .iter()
                .map(|f| f.memtable.bytes())
                .sum::<usize>()
    }

    /// The latest record of a key in `range` among the memtables.
    fn memory_latest(&self, range: (u32, u64), namespace: &str, key: &[u8]) -> Option<Row> {
        // Newer sources hold later records: the memtable, then the frozen
        // ones, newest first.
        memtable_latest(&self.memtable, range, namespace, key).or_else(|| {
            self.frozen
                .iter()
                .rev()
                .find_map(|f| memtable_latest(&f.memtable, range, namespace, key))
        })
    }

    /// The latest record of a key in `range`, across memory and segments
    /// (newest source first: a split child's own rows are newer than the
    /// ones it shares with its parent, whatever their log indices).
    pub fn latest(&self, range: (u32, u64), namespace: &str, key: &[u8]) -> Result<Option<Row>> {
        if let Some(row) = self.memory_latest(range, namespace, key) {
            return Ok(Some(row));
        }
        for seg in self.readers(range).iter().rev() {
            if let Some(row) = segment_latest(seg, namespace, key)? {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }
}

/// Opens a published segment: the local file when it exists, else (with a
/// cold tier) its object in the bucket. Blocking.
pub fn open_segment(
    segment_dir: &std::path::Path,
    tablet: u64,
    seg: &SegmentRef,
    tier: Option<&Arc<crate::tier::Tier>>,
) -> Result<Arc<SegmentReader>> {
    let path = segment_dir.join(crate::segment::file_name(&seg.id));
    let reader = match tier {
        Some(tier) if !path.exists() => {
            crate::tier::cold::open_reader(tier, tablet, seg, segment_dir)
        }
        _ => SegmentReader::open_with_id(&path, &seg.id),
    };
    Ok(Arc::new(reader.map_err(crate::Error::from)?))
}

/// The position of a row: its own tablet's (a row read from a segment a
/// split child shares keeps its parent's), else `tablet`'s.
pub fn pos_of(tablet: u64, row: &Row) -> Pos {
    Pos {
        tablet: if row.tablet == 0 { tablet } else { row.tablet },
        index: row.index,
        slot: row.slot,
    }
}
