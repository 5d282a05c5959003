//! Node-to-node transport: one QUIC connection per node pair, mutual TLS
//! against the cell CA, request/response messages for many Raft groups.
//!
//! ```text
//!  call(peer, Request{group, target_replica, kind, body})
//!    | peer slot: live connection? else dial (one dialer per peer, backoff)
//!    v
//!  one quinn::Connection per node pair
//!    +- control lane (small Control requests of every group): one
//!    |  long-lived bidi stream per calling side, frames matched by id,
//!    |  everything queued written in one write (lane.rs)
//!    +- one bidi stream per call for Bulk and large Control requests
//!       (conn.rs); Control streams prioritised over Bulk
//!    v
//!  remote: accept loop -> hello (cert SAN node id == claimed id) -> serve loop
//!          -> serve_stream: bounded frame read -> Handler::handle(from, req)
//!             or, for a lane-open frame, lane::serve: calls dispatched to
//!             the handler concurrently, answers batched back
//! ```
//!
//! A connection is usable in both directions: a node that accepted a
//! connection from a peer sends its own calls to that peer over it too.
//! When both nodes dial at once, the connection dialed by the smaller node
//! id wins (see `peer::refuse_incoming`); the loser is refused at hello with
//! `RemoteError::Duplicate` and closed, so a pair settles on one connection.
//!
//! A peer's node id is read from its certificate (`node-<id>.stele`) and
//! must equal the id its hello claims; the client side checks the server's
//! certificate against the name of the node it meant to reach. A
//! certificate from another CA fails the handshake: the server counts it in
//! `connections_refused`, the dialer sees the refusal on its hello stream
//! (TLS 1.3 reports it only at first stream use) and fails the call.
//!
//! The wire layout of frames and lanes is in `frame.rs` and `lane.rs`, and
//! in `docs/FORMAT.md` section 7.
//!
//! Every task (accept loop, per-connection serve loop, per-stream handler,
//! each lane's reader and writer) is spawned on the transport's
//! `TaskTracker` and ends on `shutdown`.

pub(crate) mod conn;
mod error;
mod frame;
mod lane;
mod options;
mod peer;
mod resolve;
mod tls;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use quinn::VarInt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use error::{Error, IdentityError, RemoteError, Result, StreamError};
pub use frame::{FrameError, FrameKind, HEADER_BYTES, Header};
pub use options::TransportOptions;
pub use resolve::{Resolve, ResolveFuture, SystemResolver};
pub use tls::ALPN;

use crate::certs::{NodeIdentity, node_dns_name};
use conn::{ReadFail, decode_remote_error, encode_remote_error, read_frame, write_frame};
use peer::{Link, Peer};
use stele_proto::addr::HostPort;

/// Connection close codes (application error codes of QUIC CONNECTION_CLOSE).
const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
const CLOSE_DUPLICATE: VarInt = VarInt::from_u32(1);
const CLOSE_IDENTITY: VarInt = VarInt::from_u32(2);
const CLOSE_SUPERSEDED: VarInt = VarInt::from_u32(3);
const CLOSE_REMOVED: VarInt = VarInt::from_u32(4);
const CLOSE_HELLO: VarInt = VarInt::from_u32(5);

/// Whether a message is latency-sensitive (Raft votes, appends, heartbeats,
/// control RPC) or a bulk transfer (snapshots, segments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    Control,
    Bulk,
}

/// One message to a replica of a Raft group on another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub group: u64,
    pub target_replica: u64,
    pub kind: MsgKind,
    pub body: Bytes,
}

pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, RemoteError>> + Send>>;

/// The receiving side: dispatches a request to the addressed replica, and
/// answers `UnknownGroup`/`UnknownReplica` when it is not hosted here. A
/// returned future may be dropped (cancelled) when the transport shuts down.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, from_node: u64, req: Request) -> HandlerFuture;
}

/// The limits the running tasks need (the identity stays out of `Inner`).
#[derive(Debug, Clone, Copy)]
struct Limits {
    message_bytes_max: u64,
    connect_timeout: Duration,
    request_read_timeout: Duration,
    control_lane_body_bytes_max: u64,
    control_queue_max: usize,
    control_inflight_max: usize,
    backoff_min: Duration,
    backoff_max: Duration,
}

