//! What can go wrong in a quorum group, and what the caller should do.
//!
//! Two kinds reach a request's caller and map onto the wire: `NotLeader`
//! (redirect) and `Unavailable` (retry later). The rest come from opening a
//! member (its directory, its redb log, its stored snapshot, its openraft
//! configuration) or from the storage under a running member, where openraft
//! receives them wrapped in an `io::Error` and stops the member.

use std::path::PathBuf;

use crate::QuorumConfig;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This member does not lead; the caller retries at the leader.
    #[error("not the leader (leader: {leader:?} at {endpoint:?})")]
    NotLeader {
        leader: Option<u64>,
        endpoint: Option<String>,
    },
    /// No leader can serve the request now (an election, a partition, a
    /// member shutting down): the caller retries later.
    #[error("quorum unavailable: {0}")]
    Unavailable(String),
    #[error(
        "create the quorum directory {}: {source}; check that the data directory is writable",
        path.display()
    )]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("quorum log {}: {source}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: redb::Error,
    },
    #[error("{what} does not decode: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: ciborium::de::Error<std::io::Error>,
    },
    /// A snapshot written by a build with another state format.
    #[error(
        "{state} state version {found} is unknown to this build, which reads version {expected}; run a build that knows it"
    )]
    StateVersion {
        state: &'static str,
        found: u16,
        expected: u16,
    },
    /// The snapshot stored with the log does not restore: the member cannot
    /// rebuild its state and must not start without it.
    #[error(
        "the snapshot stored in {} does not restore: {source}; restore this member's data directory from a peer",
        path.display()
    )]
    Snapshot {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
    /// An apply panicked while it held the state: the state may be half
    /// changed, so the member stops rather than serve or snapshot it.
    #[error("the quorum state lock is poisoned by an earlier panic; restart the member")]
    Poisoned,
    /// A seeded (restored) member directory cannot be written as asked.
    #[error("seed the quorum in {}: {reason}", path.display())]
    Seed { path: PathBuf, reason: String },
    #[error("quorum raft configuration: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("start the quorum raft: {0}")]
    Start(#[from] openraft::error::Fatal<QuorumConfig>),
}

impl Error {
    /// The error as openraft's storage traits carry it; the typed error
    /// stays inside as the source.
    pub(crate) fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }
}

impl From<Error> for tonic::Status {
    /// `NotLeader` with the leader's endpoint, or `Unavailable`: what a
    /// leader-following client retries on. The other kinds come from
    /// opening or storage and never answer a request; should one, it is an
    /// internal error.
    fn from(e: Error) -> tonic::Status {
        match e {
            Error::NotLeader { leader, endpoint } => stele_proto::Error::NotLeader {
                leader_node: leader,
                leader_endpoint: endpoint.unwrap_or_default(),
            }
            .into(),
            Error::Unavailable(reason) => stele_proto::Error::Unavailable { reason }.into(),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
