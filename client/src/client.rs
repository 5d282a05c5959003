//! The handle to a cell: its options, the route cache and how it is
//! loaded, one tonic channel per endpoint, and the single timed attempt
//! every call is made of. The calls themselves live in the `append`,
//! `read` and `scan` modules, and retry through `driver`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use stele_proto::limits;
use stele_proto::pb::data_client::DataClient;
use stele_proto::pb::{self, Record, StatusResponse, TabletDescriptor};
use tonic::transport::Channel;

use crate::retry::RetryPolicy;
use crate::routes::{Route, RouteTable};
use crate::{Error, Result, admin, record_vshard};

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
    /// The cell CA (and maybe a certificate) for `https://` endpoints;
    /// `http://` endpoints are plaintext whatever this says.
    pub tls: Option<stele_tls::ClientTls>,
    /// A namespace token sent with every data request (`stele token
    /// issue`); none: the certificate in `tls`, or a plaintext cell.
    pub token: stele_tls::token::Bearer,
    /// A client of a controller-managed cell keeps its route cache current
    /// from the controllers' pushed route changes (`WatchRoutes`); off: it
    /// learns of a change only when a request is redirected.
    pub watch_routes: bool,
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
            tls: None,
            token: stele_tls::token::Bearer::none(),
            watch_routes: true,
        }
    }
}

/// Largest response the client decodes. Nodes cap read pages at 4 MiB of
/// keys and values (always at least one row, up to a 1 MiB value), so this
/// leaves ample room.
const DECODE_BYTES_MAX: usize = 16 << 20;

/// Route answers a relay's receiver may fall behind by before it starts
/// again from the whole map.
const ROUTE_FEED_BUFFER: usize = 256;

/// Messages a relayed watch may have waiting for a slow reader before the
/// relay waits for it (and, past the feed's buffer, sends the whole map).
const RELAY_BUFFER: usize = 4;

fn route_feed() -> tokio::sync::broadcast::Sender<Arc<pb::GetRoutesResponse>> {
    tokio::sync::broadcast::Sender::new(ROUTE_FEED_BUFFER)
}

/// A data-API client of one node, with the client's token.
pub(crate) type Data =
    DataClient<tonic::service::interceptor::InterceptedService<Channel, stele_tls::token::Bearer>>;

/// A cheap-to-clone handle to a cell.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    /// The token of this handle's data requests, when it is not the
    /// options' ([`Client::with_token`]).
    token: Option<stele_tls::token::Bearer>,
}

