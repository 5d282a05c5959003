//! The gRPC data service: validation at the door, then the tablet's Raft
//! group for writes and its applied state for reads.
//!
//! Every refusal is a typed `stele_proto::Error` in the status details; a
//! request that fails validation writes nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use stele_proto::command::{
    AppendBatch, Expect, Pos, RecordIn, TabletCommand, TabletResponse, batch_id_halves,
};
use stele_proto::limits;
use stele_proto::pb::{self, data_server::Data};
use stele_proto::{Error as ApiError, vshard};
use stele_tls::token::Right;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::endpoints::Endpoints;
use crate::raft::Replica;
use crate::raft::replica::ProposeError;
use crate::raft::router::node_of;
use crate::segment::Row;

mod access;
use access::Access;
mod options;
pub(crate) mod page;
mod routes;
mod serve;
mod status;

pub use options::{DataOptions, DataParts, FailPoints};
use page::{
    KeyCursor, ScanCursor, decode_cursor, encode_cursor, limit_of, rows_within_budget, ts_to_of,
};
pub use page::{READ_BYTES_MAX, READ_LIMIT_DEFAULT, READ_LIMIT_MAX};
pub use routes::{RouteRelay, RouteWatch};
pub use serve::{Serving, serve, serve_on, serve_with};

#[derive(Clone)]
pub struct DataService {
    node: Arc<DataParts>,
    /// The cell's route map, relayed when the cell has controllers.
    routes: routes::Relay,
}

impl DataService {
    pub fn new(parts: DataParts) -> DataService {
        DataService {
            node: Arc::new(parts),
            routes: None,
        }
    }

    /// Serves `GetRoutes` and `WatchRoutes` from `relay`.
    pub fn with_route_relay(mut self, relay: RouteRelay) -> DataService {
        self.routes = Some(Arc::new(relay));
        self
    }

