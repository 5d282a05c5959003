//! An in-memory, single-process stand-in for a node's data service, for
//! tests of the client and of tools built on it (feature `fake`). It
//! checks tablets, generations and vshard ranges like a node, dedups by
//! `(namespace, batch_id)`, and can be told to fail the next requests.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use stele_proto::pb::data_server::{Data, DataServer};
use stele_proto::pb::{self, Position, Row, TabletDescriptor};
use stele_proto::vshard::{VSHARD_END, vshard};
use tonic::{Request, Response, Status};

type Error = stele_proto::Error;

/// A failure to inject into the next `Append`.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Fail with `Unavailable` without applying.
    Unavailable,
    /// Fail with `NotLeader` naming this endpoint, without applying.
    NotLeader(String),
    /// Fail with `StaleRoute` carrying this descriptor, without applying.
    StaleRoute(TabletDescriptor),
    /// Apply, then fail as if the response were lost.
    DropAfterApply,
}

/// Everything the fake knows and counts.
#[derive(Debug, Default)]
pub struct State {
    pub node_id: u64,
    pub tablets: Vec<TabletDescriptor>,
    pub faults: VecDeque<Fault>,
    /// `Append` calls received, faults included.
    pub append_requests: usize,
    /// Batch ids of the `Append` calls, in arrival order.
    pub batch_ids: Vec<Vec<u8>>,
    /// Records per `Append` call, in arrival order.
    pub batch_sizes: Vec<usize>,
    /// Batches applied (not counting duplicates).
    pub applications: usize,
    /// Receipts by (namespace, batch id, tablet): like a node's receipts,
    /// which cover a vshard range, a batch re-sent per child after a split
    /// is applied once per child.
    pub receipts: HashMap<(String, Vec<u8>, u64), Vec<Position>>,
    pub rows: Vec<(String, Row)>,
    pub fsyncs: u64,
    next_index: u64,
}

/// The fake node; clone it to keep a handle on its state.
#[derive(Debug, Clone, Default)]
pub struct FakeNode {
    pub state: Arc<Mutex<State>>,
}

impl FakeNode {
    /// A node holding one tablet (id 1) over all vshards.
    pub fn one_tablet() -> FakeNode {
        FakeNode::with_tablets(vec![TabletDescriptor {
            id: 1,
            vshard_lo: 0,
            vshard_hi: VSHARD_END,
            generation: 1,
            leader_node: 1,
            ..Default::default()
        }])
    }

    pub fn with_tablets(tablets: Vec<TabletDescriptor>) -> FakeNode {
        let node = FakeNode::default();
        {
            let mut s = node.state.lock().expect("fake state");
            s.node_id = 1;
            s.tablets = tablets;
        }
        node
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake state")
    }

    /// Serves on 127.0.0.1 at an ephemeral port; returns `http://addr`.
    /// The server runs until the runtime stops.
    pub async fn serve(&self) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let svc = DataServer::new(self.clone());
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::warn!(error = %e, "fake node stopped");
            }
        });
        Ok(format!("http://{addr}"))
    }
}

fn in_range(t: &TabletDescriptor, v: u32) -> bool {
    v >= t.vshard_lo && u64::from(v) < t.vshard_hi
}

fn page(rows: Vec<Row>, cursor: &[u8], limit: u32) -> pb::ScanResponse {
    let start = cursor
        .try_into()
        .map(|b: [u8; 8]| u64::from_be_bytes(b) as usize)
        .unwrap_or(0);
    let limit = if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let end = start.saturating_add(limit).min(rows.len());
    let next_cursor = if end < rows.len() {
        (end as u64).to_be_bytes().to_vec()
    } else {
        Vec::new()
    };
    pb::ScanResponse {
        rows: rows.get(start..end).unwrap_or_default().to_vec(),
        next_cursor,
        watermark: 1,
        missing_tablets: Vec::new(),
        ..Default::default()
    }
}

fn ts_in(ts: u64, from: u64, to: u64) -> bool {
    ts >= from && (to == 0 || ts < to)
}