pub(crate) struct Inner {
    pub(crate) seed: String,
    /// The cell's controllers, when routes come from them.
    pub(crate) admin: Option<admin::Admin>,
    /// Nodes that relay the controllers' route map, when routes come from
    /// them ([`Client::connect_nodes`]); the one that answered last is
    /// asked first.
    pub(crate) route_nodes: Vec<String>,
    pub(crate) route_node: std::sync::atomic::AtomicUsize,
    /// Every route answer and pushed change applied, for relays
    /// ([`Client::subscribe_routes`]).
    route_feed: tokio::sync::broadcast::Sender<Arc<pb::GetRoutesResponse>>,
    /// Route map generation of the last controller refresh.
    route_generation: std::sync::atomic::AtomicU64,
    pub(crate) opts: ClientOptions,
    pub(crate) routes: RwLock<RouteTable>,
    channels: Mutex<HashMap<String, Channel>>,
    pub(crate) stats: RouteCounters,
    /// The route watch ([`crate::watch`]), stopped with the client.
    watch: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    fn new(
        seed: String,
        admin: Option<admin::Admin>,
        route_nodes: Vec<String>,
        opts: ClientOptions,
    ) -> Inner {
        Inner {
            seed,
            admin,
            route_nodes,
            route_node: Default::default(),
            route_feed: route_feed(),
            route_generation: Default::default(),
            opts,
            routes: RwLock::new(RouteTable::new()),
            channels: Mutex::new(HashMap::new()),
            stats: RouteCounters::default(),
            watch: Mutex::new(None),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.watch.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

/// How the route cache was kept: what [`Client::route_stats`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Calls with an attempt answered `StaleRoute`, `NotLeader` or
    /// `TabletNotFound`: requests that went to a wrong node for want of a
    /// current route (a call counts once, however many such attempts).
    pub redirects: u64,
    /// Pushed route messages applied (the first of each watch included).
    pub pushed: u64,
    /// Routes those messages carried (changed and removed tablets).
    pub pushed_routes: u64,
    /// A route watch is open now.
    pub watching: bool,
}

#[derive(Default)]
pub(crate) struct RouteCounters {
    redirects: AtomicU64,
    pushed: AtomicU64,
    pushed_routes: AtomicU64,
    watching: AtomicBool,
}

impl RouteCounters {
    pub(crate) fn redirected(&self) {
        self.redirects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn pushed(&self, msg: &pb::GetRoutesResponse) {
        self.pushed.fetch_add(1, Ordering::Relaxed);
        let n = msg.tablets.len() + msg.removed.len();
        self.pushed_routes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_watching(&self, on: bool) {
        self.watching.store(on, Ordering::Relaxed);
    }

    fn get(&self) -> RouteStats {
        RouteStats {
            redirects: self.redirects.load(Ordering::Relaxed),
            pushed: self.pushed.load(Ordering::Relaxed),
            pushed_routes: self.pushed_routes.load(Ordering::Relaxed),
            watching: self.watching.load(Ordering::Relaxed),
        }
    }
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
        let client = Client::from_inner(Arc::new(Inner::new(
            endpoint.to_string(),
            None,
            Vec::new(),
            opts,
        )));
        client.refresh_routes().await?;
        Ok(client)
    }

    /// Connects to a controller-managed cell through its nodes only: each
    /// node relays the controllers' route map (`GetRoutes`, and pushed
    /// changes by `WatchRoutes` when [`ClientOptions::watch_routes`]), so
    /// a client that cannot reach the controllers (another network, a
    /// firewall) still routes straight to tablet leaders. The nodes are
    /// tried in turn; the first one is the seed for routes without a
    /// known leader.
    pub async fn connect_nodes(nodes: &[String], opts: ClientOptions) -> Result<Client> {
        let Some(seed) = nodes.first() else {
            return Err(stele_proto::Error::InvalidArgument {
                field: "nodes".into(),
                reason: "at least one node endpoint is needed".into(),
            }
            .into());
        };
        let client = Client::from_inner(Arc::new(Inner::new(
            seed.clone(),
            None,
            nodes.to_vec(),
            opts,
        )));
        client.refresh_routes().await?;
        client.start_watch();
        Ok(client)
    }

    /// Connects to a controller-managed cell: routes come from the
    /// controllers' route map (`GetRoutes`, deltas by generation), kept
    /// current by their pushed changes ([`ClientOptions::watch_routes`]),
    /// and the data path goes straight to tablet leaders; the controllers
    /// are also asked again when the cache is found stale.
    pub async fn connect_cell(controllers: &[String], opts: ClientOptions) -> Result<Client> {
        let admin = admin::Admin::with_tls(controllers.to_vec(), opts.tls.clone())?;
        let client = Client::from_inner(Arc::new(Inner::new(
            String::new(),
            Some(admin),
            Vec::new(),
            opts,
        )));
        client.refresh_routes().await?;
        client.start_watch();
        Ok(client)
    }

    fn start_watch(&self) {
        if self.inner.opts.watch_routes {
            let task = tokio::spawn(crate::watch::run(Arc::downgrade(&self.inner)));
            *self.inner.watch.lock().expect("watch lock") = Some(task);
        }
    }

    /// A handle to the same cell (routes, channels, route watch shared)
    /// whose data requests carry `token` instead of the options' token: a
    /// gateway passes each producer's own token through.
    pub fn with_token(&self, token: stele_tls::token::Bearer) -> Client {
        Client {
            inner: self.inner.clone(),
            token: Some(token),
        }
    }

    /// Wraps a client's shared state in a handle with the options' token.
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Client {
        Client { inner, token: None }
    }

    /// How the route cache was kept so far.
    pub fn route_stats(&self) -> RouteStats {
        self.inner.stats.get()
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
    /// cached generation, or the whole map when a route lacks its leader)
    /// or the nodes' relay of it, else from the seed node's `ListTablets`.
    pub async fn refresh_routes(&self) -> Result<()> {
        if !self.inner.route_nodes.is_empty() {
            let resp = crate::watch::get_routes_from_nodes(self, self.route_since()).await?;
            self.apply_routes(&resp);
            return Ok(());
        }
        if let Some(admin) = &self.inner.admin {
            let since = self.route_since();
            let resp = admin
                .call(|mut c| async move {
                    c.get_routes(pb::GetRoutesRequest {
                        since_generation: since,
                    })
                    .await
                })
                .await?;
            self.apply_routes(&resp);
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

    /// The route generation to ask the controllers from: the cached one,
    /// or 0 (the whole map) when a route lacks its leader.
    pub(crate) fn route_since(&self) -> u64 {
        let routes = self.inner.routes.read().expect("routes lock");
        let complete = !routes.is_empty() && routes.routes().all(|r| !r.leader_endpoint.is_empty());
        if complete {
            self.inner.route_generation.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Applies a controller route answer or pushed change: the whole map
    /// replaces the cache; a delta replaces the routes it names.
    pub(crate) fn apply_routes(&self, resp: &pb::GetRoutesResponse) {
        let mut routes = self.inner.routes.write().expect("routes lock");
        let held = self.inner.route_generation.load(Ordering::Relaxed);
        if resp.full && resp.generation >= held {
            *routes = RouteTable::from_descriptors(&resp.tablets);
        } else {
            // A delta, or a whole map older than one applied meanwhile
            // (a poll and a push crossing): per tablet, newer wins.
            for id in &resp.removed {
                routes.remove(*id);
            }
            routes.merge(&resp.tablets);
        }
        self.inner
            .route_generation
            .fetch_max(resp.generation, Ordering::Relaxed);
        drop(routes);
        if self.inner.route_feed.receiver_count() > 0 {
            // No receiver: nothing to do (a send would fail anyway).
            let _ = self.inner.route_feed.send(Arc::new(resp.clone()));
        }
    }

    /// The cached route map as a route answer: the whole map when `since`
    /// is 0 or ahead of the cache, else the routes of a newer generation
    /// (the controllers' `GetRoutes`, answered from the cache).
    pub fn route_map(&self, since: u64) -> pb::GetRoutesResponse {
        let routes = self.inner.routes.read().expect("routes lock");
        let generation = self.inner.route_generation.load(Ordering::Relaxed);
        let full = since == 0 || since > generation;
        pb::GetRoutesResponse {
            generation,
            tablets: routes
                .routes()
                .filter(|r| full || r.generation > since)
                .map(crate::routes::Route::descriptor)
                .collect(),
            removed: Vec::new(),
            full,
            filed_at_unix_us: 0,
        }
    }

    /// A relay's view of the cache: the map since `since` (as
    /// [`Client::route_map`]) and every route answer applied after it, in
    /// order. A receiver that lags is to start again from the whole map.
    pub fn subscribe_routes(
        &self,
        since: u64,
    ) -> (
        pb::GetRoutesResponse,
        tokio::sync::broadcast::Receiver<Arc<pb::GetRoutesResponse>>,
    ) {
        // Subscribed first: an answer applied meanwhile is in both, and
        // applying it twice changes nothing.
        let rx = self.inner.route_feed.subscribe();
        (self.route_map(since), rx)
    }

    /// Serves a `WatchRoutes` from this client's cache (a node's relay, a
    /// gateway): the map since `since`, then every route answer applied,
    /// the whole map again after falling behind; until the receiver is
    /// dropped.
    pub fn relay_routes(
        &self,
        since: u64,
    ) -> tokio::sync::mpsc::Receiver<std::result::Result<pb::GetRoutesResponse, tonic::Status>>
    {
        use tokio::sync::broadcast::error::RecvError;
        let (first, mut feed) = self.subscribe_routes(since);
        let (tx, rx) = tokio::sync::mpsc::channel(RELAY_BUFFER);
        let client = self.clone();
        tokio::spawn(async move {
            let mut next = first;
            loop {
                if tx.send(Ok(next)).await.is_err() {
                    return; // the watcher left
                }
                next = match feed.recv().await {
                    Ok(msg) => (*msg).clone(),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "a route watch fell behind: sending the whole map");
                        client.route_map(0)
                    }
                    Err(RecvError::Closed) => return,
                };
            }
        });
        rx
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

    /// The data client of an endpoint, reusing its channel.
    pub(crate) fn data(&self, endpoint: &str) -> Result<Data> {
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
            return Ok(self.data_client(ch.clone()));
        }
        let ch = stele_tls::channel(
            endpoint,
            self.inner.opts.tls.as_ref(),
            stele_tls::Kind::Node,
            self.inner.opts.connect_timeout,
        )
        .map_err(|e| Error::invalid_endpoint(endpoint, e))?;
        channels.insert(endpoint.to_string(), ch.clone());
        Ok(self.data_client(ch))
    }

    fn data_client(&self, ch: Channel) -> Data {
        let token = self.token.as_ref().unwrap_or(&self.inner.opts.token);
        DataClient::with_interceptor(ch, token.clone()).max_decoding_message_size(DECODE_BYTES_MAX)
    }

    /// Awaits one call within the request timeout.
    pub(crate) async fn timed<T>(
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

    /// Where to send a tablet's requests: its leader, else the seed node
    /// (which answers or redirects).
    pub(crate) fn endpoint_of<'a>(&'a self, route: &'a Route) -> &'a str {
        if route.leader_endpoint.is_empty() {
            &self.inner.seed
        } else {
            &route.leader_endpoint
        }
    }
}
