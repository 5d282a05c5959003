//! Errors of the journal. Each variant tells the caller what to do: retry
//! later (`StorageFull`), refuse the request (`TooLarge`), restart the node
//! (`Stopped`), or have an operator restore a file (`Corrupt`).

use std::io;
use std::path::PathBuf;

use super::format::Damage;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("journal I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{path} is not a Stele journal file (bad magic)")]
    BadMagic { path: PathBuf },

    #[error(
        "journal file {path} has format version {version}, this build reads only version {supported}"
    )]
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
        supported: u32,
    },

    #[error(
        "journal file {file} is damaged at byte offset {offset} ({reason}){}; the journal refuses to open: restore this file from a replica or backup",
        valid_after_text(*valid_after)
    )]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: Damage,
        /// Offset of a later frame that verifies, when the damage is not a torn tail.
        valid_after: Option<u64>,
    },

    #[error(
        "journal directory {dir} lacks file sequence {missing_seq} between existing files; restore it"
    )]
    MissingFile { dir: PathBuf, missing_seq: u64 },

    #[error("journal stopped after a refused write: {reason}; restart the node to recover")]
    Stopped { reason: String },

    #[error(
        "storage full: {free_bytes} bytes free, a group of {group_bytes} bytes would leave less than the reserve of {reserve_bytes} bytes"
    )]
    StorageFull {
        free_bytes: u64,
        group_bytes: u64,
        reserve_bytes: u64,
    },

    #[error("frame payload of {payload_bytes} bytes exceeds frame_payload_bytes_max {max_bytes}")]
    TooLarge {
        payload_bytes: usize,
        max_bytes: usize,
    },

    #[error(
        "submission of {unit_bytes} bytes does not fit in one journal file of {file_bytes_max} bytes"
    )]
    UnitTooLarge {
        unit_bytes: u64,
        file_bytes_max: u64,
    },

    #[error("a truncate frame must have an empty payload")]
    TruncatePayload,

    #[error("journal file sequence {file_seq} has been trimmed or never existed")]
    FileGone { file_seq: u64 },

    #[error("invalid journal options: {0}")]
    InvalidOptions(String),

    #[error("journal is shut down")]
    ShutDown,
}

fn valid_after_text(valid_after: Option<u64>) -> String {
    match valid_after {
        Some(offset) => format!(", and a valid frame follows at byte offset {offset}"),
        None => String::new(),
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
