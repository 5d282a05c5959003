//! Segments: immutable, self-describing, checksummed files of one tablet's
//! sorted records, built when a tablet seals its memtable.
//!
//! ```text
//! rows (sorted) --encode--> bytes --durable_write--> <dir>/<id>.seg
//!                                                       |
//!                     SegmentReader::open (prologue, header, footer, trailer checked)
//!                                                       |
//!                     scan_key / latest / scan  (blocks read on demand, crc checked)
//!
//! peer chunks --Incoming (<id>.seg.<n>.part, hashed as it streams)--> <dir>/<id>.seg
//! ```
//!
//! Every replica builds the segment of a seal from the same rows, so
//! [`encode`] is a pure, deterministic function of the header, the rows and
//! the options: no clock, no randomness, no hash-map order, zstd at a fixed
//! level, CBOR with definite lengths and fixed field order. The segment id is
//! the lowercase hex of xxh3-128 over the complete file, so replicas agree on
//! it. The byte layout is in `docs/FORMAT.md` (section 5) and mirrored by the
//! constants in [`format`].

pub(crate) mod block;
mod bloom;
mod error;
pub mod format;
mod incoming;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use error::{Damage, Error, Result};
pub use incoming::{Incoming, PART_SUFFIX};
pub use reader::{RangeRead, SegmentReader};
pub use writer::encode;

/// One record as stored in a segment. Its position is `(tablet, index, slot)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub namespace: String,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// Microseconds.
    pub ts: u64,
    /// Raft log index of the batch that wrote the record.
    pub index: u64,
    /// Position within the batch.
    pub slot: u32,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// The record's vshard (from its routing key). Stored per row since
    /// row schema 2, so a split child can read only its own range of a
    /// segment it shares with its parent.
    #[serde(default)]
    pub vshard: u32,
    /// The tablet that applied the record (its position's tablet). Not
    /// stored per row: the tablet read path fills it from the segment's
    /// header, or with its own id for memtable rows. 0 while unknown.
    #[serde(default)]
    pub tablet: u64,
}

impl Row {
    /// The segment sort order: `(namespace, key, ts, index, slot)`.
    pub fn order_key(&self) -> (&str, &[u8], u64, u64, u32) {
        (&self.namespace, &self.key, self.ts, self.index, self.slot)
    }
}

/// Header fields the caller (the tablet's seal) decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    pub tablet: u64,
    pub vshard_lo: u32,
    /// Exclusive upper bound, up to 2^32.
    pub vshard_hi: u64,
    /// First and last Raft log index the seal covers (inclusive). Every row's
    /// index lies in this range; the range may contain entries without rows.
    pub log_first: u64,
    pub log_last: u64,
}

/// Header fields the writer computes from the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentStats {
    pub rows: u64,
    /// Distinct `(namespace, key)` pairs.
    pub keys: u64,
    pub ts_min: u64,
    pub ts_max: u64,
}

/// Writer options. They shape the bytes, so every replica must use the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// Uncompressed bytes per block the writer aims for (default 64 KiB); a
    /// row larger than this gets a block of its own.
    pub block_bytes_target: usize,
    /// Largest value accepted (default 1 MiB, at most 16 MiB).
    pub value_bytes_max: usize,
    /// Format version to write (`format::FORMAT_VERSION_MIN..=MAX`; default
    /// 1). A seal takes it from its Raft entry, never from local settings.
    pub format: u32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            block_bytes_target: format::BLOCK_BYTES_TARGET_DEFAULT,
            value_bytes_max: format::VALUE_BYTES_DEFAULT_MAX,
            format: format::FORMAT_VERSION_MIN,
        }
    }
}

impl WriteOptions {
    pub fn validate(&self) -> Result<()> {
        if self.block_bytes_target == 0 || self.block_bytes_target > format::BLOCK_BYTES_TARGET_MAX
        {
            return Err(Error::Invalid(format!(
                "block_bytes_target {} not in 1..={}",
                self.block_bytes_target,
                format::BLOCK_BYTES_TARGET_MAX
            )));
        }
        if self.value_bytes_max > format::VALUE_BYTES_HARD_MAX {
            return Err(Error::Invalid(format!(
                "value_bytes_max {} exceeds {}",
                self.value_bytes_max,
                format::VALUE_BYTES_HARD_MAX
            )));
        }
        if !(format::FORMAT_VERSION_MIN..=format::FORMAT_VERSION_MAX).contains(&self.format) {
            return Err(Error::Invalid(format!(
                "segment format {} not in {}..={}",
                self.format,
                format::FORMAT_VERSION_MIN,
                format::FORMAT_VERSION_MAX
            )));
        }
        Ok(())
    }
}

/// What the catalog records about a published segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: String,
    pub bytes: u64,
    pub rows: u64,
    pub ts_min: u64,
    pub ts_max: u64,
    pub log_first: u64,
    pub log_last: u64,
}

/// The segment id of complete file bytes: lowercase hex of xxh3-128 (seed 0),
/// 32 characters.
pub fn segment_id(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// File name of a segment: `<id>.seg`.
pub fn file_name(id: &str) -> String {
    format!("{id}.seg")
}

/// Encodes the segment and publishes it as `<dir>/<id>.seg` with
/// [`crate::fsutil::durable_write`]. Invalid input writes nothing.
pub fn write(
    dir: &Path,
    header: &SegmentHeader,
    rows: &[Row],
    opts: &WriteOptions,
) -> Result<SegmentInfo> {
    let bytes = encode(header, rows, opts)?;
    let id = segment_id(&bytes);
    let path = dir.join(file_name(&id));
    crate::fsutil::durable_write(&path, &bytes).map_err(|source| Error::Io {
        file: path.clone(),
        op: "publishing",
        source,
    })?;
    // encode() succeeded, so rows is non-empty and sorted by namespace/key, not ts.
    let (ts_min, ts_max) = rows
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(r.ts), hi.max(r.ts)));
    Ok(SegmentInfo {
        id,
        bytes: bytes.len() as u64,
        rows: rows.len() as u64,
        ts_min,
        ts_max,
        log_first: header.log_first,
        log_last: header.log_last,
    })
}

/// A valid segment of `rows` rows of tablet 1 (namespace `a/b`, keys
/// `k000`..), each value given by `value(i)`, with its id: for tests that
/// move or damage whole segment files.
#[cfg(test)]
pub(crate) fn sample_segment(rows: u64, value: impl Fn(u64) -> Vec<u8>) -> (String, Vec<u8>) {
    let header = SegmentHeader {
        tablet: 1,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        log_first: 1,
        log_last: rows,
    };
    let rows: Vec<Row> = (0..rows)
        .map(|i| Row {
            namespace: "a/b".into(),
            key: format!("k{i:03}").into_bytes(),
            ts: i,
            index: i + 1,
            slot: 0,
            value: value(i),
            vshard: 0,
            tablet: 0,
        })
        .collect();
    let bytes = encode(&header, &rows, &WriteOptions::default()).expect("sample segment");
    (segment_id(&bytes), bytes)
}
