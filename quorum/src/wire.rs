//! The body of a `Quorum/Raft` call: one openraft message in a versioned
//! CBOR envelope, and its reply. The sender is [`crate::network`], the
//! receiver [`crate::service`].

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::{C, SnapshotMeta, Vote};

/// The envelope version this build sends and accepts.
pub(crate) const RPC_V: u16 = 1;

#[derive(Serialize, Deserialize)]
pub(crate) struct Envelope<T> {
    pub v: u16,
    pub msg: T,
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub(crate) enum Rpc {
    Append(AppendEntriesRequest<C>),
    Vote(VoteRequest<C>),
    PreVote(VoteRequest<C>),
    Snapshot {
        vote: Vote,
        meta: SnapshotMeta,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    TransferLeader(TransferLeaderRequest<C>),
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub(crate) enum Reply {
    Append(AppendEntriesResponse<C>),
    Vote(VoteResponse<C>),
    Snapshot(SnapshotResponse<C>),
    TransferLeader(Result<(), String>),
    /// The receiver could not serve the message; the text says why.
    Refused(String),
}

impl Reply {
    /// The reply's kind, for an error naming an unexpected one.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Append(_) => "append",
            Reply::Vote(_) => "vote",
            Reply::Snapshot(_) => "snapshot",
            Reply::TransferLeader(_) => "transfer-leader",
            Reply::Refused(_) => "refused",
        }
    }
}
