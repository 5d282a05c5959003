//! Routing client for Stele cells.
//!
//! ```text
//! Client::append(ns, records)
//!   ├─ validate (stele_proto::limits) ─ refuse before any byte is sent
//!   ├─ vshard(ns, routing key) ─▶ RouteTable ─▶ one group per tablet
//!   └─ per group: AppendRequest{tablet, generation, batch_id} ─▶ leader
//!         Retry kind    ─▶ backoff with jitter, same batch_id
//!         Redirect kind ─▶ fix routes (StaleRoute / NotLeader / TabletNotFound), same batch_id
//!         Refuse kind   ─▶ return at once
//! ```
//!
//! The route cache ([`routes`]) and the retry policy ([`retry`]) are pure;
//! this module does the I/O. One tonic channel is kept per endpoint, because
//! a tablet's leader may live on any node of the cell.
//!
//! **Architecture invariant:** this crate depends on no workspace crate but
//! `stele-proto`.

pub mod admin;
pub mod batcher;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod global;
pub mod retry;
pub mod routes;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use stele_proto::ErrorKind;
use stele_proto::limits;
use stele_proto::pb::data_client::DataClient;
use stele_proto::pb::{self, AppendRequest, AppendResponse};
use stele_proto::vshard::{namespace_range, vshard};
use tonic::transport::{Channel, Endpoint};

pub use batcher::{Batcher, BatcherOptions};
pub use error::{Error, Result};
pub use global::{GlobalClient, Placement};
pub use retry::RetryPolicy;
pub use routes::{Route, RouteTable};
pub use stele_proto::pb::{
    Condition, Consistency, Position, ReadOptions, Record, Row, StatusResponse, TabletDescriptor,
};

/// Client settings. Limits default to the protocol defaults of
/// [`stele_proto::limits`]; a cell configured with other limits needs the
/// same values here, or the node refuses what the client let through.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub retry: RetryPolicy,
    /// Longest single attempt of any call.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub value_bytes_max: usize,
    /// Largest batch, as the sum of key, routing key and value bytes.
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Page size used by [`Client::scan_all`] and [`Client::scan_key_all`].
    pub page_records: u32,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            value_bytes_max: limits::VALUE_BYTES_MAX_DEFAULT,
            batch_bytes_max: limits::BATCH_BYTES_MAX_DEFAULT,
            batch_records_max: limits::BATCH_RECORDS_MAX_DEFAULT,
            page_records: 1000,
        }
    }
}

/// The result of one atomic batch.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendOutcome {
    /// One position per record, in input order.
    pub positions: Vec<Position>,
    /// True when the node had already applied this batch id.
    pub duplicate: bool,
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScanPage {
    pub rows: Vec<Row>,
    /// `None` when the scan is complete.
    pub next_cursor: Option<Vec<u8>>,
    pub watermark: u64,
    pub missing_tablets: Vec<u64>,
}

impl From<pb::ScanResponse> for ScanPage {
    fn from(r: pb::ScanResponse) -> Self {
        ScanPage {
            rows: r.rows,
            next_cursor: (!r.next_cursor.is_empty()).then_some(r.next_cursor),
            watermark: r.watermark,
            missing_tablets: r.missing_tablets,
        }
    }
}

/// Largest response the client decodes. Nodes cap read pages at 4 MiB of
/// keys and values (always at least one row, up to a 1 MiB value), so this
/// leaves ample room.
const DECODE_BYTES_MAX: usize = 16 << 20;

/// How many times a tablet-by-tablet namespace scan starts over (a split
/// or move under it) before it gives up.
const SCAN_ROUNDS_MAX: u32 = 40;

/// A record with no routing key.
pub fn record(key: impl Into<Vec<u8>>, ts: u64, value: impl Into<Vec<u8>>) -> Record {
    Record {
        key: key.into(),
        ts,
        value: value.into(),
        routing_key: None,
    }
}

/// The vshard a record routes by.
pub fn record_vshard(namespace: &str, record: &Record) -> u32 {
    vshard(
        namespace,
        record.routing_key.as_deref().unwrap_or(&record.key),
    )
}

/// The bytes a record counts for against batch limits.
pub fn record_bytes(record: &Record) -> usize {
    record.key.len() + record.value.len() + record.routing_key.as_ref().map_or(0, Vec::len)
}

