//! The node's catalog: a redb database holding what must survive a restart
//! besides the journal and the segment files.
//!
//! ```text
//! meta      "format" -> u32            catalog format version
//! tablets   tablet   -> CBOR TabletRecord   range, generation, checkpoint, segments
//! raft      (tablet, "vote"|"purged") -> CBOR bytes (opaque openraft types)
//! receipts  (tablet, batch key) -> CBOR Receipt
//! ```
//!
//! Every commit is `Durability::Immediate`: redb fsyncs before `commit`
//! returns, so a published segment, a checkpoint and a vote are durable once
//! the call returns. Values are versioned CBOR, never Rust struct dumps.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const META: TableDefinition<&str, u32> = TableDefinition::new("meta");
const TABLETS: TableDefinition<u64, &[u8]> = TableDefinition::new("tablets");
pub(crate) const RAFT: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("raft");
const RECEIPTS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("receipts");
/// Replica ids removed from this node (moved away): never served again.
const TOMBSTONES: TableDefinition<u64, u64> = TableDefinition::new("tombstones");
/// Namespace -> owning cell (CBOR), as the directory answered: a namespace
/// never changes cell, so a cached answer is kept for good.
const NAMESPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("namespaces");
/// What the data directory belongs to: `"cell"` → the cell id its
/// objects are keyed under in the bucket.
const IDENTITY: TableDefinition<&str, &str> = TableDefinition::new("identity");

/// Catalog format version. Startup refuses any other.
pub const CATALOG_FORMAT: u32 = 1;

/// A published segment of a tablet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    pub id: String,
    pub bytes: u64,
    pub rows: u64,
    pub log_first: u64,
    pub log_last: u64,
    pub ts_min: u64,
    pub ts_max: u64,
    /// The cold copy in object storage, once an `Uploaded` command for this
    /// segment has applied. Added after catalog format 1 shipped: absent in
    /// older records (`None`), and omitted when `None`, so records without a
    /// cold copy encode exactly as before (docs/FORMAT.md, catalog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<ColdCopy>,
    /// The tablet that sealed the segment, when not the one whose record
    /// names it: a split child shares its parent's segments, whose objects
    /// stay under the parent's key. 0 (omitted): this tablet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin: u64,
    /// Named by more than one tablet since a split (the parent's copy and
    /// the child's): never compacted, since a later merge of the two would
    /// then read its rows twice. Omitted when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared: bool,
    /// The vshard ranges `[lo, hi)` of the segment's rows this tablet
    /// reads, when not every row in its range: set by a merge on a segment
    /// that also holds rows of tablets outside the side that named it (each
    /// side keeps reading only what it read before, so a segment one side
    /// rewrote is not read twice). Sorted and disjoint. Omitted when `None`
    /// (every row of the segment within the tablet's range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Vec<(u32, u64)>>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl SegmentRef {
    /// The tablet whose object key holds the segment, for a segment named
    /// by `tablet`'s record.
    pub fn owner(&self, tablet: u64) -> u64 {
        if self.origin == 0 {
            tablet
        } else {
            self.origin
        }
    }

    /// The vshard ranges of this segment's rows a tablet over `range`
    /// reads: its `keep` (else the segment's whole range, `header`, from
    /// its file's header) within `range`.
    pub fn reads(&self, header: (u32, u64), range: (u32, u64)) -> Vec<(u32, u64)> {
        match &self.keep {
            Some(keep) => intersect(keep, range),
            None => intersect(&[header], range),
        }
    }

    /// The bytes of the segment a tablet over `range` reads, estimated by
    /// the share of the segment's vshard range it reads (vshards are
    /// hashes, so rows spread evenly over them): a split's halves each
    /// count about half of what they share, not all of it.
    pub fn read_bytes(&self, header: (u32, u64), range: (u32, u64)) -> u64 {
        let width = |(lo, hi): (u32, u64)| hi.saturating_sub(u64::from(lo));
        let whole = width(header);
        if whole == 0 {
            return self.bytes;
        }
        let read: u64 = self.reads(header, range).into_iter().map(width).sum();
        (u128::from(self.bytes) * u128::from(read) / u128::from(whole)) as u64
    }

    /// Whether the segment may hold rows a tablet over `range` does not
    /// read (rows of a split sibling, or of the other side of a merge).
    pub fn holds_unread(&self, header: (u32, u64), range: (u32, u64)) -> bool {
        self.reads(header, range) != [header]
    }

    /// The reference narrowed to what a tablet over `range` reads of it
    /// (`keep` left out when that is the whole segment).
    pub fn narrowed(self, header: (u32, u64), range: (u32, u64)) -> SegmentRef {
        let reads = self.reads(header, range);
        SegmentRef {
            keep: (reads != [header]).then_some(reads),
            ..self
        }
    }

    /// Also reads `more` (the same segment named by the other side of a
    /// merge, with what that side read of it).
    pub fn widen(&mut self, header: (u32, u64), more: &[(u32, u64)]) {
        let all = union(self.keep.as_deref().unwrap_or(&[header]), more);
        self.keep = (all != [header]).then_some(all);
    }
}

