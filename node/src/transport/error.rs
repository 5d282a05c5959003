//! Errors of node-to-node transport. `Error` is what a caller of
//! `Transport::call` sees; `RemoteError` is what the receiving node's
//! handler (or its frame checks) answered, carried back in the response.
//!
//! What to do: `Unreachable`, `Connect` and `ConnectionLost` are worth a
//! retry (Raft retries on its own schedule); `Remote` depends on its kind;
//! `Config`, `Tls` and `Certs` need an operator; `ShutDown` is final.

use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid transport options: {0}")]
    Config(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("certificates: {0}")]
    Certs(#[from] crate::certs::Error),
    #[error("node {peer} has no known address; call set_peer first")]
    UnknownPeer { peer: u64 },
    #[error("node {peer} is unreachable; next connection attempt in {retry_in:?}")]
    Unreachable { peer: u64, retry_in: Duration },
    #[error("connecting to node {peer}: {reason}")]
    Connect { peer: u64, reason: String },
    #[error("connection to node {peer} lost: {reason}")]
    ConnectionLost { peer: u64, reason: String },
    #[error("node {peer} answered: {error}")]
    Remote { peer: u64, error: RemoteError },
    #[error("node {peer} broke the frame protocol: {reason}")]
    Protocol { peer: u64, reason: String },
    #[error("message of {bytes} bytes exceeds message_bytes_max {max_bytes}")]
    TooLarge { bytes: u64, max_bytes: u64 },
    #[error("transport is shut down")]
    ShutDown,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// The receiving side's refusal of one request, sent back on its stream.
/// Encoded as CBOR in an `Err` response frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RemoteError {
    /// No Raft group with this id is hosted on the receiving node.
    #[error("group {group} is not hosted here")]
    UnknownGroup { group: u64 },
    /// The group is hosted, but not the addressed replica (it moved, or the
    /// sender's membership view is stale).
    #[error("group {group} has no replica {replica} here")]
    UnknownReplica { group: u64, replica: u64 },
    /// The request exceeded the receiver's `message_bytes_max`.
    #[error("message of {bytes} bytes exceeds the receiver's limit of {max_bytes}")]
    TooLarge { bytes: u64, max_bytes: u64 },
    /// A malformed frame; the receiver counted it in `rejected_frames`.
    #[error("malformed request: {reason}")]
    Protocol { reason: String },
    /// The hello claimed a node id other than the certificate's.
    #[error("identity refused: {reason}")]
    Identity { reason: String },
    /// Both nodes dialed at once and this connection lost the tie-break;
    /// the peer's own connection is the one to use.
    #[error("duplicate connection; the peer's connection wins")]
    Duplicate,
    /// The handler refused the request for a reason of its own.
    #[error("refused: {reason}")]
    Refused { reason: String },
    /// The handler failed; the request may or may not have had effect.
    #[error("internal error: {reason}")]
    Internal { reason: String },
    /// The receiving transport is shutting down.
    #[error("receiver is shutting down")]
    ShuttingDown,
}

/// Why a stream stopped carrying frames: the stream or the connection under
/// it failed (not the peer's bytes, which are a `FrameError`). Worth a
/// retry on a new stream or connection.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Write(#[from] quinn::WriteError),
    #[error(transparent)]
    Closed(#[from] quinn::ClosedStream),
    #[error(transparent)]
    Read(#[from] quinn::ReadError),
}

/// Why an accepted connection has no node identity this node accepts: the
/// connection is refused.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("no peer certificate")]
    NoCertificate,
    #[error("peer identity is not a certificate chain")]
    NotACertificateChain,
    #[error("empty certificate chain")]
    EmptyChain,
    #[error(transparent)]
    Certificate(#[from] crate::certs::Error),
}