/// Checks a namespace and records against the limits, so an unacceptable
/// request is refused before anything is sent.
pub fn validate(namespace: &str, records: &[Record], opts: &ClientOptions) -> Result<()> {
    limits::validate_namespace(namespace)?;
    for r in records {
        limits::validate_key("key", &r.key)?;
        if let Some(rk) = &r.routing_key {
            limits::validate_key("routing_key", rk)?;
        }
        if r.value.len() > opts.value_bytes_max {
            return Err(stele_proto::Error::TooLarge {
                what: "value".into(),
                size: r.value.len() as u64,
                limit: opts.value_bytes_max as u64,
            }
            .into());
        }
        if record_bytes(r) > opts.batch_bytes_max {
            return Err(stele_proto::Error::TooLarge {
                what: "record".into(),
                size: record_bytes(r) as u64,
                limit: opts.batch_bytes_max as u64,
            }
            .into());
        }
    }
    Ok(())
}

/// Splits record indices into runs that respect the batch limits.
pub fn chunk(
    records: &[Record],
    idxs: Vec<usize>,
    records_max: usize,
    bytes_max: usize,
) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for i in idxs {
        let b = record_bytes(&records[i]);
        if !cur.is_empty() && (cur.len() >= records_max.max(1) || bytes + b > bytes_max) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += b;
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn new_batch_id() -> [u8; limits::BATCH_ID_BYTES] {
    rand::random()
}

fn jitter() -> f64 {
    rand::random::<f64>()
}

/// A record waiting to be sent: its index in the caller's input and its vshard.
#[derive(Debug, Clone, Copy)]
struct Item {
    idx: usize,
    vshard: u32,
}

/// A cheap-to-clone handle to a cell.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    seed: String,
    /// The cell's controllers, when routes come from them.
    admin: Option<admin::Admin>,
    /// Route map generation of the last controller refresh.
    route_generation: std::sync::atomic::AtomicU64,
    opts: ClientOptions,
    routes: RwLock<RouteTable>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("seed", &self.inner.seed)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to a cell through one of its nodes (`http://host:port`) and
    /// loads the route table from its `ListTablets`.
    pub async fn connect(endpoint: &str, opts: ClientOptions) -> Result<Client> {
        let client = Client {
            inner: Arc::new(Inner {
                seed: endpoint.to_string(),
                admin: None,
                route_generation: Default::default(),
                opts,
                routes: RwLock::new(RouteTable::new()),
                channels: Mutex::new(HashMap::new()),
            }),
        };
        client.refresh_routes().await?;
        Ok(client)
    }

    /// Connects to a controller-managed cell: routes come from the
    /// controllers' route map (`GetRoutes`, deltas by generation), and the
    /// data path goes straight to tablet leaders; the controllers are asked
    /// again only when the cache is found stale.
    pub async fn connect_cell(controllers: &[String], opts: ClientOptions) -> Result<Client> {
        let admin = admin::Admin::new(controllers.to_vec())?;
        let client = Client {
            inner: Arc::new(Inner {
                seed: String::new(),
                admin: Some(admin),
                route_generation: Default::default(),
                opts,
                routes: RwLock::new(RouteTable::new()),
                channels: Mutex::new(HashMap::new()),
            }),
        };
        client.refresh_routes().await?;
        Ok(client)
    }

    /// The controllers of the cell, when connected through them.
    pub fn admin(&self) -> Option<&admin::Admin> {
        self.inner.admin.as_ref()
    }

    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    pub fn seed_endpoint(&self) -> &str {
        &self.inner.seed
    }

    /// A snapshot of the route cache.
    pub fn routes(&self) -> RouteTable {
        self.inner.routes.read().expect("routes lock").clone()
    }

    /// The tablet a record routes to by the current cache, if known.
    pub fn tablet_of(&self, namespace: &str, record: &Record) -> Option<u64> {
        let v = record_vshard(namespace, record);
        self.inner
            .routes
            .read()
            .expect("routes lock")
            .lookup(v)
            .map(|r| r.tablet)
    }

    /// Reloads routes: from the controllers' route map (a delta since the
    /// cached generation, or the whole map when a route lacks its leader),
    /// else from the seed node's `ListTablets`.
    pub async fn refresh_routes(&self) -> Result<()> {
        if let Some(admin) = &self.inner.admin {
            use std::sync::atomic::Ordering;
            let complete = {
                let routes = self.inner.routes.read().expect("routes lock");
                !routes.is_empty() && routes.routes().all(|r| !r.leader_endpoint.is_empty())
            };
            let since = if complete {
                self.inner.route_generation.load(Ordering::Relaxed)
            } else {
                0
            };
            let resp = admin
                .call(|mut c| async move {
                    c.get_routes(pb::GetRoutesRequest {
                        since_generation: since,
                    })
                    .await
                })
                .await?;
            let mut routes = self.inner.routes.write().expect("routes lock");
            for id in &resp.removed {
                routes.remove(*id);
            }
            routes.merge(&resp.tablets);
            self.inner
                .route_generation
                .fetch_max(resp.generation, Ordering::Relaxed);
            return Ok(());
        }
        let tablets = self.list_tablets_at(&self.inner.seed).await?;
        self.inner
            .routes
            .write()
            .expect("routes lock")
            .merge(&tablets);
        Ok(())
    }

    /// The tablets the seed node knows.
    pub async fn list_tablets(&self) -> Result<Vec<TabletDescriptor>> {
        self.list_tablets_at(&self.inner.seed).await
    }

    async fn list_tablets_at(&self, endpoint: &str) -> Result<Vec<TabletDescriptor>> {
        let mut c = self.data(endpoint)?;
        let resp = self
            .timed(endpoint, c.list_tablets(pb::ListTabletsRequest {}))
            .await?;
        Ok(resp.tablets)
    }

    /// Status and counters of the seed node.
    pub async fn status(&self) -> Result<StatusResponse> {
        self.status_at(&self.inner.seed).await
    }

    /// Status and counters of any node.
    pub async fn status_at(&self, endpoint: &str) -> Result<StatusResponse> {
        let mut c = self.data(endpoint)?;
        self.timed(endpoint, c.status(pb::StatusRequest {})).await
    }

    /// Appends records, each atomically and idempotently with the others
    /// of its tablet group; groups for different tablets are independent
    /// batches sent concurrently. Returns positions in input order.
    ///
    /// On error, some groups may have been applied and others not; every
    /// group was retried with its own batch id until the policy gave up.
    pub async fn append(&self, namespace: &str, records: Vec<Record>) -> Result<Vec<Position>> {
        validate(namespace, &records, &self.inner.opts)?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.group_by_tablet(namespace, &records).await?;
        let opts = &self.inner.opts;
        let mut sends = Vec::new();
        for idxs in groups {
            for run in chunk(&records, idxs, opts.batch_records_max, opts.batch_bytes_max) {
                let items = run
                    .into_iter()
                    .map(|idx| Item {
                        idx,
                        vshard: record_vshard(namespace, &records[idx]),
                    })
                    .collect();
                sends.push(self.drive(namespace, &records, items, new_batch_id(), None, false));
            }
        }
        let mut positions: Vec<Option<Position>> = vec![None; records.len()];
        for result in futures::future::join_all(sends).await {
            let (placed, _duplicate) = result?;
            for (idx, pos) in placed {
                positions[idx] = Some(pos);
            }
        }
        positions
            .into_iter()
            .map(|p| p.ok_or_else(|| Error::Protocol("a record got no position".into())))
            .collect()
    }

    /// Appends one atomic batch. Every record must route to one tablet.
    /// With `expect`, the batch applies only if the condition holds, else
    /// fails with `ConditionFailed { actual }`. Without `batch_id`, a fresh
    /// random one is used; pass the same id to retry a batch whose outcome
    /// is unknown.
    pub async fn append_batch(
        &self,
        namespace: &str,
        records: Vec<Record>,
        expect: Option<Condition>,
        batch_id: Option<[u8; 16]>,
    ) -> Result<AppendOutcome> {
        let opts = &self.inner.opts;
        validate(namespace, &records, opts)?;
        if records.is_empty() {
            return Err(invalid("records", "a batch needs at least one record"));
        }
        if let Some(c) = &expect {
            limits::validate_key("expect.key", &c.key)?;
        }
        let bytes: usize = records.iter().map(record_bytes).sum();
        if bytes > opts.batch_bytes_max {
            return Err(too_large("batch", bytes, opts.batch_bytes_max));
        }
        if records.len() > opts.batch_records_max {
            return Err(too_large(
                "batch records",
                records.len(),
                opts.batch_records_max,
            ));
        }
        let items: Vec<Item> = records
            .iter()
            .enumerate()
            .map(|(idx, r)| Item {
                idx,
                vshard: record_vshard(namespace, r),
            })
            .collect();
        let first = items[0].vshard;
        if items.iter().any(|i| i.vshard != first) {
            // Different vshards may still share a tablet; check by route.
            let groups = self.group_by_tablet(namespace, &records).await?;
            if groups.len() > 1 {
                return Err(invalid(
                    "records",
                    "an atomic batch must route to one tablet",
                ));
            }
        }
        let batch_id = batch_id.unwrap_or_else(new_batch_id);
        let (placed, duplicate) = self
            .drive(namespace, &records, items, batch_id, expect.as_ref(), true)
            .await?;
        let mut positions = vec![Position::default(); records.len()];
        for (idx, pos) in placed {
            positions[idx] = pos;
        }
        Ok(AppendOutcome {
            positions,
            duplicate,
        })
    }

    /// Groups record indices by the tablet of their vshard, refreshing the
    /// routes once if some vshard has none.
    async fn group_by_tablet(
        &self,
        namespace: &str,
        records: &[Record],
    ) -> Result<Vec<Vec<usize>>> {
        for pass in 0..2 {
            let routes = self.inner.routes.read().expect("routes lock").clone();
            let mut groups: HashMap<u64, Vec<usize>> = HashMap::new();
            let mut missing = None;
            for (i, r) in records.iter().enumerate() {
                let v = record_vshard(namespace, r);
                match routes.lookup(v) {
                    Some(route) => groups.entry(route.tablet).or_default().push(i),
                    None => {
                        missing = Some(v);
                        break;
                    }
                }
            }
            match missing {
                None => {
                    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
                    groups.sort_by_key(|g| g[0]);
                    return Ok(groups);
                }
                Some(vshard) if pass == 1 => return Err(Error::NoRoute { vshard }),
                Some(_) => {
                    if let Err(e) = self.refresh_routes().await {
                        tracing::debug!(error = %e, "route refresh failed");
                    }
                }
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    /// Sends one batch (one batch id) until it is placed or the policy gives
    /// up. If a split leaves the items on several tablets, a non-atomic batch
    /// is re-sent per tablet with the same batch id: the node's receipts
    /// cover vshard ranges, so a part applied before the split is reported
    /// as a duplicate, not applied twice.
    async fn drive(
        &self,
        namespace: &str,
        records: &[Record],
        items: Vec<Item>,
        batch_id: [u8; 16],
        expect: Option<&Condition>,
        atomic: bool,
    ) -> Result<(Vec<(usize, Position)>, bool)> {
        let policy = &self.inner.opts.retry;
        let started = Instant::now();
        let (mut attempt, mut redirects) = (0u32, 0u32);
        let mut pending = vec![items];
        let mut placed = Vec::new();
        let mut duplicate = false;
        while let Some(group) = pending.pop() {
            loop {
                let routes = self.inner.routes.read().expect("routes lock").clone();
                let mut tablet = None;
                let err = match plan(&routes, &group) {
                    Err(vshard) => Error::NoRoute { vshard },
                    Ok(mut parts) if parts.len() == 1 => {
                        let (route, part) = parts.pop().expect("one part");
                        tablet = Some(route.tablet);
                        match self
                            .send_append(&route, namespace, records, &part, batch_id, expect)
                            .await
                        {
                            Ok(resp) if resp.positions.len() == part.len() => {
                                duplicate |= resp.duplicate;
                                placed.extend(part.iter().map(|i| i.idx).zip(resp.positions));
                                break;
                            }
                            Ok(resp) => {
                                return Err(Error::Protocol(format!(
                                    "{} positions for {} records",
                                    resp.positions.len(),
                                    part.len()
                                )));
                            }
                            Err(e) => e,
                        }
                    }
                    Ok(_) if atomic => {
                        return Err(invalid(
                            "records",
                            "the tablet split: the atomic batch now spans tablets",
                        ));
                    }
                    Ok(parts) => {
                        pending.extend(parts.into_iter().map(|(_, p)| p));
                        break;
                    }
                };
                attempt += 1;
                let kind = err.kind();
                if kind == ErrorKind::Redirect {
                    redirects += 1;
                }
                match policy.decide(kind, attempt, redirects, started.elapsed(), jitter()) {
                    retry::Decision::GiveUp => return Err(give_up(err, attempt, started)),
                    retry::Decision::Backoff(wait) => {
                        tracing::debug!(error = %err, ?wait, attempt, "append: retrying");
                        self.after_unreachable(&err, tablet).await;
                        tokio::time::sleep(wait).await;
                    }
                    retry::Decision::Redirect(wait) => {
                        tracing::debug!(error = %err, attempt, "append: fixing routes");
                        self.fix_routes(&err, tablet).await;
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
        Ok((placed, duplicate))
    }

    async fn send_append(
        &self,
        route: &Route,
        namespace: &str,
        records: &[Record],
        part: &[Item],
        batch_id: [u8; 16],
        expect: Option<&Condition>,
    ) -> Result<AppendResponse> {
        let endpoint = self.endpoint_of(route);
        let req = AppendRequest {
            tablet: route.tablet,
            generation: route.generation,
            batch_id: batch_id.to_vec(),
            namespace: namespace.to_string(),
            records: part.iter().map(|i| records[i.idx].clone()).collect(),
            expect: expect.cloned(),
        };
        let mut c = self.data(endpoint)?;
        self.timed(endpoint, c.append(req)).await
    }

    /// Updates the route cache after a Redirect-kind error.
    async fn fix_routes(&self, err: &Error, tablet: Option<u64>) {
        let refresh = match err.api() {
            Some(stele_proto::Error::StaleRoute { descriptor }) => {
                self.inner
                    .routes
                    .write()
                    .expect("routes lock")
                    .apply(descriptor);
                false
            }
            Some(stele_proto::Error::NotLeader {
                leader_node,
                leader_endpoint,
            }) => match tablet {
                Some(t) => !self.inner.routes.write().expect("routes lock").set_leader(
                    t,
                    *leader_node,
                    leader_endpoint,
                ),
                None => true,
            },
            Some(stele_proto::Error::TabletNotFound { tablet }) => {
                self.inner
                    .routes
                    .write()
                    .expect("routes lock")
                    .remove(*tablet);
                true
            }
            _ => true,
        };
        if refresh && let Err(e) = self.refresh_routes().await {
            tracing::debug!(error = %e, "route refresh failed");
        }
    }

    /// After a failure that is not a node's typed answer (the leader's
    /// endpoint did not answer at all), stop trusting that leader: send the
    /// next attempt to the seed, which answers or redirects, and refresh
    /// the routes from it.
    async fn after_unreachable(&self, err: &Error, tablet: Option<u64>) {
        let typed =
            matches!(err.api(), Some(e) if !matches!(e, stele_proto::Error::Unavailable { .. }));
        if typed {
            return;
        }
        if let Some(t) = tablet {
            self.inner
                .routes
                .write()
                .expect("routes lock")
                .forget_leader(t);
        }
        if let Err(e) = self.refresh_routes().await {
            tracing::debug!(error = %e, "route refresh failed");
        }
    }

    fn endpoint_of<'a>(&'a self, route: &'a Route) -> &'a str {
        if route.leader_endpoint.is_empty() {
            &self.inner.seed
        } else {
            &route.leader_endpoint
        }
    }

    /// The endpoint serving reads of one routing key: its tablet's leader if
    /// known, else the seed node (which answers or redirects).
    fn read_endpoint(&self, namespace: &str, routing_key: &[u8]) -> (Option<u64>, String) {
        let routes = self.inner.routes.read().expect("routes lock");
        match routes.lookup(vshard(namespace, routing_key)) {
            Some(r) => (Some(r.tablet), self.endpoint_of(r).to_string()),
            None => (None, self.inner.seed.clone()),
        }
    }

    /// Runs an idempotent read until it succeeds or the policy gives up.
    async fn read<T, F, Fut>(
        &self,
        mut target: impl FnMut() -> (Option<u64>, String),
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut(DataClient<Channel>, String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let policy = &self.inner.opts.retry;
        let started = Instant::now();
        let (mut attempt, mut redirects) = (0u32, 0u32);
        loop {
            let (tablet, endpoint) = target();
            let err = match self.data(&endpoint) {
                Ok(c) => match call(c, endpoint.clone()).await {
                    Ok(v) => return Ok(v),
                    Err(e) => e,
                },
                Err(e) => e,
            };
            attempt += 1;
            let kind = err.kind();
            if kind == ErrorKind::Redirect {
                redirects += 1;
            }
            match policy.decide(kind, attempt, redirects, started.elapsed(), jitter()) {
                retry::Decision::GiveUp => return Err(give_up(err, attempt, started)),
                retry::Decision::Backoff(wait) => {
                    self.after_unreachable(&err, tablet).await;
                    tokio::time::sleep(wait).await
                }
                retry::Decision::Redirect(wait) => {
                    self.fix_routes(&err, tablet).await;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The latest record of a key.
    pub async fn get(&self, namespace: &str, key: &[u8], read: ReadOptions) -> Result<Option<Row>> {
        limits::validate_namespace(namespace)?;
        limits::validate_key("key", key)?;
        let req = pb::GetRequest {
            namespace: namespace.to_string(),
            key: key.to_vec(),
            routing_key: None,
            read: Some(read),
        };
        self.read(
            || self.read_endpoint(namespace, key),
            |mut c, endpoint| {
                let req = req.clone();
                async move { self.timed(&endpoint, c.get(req)).await.map(|r| r.row) }
            },
        )
        .await
    }

    /// One page of a key's records with `ts_from <= ts < ts_to` (`ts_to` 0:
    /// unbounded), ascending. Pass the previous page's `next_cursor` to go on.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan_key(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        limit: u32,
        cursor: Option<Vec<u8>>,
        read: ReadOptions,
    ) -> Result<ScanPage> {
        limits::validate_namespace(namespace)?;
        limits::validate_key("key", key)?;
        let req = pb::ScanKeyRequest {
            namespace: namespace.to_string(),
            key: key.to_vec(),
            routing_key: None,
            ts_from,
            ts_to,
            limit,
            cursor: cursor.unwrap_or_default(),
            read: Some(read),
        };
        self.read(
            || self.read_endpoint(namespace, key),
            |mut c, endpoint| {
                let req = req.clone();
                async move {
                    self.timed(&endpoint, c.scan_key(req))
                        .await
                        .map(ScanPage::from)
                }
            },
        )
        .await
    }

    /// One page of a namespace's records with `ts_from <= ts < ts_to` and
    /// keys starting with `key_prefix`, merged by (ts, key). In this version
    /// the node serves the scan over its local tablets, so the client sends
    /// it to one node: the leader of the namespace's first tablet, if known.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        limit: u32,
        cursor: Option<Vec<u8>>,
        read: ReadOptions,
    ) -> Result<ScanPage> {
        limits::validate_namespace(namespace)?;
        let req = pb::ScanRequest {
            namespace: namespace.to_string(),
            ts_from,
            ts_to,
            key_prefix: key_prefix.to_vec(),
            limit,
            cursor: cursor.unwrap_or_default(),
            read: Some(read),
            tablet: 0,
            generation: 0,
        };
        let (lo, _) = namespace_range(namespace);
        self.read(
            || {
                let routes = self.inner.routes.read().expect("routes lock");
                match routes.lookup(lo) {
                    Some(r) => (Some(r.tablet), self.endpoint_of(r).to_string()),
                    None => (None, self.inner.seed.clone()),
                }
            },
            |mut c, endpoint| {
                let req = req.clone();
                async move { self.timed(&endpoint, c.scan(req)).await.map(ScanPage::from) }
            },
        )
        .await
    }

    /// Every record of a key in the range, following cursors to the end.
    pub async fn scan_key_all(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let page = self
                .scan_key(
                    namespace,
                    key,
                    ts_from,
                    ts_to,
                    self.inner.opts.page_records,
                    cursor,
                    read,
                )
                .await?;
            rows.extend(page.rows);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(rows),
            }
        }
    }

    /// Every record of a namespace in the range, following cursors to the end.
    pub async fn scan_all(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        // Tablet by tablet, each from its own leader: the tablets of a
        // split namespace need not share a leader (or a node). A tablet
        // whose range changed under the scan (a split) answers StaleRoute,
        // and the scan starts over on the new routes.
        let (lo, hi) = namespace_range(namespace);
        let started = Instant::now();
        let mut last = None;
        for round in 0..SCAN_ROUNDS_MAX {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(round.min(10)))).await;
            }
            let routes: Vec<Route> = {
                let table = self.inner.routes.read().expect("routes lock");
                table
                    .routes()
                    .filter(|r| u64::from(r.lo) < hi && r.hi > u64::from(lo))
                    .cloned()
                    .collect()
            };
            let mut reached = u64::from(lo);
            for r in &routes {
                if u64::from(r.lo) <= reached {
                    reached = reached.max(r.hi);
                }
            }
            if reached < hi {
                if let Err(e) = self.refresh_routes().await {
                    last = Some(e);
                }
                continue;
            }
            let mut rows = Vec::new();
            let mut restart = false;
            for route in &routes {
                match self
                    .scan_tablet(namespace, route, ts_from, ts_to, key_prefix, read)
                    .await
                {
                    Ok(r) => rows.extend(r),
                    Err(e) if e.kind() == ErrorKind::Redirect => {
                        last = Some(e);
                        restart = true;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if restart {
                continue;
            }
            let order = |r: &Row| {
                let p = r.position.unwrap_or_default();
                (r.ts, r.key.clone(), p.tablet, p.index, p.slot)
            };
            rows.sort_by_key(order);
            return Ok(rows);
        }
        Err(give_up(
            last.unwrap_or(Error::NoRoute { vshard: lo }),
            SCAN_ROUNDS_MAX,
            started,
        ))
    }

    /// Every row of one tablet's part of a namespace, page by page from
    /// its leader, at the route's generation. A redirect-kind error other
    /// than `NotLeader` (the tablet split or moved away) is returned for
    /// the caller to start over; `NotLeader` and unavailability are retried.
    async fn scan_tablet(
        &self,
        namespace: &str,
        route: &Route,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        let policy = &self.inner.opts.retry;
        let mut rows = Vec::new();
        let mut cursor = Vec::new();
        loop {
            let req = pb::ScanRequest {
                namespace: namespace.to_string(),
                ts_from,
                ts_to,
                key_prefix: key_prefix.to_vec(),
                limit: self.inner.opts.page_records,
                cursor: cursor.clone(),
                read: Some(read),
                tablet: route.tablet,
                generation: route.generation,
            };
            let started = Instant::now();
            let (mut attempt, mut redirects) = (0u32, 0u32);
            let page = loop {
                let endpoint = {
                    let table = self.inner.routes.read().expect("routes lock");
                    match table.get(route.tablet) {
                        Some(r) => self.endpoint_of(r).to_string(),
                        None => self.inner.seed.clone(),
                    }
                };
                let err = match self.data(&endpoint) {
                    Ok(mut c) => match self.timed(&endpoint, c.scan(req.clone())).await {
                        Ok(page) => break page,
                        Err(e) => e,
                    },
                    Err(e) => e,
                };
                let not_leader = matches!(err.api(), Some(stele_proto::Error::NotLeader { .. }));
                if err.kind() == ErrorKind::Redirect && !not_leader {
                    self.fix_routes(&err, Some(route.tablet)).await;
                    return Err(err);
                }
                attempt += 1;
                if not_leader {
                    redirects += 1;
                }
                match policy.decide(err.kind(), attempt, redirects, started.elapsed(), jitter()) {
                    retry::Decision::GiveUp => return Err(give_up(err, attempt, started)),
                    retry::Decision::Backoff(wait) => {
                        self.after_unreachable(&err, Some(route.tablet)).await;
                        tokio::time::sleep(wait).await
                    }
                    retry::Decision::Redirect(wait) => {
                        self.fix_routes(&err, Some(route.tablet)).await;
                        tokio::time::sleep(wait).await;
                    }
                }
            };
            rows.extend(page.rows);
            if page.next_cursor.is_empty() {
                return Ok(rows);
            }
            cursor = page.next_cursor;
        }
    }

    /// The data client of an endpoint, reusing its channel.
    fn data(&self, endpoint: &str) -> Result<DataClient<Channel>> {
        if endpoint.is_empty() {
            // A controller-routed client with no leader known for the
            // tablet yet (an election): retried after a route refresh.
            return Err(stele_proto::Error::Unavailable {
                reason: "no leader known for the tablet yet".into(),
            }
            .into());
        }
        let mut channels = self.inner.channels.lock().expect("channels lock");
        if let Some(ch) = channels.get(endpoint) {
            return Ok(DataClient::new(ch.clone()).max_decoding_message_size(DECODE_BYTES_MAX));
        }
        let ch = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| Error::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .connect_timeout(self.inner.opts.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(endpoint.to_string(), ch.clone());
        Ok(DataClient::new(ch).max_decoding_message_size(DECODE_BYTES_MAX))
    }

    /// Awaits one call within the request timeout.
    async fn timed<T>(
        &self,
        endpoint: &str,
        call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        let timeout = self.inner.opts.request_timeout;
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(status.into()),
            Err(_) => Err(Error::RequestTimeout {
                endpoint: endpoint.to_string(),
                elapsed: timeout,
            }),
        }
    }
}

/// Groups items by the route of their vshard; `Err(vshard)` when one has none.
fn plan(routes: &RouteTable, items: &[Item]) -> Result<Vec<(Route, Vec<Item>)>, u32> {
    let mut parts: Vec<(Route, Vec<Item>)> = Vec::new();
    for item in items {
        let route = routes.lookup(item.vshard).ok_or(item.vshard)?;
        match parts.iter_mut().find(|(r, _)| r.tablet == route.tablet) {
            Some((_, p)) => p.push(*item),
            None => parts.push((route.clone(), vec![*item])),
        }
    }
    Ok(parts)
}

/// The error to return when the policy gives up: Refuse-kind errors as they
/// are, anything else wrapped to say the budget ran out.
fn give_up(err: Error, attempts: u32, started: Instant) -> Error {
    if err.kind() == ErrorKind::Refuse {
        return err;
    }
    Error::Exhausted {
        attempts,
        elapsed: started.elapsed(),
        last: Box::new(err),
    }
}

fn invalid(field: &str, reason: &str) -> Error {
    stele_proto::Error::InvalidArgument {
        field: field.into(),
        reason: reason.into(),
    }
    .into()
}

fn too_large(what: &str, size: usize, limit: usize) -> Error {
    stele_proto::Error::TooLarge {
        what: what.into(),
        size: size as u64,
        limit: limit as u64,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_refuses_before_sending() {
        let opts = ClientOptions {
            value_bytes_max: 10,
            ..Default::default()
        };
        let ok = [record("k", 1, "v")];
        validate("a/b", &ok, &opts).unwrap();
        let cases: Vec<(&str, Vec<Record>, &str)> = vec![
            ("nope", ok.to_vec(), "InvalidArgument"),
            ("a/b", vec![record("", 1, "v")], "InvalidArgument"),
            ("a/b", vec![record("k", 1, vec![0; 11])], "TooLarge"),
            (
                "a/b",
                vec![record(vec![1; limits::KEY_BYTES_MAX + 1], 1, "v")],
                "TooLarge",
            ),
        ];
        for (ns, records, want) in cases {
            let err = validate(ns, &records, &opts).unwrap_err();
            assert!(
                format!("{:?}", err.api().unwrap()).starts_with(want),
                "{err}"
            );
            assert_eq!(err.kind(), ErrorKind::Refuse);
        }
    }

    #[test]
    fn chunks_respect_limits() {
        let records: Vec<Record> = (0..10)
            .map(|i| record(vec![b'k'; 5], i, vec![0; 5]))
            .collect();
        let sizes = |c: Vec<Vec<usize>>| c.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(
            sizes(chunk(&records, (0..10).collect(), 4, 1000)),
            [4, 4, 2]
        );
        assert_eq!(
            sizes(chunk(&records, (0..10).collect(), 100, 30)),
            [3, 3, 3, 1]
        );
        assert_eq!(sizes(chunk(&records, (0..10).collect(), 100, 1)), [1; 10]);
        assert!(chunk(&records, vec![], 4, 100).is_empty());
    }

    #[test]
    fn plan_groups_by_tablet() {
        let routes = RouteTable::from_descriptors(&[
            TabletDescriptor {
                id: 1,
                vshard_lo: 0,
                vshard_hi: 100,
                ..Default::default()
            },
            TabletDescriptor {
                id: 2,
                vshard_lo: 100,
                vshard_hi: 200,
                ..Default::default()
            },
        ]);
        let items = |vs: &[u32]| -> Vec<Item> {
            vs.iter()
                .enumerate()
                .map(|(idx, &vshard)| Item { idx, vshard })
                .collect()
        };
        let parts = plan(&routes, &items(&[1, 150, 2, 199])).unwrap();
        let got: Vec<(u64, Vec<usize>)> = parts
            .iter()
            .map(|(r, p)| (r.tablet, p.iter().map(|i| i.idx).collect()))
            .collect();
        assert_eq!(got, [(1, vec![0, 2]), (2, vec![1, 3])]);
        assert_eq!(plan(&routes, &items(&[1, 500])).unwrap_err(), 500);
    }
}