/// Whether `vshard` lies in one of `ranges`.
pub fn in_ranges(ranges: &[(u32, u64)], vshard: u32) -> bool {
    ranges
        .iter()
        .any(|&(lo, hi)| vshard >= lo && u64::from(vshard) < hi)
}

/// The parts of sorted, disjoint `ranges` within `[lo, hi)`.
fn intersect(ranges: &[(u32, u64)], (lo, hi): (u32, u64)) -> Vec<(u32, u64)> {
    ranges
        .iter()
        .map(|&(a, b)| (a.max(lo), b.min(hi)))
        .filter(|&(a, b)| u64::from(a) < b)
        .collect()
}

/// The union of two sets of sorted, disjoint ranges, sorted, disjoint and
/// with adjacent ranges joined.
fn union(a: &[(u32, u64)], b: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut all: Vec<(u32, u64)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Vec<(u32, u64)> = Vec::with_capacity(all.len());
    for (lo, hi) in all {
        match out.last_mut() {
            Some(last) if u64::from(lo) <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// What `Uploaded` recorded about a segment's object: enough for a replica
/// to confirm the object before dropping its local file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdCopy {
    /// Object size (the segment's length).
    pub bytes: u64,
    /// The whole-file xxh3-64 stored in the segment's trailer.
    pub file_xxh3: u64,
}

/// Everything the catalog knows about one tablet replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletRecord {
    pub v: u16,
    pub id: u64,
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    pub generation: u64,
    /// Highest log index whose rows are all in published segments (0: none).
    pub checkpoint: u64,
    /// The openraft log id and membership at the checkpoint (opaque CBOR
    /// owned by `node::raft`), the state machine's durable applied state.
    #[serde(with = "serde_bytes")]
    pub applied_state: Vec<u8>,
    pub segments: Vec<SegmentRef>,
    /// This replica's Raft member id: unique in the cell, never reused.
    pub replica_id: u64,
    /// A split child's voters: every one of them creates the group with
    /// exactly these (the same on each, as openraft allows), also after a
    /// crash before it did. Empty for every other tablet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_voters: Vec<u64>,
    /// Frozen for a merge as of the checkpoint: takes no writes, waits to
    /// be absorbed by its neighbour. Omitted when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub frozen: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A receipt row, keyed by (tablet, receipt key).
#[derive(Debug, Clone)]
pub struct ReceiptRow {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The node catalog. Cheap to clone.
#[derive(Clone)]
pub struct Catalog {
    db: Arc<Database>,
    path: PathBuf,
    votes: crate::catalog_group::GroupWriter,
}

/// Deletes a replica's rows (record, Raft state, receipts) and tombstones
/// its id, inside `txn`.
fn remove_in(
    txn: &redb::WriteTransaction,
    tablet: u64,
    replica_id: u64,
) -> std::result::Result<(), redb::Error> {
    let mut tablets = txn.open_table(TABLETS)?;
    tablets.remove(tablet)?;
    let mut raft = txn.open_table(RAFT)?;
    raft.retain_in((tablet, "")..(tablet + 1, ""), |_, _| false)?;
    let mut receipts = txn.open_table(RECEIPTS)?;
    let lo: (u64, &[u8]) = (tablet, &[]);
    let hi: (u64, &[u8]) = (tablet + 1, &[]);
    receipts.retain_in(lo..hi, |_, _| false)?;
    let mut tomb = txn.open_table(TOMBSTONES)?;
    tomb.insert(replica_id, tablet)?;
    Ok(())
}

fn db_err(path: &Path) -> impl Fn(redb::Error) -> Error + '_ {
    move |e| Error::Catalog {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

pub(crate) fn to_cbor<T: Serialize>(value: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    ciborium::into_writer(value, &mut buf).expect("CBOR encoding into a Vec cannot fail");
    buf
}

pub(crate) fn from_cbor<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T> {
    ciborium::from_reader(bytes).map_err(|e| Error::Decode {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

impl Catalog {
    /// Opens or creates the catalog at `path`, refusing an unknown format.
    pub fn open(path: &Path) -> Result<Catalog> {
        let err = db_err(path);
        let db = Database::create(path).map_err(|e| err(e.into()))?;
        let txn = db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
            let found = meta
                .get("format")
                .map_err(|e| err(e.into()))?
                .map(|g| g.value());
            match found {
                None => {
                    meta.insert("format", CATALOG_FORMAT)
                        .map_err(|e| err(e.into()))?;
                }
                Some(CATALOG_FORMAT) => {}
                Some(other) => {
                    return Err(Error::UnknownVersion {
                        what: format!("catalog {}", path.display()),
                        found: other,
                        supported: CATALOG_FORMAT,
                    });
                }
            }
            txn.open_table(TABLETS).map_err(|e| err(e.into()))?;
            txn.open_table(RAFT).map_err(|e| err(e.into()))?;
            txn.open_table(RECEIPTS).map_err(|e| err(e.into()))?;
        }
        txn.commit().map_err(|e| err(e.into()))?;
        let db = Arc::new(db);
        let votes = crate::catalog_group::GroupWriter::start(&db).map_err(|e| Error::Catalog {
            path: path.to_path_buf(),
            reason: format!("starting its vote writer: {e}"),
        })?;
        Ok(Catalog {
            db,
            path: path.to_path_buf(),
            votes,
        })
    }

    fn err(&self) -> impl Fn(redb::Error) -> Error + '_ {
        db_err(&self.path)
    }

    /// The cell id this data directory is bound to (`None`: not yet).
    pub fn cell(&self) -> Result<Option<String>> {
        let txn = self.db.begin_read().map_err(|e| self.err()(e.into()))?;
        let table = match txn.open_table(IDENTITY) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.err()(e.into())),
        };
        let cell = table.get("cell").map_err(|e| self.err()(e.into()))?;
        Ok(cell.map(|g| g.value().to_string()))
    }

    /// Binds this data directory to `cell` the first time a cold tier
    /// names one (or a restore writes it); afterwards refuses any other
    /// cell id, whose objects would be keyed elsewhere in the bucket
    /// (uploads under another cell, cold reads that find nothing).
    pub fn bind_cell(&self, cell: &str) -> Result<()> {
        let err = self.err();
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut table = txn.open_table(IDENTITY).map_err(|e| err(e.into()))?;
            let bound = table
                .get("cell")
                .map_err(|e| err(e.into()))?
                .map(|g| g.value().to_string());
            match bound {
                Some(b) if b == cell => return Ok(()),
                Some(b) => {
                    return Err(Error::OtherCell {
                        bound: b,
                        given: cell.to_string(),
                    });
                }
                None => {
                    table.insert("cell", cell).map_err(|e| err(e.into()))?;
                }
            }
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    /// All tablet records, by id.
    pub fn tablets(&self) -> Result<Vec<TabletRecord>> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = txn.open_table(TABLETS).map_err(|e| err(e.into()))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| err(e.into()))? {
            let (_, v) = row.map_err(|e| err(e.into()))?;
            out.push(from_cbor("tablet record", v.value())?);
        }
        Ok(out)
    }

    pub fn tablet(&self, id: u64) -> Result<Option<TabletRecord>> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = txn.open_table(TABLETS).map_err(|e| err(e.into()))?;
        match table.get(id).map_err(|e| err(e.into()))? {
            Some(v) => Ok(Some(from_cbor("tablet record", v.value())?)),
            None => Ok(None),
        }
    }

    /// Writes a tablet record (creation or metadata change).
    pub fn put_tablet(&self, record: &TabletRecord) -> Result<()> {
        self.publish(record, &[], &[])
    }

    /// Publishes a tablet's new record (segments, checkpoint) together with
    /// the receipts it adds and the receipt keys it drops, in one durable
    /// transaction: a crash leaves all of it or none.
    pub fn publish(
        &self,
        record: &TabletRecord,
        add_receipts: &[ReceiptRow],
        drop_receipts: &[Vec<u8>],
    ) -> Result<()> {
        self.publish_split(record, add_receipts, drop_receipts, None, None)
            .map(|_| ())
    }

    /// [`Catalog::publish`], and in the same transaction a split child's
    /// record, receipts and Raft purge point, unless the catalog holds that
    /// tablet already.
    /// Returns whether the child was created.
    pub fn publish_split(
        &self,
        record: &TabletRecord,
        add_receipts: &[ReceiptRow],
        drop_receipts: &[Vec<u8>],
        child: Option<(&TabletRecord, &[ReceiptRow], &[u8])>,
        retire: Option<(u64, u64)>,
    ) -> Result<bool> {
        let err = self.err();
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        let mut created = false;
        {
            let mut tablets = txn.open_table(TABLETS).map_err(|e| err(e.into()))?;
            tablets
                .insert(record.id, to_cbor(record).as_slice())
                .map_err(|e| err(e.into()))?;
            let mut receipts = txn.open_table(RECEIPTS).map_err(|e| err(e.into()))?;
            for key in drop_receipts {
                receipts
                    .remove((record.id, key.as_slice()))
                    .map_err(|e| err(e.into()))?;
            }
            for row in add_receipts {
                receipts
                    .insert((record.id, row.key.as_slice()), row.value.as_slice())
                    .map_err(|e| err(e.into()))?;
            }
            if let Some((child, rows, purged)) = child {
                let exists = tablets.get(child.id).map_err(|e| err(e.into()))?.is_some();
                if !exists {
                    tablets
                        .insert(child.id, to_cbor(child).as_slice())
                        .map_err(|e| err(e.into()))?;
                    for row in rows {
                        receipts
                            .insert((child.id, row.key.as_slice()), row.value.as_slice())
                            .map_err(|e| err(e.into()))?;
                    }
                    let mut raft = txn.open_table(RAFT).map_err(|e| err(e.into()))?;
                    raft.insert((child.id, "purged"), purged)
                        .map_err(|e| err(e.into()))?;
                    created = true;
                }
            }
        }
        if let Some((tablet, replica_id)) = retire {
            remove_in(&txn, tablet, replica_id).map_err(&err)?;
        }
        txn.commit().map_err(|e| err(e.into()))?;
        Ok(created)
    }

    /// The receipts of one tablet.
    pub fn receipts(&self, tablet: u64) -> Result<Vec<ReceiptRow>> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = txn.open_table(RECEIPTS).map_err(|e| err(e.into()))?;
        let lo: (u64, &[u8]) = (tablet, &[]);
        let mut out = Vec::new();
        for row in table.range(lo..).map_err(|e| err(e.into()))? {
            let (k, v) = row.map_err(|e| err(e.into()))?;
            let (t, key) = k.value();
            if t != tablet {
                break;
            }
            out.push(ReceiptRow {
                key: key.to_vec(),
                value: v.value().to_vec(),
            });
        }
        Ok(out)
    }

    /// Durably stores an opaque Raft value (vote, purged log id) of a tablet.
    pub fn put_raft(&self, tablet: u64, name: &str, value: &[u8]) -> Result<()> {
        let err = self.err();
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut table = txn.open_table(RAFT).map_err(|e| err(e.into()))?;
            table
                .insert((tablet, name), value)
                .map_err(|e| err(e.into()))?;
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    /// [`Catalog::put_raft`] in one transaction with every other value
    /// waiting (group commit, on the catalog's own thread): for votes,
    /// which a storm of elections writes by the thousand.
    pub async fn put_raft_grouped(
        &self,
        tablet: u64,
        name: &'static str,
        value: Vec<u8>,
    ) -> Result<()> {
        self.votes
            .put(tablet, name, value)
            .await
            .map_err(|reason| Error::Catalog {
                path: self.path.clone(),
                reason,
            })
    }

    /// Transactions the vote writer committed (each for one or more votes).
    pub fn vote_commits(&self) -> u64 {
        self.votes.commits()
    }

    /// Deletes everything the catalog holds for a tablet replica (record,
    /// Raft values, receipts) and tombstones its replica id, in one
    /// durable transaction.
    pub fn remove_tablet(&self, tablet: u64, replica_id: u64) -> Result<()> {
        let err = self.err();
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        remove_in(&txn, tablet, replica_id).map_err(&err)?;
        txn.commit().map_err(|e| err(e.into()))
    }

    /// Whether `replica_id` was removed from this node.
    pub fn is_tombstoned(&self, replica_id: u64) -> Result<bool> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = match txn.open_table(TOMBSTONES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
            Err(e) => return Err(err(e.into())),
        };
        Ok(table.get(replica_id).map_err(|e| err(e.into()))?.is_some())
    }

    /// Every cached namespace owner (namespace, CBOR record).
    pub fn namespace_owners(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = match txn.open_table(NAMESPACES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(err(e.into())),
        };
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| err(e.into()))? {
            let (k, v) = row.map_err(|e| err(e.into()))?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    pub fn put_namespace_owner(&self, namespace: &str, record: &[u8]) -> Result<()> {
        let err = self.err();
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut table = txn.open_table(NAMESPACES).map_err(|e| err(e.into()))?;
            table.insert(namespace, record).map_err(|e| err(e.into()))?;
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    pub fn get_raft(&self, tablet: u64, name: &str) -> Result<Option<Vec<u8>>> {
        let err = self.err();
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = txn.open_table(RAFT).map_err(|e| err(e.into()))?;
        Ok(table
            .get((tablet, name))
            .map_err(|e| err(e.into()))?
            .map(|v| v.value().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_bound_to_one_cell() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let c = Catalog::open(&path).unwrap();
        // A catalog from before the identity table: not bound yet.
        assert_eq!(c.cell().unwrap(), None);
        c.bind_cell("c1").unwrap();
        c.bind_cell("c1").unwrap();
        drop(c);
        let c = Catalog::open(&path).unwrap();
        assert_eq!(c.cell().unwrap().as_deref(), Some("c1"));
        let e = c.bind_cell("c2").unwrap_err();
        assert!(
            matches!(&e, Error::OtherCell { bound, given } if bound == "c1" && given == "c2"),
            "{e}"
        );
        assert!(e.to_string().contains("--cell-id c1"), "{e}");
        assert_eq!(c.cell().unwrap().as_deref(), Some("c1"), "still c1");
    }

    #[test]
    fn keep_narrows_to_each_side_and_widens_back() {
        let seg = SegmentRef {
            id: "s".into(),
            bytes: 1,
            rows: 1,
            log_first: 1,
            log_last: 1,
            ts_min: 0,
            ts_max: 0,
            cold: None,
            origin: 0,
            shared: true,
            keep: None,
        };
        let header = (0, 300);
        // Three tablets read a segment sealed over [0, 300).
        assert_eq!(seg.reads(header, (100, 200)), vec![(100, 200)]);
        assert!(seg.holds_unread(header, (100, 200)));
        assert!(!seg.holds_unread(header, (0, 1 << 32)));
        let big = SegmentRef {
            bytes: 3000,
            ..seg.clone()
        };
        assert_eq!(big.read_bytes(header, (100, 200)), 1000);
        assert_eq!(big.read_bytes(header, (0, 1 << 32)), 3000);
        assert_eq!(big.read_bytes(header, (400, 500)), 0);
        let low = seg.clone().narrowed(header, (0, 100));
        let high = seg.clone().narrowed(header, (200, 300));
        assert_eq!(low.keep, Some(vec![(0, 100)]));
        // A merge of [0, 100) and [200, 300) (the middle one rewrote its
        // copy): two pieces, read over any wider range.
        let mut both = low.clone();
        both.widen(header, &high.reads(header, (200, 300)));
        assert_eq!(both.keep, Some(vec![(0, 100), (200, 300)]));
        assert_eq!(both.reads(header, (0, 1 << 32)), vec![(0, 100), (200, 300)]);
        assert!(both.holds_unread(header, (0, 300)));
        assert!(in_ranges(&both.reads(header, (0, 300)), 250));
        assert!(!in_ranges(&both.reads(header, (0, 300)), 150));
        // Adjacent pieces join; the whole segment is no keep at all.
        both.widen(header, &[(100, 200)]);
        assert_eq!(both.keep, None);
        assert_eq!(low.clone().narrowed(header, (0, 100)), low, "idempotent");
        // Encoded only when set.
        let bytes = to_cbor(&seg);
        let plain: SegmentRef = from_cbor("ref", &bytes).unwrap();
        assert_eq!(plain, seg);
        let bytes = to_cbor(&low);
        assert_eq!(from_cbor::<SegmentRef>("ref", &bytes).unwrap(), low);
    }

    fn record(id: u64) -> TabletRecord {
        TabletRecord {
            v: 1,
            id,
            vshard_lo: 0,
            vshard_hi: 1 << 32,
            generation: 1,
            checkpoint: 0,
            applied_state: vec![],
            segments: vec![],
            replica_id: id,
            init_voters: Vec::new(),
            frozen: false,
        }
    }

    #[test]
    fn publish_is_atomic_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        {
            let cat = Catalog::open(&path).unwrap();
            cat.put_tablet(&record(1)).unwrap();
            cat.put_tablet(&record(2)).unwrap();
            let mut r = record(1);
            r.checkpoint = 10;
            r.segments.push(SegmentRef {
                id: "abc".into(),
                bytes: 1,
                rows: 1,
                log_first: 1,
                log_last: 10,
                ts_min: 0,
                ts_max: 0,
                cold: None,
                origin: 0,
                shared: false,
                keep: None,
            });
            let rows = vec![ReceiptRow {
                key: b"k1".to_vec(),
                value: b"v1".to_vec(),
            }];
            cat.publish(&r, &rows, &[]).unwrap();
            cat.publish(&r, &[], &[b"k1".to_vec()]).unwrap();
            cat.put_raft(1, "vote", b"x").unwrap();
        }
        let cat = Catalog::open(&path).unwrap();
        let all = cat.tablets().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].checkpoint, 10);
        assert_eq!(all[0].segments[0].id, "abc");
        assert!(cat.receipts(1).unwrap().is_empty());
        assert_eq!(cat.get_raft(1, "vote").unwrap().unwrap(), b"x");
        assert_eq!(cat.get_raft(2, "vote").unwrap(), None);
    }

    #[test]
    fn receipts_are_per_tablet() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::open(&dir.path().join("c.redb")).unwrap();
        for t in 1..=3 {
            let rows: Vec<_> = (0..3)
                .map(|i| ReceiptRow {
                    key: vec![i],
                    value: vec![t as u8],
                })
                .collect();
            cat.publish(&record(t), &rows, &[]).unwrap();
        }
        let r2 = cat.receipts(2).unwrap();
        assert_eq!(r2.len(), 3);
        assert!(r2.iter().all(|r| r.value == vec![2]));
    }

    /// A SegmentRef written before the cold tier existed (no `cold` key)
    /// still decodes, and one without a cold copy encodes exactly as before.
    #[test]
    fn segment_ref_cold_field_is_back_compatible() {
        #[derive(Serialize)]
        struct SegmentRefV0 {
            id: String,
            bytes: u64,
            rows: u64,
            log_first: u64,
            log_last: u64,
            ts_min: u64,
            ts_max: u64,
        }
        let old = to_cbor(&SegmentRefV0 {
            id: "abc".into(),
            bytes: 10,
            rows: 2,
            log_first: 1,
            log_last: 5,
            ts_min: 3,
            ts_max: 4,
        });
        let r: SegmentRef = from_cbor("segment ref", &old).unwrap();
        assert_eq!(r.cold, None);
        assert_eq!(to_cbor(&r), old, "no cold copy: same bytes as before");
        let mut with = r.clone();
        with.cold = Some(ColdCopy {
            bytes: 10,
            file_xxh3: 7,
        });
        let back: SegmentRef = from_cbor("segment ref", &to_cbor(&with)).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn unknown_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META).unwrap().insert("format", 99).unwrap();
            txn.commit().unwrap();
        }
        match Catalog::open(&path) {
            Err(Error::UnknownVersion { found: 99, .. }) => {}
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("unknown format accepted"),
        }
    }
}