/// Counters as `Transport::stats` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Connections past hello and not yet closed, both directions.
    pub connections_open: u64,
    /// The same, per peer node id: 1 in steady state.
    pub open_per_peer: BTreeMap<u64, u64>,
    pub connections_dialed: u64,
    pub connections_accepted: u64,
    /// Incoming connections refused: failed handshake (e.g. a certificate
    /// from another CA), no node name, a hello that lies or never comes.
    pub connections_refused: u64,
    /// Connections given up at hello because the pair already had one.
    pub connections_duplicate: u64,
    /// Request streams and control lanes opened by this node plus those
    /// served.
    pub streams: u64,
    /// Writes on control lanes, both directions (this node's calls and its
    /// answers to the peer's calls).
    pub control_batches: u64,
    /// Lane-call, lane-ok and lane-err frames those writes carried.
    pub control_messages: u64,
    /// Malformed, truncated, oversized or unexpected frames (either side).
    pub rejected_frames: u64,
    /// Requests answered `UnknownGroup` or `UnknownReplica` by the handler.
    pub unknown_targets: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections_dialed: AtomicU64,
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    connections_duplicate: AtomicU64,
    streams: AtomicU64,
    control_batches: AtomicU64,
    control_messages: AtomicU64,
    rejected_frames: AtomicU64,
    unknown_targets: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

