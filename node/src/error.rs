//! Errors of the storage node. Wire-facing failures are converted to
//! `stele_proto::Error` at the service boundary (`service.rs`).

use std::path::PathBuf;
use std::time::Duration;

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
    /// Waiting for `what` took longer than `after`.
    #[error("{what}: timed out after {after:?}: {reason}")]
    Timeout {
        what: String,
        after: Duration,
        reason: String,
    },
    /// A server (the gRPC data API) failed to start or stopped with an
    /// error.
    #[error("serve {what}: {reason}")]
    Serve { what: &'static str, reason: String },
    /// openraft refused to start or initialize a tablet's group.
    #[error("tablet {tablet}: raft group: {reason}")]
    RaftInit { tablet: u64, reason: String },
    /// This node will not host the replica asked for.
    #[error("replica {replica} of tablet {tablet}: {refusal}")]
    ReplicaRefused {
        tablet: u64,
        replica: u64,
        refusal: Refusal,
    },
    /// The data directory holds another cell's data.
    #[error(
        "this data directory belongs to cell {bound:?} (its objects are under cells/{bound}/ in the bucket), \
         not {given:?}: start it with --cell-id {bound}"
    )]
    OtherCell { bound: String, given: String },
    #[error(transparent)]
    Api(#[from] stele_proto::Error),
    #[error("journal: {0}")]
    Journal(#[from] crate::journal::Error),
    #[error("segment: {0}")]
    Segment(#[from] crate::segment::Error),
}

/// Why a node will not host a replica.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The node holds another replica of the tablet; it must be retired
    /// first.
    #[error("this node already holds replica {here} of the tablet")]
    OtherReplicaHere { here: u64 },
    /// The id was removed from this node before: replica ids are never
    /// reused.
    #[error("removed from this node before; replica ids are never reused")]
    Tombstoned,
    /// The id names another node.
    #[error("belongs to node {owner}, not this one ({here})")]
    OtherNode { owner: u64, here: u64 },
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
