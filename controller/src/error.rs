//! The controller's errors across its module boundaries.
//!
//! The gRPC API answers with `tonic::Status` (the wire's kinds: redirect to
//! the leader, retry, refuse); everything below it returns [`Error`], which
//! converts into the matching status.

use stele_proto::pb;
use stele_quorum::Error as QuorumError;
use stele_quorum::refuse;
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

/// A heartbeat's registration, checked before anything changes: present,
/// a node id in range, sent by that node's certificate (a forged id is
/// refused and counted), endpoints others can dial.
pub(crate) fn checked_registration(
    caller: &stele_tls::Caller,
    reg: Option<pb::NodeRegistration>,
) -> Result<pb::NodeRegistration, tonic::Status> {
    let Some(reg) = reg else {
        return Err(refuse("node", "missing registration"));
    };
    if reg.id == 0 || reg.id >= 1 << 16 {
        return Err(refuse("node.id", "node ids are 1..65535"));
    }
    if !caller.may_act_as_node(reg.id) {
        let why = format!("a heartbeat as node {} from {}", reg.id, caller.describe());
        return Err(stele_tls::auth::deny("/stele.v1.Controller/Heartbeat", why));
    }
    // An endpoint nobody can dial (0.0.0.0, a port 0, not HOST:PORT)
    // would be published to every node and client: refuse it here.
    if let Err(e) = stele_proto::addr::dialable_url(&reg.client_endpoint) {
        return Err(refuse("node.client_endpoint", e));
    }
    if let Err(e) = stele_proto::addr::dialable(&reg.peer_endpoint) {
        return Err(refuse("node.peer_endpoint", e));
    }
    Ok(reg)
}