struct Inner {
    node_id: u64,
    /// Random per process, never 0: carried in the hello exchange so a
    /// peer can tell a restarted process from the one it knew.
    boot_id: u64,
    limits: Limits,
    endpoint: quinn::Endpoint,
    tls: tls::Presented,
    handler: Arc<dyn Handler>,
    resolver: Arc<dyn Resolve>,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    /// Every connection past hello and not yet closed: stable id -> peer.
    live: Mutex<HashMap<usize, u64>>,
    stats: Counters,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// A running transport. Dropping it stops its tasks; `shutdown` also waits
/// for them and for the endpoint to go idle.
pub struct Transport {
    inner: Arc<Inner>,
}

impl Transport {
    /// Binds the UDP socket and starts accepting. Must run inside a tokio runtime.
    pub fn bind(opts: TransportOptions, handler: Arc<dyn Handler>) -> Result<Transport> {
        opts.validate()?;
        let mut tc = quinn::TransportConfig::default();
        tc.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(opts.idle_timeout)
                .map_err(|e| Error::Config(format!("idle_timeout: {e}")))?,
        ))
        .keep_alive_interval(Some(opts.keepalive))
        .max_concurrent_bidi_streams(VarInt::from_u32(opts.streams_max))
        .max_concurrent_uni_streams(VarInt::from_u32(0));
        let (tls, server_config) = tls::Presented::new(&opts.identity, Arc::new(tc))?;
        let endpoint = quinn::Endpoint::server(server_config, opts.listen)
            .map_err(|e| Error::io(format!("bind {}", opts.listen), e))?;
        let inner = Arc::new(Inner {
            node_id: opts.node_id,
            boot_id: rand::random::<u64>().max(1),
            limits: Limits {
                message_bytes_max: opts.message_bytes_max,
                connect_timeout: opts.connect_timeout,
                request_read_timeout: opts.request_read_timeout,
                control_lane_body_bytes_max: opts.control_lane_body_bytes_max,
                control_queue_max: opts.control_queue_max,
                control_inflight_max: opts.control_inflight_max,
                backoff_min: opts.reconnect_backoff_min,
                backoff_max: opts.reconnect_backoff_max,
            },
            endpoint,
            tls,
            handler,
            resolver: opts.resolver,
            peers: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            stats: Counters::default(),
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        inner.tasks.spawn(accept_loop(inner.clone()));
        Ok(Transport { inner })
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// Presents `identity` (a rotated certificate, new roots) on every
    /// later connection; open ones keep theirs. An identity of another
    /// node is refused and the current one kept.
    pub fn reload_identity(&self, identity: &NodeIdentity) -> Result<()> {
        self.inner.tls.replace(&self.inner.endpoint, identity)
    }

    /// The serial (lowercase hex) of the certificate new connections present.
    pub fn certificate_serial(&self) -> String {
        self.inner.tls.serial()
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.inner
            .endpoint
            .local_addr()
            .map_err(|e| Error::io("local address", e))
    }

    /// Sets or changes where `node_id` listens. A live connection is kept;
    /// the address (a name: looked up anew) is used for the next dial.
    pub fn set_peer(&self, node_id: u64, addr: impl Into<HostPort>) {
        let peer = self.inner.peer_entry(node_id);
        let mut st = peer.state.lock().unwrap();
        st.addr = Some(addr.into());
        // A new address deserves an immediate try.
        st.next_dial_at = None;
    }

    /// Forgets `node_id` and closes its connection.
    pub fn remove_peer(&self, node_id: u64) {
        let removed = self.inner.peers.lock().unwrap().remove(&node_id);
        if let Some(peer) = removed
            && let Some(link) = peer.state.lock().unwrap().conn.take()
        {
            link.conn.close(CLOSE_REMOVED, b"peer removed");
        }
    }

    /// Sends `req` to the node `peer` and returns its answer. A call to this
    /// node itself goes straight to the handler. A control request up to
    /// `control_lane_body_bytes_max` goes on the connection's control lane,
    /// anything else on a stream of its own. Cancel-safe: dropping the
    /// future forgets a lane call (its answer is dropped when it comes)
    /// or resets the call's stream.
    pub async fn call(&self, peer: u64, req: Request) -> Result<Bytes> {
        let inner = &self.inner;
        if inner.cancel.is_cancelled() {
            return Err(Error::ShutDown);
        }
        let bytes = req.body.len() as u64;
        if bytes > inner.limits.message_bytes_max {
            return Err(Error::TooLarge {
                bytes,
                max_bytes: inner.limits.message_bytes_max,
            });
        }
        if peer == inner.node_id {
            return inner
                .handler
                .handle(peer, req)
                .await
                .map_err(|error| Error::Remote { peer, error });
        }
        let link = inner.connection(peer).await?;
        if req.kind == MsgKind::Control && bytes <= inner.limits.control_lane_body_bytes_max {
            lane::call(inner, peer, &link.conn, &link.lanes, req).await
        } else {
            conn::call_on(inner, peer, &link.conn, req).await
        }
    }

    pub fn stats(&self) -> TransportStats {
        let s = &self.inner.stats;
        let mut open_per_peer = BTreeMap::new();
        let live = self.inner.live.lock().unwrap();
        for peer in live.values() {
            *open_per_peer.entry(*peer).or_insert(0) += 1;
        }
        TransportStats {
            connections_open: live.len() as u64,
            open_per_peer,
            connections_dialed: s.connections_dialed.load(Ordering::Relaxed),
            connections_accepted: s.connections_accepted.load(Ordering::Relaxed),
            connections_refused: s.connections_refused.load(Ordering::Relaxed),
            connections_duplicate: s.connections_duplicate.load(Ordering::Relaxed),
            streams: s.streams.load(Ordering::Relaxed),
            control_batches: s.control_batches.load(Ordering::Relaxed),
            control_messages: s.control_messages.load(Ordering::Relaxed),
            rejected_frames: s.rejected_frames.load(Ordering::Relaxed),
            unknown_targets: s.unknown_targets.load(Ordering::Relaxed),
            bytes_in: s.bytes_in.load(Ordering::Relaxed),
            bytes_out: s.bytes_out.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, closes every connection, cancels in-flight handlers
    /// and waits for all tasks and for the endpoint to go idle (bounded).
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.cancel.cancel();
        inner.endpoint.close(CLOSE_SHUTDOWN, b"shutdown");
        inner.tasks.close();
        inner.tasks.wait().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), inner.endpoint.wait_idle()).await;
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.inner.cancel.cancel();
        self.inner.endpoint.close(CLOSE_SHUTDOWN, b"shutdown");
    }
}

impl Inner {
    fn peer_entry(&self, node_id: u64) -> Arc<Peer> {
        self.peers
            .lock()
            .unwrap()
            .entry(node_id)
            .or_insert_with(|| Arc::new(Peer::new(node_id)))
            .clone()
    }

