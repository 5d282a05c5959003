//! The member's durable Raft state in one redb database: the log, the vote,
//! the committed and purged log ids, and the last snapshot.
//!
//! ```text
//! <dir>/quorum.redb
//!   log   index -> CBOR Entry
//!   meta  "vote" | "committed" | "purged" | "snapshot" -> CBOR
//! ```
//! Every write is one redb transaction committed with fsync (redb's default
//! `Durability::Immediate`), so an append is flushed when openraft is told.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::OptionalSend;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::{C, Entry, Error, LogId, Result, SnapshotMeta, Vote, decode, to_cbor};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

const VOTE: &str = "vote";
pub(crate) const COMMITTED: &str = "committed";
pub(crate) const PURGED: &str = "purged";
const SNAPSHOT: &str = "snapshot";

/// The database file inside a member's directory.
pub(crate) const FILE: &str = "quorum.redb";

/// A stored snapshot: meta and the state's bytes.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub meta: SnapshotMeta,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

#[derive(Clone)]
pub(crate) struct Store {
    path: Arc<PathBuf>,
    db: Arc<Database>,
    /// vote, committed and purged, read often.
    cache: Arc<Mutex<Cache>>,
}

#[derive(Default)]
struct Cache {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

/// Creates `dir` and syncs it and its parent, so the new directory (and
/// the database about to be created in it) survives a crash.
fn create_dir_durable(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    for d in std::iter::once(dir).chain(parent) {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the database in `dir` and reads its vote,
    /// committed and purged ids. A value that does not decode is an error:
    /// forgetting a vote could let this member vote twice in a term.
    pub fn open(dir: &Path) -> Result<Store> {
        create_dir_durable(dir).map_err(|source| Error::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE);
        let db = Database::create(&path).map_err(|e| Error::Storage {
            path: path.clone(),
            source: e.into(),
        })?;
        let store = Store {
            path: Arc::new(path),
            db: Arc::new(db),
            cache: Default::default(),
        };
        store.write(|txn| {
            txn.open_table(LOG)?;
            txn.open_table(META)?;
            Ok(())
        })?;
        let cache = Cache {
            vote: store.get_meta(VOTE)?,
            committed: store.get_meta::<Option<LogId>>(COMMITTED)?.flatten(),
            purged: store.get_meta::<Option<LogId>>(PURGED)?.flatten(),
        };
        *store.cache() = cache;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn storage(&self, source: redb::Error) -> Error {
        Error::Storage {
            path: self.path.to_path_buf(),
            source,
        }
    }

    /// Runs `f` in one write transaction and commits it (with fsync).
    fn write<T>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T> {
        let run = || {
            let txn = self.db.begin_write()?;
            let out = f(&txn)?;
            txn.commit()?;
            Ok(out)
        };
        run().map_err(|e| self.storage(e))
    }

    /// Runs `f` in one read transaction.
    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T> {
        let run = || f(&self.db.begin_read()?);
        run().map_err(|e| self.storage(e))
    }

    pub fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &'static str) -> Result<Option<T>> {
        let bytes = self.read(|txn| {
            let table = txn.open_table(META)?;
            Ok(table.get(key)?.map(|v| v.value().to_vec()))
        })?;
        bytes.map(|b| decode(key, &b)).transpose()
    }

    pub fn put_meta<T: Serialize>(&self, key: &'static str, value: &T) -> Result<()> {
        let bytes = to_cbor(value);
        self.write(|txn| {
            txn.open_table(META)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
    }

    pub fn snapshot(&self) -> Result<Option<StoredSnapshot>> {
        self.get_meta(SNAPSHOT)
    }

    pub fn put_snapshot(&self, snapshot: &StoredSnapshot) -> Result<()> {
        self.put_meta(SNAPSHOT, snapshot)
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        // The cache holds three plain values, each replaced whole: a panic
        // elsewhere cannot leave it half written.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn entries<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry>> {
        let raw = self.read(|txn| {
            let table = txn.open_table(LOG)?;
            let mut raw = Vec::new();
            for item in table.range(range)? {
                raw.push(item?.1.value().to_vec());
            }
            Ok(raw)
        })?;
        raw.iter().map(|b| decode("quorum log entry", b)).collect()
    }

    fn last_entry(&self) -> Result<Option<Entry>> {
        let raw = self.read(|txn| {
            let table = txn.open_table(LOG)?;
            Ok(table.last()?.map(|(_, v)| v.value().to_vec()))
        })?;
        raw.map(|b| decode("quorum log entry", &b)).transpose()
    }

    fn append_all(&self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        self.write(|txn| {
            let mut table = txn.open_table(LOG)?;
            for e in entries {
                table.insert(e.index(), to_cbor(&e).as_slice())?;
            }
            Ok(())
        })
    }
}

impl RaftLogReader<C> for Store {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        self.entries(range).map_err(Error::into_io)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.cache().vote)
    }
}

impl RaftLogStorage<C> for Store {
    type LogReader = Store;

    async fn get_log_state(&mut self) -> io::Result<LogState<C>> {
        let last = self.last_entry().map_err(Error::into_io)?;
        let purged = self.cache().purged;
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.map(|e| e.log_id()).or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Store {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.put_meta(VOTE, vote).map_err(Error::into_io)?;
        self.cache().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        self.put_meta(COMMITTED, &committed)
            .map_err(Error::into_io)?;
        self.cache().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.cache().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // The commit has synced the entries before openraft hears of them.
        match self.append_all(entries) {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::other(e.to_string())));
                Err(e.into_io())
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.as_ref().map_or(0, |l| l.index() + 1);
        self.write(|txn| {
            txn.open_table(LOG)?.retain_in(from.., |_, _| false)?;
            Ok(())
        })
        .map_err(Error::into_io)
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        // The purged id and the removal commit together: a crash leaves
        // either both or neither.
        let purged = to_cbor(&Some(log_id));
        self.write(|txn| {
            txn.open_table(META)?.insert(PURGED, purged.as_slice())?;
            txn.open_table(LOG)?
                .retain_in(..=log_id.index(), |_, _| false)?;
            Ok(())
        })
        .map_err(Error::into_io)?;
        self.cache().purged = Some(log_id);
        Ok(())
    }
}

#[cfg(test)]
#[path = "store_test.rs"]
mod tests;
