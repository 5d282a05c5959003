//! Errors of the storage node. Wire-facing failures are converted to
//! `stele_proto::Error` at the service boundary (`service.rs`).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("catalog {}: {reason}", .path.display())]
    Catalog { path: PathBuf, reason: String },
    #[error("cannot decode {what}: {reason}")]
    Decode { what: String, reason: String },
    #[error("{what} has format version {found}; this build reads {supported}")]
    UnknownVersion {
        what: String,
        found: u32,
        supported: u32,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Api(#[from] stele_proto::Error),
    #[error("journal: {0}")]
    Journal(#[from] crate::journal::Error),
    #[error("segment: {0}")]
    Segment(#[from] crate::segment::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