    /// The live connection to `peer`, dialing it if needed. Only one dial
    /// per peer runs at a time; concurrent callers wait for its outcome.
    async fn connection(self: &Arc<Self>, peer_id: u64) -> Result<Link> {
        let peer = self
            .peers
            .lock()
            .unwrap()
            .get(&peer_id)
            .cloned()
            .ok_or(Error::UnknownPeer { peer: peer_id })?;
        if let Some(link) = peer.live_link() {
            return Ok(link);
        }
        let _dialing = tokio::select! {
            guard = peer.dial_lock.lock() => guard,
            _ = self.cancel.cancelled() => return Err(Error::ShutDown),
        };
        if let Some(link) = peer.live_link() {
            return Ok(link);
        }
        let addr = {
            let mut st = peer.state.lock().unwrap();
            let addr = st.addr.clone();
            let addr = addr.ok_or(Error::UnknownPeer { peer: peer_id })?;
            if let Some(at) = st.next_dial_at {
                let now = Instant::now();
                if at > now {
                    return Err(Error::Unreachable {
                        peer: peer_id,
                        retry_in: at - now,
                    });
                }
            }
            st.dialing = true;
            addr
        };
        let result = tokio::select! {
            r = self.dial(&peer, &addr) => r,
            _ = self.cancel.cancelled() => Err(Error::ShutDown),
        };
        let mut st = peer.state.lock().unwrap();
        st.dialing = false;
        match result {
            Ok(link) => {
                st.backoff = Duration::ZERO;
                st.next_dial_at = None;
                Ok(link)
            }
            Err(e) => {
                st.backoff =
                    (st.backoff * 2).clamp(self.limits.backoff_min, self.limits.backoff_max);
                st.next_dial_at = Some(Instant::now() + st.backoff);
                tracing::debug!(peer = peer_id, %addr, error = %e, backoff = ?st.backoff, "dial failed");
                Err(e)
            }
        }
    }

    /// Handshake + hello. On `Duplicate`, waits for the peer's own
    /// connection to arrive through the accept loop and returns that.
    async fn dial(self: &Arc<Self>, peer: &Arc<Peer>, name: &HostPort) -> Result<Link> {
        let peer_id = peer.id;
        let fail = |reason: String| Error::Connect {
            peer: peer_id,
            reason,
        };
        let deadline = Instant::now() + self.limits.connect_timeout;
        let hello = async {
            let addr = resolve::dial_address(&*self.resolver, &self.endpoint, name).await;
            let addr = addr.map_err(fail)?;
            let connecting = self
                .endpoint
                .connect_with(self.tls.client(), addr, &node_dns_name(peer_id))
                .map_err(|e| fail(e.to_string()))?;
            let conn = connecting
                .await
                .map_err(|e| fail(format!("handshake: {e}")))?;
            // TLS 1.3: a client certificate the peer refuses shows up here,
            // on the first stream, not in the handshake above.
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| fail(format!("hello: {e}")))?;
            let header = Header {
                kind: FrameKind::Hello,
                group: self.node_id,
                target: self.boot_id,
                length: 0,
            };
            write_frame(&mut send, header, Bytes::new(), self)
                .await
                .map_err(|e| fail(format!("hello: {e}")))?;
            let answer = read_frame(&mut recv, HELLO_BODY_MAX, self).await;
            Ok::<_, Error>((conn, answer))
        };
        let (conn, answer) = tokio::time::timeout_at(deadline, hello)
            .await
            .map_err(|_| fail("timed out".into()))??;
        let (head, body) = match answer {
            Ok(frame) => frame,
            Err(ReadFail::Stream(reason)) => return Err(fail(format!("hello: {reason}"))),
            Err(ReadFail::Frame(e)) => {
                self.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                conn.close(CLOSE_HELLO, b"bad hello answer");
                return Err(fail(format!("hello answer: {e}")));
            }
        };
        match head.kind {
            FrameKind::HelloOk => {
                self.stats
                    .connections_dialed
                    .fetch_add(1, Ordering::Relaxed);
                Ok(self.install(peer, conn, true, head.target))
            }
            FrameKind::Err if matches!(decode_remote_error(&body), Ok(RemoteError::Duplicate)) => {
                self.stats
                    .connections_duplicate
                    .fetch_add(1, Ordering::Relaxed);
                conn.close(CLOSE_DUPLICATE, b"duplicate");
                peer.wait_installed(deadline)
                    .await
                    .ok_or_else(|| fail("peer's own connection did not arrive".into()))
            }
            FrameKind::Err => {
                conn.close(CLOSE_HELLO, b"hello refused");
                Err(match decode_remote_error(&body) {
                    Ok(error) => Error::Remote {
                        peer: peer_id,
                        error,
                    },
                    Err(e) => fail(e.to_string()),
                })
            }
            other => {
                self.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                conn.close(CLOSE_HELLO, b"bad hello answer");
                Err(fail(format!("hello answered with {other:?}")))
            }
        }
    }

