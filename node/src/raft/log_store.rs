//! openraft log storage of one tablet over the node's shared journal.
//!
//! ```text
//! append      -> Entry frames queued on the journal; the entries stay in
//!                memory (Pending) until written, then (Stored) until this
//!                replica applied them, then are read back from the journal
//!                by location
//! truncate    -> Truncate frame (index = first index removed), awaited
//! committed   -> Commit frame, not awaited (advisory: replays the
//!                committed tail at start-up without waiting for an election)
//! vote, purge -> catalog (durable commit); they must outlive journal trims
//! ```
//!
//! No entry is held in memory twice, nor longer than its trip through the
//! replica: once the journal has written a frame and the state machine has
//! applied it (the `applied` mark it shares with the log), the index keeps
//! only its location. Replicating to a follower that lags further behind,
//! and restarts, read the journal. (Reading back every entry to apply and
//! replicate it cost a journal read and a CBOR decode per entry: about 7%
//! of a three-node cell's CPU under single-record appends.)

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::OptionalSend;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use serde::{Deserialize, Serialize};

use super::{Entry, LogId, TabletConfig, Vote, decode, encode, io_err};
use crate::catalog::Catalog;
use crate::error::Result;
use crate::journal::{Frame, FrameKind, Journal, Location, RecoveredFrame};

/// Version of the CBOR record carried by an Entry frame's payload.
const LOG_RECORD_V: u16 = 1;

#[derive(Serialize, Deserialize)]
pub(crate) struct LogRecord {
    pub(crate) v: u16,
    pub(crate) entry: Entry,
}

/// [`LogRecord`] by reference, for encoding: the same bytes, without a
/// copy of the entry.
#[derive(Serialize)]
struct LogRecordRef<'a> {
    v: u16,
    entry: &'a Entry,
}

#[cfg(any(test, feature = "fuzz"))]
impl LogRecord {
    /// A record of `cmd` at `index` in term 3, a seed for the fuzz target
    /// (`fuzz_api`) and the golden records (`raft::golden_test`).
    pub(crate) fn seed(index: u64, cmd: stele_proto::command::TabletCommand) -> Self {
        use openraft::vote::RaftLeaderIdExt;
        let leader = <TabletConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(3, 1);
        LogRecord {
            v: LOG_RECORD_V,
            entry: Entry::new_normal(LogId::new(leader, index), cmd),
        }
    }
}

#[derive(Clone)]
enum Slot {
    Pending {
        log_id: LogId,
        entry: Arc<Entry>,
    },
    /// Written; `entry` is kept until this replica applied it.
    Stored {
        log_id: LogId,
        loc: Location,
        entry: Option<Arc<Entry>>,
    },
}

impl Slot {
    fn log_id(&self) -> &LogId {
        match self {
            Slot::Pending { log_id, .. } | Slot::Stored { log_id, .. } => log_id,
        }
    }
}

#[derive(Default)]
struct LogIndex {
    entries: BTreeMap<u64, Slot>,
    /// Indexes of Stored slots that still hold their entry, ascending
    /// (maybe with indexes truncated since, or repeated after a truncate).
    held: VecDeque<u64>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

impl LogIndex {
    /// Drops the entries held for indexes at or below `applied`.
    fn release(&mut self, applied: u64) {
        while let Some(&i) = self.held.front() {
            if i > applied {
                break;
            }
            self.held.pop_front();
            if let Some(Slot::Stored { entry, .. }) = self.entries.get_mut(&i) {
                *entry = None;
            }
        }
    }
}

/// The log of one tablet replica. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct LogStore {
    tablet: u64,
    journal: Journal,
    catalog: Catalog,
    index: Arc<Mutex<LogIndex>>,
    applied: AppliedMark,
}

/// The highest log index the replica's state machine has applied, shared
/// by the state machine (which raises it) and the log (which then drops
/// the entries it held for the apply).
#[derive(Clone, Default)]
pub struct AppliedMark(Arc<AtomicU64>);