#[tonic::async_trait]
impl Data for FakeNode {
    async fn append(
        &self,
        request: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let req = request.into_inner();
        let mut s = self.lock();
        s.append_requests += 1;
        s.batch_ids.push(req.batch_id.clone());
        s.batch_sizes.push(req.records.len());
        let fault = s.faults.pop_front();
        match &fault {
            Some(Fault::Unavailable) => {
                return Err(Error::Unavailable {
                    reason: "injected".into(),
                }
                .into());
            }
            Some(Fault::NotLeader(endpoint)) => {
                return Err(Error::NotLeader {
                    leader_node: Some(2),
                    leader_endpoint: endpoint.clone(),
                }
                .into());
            }
            Some(Fault::StaleRoute(d)) => {
                return Err(Error::StaleRoute {
                    descriptor: d.clone(),
                }
                .into());
            }
            Some(Fault::DropAfterApply) | None => {}
        }
        stele_proto::limits::parse_batch_id(&req.batch_id)?;
        let Some(tablet) = s.tablets.iter().find(|t| t.id == req.tablet).cloned() else {
            return Err(Error::TabletNotFound { tablet: req.tablet }.into());
        };
        let stale = req.generation != tablet.generation
            || req.records.iter().any(|r| {
                let rk = r.routing_key.as_deref().unwrap_or(&r.key);
                !in_range(&tablet, vshard(&req.namespace, rk))
            });
        if stale {
            return Err(Error::StaleRoute { descriptor: tablet }.into());
        }
        let receipt_key = (req.namespace.clone(), req.batch_id.clone(), tablet.id);
        if let Some(positions) = s.receipts.get(&receipt_key) {
            return Ok(Response::new(pb::AppendResponse {
                positions: positions.clone(),
                duplicate: true,
            }));
        }
        if let Some(cond) = &req.expect {
            let actual = s
                .rows
                .iter()
                .rev()
                .find(|(ns, r)| *ns == req.namespace && r.key == cond.key)
                .and_then(|(_, r)| r.position);
            if actual != cond.version {
                return Err(Error::ConditionFailed { actual }.into());
            }
        }
        s.next_index += 1;
        s.fsyncs += 1;
        let index = s.next_index;
        let mut positions = Vec::new();
        for (slot, r) in req.records.into_iter().enumerate() {
            let position = Position {
                tablet: tablet.id,
                index,
                slot: slot as u32,
            };
            positions.push(position);
            s.rows.push((
                req.namespace.clone(),
                Row {
                    key: r.key,
                    ts: r.ts,
                    value: r.value,
                    position: Some(position),
                },
            ));
        }
        s.applications += 1;
        s.receipts.insert(receipt_key, positions.clone());
        if matches!(fault, Some(Fault::DropAfterApply)) {
            return Err(Status::unavailable("response dropped (injected)"));
        }
        Ok(Response::new(pb::AppendResponse {
            positions,
            duplicate: false,
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let req = request.into_inner();
        let s = self.lock();
        let row = s
            .rows
            .iter()
            .rev()
            .find(|(ns, r)| *ns == req.namespace && r.key == req.key)
            .map(|(_, r)| r.clone());
        Ok(Response::new(pb::GetResponse {
            row,
            watermark: 1,
            ..Default::default()
        }))
    }

    async fn scan_key(
        &self,
        request: Request<pb::ScanKeyRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let req = request.into_inner();
        let s = self.lock();
        let mut rows: Vec<Row> = s
            .rows
            .iter()
            .filter(|(ns, r)| {
                *ns == req.namespace && r.key == req.key && ts_in(r.ts, req.ts_from, req.ts_to)
            })
            .map(|(_, r)| r.clone())
            .collect();
        rows.sort_by_key(|r| (r.ts, r.position.map(|p| (p.tablet, p.index, p.slot))));
        Ok(Response::new(page(rows, &req.cursor, req.limit)))
    }

    async fn scan(
        &self,
        request: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let req = request.into_inner();
        let s = self.lock();
        let mut rows: Vec<Row> = s
            .rows
            .iter()
            .filter(|(ns, r)| {
                *ns == req.namespace
                    && r.key.starts_with(&req.key_prefix)
                    && ts_in(r.ts, req.ts_from, req.ts_to)
                    && (req.tablet == 0 || r.position.is_some_and(|p| p.tablet == req.tablet))
            })
            .map(|(_, r)| r.clone())
            .collect();
        rows.sort_by(|a, b| (a.ts, &a.key).cmp(&(b.ts, &b.key)));
        Ok(Response::new(page(rows, &req.cursor, req.limit)))
    }

    async fn list_tablets(
        &self,
        _request: Request<pb::ListTabletsRequest>,
    ) -> Result<Response<pb::ListTabletsResponse>, Status> {
        let s = self.lock();
        Ok(Response::new(pb::ListTabletsResponse {
            node_id: s.node_id,
            tablets: s.tablets.clone(),
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = self.lock();
        Ok(Response::new(pb::StatusResponse {
            node_id: s.node_id,
            version: "fake".into(),
            tablets: s.tablets.len() as u64,
            journal_fsyncs: s.fsyncs,
            records_appended: s.rows.len() as u64,
            ..Default::default()
        }))
    }

    /// The fake's tablets as a whole route map, as a relaying node of a
    /// one-node cell answers.
    async fn get_routes(
        &self,
        _request: Request<pb::GetRoutesRequest>,
    ) -> Result<Response<pb::GetRoutesResponse>, Status> {
        Ok(Response::new(self.route_map()))
    }

    type WatchRoutesStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::GetRoutesResponse, Status>> + Send>,
    >;

    /// The whole map, then nothing until the caller leaves (the fake's
    /// routes change only by the test's hand).
    async fn watch_routes(
        &self,
        _request: Request<pb::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        use tokio_stream::StreamExt;
        let first = tokio_stream::once(Ok(self.route_map()));
        Ok(Response::new(Box::pin(
            first.chain(tokio_stream::pending()),
        )))
    }
}

impl FakeNode {
    fn route_map(&self) -> pb::GetRoutesResponse {
        let s = self.lock();
        pb::GetRoutesResponse {
            generation: s.tablets.iter().map(|t| t.generation).max().unwrap_or(0),
            tablets: s.tablets.clone(),
            removed: Vec::new(),
            full: true,
            filed_at_unix_us: 0,
        }
    }
}