    /// Makes `conn` the pair's connection and starts serving the peer's
    /// requests on it. The connection it replaces, if any, is closed.
    fn install(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        conn: quinn::Connection,
        dialed_by_us: bool,
        remote_boot: u64,
    ) -> Link {
        let link = Link::new(conn.clone(), dialed_by_us, remote_boot);
        let old = peer.state.lock().unwrap().conn.replace(link.clone());
        self.register(peer, conn, old);
        link
    }

    fn register(self: &Arc<Self>, peer: &Arc<Peer>, conn: quinn::Connection, old: Option<Link>) {
        if let Some(old) = old
            && old.conn.stable_id() != conn.stable_id()
        {
            old.conn.close(CLOSE_SUPERSEDED, b"superseded");
        }
        self.live.lock().unwrap().insert(conn.stable_id(), peer.id);
        peer.installed.notify_waiters();
        self.tasks
            .spawn(serve_connection(self.clone(), peer.clone(), conn));
    }
}

/// Largest hello or hello answer body (an encoded `RemoteError`).
const HELLO_BODY_MAX: u64 = 4096;

async fn accept_loop(inner: Arc<Inner>) {
    loop {
        let incoming = tokio::select! {
            incoming = inner.endpoint.accept() => incoming,
            _ = inner.cancel.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let task = accept_one(inner.clone(), incoming);
        let cancel = inner.cancel.clone();
        inner.tasks.spawn(async move {
            tokio::select! {
                () = task => {}
                _ = cancel.cancelled() => {}
            }
        });
    }
}

/// Handshake, identity and hello of one incoming connection.
async fn accept_one(inner: Arc<Inner>, incoming: quinn::Incoming) {
    let refused = |why: &str, remote: SocketAddr| {
        inner
            .stats
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(%remote, why, "refused a node connection");
    };
    let remote = incoming.remote_address();
    let conn = match tokio::time::timeout(inner.limits.connect_timeout, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return refused(&format!("handshake: {e}"), remote),
        Err(_) => return refused("handshake timed out", remote),
    };
    let peer_id = match tls::peer_node_id(&conn) {
        Ok(id) => id,
        Err(e) => {
            conn.close(CLOSE_IDENTITY, b"no node name");
            return refused(&e.to_string(), remote);
        }
    };
    let hello = tokio::time::timeout(inner.limits.connect_timeout, async {
        let (send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
        let frame = read_frame(&mut recv, HELLO_BODY_MAX, &inner).await;
        Ok::<_, String>((send, frame))
    })
    .await;
    let (mut send, frame) = match hello {
        Ok(Ok(x)) => x,
        Ok(Err(reason)) => return refused(&format!("hello: {reason}"), remote),
        Err(_) => {
            conn.close(CLOSE_HELLO, b"no hello");
            return refused("no hello in time", remote);
        }
    };
    let head = match frame {
        Ok((head, _)) if head.kind == FrameKind::Hello => head,
        Ok((head, _)) => {
            inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            conn.close(CLOSE_HELLO, b"expected hello");
            return refused(&format!("{:?} frame instead of hello", head.kind), remote);
        }
        Err(ReadFail::Frame(e)) => {
            inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            conn.close(CLOSE_HELLO, b"bad hello");
            return refused(&format!("bad hello: {e}"), remote);
        }
        Err(ReadFail::Stream(reason)) => return refused(&format!("hello: {reason}"), remote),
    };
    let answer_err = |error: RemoteError| {
        let body = encode_remote_error(&error);
        let header = Header {
            kind: FrameKind::Err,
            group: 0,
            target: 0,
            length: body.len() as u32,
        };
        (header, body)
    };
    if head.group != peer_id || peer_id == inner.node_id {
        let reason = format!(
            "hello claims node {} but the certificate names node {peer_id}",
            head.group
        );
        refused(&reason, remote);
        let (h, b) = answer_err(RemoteError::Identity { reason });
        let _ = write_frame(&mut send, h, b, &inner).await;
        linger_then_close(&conn, inner.limits.connect_timeout, CLOSE_IDENTITY).await;
        return;
    }
    let peer = inner.peer_entry(peer_id);
    // Decide and install under one lock so that a dial finishing on this
    // side cannot slip between the two.
    let decision = {
        let mut st = peer.state.lock().unwrap();
        let live_dialed_by_us = st
            .conn
            .as_ref()
            .is_some_and(|l| l.dialed_by_us && l.conn.close_reason().is_none());
        let restarted = st.conn.as_ref().is_some_and(|l| {
            l.remote_boot != 0 && head.target != 0 && l.remote_boot != head.target
        });
        if restarted {
            tracing::info!(
                peer = peer_id,
                "peer restarted: its new connection replaces the old one"
            );
        }
        if peer::refuse_incoming(
            inner.node_id,
            peer_id,
            st.dialing,
            live_dialed_by_us,
            restarted,
        ) {
            None
        } else {
            Some(st.conn.replace(Link::new(conn.clone(), false, head.target)))
        }
    };
    match decision {
        None => {
            inner
                .stats
                .connections_duplicate
                .fetch_add(1, Ordering::Relaxed);
            let (h, b) = answer_err(RemoteError::Duplicate);
            let _ = write_frame(&mut send, h, b, &inner).await;
            linger_then_close(&conn, inner.limits.connect_timeout, CLOSE_DUPLICATE).await;
        }
        Some(old) => {
            inner
                .stats
                .connections_accepted
                .fetch_add(1, Ordering::Relaxed);
            inner.register(&peer, conn, old);
            let header = Header {
                kind: FrameKind::HelloOk,
                group: inner.node_id,
                target: inner.boot_id,
                length: 0,
            };
            let _ = write_frame(&mut send, header, Bytes::new(), &inner).await;
        }
    }
}

/// Lets the dialer read our refusal before the connection goes: it closes
/// the connection itself on reading it; we close after a bound regardless.
async fn linger_then_close(conn: &quinn::Connection, bound: Duration, code: VarInt) {
    let _ = tokio::time::timeout(bound, conn.closed()).await;
    conn.close(code, b"refused");
}

/// Accepts the peer's request streams on one connection until it closes,
/// then forgets the connection.
async fn serve_connection(inner: Arc<Inner>, peer: Arc<Peer>, conn: quinn::Connection) {
    loop {
        let accepted = tokio::select! {
            accepted = conn.accept_bi() => accepted,
            _ = inner.cancel.cancelled() => break,
        };
        match accepted {
            Ok((send, recv)) => {
                let stream = conn::serve_stream(inner.clone(), peer.id, send, recv);
                inner.tasks.spawn(stream);
            }
            Err(e) => {
                tracing::debug!(peer = peer.id, error = %e, "connection ended");
                break;
            }
        }
    }
    let id = conn.stable_id();
    inner.live.lock().unwrap().remove(&id);
    let mut st = peer.state.lock().unwrap();
    if st.conn.as_ref().is_some_and(|l| l.conn.stable_id() == id) {
        st.conn = None;
    }
}
