//! The receiving side of peer messages: the gRPC `Quorum/Raft` call,
//! handed to this member's openraft.

use std::io::Cursor;
use std::sync::Arc;

use stele_proto::pb;

use crate::wire::{Envelope, RPC_V, Reply, Rpc};
use crate::{Quorum, QuorumState, Snapshot, decode, to_cbor};

/// The gRPC face of a quorum member: peers' Raft messages.
pub struct QuorumService<S: QuorumState>(pub Arc<Quorum<S>>);

#[tonic::async_trait]
impl<S: QuorumState> pb::quorum_server::Quorum for QuorumService<S> {
    async fn raft(
        &self,
        request: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        let body = self.0.handle_raft(&request.into_inner().body).await;
        Ok(tonic::Response::new(pb::RaftReply { body }))
    }
}

impl<S: QuorumState> Quorum<S> {
    /// Serves one peer message (the body of a `Quorum/Raft` call). A message
    /// this member cannot serve is answered `Refused` with the reason, which
    /// the sender reports as the peer being unreachable.
    pub async fn handle_raft(&self, body: &[u8]) -> Vec<u8> {
        let reply = match decode::<Envelope<Rpc>>("quorum rpc", body) {
            Err(e) => Reply::Refused(e.to_string()),
            Ok(env) if env.v != RPC_V => Reply::Refused(format!("quorum rpc version {}", env.v)),
            Ok(env) => self.serve(env.msg).await,
        };
        to_cbor(&Envelope {
            v: RPC_V,
            msg: reply,
        })
    }

    async fn serve(&self, rpc: Rpc) -> Reply {
        let raft = &self.raft;
        let refused = |e: openraft::error::RaftError<crate::C, _>| Reply::Refused(e.to_string());
        match rpc {
            Rpc::Append(r) => raft
                .append_entries(r)
                .await
                .map(Reply::Append)
                .unwrap_or_else(refused),
            Rpc::Vote(r) => raft.vote(r).await.map(Reply::Vote).unwrap_or_else(refused),
            Rpc::PreVote(r) => raft
                .pre_vote(r)
                .await
                .map(Reply::Vote)
                .unwrap_or_else(refused),
            Rpc::Snapshot { vote, meta, data } => {
                let snapshot = Snapshot {
                    meta,
                    snapshot: Cursor::new(data),
                };
                raft.install_full_snapshot(vote, snapshot)
                    .await
                    .map(Reply::Snapshot)
                    .unwrap_or_else(|e| Reply::Refused(e.to_string()))
            }
            Rpc::TransferLeader(r) => raft
                .handle_transfer_leader(r)
                .await
                .map(|r| Reply::TransferLeader(r.map_err(|e| e.to_string())))
                .unwrap_or_else(|e| Reply::Refused(e.to_string())),
        }
    }
}