    fn relay(&self) -> Result<&RouteRelay, ApiError> {
        self.routes.as_deref().ok_or_else(routes::not_managed)
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn invalid(field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::InvalidArgument {
        field: field.into(),
        reason: reason.into(),
    }
}

pub fn descriptor(endpoints: &Endpoints, r: &Replica) -> pb::TabletDescriptor {
    let log = r.log_state();
    let data = r.tablet.read();
    let leader_node = log.leader.map(node_of);
    pb::TabletDescriptor {
        id: r.tablet.id,
        vshard_lo: r.tablet.range().0,
        vshard_hi: r.tablet.range().1,
        generation: r.tablet.generation(),
        leader_node: leader_node.unwrap_or(0),
        leader_endpoint: leader_node
            .map(|n| endpoints.endpoint_of(n))
            .unwrap_or_default(),
        applied_index: data.applied_index(),
        checkpoint_index: data.checkpoint,
        memtable_bytes: data.memtable_bytes() as u64,
        segments: data.segments.len() as u32,
        last_log_index: log.last_log_index,
        purged_index: log.purged_index,
    }
}

fn row_to_pb(tablet: u64, row: Row) -> pb::Row {
    pb::Row {
        position: Some(crate::tablet::pos_of(tablet, &row).into()),
        key: row.key,
        ts: row.ts,
        value: row.value,
    }
}

impl DataService {
    fn replica(&self, tablet: u64) -> Result<Arc<Replica>, ApiError> {
        self.node
            .replicas
            .replica(tablet)
            .ok_or(ApiError::TabletNotFound { tablet })
    }

    /// Whether `replicas`' live ranges cover the vshards `[lo, hi)`.
    fn covers(replicas: &[Arc<Replica>], lo: u32, hi: u64) -> bool {
        let mut ranges: Vec<(u32, u64)> = replicas.iter().map(|r| r.tablet.range()).collect();
        ranges.sort_unstable();
        let mut reached = u64::from(lo);
        for (tlo, thi) in ranges {
            if u64::from(tlo) <= reached {
                reached = reached.max(thi);
            }
        }
        reached >= hi
    }

    fn not_leader(&self, r: &Replica) -> ApiError {
        let leader = r
            .leader()
            .map(node_of)
            // A leader cut off from its quorum still names itself; pointing
            // the client back here would loop it. Unknown sends it to the
            // other nodes for a fresh route.
            .filter(|n| *n != self.node.options.node_id);
        ApiError::NotLeader {
            leader_node: leader,
            leader_endpoint: leader
                .map(|n| self.node.endpoints.endpoint_of(n))
                .unwrap_or_default(),
        }
    }

    /// A failed proposal or read barrier as the client sees it.
    fn propose_error(&self, r: &Replica, e: ProposeError) -> ApiError {
        match e {
            ProposeError::NotLeader { .. } => self.not_leader(r),
            e @ ProposeError::Unavailable { .. } => ApiError::Unavailable {
                reason: e.to_string(),
            },
        }
    }

    /// Refuses a request routed by a stale generation of `r`'s range.
    ///
    /// The node knows the generation of its tablet's range. Under a
    /// controller, moves bump the cell's generation without touching the
    /// range, so a route at or past the range's generation is good; a
    /// static cell's generations never move, so they must match.
    fn check_generation(&self, r: &Replica, generation: u64) -> Result<(), ApiError> {
        let g = r.tablet.generation();
        let stale = if self.node.options.controlled {
            generation < g
        } else {
            generation != g
        };
        if stale {
            return Err(ApiError::StaleRoute {
                descriptor: descriptor(&self.node.endpoints, r),
            });
        }
        Ok(())
    }

    /// Validates an append and turns it into a tablet command.
    fn admit(&self, req: pb::AppendRequest) -> Result<(Arc<Replica>, AppendBatch), ApiError> {
        let r = self.replica(req.tablet)?;
        self.check_generation(&r, req.generation)?;
        limits::validate_namespace(&req.namespace)?;
        let batch_id = limits::parse_batch_id(&req.batch_id)?;
        let opts = &self.node.options;
        if req.records.is_empty() {
            return Err(invalid("records", "a batch needs at least one record"));
        }
        if req.records.len() > opts.batch_records_max {
            return Err(ApiError::TooLarge {
                what: "batch record count".into(),
                size: req.records.len() as u64,
                limit: opts.batch_records_max as u64,
            });
        }
        let mut total = 0usize;
        let mut records = Vec::with_capacity(req.records.len());
        for rec in req.records {
            limits::validate_key("key", &rec.key)?;
            if let Some(rk) = &rec.routing_key {
                limits::validate_key("routing_key", rk)?;
            }
            if rec.value.len() > opts.value_bytes_max {
                return Err(ApiError::TooLarge {
                    what: "value".into(),
                    size: rec.value.len() as u64,
                    limit: opts.value_bytes_max as u64,
                });
            }
            total += rec.key.len() + rec.value.len();
            if total > opts.batch_bytes_max {
                return Err(ApiError::TooLarge {
                    what: "batch".into(),
                    size: total as u64,
                    limit: opts.batch_bytes_max as u64,
                });
            }
            let v = vshard::vshard(
                &req.namespace,
                rec.routing_key.as_deref().unwrap_or(&rec.key),
            );
            if !r.tablet.accepts(v) {
                return Err(ApiError::StaleRoute {
                    descriptor: descriptor(&self.node.endpoints, &r),
                });
            }
            records.push(RecordIn {
                key: rec.key,
                ts: rec.ts,
                value: rec.value,
                vshard: v,
            });
        }
        let expect = match req.expect {
            Some(c) => {
                limits::validate_key("expect.key", &c.key)?;
                Some(Expect {
                    key: c.key,
                    version: c.version.map(Pos::from),
                })
            }
            None => None,
        };
        if let Some(reason) = self.node.journal.stopped() {
            return Err(ApiError::Unavailable {
                reason: format!("journal stopped: {reason}"),
            });
        }
        let free = self.node.disk.free_bytes();
        if free < opts.disk_reserve_bytes.saturating_add(total as u64) {
            return Err(ApiError::StorageFull {
                free_bytes: free,
                reserve_bytes: opts.disk_reserve_bytes,
            });
        }
        Ok((
            r,
            AppendBatch {
                namespace: req.namespace,
                batch_id: batch_id_halves(batch_id),
                records,
                expect,
                proposed_at_us: now_us(),
            },
        ))
    }

    /// One append; `span` is its `append` span (`crate::trace`), which
    /// learns the replica here.
    async fn append(
        &self,
        req: pb::AppendRequest,
        span: &tracing::Span,
    ) -> Result<pb::AppendResponse, ApiError> {
        limits::validate_namespace(&req.namespace)?;
        self.node.check_namespace(&req.namespace).await?;
        let (r, batch) = self.admit(req)?;
        span.record("replica", r.replica_id);
        let resp = if self.node.replicas.log_format() >= stele_proto::formats::LOG_APPEND_MANY {
            let opts = &self.node.options;
            let limits = crate::raft::coalesce::Limits {
                in_flight: opts.append_in_flight,
                bytes: opts.batch_bytes_max
                    + opts.batch_records_max * crate::raft::coalesce::RECORD_OVERHEAD,
                stall: opts.append_stall,
            };
            r.append_coalesced(batch, limits).await
        } else {
            r.propose(TabletCommand::Append(batch)).await
        }
        .map_err(|e| self.propose_error(&r, e))?;
        match resp {
            TabletResponse::Appended {
                positions,
                duplicate,
            } => Ok(pb::AppendResponse {
                positions: positions.into_iter().map(Into::into).collect(),
                duplicate,
            }),
            TabletResponse::ConditionFailed { actual } => Err(ApiError::ConditionFailed {
                actual: actual.map(Into::into),
            }),
            TabletResponse::Rejected { reason } => {
                tracing::warn!(tablet = r.tablet.id, %reason, "batch rejected at apply");
                Err(ApiError::StaleRoute {
                    descriptor: descriptor(&self.node.endpoints, &r),
                })
            }
            other => Err(ApiError::Unavailable {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// Makes a read of `r` consistent as asked; returns the watermark.
    async fn read_barrier(
        &self,
        r: &Replica,
        read: &Option<pb::ReadOptions>,
    ) -> Result<(), ApiError> {
        let read = (*read).unwrap_or_default();
        match pb::Consistency::try_from(read.consistency) {
            Ok(pb::Consistency::Linearizable) => {
                if self.node.options.unsafe_local_reads && r.is_leader() {
                    // Deliberately unsafe (jepsen negative control).
                    return Ok(());
                }
                if self.node.options.unsafe_wake_reads && r.unsafe_wake_read() {
                    // Deliberately unsafe (jepsen negative control).
                    return Ok(());
                }
                r.read_index().await.map_err(|e| self.propose_error(r, e))?;
                Ok(())
            }
            Ok(pb::Consistency::Bounded) => {
                if r.is_leader() {
                    return Ok(());
                }
                // A follower's data is complete up to the commit index its
                // leader sent in the last message it got; its age bounds
                // the staleness, once that index is applied here. A
                // sleeping follower's data ages from its agreement to sleep
                // (the leader's node beats say nothing about this group's
                // log, so they never count as fresh data).
                let contact = *r.tablet.leader_contact.lock().expect("lock poisoned");
                let applied = r.tablet.read().applied_index();
                let staleness_ms = match contact {
                    Some((at, commit)) if applied >= commit => at.elapsed().as_millis() as u64,
                    _ => u64::MAX,
                };
                if staleness_ms > read.max_staleness_ms {
                    return Err(ApiError::TooStale {
                        staleness_ms,
                        max_staleness_ms: read.max_staleness_ms,
                    });
                }
                Ok(())
            }
            Err(_) => Err(invalid("read.consistency", "unknown consistency")),
        }
    }

    fn key_replica(
        &self,
        namespace: &str,
        key: &[u8],
        routing_key: &Option<Vec<u8>>,
    ) -> Result<Arc<Replica>, ApiError> {
        limits::validate_namespace(namespace)?;
        limits::validate_key("key", key)?;
        let v = vshard::vshard(namespace, routing_key.as_deref().unwrap_or(key));
        self.node
            .replicas
            .replica_for(v)
            .ok_or(ApiError::Incomplete { missing: vec![] })
    }

    /// After a read of `r` for vshard `v`: the read counts only if `v` was
    /// still in the replica's range, else a split moved it away while the
    /// read waited (the rows it filtered out now belong to the child), and
    /// the client must route again. Ranges only shrink, so still holding
    /// `v` now means it held it when the rows were read.
    fn still_holds(&self, r: &Replica, v: u32) -> Result<(), ApiError> {
        if r.tablet.contains(v) {
            Ok(())
        } else {
            Err(ApiError::StaleRoute {
                descriptor: descriptor(&self.node.endpoints, r),
            })
        }
    }

    async fn get(&self, req: pb::GetRequest) -> Result<pb::GetResponse, ApiError> {
        limits::validate_namespace(&req.namespace)?;
        self.node.check_namespace(&req.namespace).await?;
        let r = self.key_replica(&req.namespace, &req.key, &req.routing_key)?;
        let v = vshard::vshard(
            &req.namespace,
            req.routing_key.as_deref().unwrap_or(&req.key),
        );
        self.read_barrier(&r, &req.read).await?;
        r.tablet.stats.reads_served.fetch_add(1, Ordering::Relaxed);
        let tablet = r.tablet.clone();
        let ((row, watermark), cold) = tokio::task::spawn_blocking(move || {
            let (row, cold) =
                crate::tier::cold::counted(|| tablet.latest_unlocked(&req.namespace, &req.key));
            row.map(|row| (row, cold))
        })
        .await
        .map_err(|e| ApiError::Unavailable {
            reason: e.to_string(),
        })?
        .map_err(read_error)?;
        self.still_holds(&r, v)?;
        Ok(pb::GetResponse {
            row: row.map(|row| row_to_pb(r.tablet.id, row)),
            watermark,
            cold_bytes_fetched: cold.fetched,
            cold_bytes_cached: cold.cached,
        })
    }

    async fn scan_key(&self, req: pb::ScanKeyRequest) -> Result<pb::ScanResponse, ApiError> {
        limits::validate_namespace(&req.namespace)?;
        self.node.check_namespace(&req.namespace).await?;
        let r = self.key_replica(&req.namespace, &req.key, &req.routing_key)?;
        let v = vshard::vshard(
            &req.namespace,
            req.routing_key.as_deref().unwrap_or(&req.key),
        );
        let cursor: Option<KeyCursor> = decode_cursor(&req.cursor)?;
        self.read_barrier(&r, &req.read).await?;
        if let Some(delay) = self.node.options.fail_points.key_read_delay() {
            tokio::time::sleep(delay).await;
        }
        r.tablet.stats.reads_served.fetch_add(1, Ordering::Relaxed);
        let limit = limit_of(req.limit);
        let tablet = r.tablet.clone();
        let ts_to = ts_to_of(req.ts_to);
        let after = cursor.map(|c| (c.ts, c.tablet, c.index, c.slot));
        let ((rows, watermark), cold) = tokio::task::spawn_blocking(move || {
            let (rows, cold) = crate::tier::cold::counted(|| {
                tablet.scan_key_unlocked(
                    &req.namespace,
                    &req.key,
                    req.ts_from,
                    ts_to,
                    after,
                    limit + 1,
                )
            });
            rows.map(|rows| (rows, cold))
        })
        .await
        .map_err(|e| ApiError::Unavailable {
            reason: e.to_string(),
        })?
        .map_err(read_error)?;
        self.still_holds(&r, v)?;
        let take = rows_within_budget(rows.iter()).min(limit);
        let more = rows.len() > take;
        let rows: Vec<Row> = rows.into_iter().take(take).collect();
        let next_cursor = match (more, rows.last()) {
            (true, Some(last)) => encode_cursor(&KeyCursor {
                ts: last.ts,
                index: last.index,
                slot: last.slot,
                tablet: crate::tablet::pos_of(r.tablet.id, last).tablet,
            }),
            _ => Vec::new(),
        };
        Ok(pb::ScanResponse {
            rows: rows
                .into_iter()
                .map(|row| row_to_pb(r.tablet.id, row))
                .collect(),
            next_cursor,
            watermark,
            missing_tablets: vec![],
            cold_bytes_fetched: cold.fetched,
            cold_bytes_cached: cold.cached,
        })
    }

    async fn scan(&self, req: pb::ScanRequest) -> Result<pb::ScanResponse, ApiError> {
        limits::validate_namespace(&req.namespace)?;
        self.node.check_namespace(&req.namespace).await?;
        let cursor: Option<ScanCursor> = decode_cursor(&req.cursor)?;
        let limit = limit_of(req.limit);
        let (lo, hi) = vshard::namespace_range(&req.namespace);
        let overlaps = |r: &Replica| {
            let (tlo, thi) = r.tablet.range();
            u64::from(tlo) < hi && thi > u64::from(lo)
        };
        let covering: Vec<Arc<Replica>> = if req.tablet != 0 {
            let r = self.replica(req.tablet)?;
            self.check_generation(&r, req.generation)?;
            // A tablet frozen for a merge serves no reads: the tablet that
            // absorbs it may already take writes for its range.
            if r.tablet.is_frozen() {
                return Err(ApiError::StaleRoute {
                    descriptor: descriptor(&self.node.endpoints, &r),
                });
            }
            if overlaps(&r) { vec![r] } else { Vec::new() }
        } else {
            self.node
                .replicas
                .replicas()
                .into_iter()
                .filter(|r| overlaps(r) && !r.tablet.is_frozen())
                .collect()
        };
        let partial = req.read.as_ref().is_some_and(|r| r.partial);
        // The local replicas must cover the whole namespace: between a
        // split and the opening of its child here, half of it is nowhere,
        // and a scan must not pass that off as empty.
        if !partial && req.tablet == 0 && !Self::covers(&covering, lo, hi) {
            return Err(ApiError::Incomplete { missing: vec![] });
        }
        let read_generation = covering.first().map_or(0, |r| r.tablet.generation());
        let read_set = covering.clone();
        let mut missing = Vec::new();
        let mut all: Vec<(u64, Row)> = Vec::new();
        let mut watermark = u64::MAX;
        let mut cold = crate::tier::cold::ColdRead::default();
        let ts_to = ts_to_of(req.ts_to);
        for r in covering {
            if let Err(e) = self.read_barrier(&r, &req.read).await {
                if partial {
                    missing.push(r.tablet.id);
                    continue;
                }
                return Err(e);
            }
            r.tablet.stats.reads_served.fetch_add(1, Ordering::Relaxed);
            let tablet = r.tablet.clone();
            let ns = req.namespace.clone();
            let prefix = req.key_prefix.clone();
            let from = req.ts_from;
            let result = tokio::task::spawn_blocking(move || {
                let (rows, read) =
                    crate::tier::cold::counted(|| tablet.scan_unlocked(&ns, &prefix, from, ts_to));
                rows.map(|(rows, applied)| (rows, applied, read))
            })
            .await
            .map_err(|e| ApiError::Unavailable {
                reason: e.to_string(),
            })?;
            match result {
                Ok((rows, applied, read)) => {
                    cold.fetched += read.fetched;
                    cold.cached += read.cached;
                    watermark = watermark.min(applied);
                    // Each row under its position's tablet (a split child's
                    // shared rows keep the parent's): the order and the
                    // cursor are by position, whoever serves the row.
                    all.extend(
                        rows.into_iter()
                            .map(|row| (crate::tablet::pos_of(r.tablet.id, &row).tablet, row)),
                    );
                }
                Err(e) if partial => {
                    tracing::warn!(tablet = r.tablet.id, error = %e, "scan: tablet unreadable");
                    missing.push(r.tablet.id);
                }
                Err(e) => return Err(read_error(e)),
            }
        }
        // A split under the read moved rows out of what was read: a
        // tablet-routed scan must start over at the new generation, and a
        // node-local one must still cover the namespace.
        if req.tablet != 0
            && let Some(r) = self.node.replicas.replica(req.tablet)
            && r.tablet.generation() != read_generation
        {
            return Err(ApiError::StaleRoute {
                descriptor: descriptor(&self.node.endpoints, &r),
            });
        }
        if req.tablet == 0 && !partial && !Self::covers(&read_set, lo, hi) {
            return Err(ApiError::Incomplete { missing: vec![] });
        }
        all.sort_by(|a, b| {
            (a.1.ts, &a.1.key, a.0, a.1.index, a.1.slot)
                .cmp(&(b.1.ts, &b.1.key, b.0, b.1.index, b.1.slot))
        });
        if let Some(c) = &cursor {
            let after = (c.ts, &c.key, c.tablet, c.index, c.slot);
            all.retain(|(t, row)| (row.ts, &row.key, *t, row.index, row.slot) > after);
        }
        let take = rows_within_budget(all.iter().map(|(_, r)| r)).min(limit);
        let more = all.len() > take;
        all.truncate(take);
        let next_cursor = match (more, all.last()) {
            (true, Some((t, last))) => encode_cursor(&ScanCursor {
                ts: last.ts,
                key: last.key.clone(),
                tablet: *t,
                index: last.index,
                slot: last.slot,
            }),
            _ => Vec::new(),
        };
        Ok(pb::ScanResponse {
            rows: all.into_iter().map(|(t, row)| row_to_pb(t, row)).collect(),
            next_cursor,
            watermark: if watermark == u64::MAX { 0 } else { watermark },
            missing_tablets: missing,
            cold_bytes_fetched: cold.fetched,
            cold_bytes_cached: cold.cached,
        })
    }
}

/// A read that hit damaged data: reported, never returned as data.
fn read_error(e: crate::Error) -> ApiError {
    tracing::error!(error = %e, "read failed");
    ApiError::Unavailable {
        reason: format!("read failed: {e}"),
    }
}

#[tonic::async_trait]
impl Data for DataService {
    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let access = Access::of(&req);
        let req = req.into_inner();
        let (ns, right) = (&req.namespace, Right::Append);
        self.node.permit(&access, "Append", ns, right)?;
        let started = std::time::Instant::now();
        let records = req.records.len() as u64;
        let bytes = req
            .records
            .iter()
            .map(|r| (r.key.len() + r.value.len()) as u64);
        let bytes = bytes.sum();
        let batch = crate::trace::Batch::of_bytes(&req.batch_id);
        let replica = tracing::field::Empty;
        let span = tracing::debug_span!("append", tablet = req.tablet, replica, %batch, records);
        let r = DataService::append(self, req, &span)
            .instrument(span.clone())
            .await;
        span.in_scope(|| match &r {
            Ok(a) => tracing::debug!(duplicate = a.duplicate, "append acknowledged"),
            Err(e) => tracing::debug!(error = %e, "append refused"),
        });
        crate::metrics::record_append(started.elapsed(), r.is_ok(), records, bytes);
        if r.is_ok() {
            self.node.load.record_append(started.elapsed(), records);
        }
        Ok(Response::new(r?))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let access = Access::of(&req);
        let req = req.into_inner();
        self.node
            .permit(&access, "Get", &req.namespace, Right::Read)?;
        let started = std::time::Instant::now();
        let r = DataService::get(self, req).await;
        crate::metrics::record_read(crate::metrics::ReadKind::Get, started.elapsed(), r.is_ok());
        if r.is_ok() {
            self.node.load.record_read();
        }
        Ok(Response::new(r?))
    }

    async fn scan_key(
        &self,
        req: Request<pb::ScanKeyRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let access = Access::of(&req);
        let req = req.into_inner();
        self.node
            .permit(&access, "ScanKey", &req.namespace, Right::Read)?;
        let started = std::time::Instant::now();
        let r = DataService::scan_key(self, req).await;
        crate::metrics::record_read(
            crate::metrics::ReadKind::ScanKey,
            started.elapsed(),
            r.is_ok(),
        );
        if r.is_ok() {
            self.node.load.record_read();
        }
        Ok(Response::new(r?))
    }

    async fn scan(
        &self,
        req: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let access = Access::of(&req);
        let req = req.into_inner();
        self.node
            .permit(&access, "Scan", &req.namespace, Right::Read)?;
        let started = std::time::Instant::now();
        let r = DataService::scan(self, req).await;
        crate::metrics::record_read(crate::metrics::ReadKind::Scan, started.elapsed(), r.is_ok());
        if r.is_ok() {
            self.node.load.record_read();
        }
        Ok(Response::new(r?))
    }

    async fn list_tablets(
        &self,
        _req: Request<pb::ListTabletsRequest>,
    ) -> Result<Response<pb::ListTabletsResponse>, Status> {
        let tablets = self
            .node
            .replicas
            .replicas()
            .iter()
            .map(|r| descriptor(&self.node.endpoints, r))
            .collect();
        Ok(Response::new(pb::ListTabletsResponse {
            node_id: self.node.options.node_id,
            tablets,
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(status::of(&self.node)))
    }

    async fn get_routes(
        &self,
        req: Request<pb::GetRoutesRequest>,
    ) -> Result<Response<pb::GetRoutesResponse>, Status> {
        let since = req.into_inner().since_generation;
        Ok(Response::new(self.relay()?.get(since).await?))
    }

    type WatchRoutesStream = RouteWatch;

    async fn watch_routes(
        &self,
        req: Request<pb::WatchRoutesRequest>,
    ) -> Result<Response<RouteWatch>, Status> {
        let since = req.into_inner().since_generation;
        Ok(Response::new(self.relay()?.watch(since).await?))
    }
}
