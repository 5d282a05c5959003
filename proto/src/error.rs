//! The typed errors that cross the wire, and their mapping to gRPC statuses.
//!
//! A failed call carries a gRPC status whose code says the broad class and
//! whose `details` hold an encoded [`pb::ErrorDetail`] with the precise
//! reason. [`Error::kind`] tells a caller what to do about it.

use prost::Message;
use tonic::{Code, Status};

use crate::pb;
use crate::pb::error_detail::Kind;

/// What a caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Try the same request again, after a backoff.
    Retry,
    /// Refresh routes or follow the hint, then retry.
    Redirect,
    /// The request itself is unacceptable; retrying it will not help.
    Refuse,
}

/// A typed error of the data API.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("not the leader of the tablet (leader: {leader_node:?} {leader_endpoint})")]
    NotLeader {
        leader_node: Option<u64>,
        leader_endpoint: String,
    },
    #[error("stale route: tablet {} now covers [{}, {}) at generation {}", .descriptor.id, .descriptor.vshard_lo, .descriptor.vshard_hi, .descriptor.generation)]
    StaleRoute { descriptor: pb::TabletDescriptor },
    #[error("tablet {tablet} is not on this node")]
    TabletNotFound { tablet: u64 },
    #[error("{what} is too large: {size} bytes, limit {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("storage full: {free_bytes} bytes free, reserve {reserve_bytes}")]
    StorageFull { free_bytes: u64, reserve_bytes: u64 },
    #[error("condition failed: actual version {actual:?}")]
    ConditionFailed { actual: Option<pb::Position> },
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("replica is {staleness_ms} ms behind, more than the {max_staleness_ms} ms asked")]
    TooStale {
        staleness_ms: u64,
        max_staleness_ms: u64,
    },
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    #[error("incomplete result: tablets {missing:?} could not be read")]
    Incomplete { missing: Vec<u64> },
    #[error("namespace {namespace:?} is not in the directory")]
    NamespaceNotFound { namespace: String },
    #[error("namespace {namespace:?} belongs to cell {cell:?}, not this one")]
    WrongCell {
        namespace: String,
        cell: String,
        controllers: Vec<String>,
    },
    #[error("permission denied: {reason}")]
    PermissionDenied { reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What the caller should do.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotLeader { .. } | Error::StaleRoute { .. } | Error::TabletNotFound { .. } => {
                ErrorKind::Redirect
            }
            Error::Unavailable { .. } | Error::TooStale { .. } | Error::Incomplete { .. } => {
                ErrorKind::Retry
            }
            Error::TooLarge { .. }
            | Error::StorageFull { .. }
            | Error::ConditionFailed { .. }
            | Error::InvalidArgument { .. }
            | Error::NamespaceNotFound { .. }
            // Nothing this cell can do: the caller resolves the namespace
            // again through the directory (the cross-cell client does).
            | Error::WrongCell { .. }
            | Error::PermissionDenied { .. } => ErrorKind::Refuse,
        }
    }

    fn code(&self) -> Code {
        match self {
            Error::NotLeader { .. } | Error::StaleRoute { .. } | Error::WrongCell { .. } => {
                Code::FailedPrecondition
            }
            Error::TabletNotFound { .. } | Error::NamespaceNotFound { .. } => Code::NotFound,
            Error::TooLarge { .. } | Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::StorageFull { .. } => Code::ResourceExhausted,
            Error::ConditionFailed { .. } => Code::Aborted,
            Error::PermissionDenied { .. } => Code::PermissionDenied,
            Error::TooStale { .. } | Error::Unavailable { .. } | Error::Incomplete { .. } => {
                Code::Unavailable
            }
        }
    }

    fn detail(&self) -> Kind {
        match self.clone() {
            Error::NotLeader {
                leader_node,
                leader_endpoint,
            } => Kind::NotLeader(pb::NotLeader {
                leader_node,
                leader_endpoint,
            }),
            Error::StaleRoute { descriptor } => Kind::StaleRoute(pb::StaleRoute {
                descriptor: Some(descriptor),
            }),
            Error::TabletNotFound { tablet } => Kind::TabletNotFound(pb::TabletNotFound { tablet }),
            Error::TooLarge { what, size, limit } => {
                Kind::TooLarge(pb::TooLarge { what, size, limit })
            }
            Error::StorageFull {
                free_bytes,
                reserve_bytes,
            } => Kind::StorageFull(pb::StorageFull {
                free_bytes,
                reserve_bytes,
            }),
            Error::ConditionFailed { actual } => {
                Kind::ConditionFailed(pb::ConditionFailed { actual })
            }
            Error::InvalidArgument { field, reason } => {
                Kind::InvalidArgument(pb::InvalidArgument { field, reason })
            }
            Error::TooStale {
                staleness_ms,
                max_staleness_ms,
            } => Kind::TooStale(pb::TooStale {
                staleness_ms,
                max_staleness_ms,
            }),
            Error::Unavailable { reason } => Kind::Unavailable(pb::Unavailable { reason }),
            Error::Incomplete { missing } => Kind::Incomplete(pb::Incomplete {
                missing_tablets: missing,
            }),
            Error::NamespaceNotFound { namespace } => {
                Kind::NamespaceNotFound(pb::NamespaceNotFound { namespace })
            }
            Error::WrongCell {
                namespace,
                cell,
                controllers,
            } => Kind::WrongCell(pb::WrongCell {
                namespace,
                cell,
                controllers,
            }),
            Error::PermissionDenied { reason } => {
                Kind::PermissionDenied(pb::PermissionDenied { reason })
            }
        }
    }

    fn from_detail(kind: Kind) -> Self {
        match kind {
            Kind::NotLeader(d) => Error::NotLeader {
                leader_node: d.leader_node,
                leader_endpoint: d.leader_endpoint,
            },
            Kind::StaleRoute(d) => Error::StaleRoute {
                descriptor: d.descriptor.unwrap_or_default(),
            },
            Kind::TabletNotFound(d) => Error::TabletNotFound { tablet: d.tablet },
            Kind::TooLarge(d) => Error::TooLarge {
                what: d.what,
                size: d.size,
                limit: d.limit,
            },
            Kind::StorageFull(d) => Error::StorageFull {
                free_bytes: d.free_bytes,
                reserve_bytes: d.reserve_bytes,
            },
            Kind::ConditionFailed(d) => Error::ConditionFailed { actual: d.actual },
            Kind::InvalidArgument(d) => Error::InvalidArgument {
                field: d.field,
                reason: d.reason,
            },
            Kind::TooStale(d) => Error::TooStale {
                staleness_ms: d.staleness_ms,
                max_staleness_ms: d.max_staleness_ms,
            },
            Kind::Unavailable(d) => Error::Unavailable { reason: d.reason },
            Kind::Incomplete(d) => Error::Incomplete {
                missing: d.missing_tablets,
            },
            Kind::NamespaceNotFound(d) => Error::NamespaceNotFound {
                namespace: d.namespace,
            },
            Kind::WrongCell(d) => Error::WrongCell {
                namespace: d.namespace,
                cell: d.cell,
                controllers: d.controllers,
            },
            Kind::PermissionDenied(d) => Error::PermissionDenied { reason: d.reason },
        }
    }

    /// Decodes a status into a typed error. A status without Stele details
    /// (from a proxy, or a transport failure) becomes `Unavailable` for
    /// transient codes and `InvalidArgument` for request errors.
    pub fn from_status(status: &Status) -> Self {
        if let Ok(pb::ErrorDetail { kind: Some(kind) }) = pb::ErrorDetail::decode(status.details())
        {
            return Error::from_detail(kind);
        }
        match status.code() {
            // The authorization layer answers before any service, without
            // details.
            Code::PermissionDenied | Code::Unauthenticated => Error::PermissionDenied {
                reason: status.message().to_string(),
            },
            Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => {
                Error::InvalidArgument {
                    field: "request".into(),
                    reason: status.message().to_string(),
                }
            }
            _ => Error::Unavailable {
                reason: format!("{:?}: {}", status.code(), status.message()),
            },
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let detail = pb::ErrorDetail {
            kind: Some(err.detail()),
        };
        Status::with_details(err.code(), err.to_string(), detail.encode_to_vec().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_round_trips_through_a_status() {
        let cases = vec![
            Error::PermissionDenied {
                reason: "needs an operator certificate".into(),
            },
            Error::NotLeader {
                leader_node: Some(3),
                leader_endpoint: "http://127.0.0.1:1".into(),
            },
            Error::StaleRoute {
                descriptor: pb::TabletDescriptor {
                    id: 4,
                    vshard_hi: 1 << 32,
                    ..Default::default()
                },
            },
            Error::TabletNotFound { tablet: 9 },
            Error::TooLarge {
                what: "value".into(),
                size: 10,
                limit: 5,
            },
            Error::StorageFull {
                free_bytes: 1,
                reserve_bytes: 2,
            },
            Error::ConditionFailed {
                actual: Some(pb::Position {
                    tablet: 1,
                    index: 2,
                    slot: 3,
                }),
            },
            Error::ConditionFailed { actual: None },
            Error::InvalidArgument {
                field: "key".into(),
                reason: "empty".into(),
            },
            Error::TooStale {
                staleness_ms: 5,
                max_staleness_ms: 1,
            },
            Error::Unavailable { reason: "x".into() },
            Error::Incomplete {
                missing: vec![1, 2],
            },
            Error::NamespaceNotFound {
                namespace: "a/b".into(),
            },
            Error::WrongCell {
                namespace: "a/b".into(),
                cell: "c2".into(),
                controllers: vec!["http://127.0.0.1:2".into()],
            },
        ];
        for err in cases {
            let status = Status::from(err.clone());
            assert_eq!(Error::from_status(&status), err);
        }
    }

    #[test]
    fn foreign_status_is_classified() {
        let e = Error::from_status(&Status::unavailable("down"));
        assert_eq!(e.kind(), ErrorKind::Retry);
        let e = Error::from_status(&Status::invalid_argument("bad"));
        assert_eq!(e.kind(), ErrorKind::Refuse);
    }
}
