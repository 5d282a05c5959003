//! Errors of the segment module.
//!
//! Reading a segment either returns correct rows or one of these; damage is
//! never returned as data. `Corrupt` always names the file and the byte offset
//! of the structure that failed its check (the prologue, a block, the footer or
//! the trailer), so an operator can find it with `xxd -s`.

use std::io;
use std::path::PathBuf;

/// `segment::Error`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system failed a read, write or open; the file may be fine.
    #[error("segment {file}: i/o error while {op}: {source}")]
    Io {
        file: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A checksum or a structural check failed: the file is damaged or truncated.
    /// Fetch the segment again from a peer or object storage.
    #[error("segment {file}: corrupt at byte {offset}: {what}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        what: String,
    },
    /// The file is a segment of a format version this build cannot read.
    #[error(
        "segment {file}: unknown format version {version} (this build reads version {supported})"
    )]
    UnknownVersion {
        file: PathBuf,
        version: u32,
        supported: u32,
    },
    /// The file does not start with the segment magic: not a segment at all.
    #[error("{file}: not a segment file (magic {found:02x?})")]
    BadMagic { file: PathBuf, found: Vec<u8> },
    /// Writer input rows are not in `(namespace, key, ts, index, slot)` order.
    #[error(
        "segment input row {row} is not strictly after row {prev} in (namespace, key, ts, index, slot) order"
    )]
    Unsorted { prev: usize, row: usize },
    /// Two writer input rows share a log position.
    #[error("segment input has two rows at position (index {index}, slot {slot})")]
    DuplicatePosition { index: u64, slot: u32 },
    /// Writer input or options break a documented limit.
    #[error("invalid segment input: {0}")]
    Invalid(String),
}

/// `segment::Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a segment's bytes or structures fail a check: the `what` of
/// [`Error::Corrupt`], which adds the file and the byte offset. The codec
/// (`block`, `bloom`) and the reader's invariant checks return it, so a
/// failed check is a value a test can match, not a sentence to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    // Rows inside a decompressed block (`block::decode_rows`).
    #[error("{rows} rows cannot fit in {bytes} bytes")]
    TooManyRows { rows: u64, bytes: usize },
    #[error("bad {field} length varint at block byte {at}")]
    BadLength { field: &'static str, at: usize },
    #[error("{field} length {len} at block byte {at} exceeds {max}")]
    LengthOverMax {
        field: &'static str,
        len: u64,
        at: usize,
        max: usize,
    },
    #[error("{field} of {len} bytes at block byte {at} runs past the block end")]
    PastBlockEnd {
        field: &'static str,
        len: usize,
        at: usize,
    },
    #[error("bad {field} varint at block byte {at}")]
    BadVarint { field: &'static str, at: usize },
    #[error("namespace before block byte {at} is not UTF-8")]
    NamespaceNotUtf8 { at: usize },
    #[error("{field} {value} before block byte {at} exceeds u32")]
    OverU32 {
        field: &'static str,
        value: u64,
        at: usize,
    },
    #[error("{bytes} trailing bytes after {rows} rows")]
    TrailingBytes { bytes: usize, rows: u64 },

    // A decoded block against the block index and the header.
    #[error("no rows")]
    NoRows,
    #[error("first or last key differs from the block index")]
    BlockKeys,
    #[error("rows are not strictly sorted")]
    RowsUnsorted,
    #[error("ts range differs from the block index")]
    BlockTsRange,
    #[error("row index {index} outside the header's log range")]
    RowOutsideLog { index: u64 },

    // The header.
    #[error("unknown row schema {schema}")]
    UnknownRowSchema { schema: u32 },
    #[error("bad vshard range [{lo}, {hi})")]
    VshardRange { lo: u32, hi: u64 },
    #[error("inconsistent header ranges or counts")]
    HeaderCounts,

    // The footer and its block index.
    #[error("footer stats differ from the header")]
    FooterStats,
    #[error("footer index range outside the header's log range")]
    FooterIndexRange,
    #[error("no blocks")]
    NoBlocks,
    #[error("footer first/last key differs from the block index")]
    FooterKeys,
    #[error("block {block} at {offset} but the previous one ends at {expected}")]
    BlockGap {
        block: usize,
        offset: u64,
        expected: u64,
    },
    #[error("block {block} has impossible sizes")]
    BlockSizes { block: usize },
    #[error("block {block} runs past the footer")]
    BlockPastFooter { block: usize },
    #[error("block {block} has reversed ranges")]
    BlockReversed { block: usize },
    #[error("block {block} starts before block {} ends", block - 1)]
    BlockOverlap { block: usize },
    #[error("blocks end at {end}, the footer starts at {footer_offset}")]
    BlocksEnd { end: u64, footer_offset: u64 },
    #[error("block index totals differ from the header")]
    IndexTotals,

    // The stored bloom filter.
    #[error("bloom bits_len {bits_len} is not a positive multiple of 8")]
    BloomBitsLen { bits_len: u64 },
    #[error("bloom has {bytes} bytes, bits_len {bits_len} needs {}", bits_len / 8)]
    BloomBytes { bytes: usize, bits_len: u64 },
    #[error("bloom hash count {hashes} out of range")]
    BloomHashes { hashes: u32 },

    // A fixed-width field (prologue, trailer, block checksum).
    #[error(transparent)]
    Field(#[from] crate::fixed::Error),
}
