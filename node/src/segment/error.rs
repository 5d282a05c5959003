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