impl AppliedMark {
    pub fn set(&self, index: u64) {
        self.0.fetch_max(index, Ordering::Release);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// What replaying a tablet's journal frames found.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplayStats {
    /// Frames above the purge point that were read and decoded.
    pub frames_read: u64,
    /// Frames at or below the purge point, skipped without reading.
    pub frames_skipped: u64,
}

const VOTE: &str = "vote";
const PURGED: &str = "purged";

impl LogStore {
    /// Rebuilds a tablet's log from the catalog and its recovered journal
    /// frames (in journal order).
    pub fn recover<'a>(
        tablet: u64,
        journal: Journal,
        catalog: Catalog,
        frames: impl Iterator<Item = &'a RecoveredFrame>,
    ) -> Result<(LogStore, ReplayStats)> {
        let mut idx = LogIndex {
            vote: match catalog.get_raft(tablet, VOTE)? {
                Some(b) => Some(decode("vote", &b)?),
                None => None,
            },
            last_purged: match catalog.get_raft(tablet, PURGED)? {
                Some(b) => decode("purged log id", &b)?,
                None => None,
            },
            ..Default::default()
        };
        let purged_index = idx.last_purged.as_ref().map(|l| l.index());
        let mut stats = ReplayStats::default();
        for f in frames {
            match f.kind {
                FrameKind::Entry => {
                    if purged_index.is_some_and(|p| f.index <= p) {
                        stats.frames_skipped += 1;
                        continue;
                    }
                    let frame = journal.read(f.location).map_err(crate::Error::from)?;
                    let rec: LogRecord = decode("log entry", &frame.payload)?;
                    if rec.v != LOG_RECORD_V {
                        return Err(crate::Error::UnknownVersion {
                            what: format!("log record of tablet {tablet}"),
                            found: u32::from(rec.v),
                            supported: u32::from(LOG_RECORD_V),
                        });
                    }
                    stats.frames_read += 1;
                    // An append at index i replaces any suffix from i on.
                    idx.entries.split_off(&f.index);
                    idx.entries.insert(
                        f.index,
                        Slot::Stored {
                            log_id: rec.entry.log_id(),
                            loc: f.location,
                            entry: None,
                        },
                    );
                }
                FrameKind::Truncate => {
                    idx.entries.split_off(&f.index);
                    if f.index == 0 {
                        // The whole log is void: also what an earlier
                        // replica of the tablet on this node committed
                        // (a new replica starts with this frame).
                        idx.committed = None;
                    }
                }
                FrameKind::Commit => {
                    let frame = journal.read(f.location).map_err(crate::Error::from)?;
                    let committed: Option<LogId> = decode("committed log id", &frame.payload)?;
                    idx.committed = committed;
                }
            }
        }
        if let Some(p) = purged_index {
            idx.entries = idx.entries.split_off(&(p + 1));
            // The journal keeps trim points in memory only.
            journal.set_trim_point(tablet, p);
        }
        Ok((
            LogStore {
                tablet,
                journal,
                catalog,
                index: Arc::new(Mutex::new(idx)),
                applied: AppliedMark::default(),
            },
            stats,
        ))
    }

    /// A new, empty log for a replica created at run time. Its first frame
    /// voids whatever the journal still holds of an earlier replica of the
    /// same tablet on this node, so a restart never replays it.
    pub async fn create(tablet: u64, journal: Journal, catalog: Catalog) -> Result<LogStore> {
        let frame = Frame {
            kind: FrameKind::Truncate,
            tablet,
            index: 0,
            payload: Bytes::new(),
        };
        journal.append(vec![frame]).await?;
        // A split child's catalog rows start it purged at index 0.
        let last_purged = match catalog.get_raft(tablet, PURGED)? {
            Some(b) => decode("purged log id", &b)?,
            None => None,
        };
        let store = LogStore::new(tablet, journal, catalog);
        store.lock().last_purged = last_purged;
        Ok(store)
    }

    /// A new, empty log for a tablet that has none.
    pub fn new(tablet: u64, journal: Journal, catalog: Catalog) -> LogStore {
        LogStore {
            tablet,
            journal,
            catalog,
            index: Arc::new(Mutex::new(LogIndex::default())),
            applied: AppliedMark::default(),
        }
    }

    /// How many written entries the log still holds in memory.
    #[cfg(test)]
    pub(crate) fn held_entries(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|s| matches!(s, Slot::Stored { entry: Some(_), .. }))
            .count()
    }

    /// The mark the replica's state machine raises as it applies.
    pub fn applied_mark(&self) -> AppliedMark {
        self.applied.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogIndex> {
        // A poisoned lock means a panic mid-update; the index may be torn.
        self.index.lock().expect("log index lock poisoned")
    }

    fn read_slot(&self, slot: Slot) -> io::Result<Entry> {
        match slot {
            Slot::Pending { entry, .. }
            | Slot::Stored {
                entry: Some(entry), ..
            } => Ok((*entry).clone()),
            Slot::Stored {
                loc, entry: None, ..
            } => {
                let frame = self.journal.read(loc).map_err(io_err)?;
                let rec: LogRecord = decode("log entry", &frame.payload).map_err(io_err)?;
                Ok(rec.entry)
            }
        }
    }

    /// True for a log that never held anything: no entry, no purge, no vote.
    pub fn is_empty(&self) -> bool {
        let idx = self.lock();
        idx.entries.is_empty() && idx.last_purged.is_none() && idx.vote.is_none()
    }

    /// Index of the last purged entry, if any.
    pub fn last_purged_index(&self) -> Option<u64> {
        self.lock().last_purged.as_ref().map(|l| l.index())
    }
}

