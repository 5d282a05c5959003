//! The controller's errors across its module boundaries.
//!
//! The gRPC API answers with `tonic::Status` (the wire's kinds: redirect to
//! the leader, retry, refuse); everything below it returns [`Error`], which
//! converts into the matching status.

use stele_quorum::Error as QuorumError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not the leader, or the quorum cannot commit now: follow the leader
    /// hint or retry.
    #[error(transparent)]
    Quorum(#[from] QuorumError),
    /// The quorum answered with bytes that are not a controller reply: the
    /// controllers run different versions; upgrade them to one.
    #[error("controller reply could not be decoded ({0}); run one controller version")]
    Reply(QuorumError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            Error::Quorum(e) => e.into(),
            Error::Reply(_) => Status::internal(e.to_string()),
        }
    }
}
