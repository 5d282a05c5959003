//! Errors of the routing client.
//!
//! The typed server errors of the data API ([`stele_proto::Error`]) are kept
//! whole, so a caller can match on `ConditionFailed { actual }` or
//! `TooLarge`; the client adds the failures that happen on its side of the
//! wire (transport, time budget, endpoint syntax).

use std::time::Duration;

use stele_proto::ErrorKind;

/// A failed client call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A typed data-API error, returned by a node or found by the client's
    /// own validation before sending.
    #[error(transparent)]
    Api(#[from] stele_proto::Error),
    /// The endpoint URL could not be used.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// One attempt took longer than `ClientOptions::request_timeout`. The
    /// request may or may not have been applied.
    #[error("request to {endpoint} timed out after {elapsed:?}")]
    RequestTimeout { endpoint: String, elapsed: Duration },
    /// The retry budget (attempts or deadline) ran out; `last` is the error of
    /// the final attempt. An append that ends here is indeterminate: it may
    /// have been applied, and retrying it with the same batch id is safe.
    #[error("gave up after {attempts} attempts in {elapsed:?}: {last}")]
    Exhausted {
        attempts: u32,
        elapsed: Duration,
        last: Box<Error>,
    },
    /// No known tablet covers the vshard, even after refreshing routes.
    #[error("no tablet covers vshard {vshard}")]
    NoRoute { vshard: u32 },
    /// A node answered with something the protocol does not allow.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The batcher has shut down.
    #[error("batcher closed")]
    Closed,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid_endpoint(endpoint: &str, e: stele_tls::Error) -> Error {
        Error::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        }
    }

    /// What the caller should do. Timeouts are retried: every data request is
    /// idempotent (appends by batch id).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
            Error::RequestTimeout { .. } => ErrorKind::Retry,
            Error::NoRoute { .. } => ErrorKind::Redirect,
            Error::InvalidEndpoint { .. }
            | Error::Exhausted { .. }
            | Error::Protocol(_)
            | Error::Closed => ErrorKind::Refuse,
        }
    }

    /// The typed data-API error, if this is one (looking through `Exhausted`).
    pub fn api(&self) -> Option<&stele_proto::Error> {
        match self {
            Error::Api(e) => Some(e),
            Error::Exhausted { last, .. } => last.api(),
            _ => None,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::Api(stele_proto::Error::from_status(&status))
    }
}