impl RaftLogReader<TabletConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let slots: Vec<Slot> = {
            let mut idx = self.lock();
            idx.release(self.applied.get());
            idx.entries.range(range).map(|(_, s)| s.clone()).collect()
        };
        slots.into_iter().map(|s| self.read_slot(s)).collect()
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.lock().vote)
    }
}

impl RaftLogStorage<TabletConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TabletConfig>> {
        let idx = self.lock();
        let last = idx
            .entries
            .values()
            .next_back()
            .map(|s| *s.log_id())
            .or_else(|| idx.last_purged);
        Ok(LogState {
            last_purged_log_id: idx.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        // Durable before returning: redb commits with fsync, one commit
        // for every vote waiting at the time (`catalog_group`).
        self.catalog
            .put_raft_grouped(self.tablet, VOTE, encode(vote))
            .await
            .map_err(io_err)?;
        self.lock().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        self.lock().committed = committed;
        let index = committed.as_ref().map_or(0, |l| l.index());
        let frame = Frame {
            kind: FrameKind::Commit,
            tablet: self.tablet,
            index,
            payload: Bytes::from(encode(&committed)),
        };
        // Advisory: losing it costs only a slower start-up, never safety.
        self.journal.submit(vec![frame], Box::new(|_| {}));
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TabletConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut frames = Vec::new();
        let mut pending = Vec::new();
        for entry in entries {
            let payload = encode(&LogRecordRef {
                v: LOG_RECORD_V,
                entry: &entry,
            });
            frames.push(Frame {
                kind: FrameKind::Entry,
                tablet: self.tablet,
                index: entry.index(),
                payload: Bytes::from(payload),
            });
            pending.push((entry.log_id(), Arc::new(entry)));
        }
        {
            let mut idx = self.lock();
            idx.release(self.applied.get());
            for (log_id, entry) in &pending {
                idx.entries.split_off(&log_id.index());
                idx.entries.insert(
                    log_id.index(),
                    Slot::Pending {
                        log_id: *log_id,
                        entry: entry.clone(),
                    },
                );
            }
        }
        let index = self.index.clone();
        let applied = self.applied.clone();
        self.journal.submit(
            frames,
            Box::new(move |result| match result {
                Ok(locations) => {
                    if let Ok(mut idx) = index.lock() {
                        let applied = applied.get();
                        for ((log_id, entry), loc) in pending.into_iter().zip(locations) {
                            // Only replace the very entry we wrote: a later
                            // truncate or overwrite must not be undone.
                            let same = matches!(
                                idx.entries.get(&log_id.index()),
                                Some(Slot::Pending { entry: e, .. }) if Arc::ptr_eq(e, &entry)
                            );
                            if same {
                                let keep = log_id.index() > applied;
                                if keep {
                                    idx.held.push_back(log_id.index());
                                }
                                idx.entries.insert(
                                    log_id.index(),
                                    Slot::Stored {
                                        log_id,
                                        loc,
                                        entry: keep.then_some(entry),
                                    },
                                );
                            }
                        }
                    }
                    callback.io_completed(Ok(()));
                }
                Err(e) => callback.io_completed(Err(io_err(e))),
            }),
        );
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let first_removed = last_log_id.as_ref().map_or(0, |l| l.index() + 1);
        {
            let mut idx = self.lock();
            idx.entries.split_off(&first_removed);
            while idx.held.back().is_some_and(|&i| i >= first_removed) {
                idx.held.pop_back();
            }
        }
        let frame = Frame {
            kind: FrameKind::Truncate,
            tablet: self.tablet,
            index: first_removed,
            payload: Bytes::new(),
        };
        self.journal.append(vec![frame]).await.map_err(io_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.catalog
            .put_raft(self.tablet, PURGED, &encode(&Some(log_id)))
            .map_err(io_err)?;
        {
            let mut idx = self.lock();
            idx.entries = idx.entries.split_off(&(log_id.index() + 1));
            idx.release(log_id.index());
            idx.last_purged = Some(log_id);
        }
        self.journal.set_trim_point(self.tablet, log_id.index());
        Ok(())
    }
}
