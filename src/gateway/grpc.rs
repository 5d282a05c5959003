//! The gateway's gRPC front: the data API (`stele.v1.Data`) for producers
//! with generated gRPC stubs in any language, routed by the gateway
//! (`stele gateway --grpc-listen`).
//!
//! ```text
//! Append{tablet 0, generation 0, batch_id, records} ─▶ budget (else
//!   RESOURCE_EXHAUSTED, retry-after) ─▶ the records' one tablet, found by
//!   the gateway ─▶ its leader (same batch id: a retry applies once)
//! Get / ScanKey ─▶ the key's (or routing key's) tablet leader
//! Scan{tablet 0} ─▶ the namespace tablet by tablet (the cursor is the
//!   gateway's, FORMAT.md section 12)
//! ListTablets / GetRoutes / WatchRoutes ─▶ the gateway's route map
//! ```
//!
//! A request keeps the node API's contract except routing: an append is
//! still one atomic batch whose records share a tablet (records of several
//! tablets are refused, as a node refuses them); the caller leaves tablet
//! and generation 0 and the gateway fills them in.

use std::sync::Arc;

use stele_client::{Client, NsCursor};
use stele_proto::Error as ApiError;
use stele_proto::pb::{self, data_server::Data};
use tonic::{Request, Response, Status};

use super::Gateway;

/// The data API over the gateway's client.
#[derive(Clone)]
pub struct GrpcData {
    gw: Arc<Gateway>,
}

impl GrpcData {
    pub fn new(gw: Arc<Gateway>) -> GrpcData {
        GrpcData { gw }
    }

    /// The server, its messages bounded by the body limit.
    pub fn server(self) -> pb::data_server::DataServer<GrpcData> {
        let max = self.gw.opts.body_bytes_max;
        pb::data_server::DataServer::new(self).max_decoding_message_size(max)
    }

    /// The gateway's client with the caller's bearer token, if any.
    fn client_of<T>(&self, req: &Request<T>) -> Result<Client, Status> {
        match stele_tls::token::bearer_of(req) {
            None if self.gw.opts.require_token => Err(ApiError::PermissionDenied {
                reason: "this gateway requires a producer token (authorization: Bearer <token>)"
                    .into(),
            }
            .into()),
            None => Ok(self.gw.client.clone()),
            Some(t) => {
                let bearer = stele_tls::token::Bearer::new(&t).map_err(|e| {
                    Status::from(ApiError::PermissionDenied {
                        reason: format!("malformed token: {e}"),
                    })
                })?;
                Ok(self.gw.client.with_token(bearer))
            }
        }
    }
}

/// A client error as the data API's status: its typed error when it has
/// one, else unavailable (the gateway could not reach the cell).
fn status_of(e: stele_client::Error) -> Status {
    match e.api() {
        Some(api) => api.clone().into(),
        None => ApiError::Unavailable {
            reason: format!("the gateway: {e}"),
        }
        .into(),
    }
}

fn invalid(field: &str, reason: &str) -> Status {
    ApiError::InvalidArgument {
        field: field.into(),
        reason: reason.into(),
    }
    .into()
}

/// The budget is full: `RESOURCE_EXHAUSTED` with `retry-after: 1`, its
/// detail a retryable `Unavailable` (what a Stele client acts on).
fn overloaded() -> Status {
    let typed: Status = ApiError::Unavailable {
        reason: "the gateway's memory budget is full".into(),
    }
    .into();
    let mut s = Status::with_details(
        tonic::Code::ResourceExhausted,
        typed.message(),
        typed.details().to_vec().into(),
    );
    s.metadata_mut().insert(
        "retry-after",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    s
}

fn read_of(r: Option<pb::ReadOptions>) -> pb::ReadOptions {
    r.unwrap_or_default()
}

#[tonic::async_trait]
impl Data for GrpcData {
    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let client = self.client_of(&req)?;
        let req = req.into_inner();
        let _held = self
            .gw
            .hold(prost::Message::encoded_len(&req))
            .ok_or_else(overloaded)?;
        if req.tablet != 0 || req.generation != 0 {
            return Err(invalid(
                "tablet",
                "the gateway routes appends: leave tablet and generation 0",
            ));
        }
        let batch_id: [u8; 16] = req
            .batch_id
            .as_slice()
            .try_into()
            .map_err(|_| invalid("batch_id", "must be 16 bytes"))?;
        let n = req.records.len();
        let out = client
            .append_batch(&req.namespace, req.records, req.expect, Some(batch_id))
            .await
            .map_err(status_of)?;
        self.gw.records(n);
        Ok(Response::new(pb::AppendResponse {
            positions: out.positions,
            duplicate: out.duplicate,
        }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let client = self.client_of(&req)?;
        let req = req.into_inner();
        let row = client
            .get_routed(
                &req.namespace,
                &req.key,
                req.routing_key.as_deref(),
                read_of(req.read),
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::GetResponse {
            row,
            ..Default::default()
        }))
    }

    async fn scan_key(
        &self,
        req: Request<pb::ScanKeyRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let client = self.client_of(&req)?;
        let req = req.into_inner();
        let page = client
            .scan_key_routed(
                &req.namespace,
                &req.key,
                req.routing_key.as_deref(),
                req.ts_from,
                req.ts_to,
                req.limit,
                (!req.cursor.is_empty()).then_some(req.cursor),
                read_of(req.read),
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ScanResponse {
            rows: page.rows,
            next_cursor: page.next_cursor.unwrap_or_default(),
            watermark: page.watermark,
            missing_tablets: page.missing_tablets,
            ..Default::default()
        }))
    }

    async fn scan(
        &self,
        req: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let client = self.client_of(&req)?;
        let req = req.into_inner();
        if req.tablet != 0 || req.generation != 0 {
            return Err(invalid(
                "tablet",
                "the gateway scans the whole namespace: leave tablet and generation 0",
            ));
        }
        let cursor = if req.cursor.is_empty() {
            None
        } else {
            Some(
                NsCursor::decode(&req.cursor)
                    .ok_or_else(|| invalid("cursor", "not a cursor this gateway API gave"))?,
            )
        };
        let (rows, next) = client
            .scan_page(
                &req.namespace,
                req.ts_from,
                req.ts_to,
                &req.key_prefix,
                req.limit,
                cursor,
                read_of(req.read),
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ScanResponse {
            rows,
            next_cursor: next.map(|c| c.encode()).unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn list_tablets(
        &self,
        _req: Request<pb::ListTabletsRequest>,
    ) -> Result<Response<pb::ListTabletsResponse>, Status> {
        Ok(Response::new(pb::ListTabletsResponse {
            node_id: 0,
            tablets: self.gw.client.route_map(0).tablets,
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(pb::StatusResponse {
            node_id: 0,
            version: env!("CARGO_PKG_VERSION").into(),
            tablets: self.gw.client.routes().len() as u64,
            ..Default::default()
        }))
    }

    async fn get_routes(
        &self,
        req: Request<pb::GetRoutesRequest>,
    ) -> Result<Response<pb::GetRoutesResponse>, Status> {
        let since = req.into_inner().since_generation;
        Ok(Response::new(self.gw.client.route_map(since)))
    }

    type WatchRoutesStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::GetRoutesResponse, Status>>;

    async fn watch_routes(
        &self,
        req: Request<pb::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        let since = req.into_inner().since_generation;
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            self.gw.client.relay_routes(since),
        )))
    }
}
