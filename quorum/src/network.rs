//! The sending side of peer messages: one lazily connected gRPC client per
//! peer, reconnected after an error. Every failure reaches openraft as the
//! peer being unreachable; openraft retries on its own schedule.

use std::io::Cursor;
use std::time::Duration;

use openraft::OptionalSend;
use openraft::RaftNetworkV2;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::impls::BasicNode;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use stele_proto::pb;

use crate::wire::{Envelope, RPC_V, Reply, Rpc};
use crate::{C, Snapshot, Vote, decode, to_cbor};

/// Largest peer message either way: a snapshot of a whole state.
const MESSAGE_BYTES_MAX: usize = 256 << 20;
/// A peer that does not accept a connection this fast counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A snapshot may take longer to send than a heartbeat's budget.
const SNAPSHOT_TIMEOUT_MIN: Duration = Duration::from_secs(10);
/// What an append gets on top of openraft's budget (a heartbeat interval)
/// per MiB of commands it carries: a large command (a new cell's placement
/// of 100,000 tablets is a few MiB) takes longer to send, decode and apply
/// than a heartbeat interval, and an append that always times out never
/// replicates (docs/BENCHMARKS.md, "Controller at full size").
const APPEND_TIME_PER_MIB: Duration = Duration::from_millis(500);

/// The deadline of an append carrying `bytes` of commands, given
/// openraft's `budget`.
fn append_timeout(budget: Duration, bytes: usize) -> Duration {
    budget + APPEND_TIME_PER_MIB.mul_f64(bytes as f64 / (1 << 20) as f64)
}

/// Why a message to a peer got no usable reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("peer endpoint: {0}")]
    Endpoint(#[source] stele_tls::Error),
    #[error("peer {endpoint}: {}", status.message())]
    Status {
        endpoint: String,
        status: tonic::Status,
    },
    #[error("peer {endpoint}: no reply within {after:?}")]
    Timeout { endpoint: String, after: Duration },
    #[error("peer {endpoint}: {source}")]
    Decode {
        endpoint: String,
        #[source]
        source: Box<crate::Error>,
    },
    #[error("peer {endpoint}: reply version {found}, this build reads {RPC_V}")]
    Version { endpoint: String, found: u16 },
    #[error("peer {endpoint} refused: {reason}")]
    Refused { endpoint: String, reason: String },
    #[error("peer {endpoint}: a {got} reply to a {sent} message")]
    UnexpectedReply {
        endpoint: String,
        sent: &'static str,
        got: &'static str,
    },
}

/// How members reach each other: TLS with the member's certificate
/// (expecting a member of `expect`'s kind to answer), or plaintext.
#[derive(Clone)]
pub(crate) struct Network {
    pub(crate) tls: Option<stele_tls::ClientTls>,
    pub(crate) expect: stele_tls::Kind,
}

/// A client to one peer member, connected lazily and reconnected on error.
pub(crate) struct Peer {
    endpoint: String,
    network: Network,
    client: Option<pb::quorum_client::QuorumClient<tonic::transport::Channel>>,
}

impl RaftNetworkFactory<C> for Network {
    type Network = Peer;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> Peer {
        Peer {
            endpoint: node.addr.clone(),
            network: self.clone(),
            client: None,
        }
    }
}

impl Peer {
    fn client(
        &mut self,
    ) -> Result<&mut pb::quorum_client::QuorumClient<tonic::transport::Channel>, Error> {
        if self.client.is_none() {
            let channel = stele_tls::channel(
                &self.endpoint,
                self.network.tls.as_ref(),
                self.network.expect,
                CONNECT_TIMEOUT,
            )
            .map_err(Error::Endpoint)?;
            self.client = Some(
                pb::quorum_client::QuorumClient::new(channel)
                    .max_decoding_message_size(MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(MESSAGE_BYTES_MAX),
            );
        }
        Ok(self.client.as_mut().expect("set above"))
    }

    async fn call(&mut self, rpc: Rpc, timeout: Duration) -> Result<Reply, Error> {
        let mut req = tonic::Request::new(pb::RaftMessage {
            body: to_cbor(&Envelope { v: RPC_V, msg: rpc }),
        });
        req.set_timeout(timeout);
        let client = self.client()?;
        let body = match tokio::time::timeout(timeout, client.raft(req)).await {
            Ok(Ok(r)) => r.into_inner().body,
            Ok(Err(status)) => {
                self.client = None;
                return Err(Error::Status {
                    endpoint: self.endpoint.clone(),
                    status,
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    endpoint: self.endpoint.clone(),
                    after: timeout,
                });
            }
        };
        let env: Envelope<Reply> =
            decode("quorum reply", &body).map_err(|source| Error::Decode {
                endpoint: self.endpoint.clone(),
                source: Box::new(source),
            })?;
        if env.v != RPC_V {
            return Err(Error::Version {
                endpoint: self.endpoint.clone(),
                found: env.v,
            });
        }
        match env.msg {
            Reply::Refused(reason) => Err(Error::Refused {
                endpoint: self.endpoint.clone(),
                reason,
            }),
            other => Ok(other),
        }
    }

    fn unexpected(&self, sent: &'static str, got: &Reply) -> Error {
        Error::UnexpectedReply {
            endpoint: self.endpoint.clone(),
            sent,
            got: got.kind(),
        }
    }
}

fn unreachable(e: Error) -> RPCError<C> {
    RPCError::Unreachable(Unreachable::new(&e))
}

impl RaftNetworkV2<C> for Peer {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        let bytes = rpc
            .entries
            .iter()
            .map(|e| match &e.payload {
                openraft::EntryPayload::Normal(cmd) => cmd.0.len(),
                _ => 0,
            })
            .sum();
        let timeout = append_timeout(option.hard_ttl(), bytes);
        match self.call(Rpc::Append(rpc), timeout).await {
            Ok(Reply::Append(r)) => Ok(r),
            Ok(other) => Err(unreachable(self.unexpected("append", &other))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self.call(Rpc::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(other) => Err(unreachable(self.unexpected("vote", &other))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        match self.call(Rpc::PreVote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(other) => Err(unreachable(self.unexpected("pre-vote", &other))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let rpc = Rpc::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
        };
        let timeout = option.hard_ttl().max(SNAPSHOT_TIMEOUT_MIN);
        let e = match self.call(rpc, timeout).await {
            Ok(Reply::Snapshot(r)) => return Ok(r),
            Ok(other) => self.unexpected("snapshot", &other),
            Err(e) => e,
        };
        Err(StreamingError::Unreachable(Unreachable::new(&e)))
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<C>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<C>, RPCError<C>> {
        match self.call(Rpc::TransferLeader(req), option.hard_ttl()).await {
            Ok(Reply::TransferLeader(Ok(()))) => Ok(Ok(())),
            Ok(Reply::TransferLeader(Err(reason))) => Err(unreachable(Error::Refused {
                endpoint: self.endpoint.clone(),
                reason,
            })),
            Ok(other) => Err(unreachable(self.unexpected("transfer-leader", &other))),
            Err(e) => Err(unreachable(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_appends_get_time_for_their_size() {
        let budget = Duration::from_millis(250);
        assert_eq!(append_timeout(budget, 0), budget);
        assert_eq!(
            append_timeout(budget, 100),
            budget + APPEND_TIME_PER_MIB.mul_f64(100.0 / 1048576.0)
        );
        assert_eq!(
            append_timeout(budget, 4 << 20),
            budget + APPEND_TIME_PER_MIB * 4
        );
    }
}
