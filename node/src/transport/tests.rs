//! Transport tests over real UDP sockets on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::RngCore;

use super::frame::{FrameKind, HEADER_BYTES, Header, LANE_VERSION};
use super::*;
use crate::certs::{CellCa, NodeIdentity};

/// Hosts groups `0..groups`; group g's replica on node n is `g * 1000 + n`.
/// Control requests are echoed; bulk requests answer their length. A
/// control request for the `slow` group takes its time, logging
/// "slow start" when it begins.
struct TestHandler {
    node: u64,
    groups: u64,
    log: Arc<Mutex<Vec<String>>>,
    slow: Option<(u64, Duration)>,
}

fn replica(group: u64, node: u64) -> u64 {
    group * 1000 + node
}

impl Handler for TestHandler {
    fn handle(&self, _from_node: u64, req: Request) -> HandlerFuture {
        let (node, groups, log, slow) = (self.node, self.groups, self.log.clone(), self.slow);
        Box::pin(async move {
            if req.group >= groups {
                return Err(RemoteError::UnknownGroup { group: req.group });
            }
            if req.target_replica != replica(req.group, node) {
                return Err(RemoteError::UnknownReplica {
                    group: req.group,
                    replica: req.target_replica,
                });
            }
            match req.kind {
                MsgKind::Control => {
                    if let Some((group, pause)) = slow
                        && group == req.group
                    {
                        log.lock().unwrap().push("slow start".into());
                        tokio::time::sleep(pause).await;
                    }
                    Ok(req.body)
                }
                MsgKind::Bulk => {
                    log.lock().unwrap().push("bulk received".into());
                    Ok(Bytes::copy_from_slice(
                        &(req.body.len() as u64).to_le_bytes(),
                    ))
                }
            }
        })
    }
}

fn options(identity: NodeIdentity, listen: SocketAddr) -> TransportOptions {
    let mut o = TransportOptions::new(identity.node_id(), listen, identity);
    o.connect_timeout = Duration::from_secs(2);
    o.reconnect_backoff_min = Duration::from_millis(20);
    o.reconnect_backoff_max = Duration::from_millis(200);
    o
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn bind(opts: TransportOptions, groups: u64) -> (Transport, Arc<Mutex<Vec<String>>>) {
    bind_slow(opts, groups, None)
}

/// `bind` with a handler that is slow for one group.
fn bind_slow(
    opts: TransportOptions,
    groups: u64,
    slow: Option<(u64, Duration)>,
) -> (Transport, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let handler = Arc::new(TestHandler {
        node: opts.node_id,
        groups,
        log: log.clone(),
        slow,
    });
    (Transport::bind(opts, handler).unwrap(), log)
}

/// `n` transports of one ephemeral cell, each knowing every other's address.
fn cell(n: u64, groups: u64) -> (CellCa, Vec<Arc<Transport>>) {
    let (ca, ids) = NodeIdentity::ephemeral_cell(n).unwrap();
    let ts: Vec<Arc<Transport>> = ids
        .into_iter()
        .map(|id| Arc::new(bind(options(id, any_port()), groups).0))
        .collect();
    for a in &ts {
        for b in &ts {
            if a.node_id() != b.node_id() {
                a.set_peer(b.node_id(), b.local_addr().unwrap());
            }
        }
    }
    (ca, ts)
}

fn control(group: u64, node: u64, body: &'static [u8]) -> Request {
    Request {
        group,
        target_replica: replica(group, node),
        kind: MsgKind::Control,
        body: Bytes::from_static(body),
    }
}

async fn shutdown_all(ts: &[Arc<Transport>]) {
    for t in ts {
        t.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_pair_whatever_the_group_count() {
    const GROUPS: u64 = 1000;
    let (_ca, ts) = cell(3, GROUPS);
    let mut calls = Vec::new();
    for group in 0..GROUPS {
        for a in 0..3 {
            for b in 0..3 {
                if a == b {
                    continue;
                }
                let from = ts[a].clone();
                let to = ts[b].node_id();
                calls.push(async move {
                    let body = Bytes::from(format!("g{group} {a}->{b}"));
                    let req = Request {
                        group,
                        target_replica: replica(group, to),
                        kind: MsgKind::Control,
                        body: body.clone(),
                    };
                    (from.call(to, req).await, body)
                });
            }
        }
    }
    let results = futures::future::join_all(calls).await;
    assert_eq!(results.len(), 6000);
    for (got, want) in results {
        assert_eq!(got.unwrap(), want);
    }
    for t in &ts {
        let stats = t.stats();
        let others: BTreeMap<u64, u64> = ts
            .iter()
            .filter(|o| o.node_id() != t.node_id())
            .map(|o| (o.node_id(), 1))
            .collect();
        assert_eq!(
            stats.open_per_peer,
            others,
            "node {}: {stats:?}",
            t.node_id()
        );
        assert_eq!(stats.connections_open, 2);
        assert_eq!(stats.rejected_frames, 0);
    }
    // Each pair was set up exactly once: one dial on one side, one accept
    // on the other.
    let dialed: u64 = ts.iter().map(|t| t.stats().connections_dialed).sum();
    let accepted: u64 = ts.iter().map(|t| t.stats().connections_accepted).sum();
    assert_eq!((dialed, accepted), (3, 3));
    shutdown_all(&ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_remote_errors_and_calls_to_self() {
    let (_ca, ts) = cell(2, 10);
    let err = ts[0].call(2, control(10, 2, b"x")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Remote {
                peer: 2,
                error: RemoteError::UnknownGroup { group: 10 }
            }
        ),
        "{err:?}"
    );
    let err = ts[0].call(2, control(3, 1, b"x")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Remote {
                error: RemoteError::UnknownReplica { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(ts[1].stats().unknown_targets, 2);
    assert_eq!(ts[0].call(1, control(3, 1, b"me")).await.unwrap(), "me");
    assert!(matches!(
        ts[0].call(9, control(3, 9, b"x")).await,
        Err(Error::UnknownPeer { peer: 9 })
    ));
    ts[0].remove_peer(2);
    assert!(matches!(
        ts[0].call(2, control(3, 2, b"x")).await,
        Err(Error::UnknownPeer { peer: 2 })
    ));
    shutdown_all(&ts).await;
    assert!(matches!(
        ts[0].call(1, control(3, 1, b"x")).await,
        Err(Error::ShutDown)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused() {
    let (ca, ts) = cell(2, 10);
    let (_other_ca, other_ids) = NodeIdentity::ephemeral_cell(3).unwrap();
    // Node 3 of another cell, trusting our CA so that it accepts our server
    // certificate: only our server's check of its certificate stands in its way.
    let rogue_id = other_ids[2].clone().with_roots(vec![ca.cert_der().clone()]);
    let (rogue, _) = bind(options(rogue_id, any_port()), 10);
    rogue.set_peer(1, ts[0].local_addr().unwrap());
    let err = rogue
        .call(1, control(3, 1, b"let me in"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { peer: 1, .. }), "{err:?}");
    // The client hears of the refusal before the server's accept task has
    // counted it: wait for the count rather than race it.
    let mut stats = ts[0].stats();
    for _ in 0..100 {
        if stats.connections_refused >= 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        stats = ts[0].stats();
    }
    assert_eq!(stats.connections_refused, 1, "{stats:?}");
    assert_eq!(stats.connections_open, 0);
    // The server goes on serving its cell.
    assert_eq!(ts[1].call(1, control(3, 1, b"hi")).await.unwrap(), "hi");
    assert_eq!(ts[0].stats().open_per_peer, BTreeMap::from([(2, 1)]));
    rogue.shutdown().await;
    shutdown_all(&ts).await;
}

/// A hand-driven client holding node 2's valid certificate.
struct RawClient {
    _endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl RawClient {
    async fn connect(identity: &NodeIdentity, server: SocketAddr, claim: u64) -> (Self, Header) {
        let tc = Arc::new(quinn::TransportConfig::default());
        let cfg = tls::client_config(identity, tc).unwrap();
        let endpoint = quinn::Endpoint::client(any_port()).unwrap();
        let conn = endpoint
            .connect_with(cfg, server, "node-1.stele")
            .unwrap()
            .await
            .unwrap();
        let client = RawClient {
            _endpoint: endpoint,
            conn,
        };
        let hello = Header {
            kind: FrameKind::Hello,
            group: claim,
            target: 0,
            length: 0,
        };
        let answer = client.exchange(&hello.encode()).await;
        (client, answer.0)
    }

    /// Sends `bytes` on a new stream, finishes it, returns the answer.
    async fn exchange(&self, bytes: &[u8]) -> (Header, Bytes) {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        // The server may stop reading early (oversized frame); that is fine.
        let _ = send.write_all(bytes).await;
        let _ = send.finish();
        let answer = recv.read_to_end(1 << 20).await.unwrap();
        let mut head = [0u8; HEADER_BYTES];
        head.copy_from_slice(&answer[..HEADER_BYTES]);
        let header = Header::decode(&head, 1 << 20).unwrap();
        (header, Bytes::copy_from_slice(&answer[HEADER_BYTES..]))
    }
}

/// An `Err` body that is not a CBOR `RemoteError` is the peer breaking the
/// frame protocol, a `FrameError`, not a refusal.
#[test]
fn an_undecodable_error_body_is_a_frame_error() {
    let refusal = RemoteError::UnknownGroup { group: 3 };
    assert_eq!(
        conn::decode_remote_error(&conn::encode_remote_error(&refusal)).unwrap(),
        refusal
    );
    match conn::decode_remote_error(b"\xff not cbor") {
        Err(FrameError::ErrorBody { reason }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
}

fn remote_error(answer: (Header, Bytes)) -> RemoteError {
    assert_eq!(answer.0.kind, FrameKind::Err);
    conn::decode_remote_error(&answer.1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_are_rejected_and_counted() {
    const MAX: u64 = 1 << 20;
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let mut o1 = options(ids[0].clone(), any_port());
    o1.message_bytes_max = MAX;
    let (server, _) = bind(o1, 10);
    let addr = server.local_addr().unwrap();

    // A hello that claims another node's id is refused.
    let (_liar, answer) = RawClient::connect(&ids[1], addr, 7).await;
    assert_eq!(answer.kind, FrameKind::Err);
    assert_eq!(server.stats().connections_refused, 1);

    let (raw, answer) = RawClient::connect(&ids[1], addr, 2).await;
    assert_eq!(answer.kind, FrameKind::HelloOk);
    let header = |kind, group, length| {
        Header {
            kind,
            group,
            target: replica(group, 1),
            length,
        }
        .encode()
    };

    let mut random = vec![0u8; 500];
    rand::rng().fill_bytes(&mut random);
    random[0] = 0xFF; // never the magic
    let mut truncated = header(FrameKind::Control, 3, 100).to_vec();
    truncated.extend_from_slice(&[1; 10]);
    let oversized = header(FrameKind::Bulk, 3, MAX as u32 + 1).to_vec();
    let mut trailing = header(FrameKind::Control, 3, 2).to_vec();
    trailing.extend_from_slice(b"ok!");
    let wrong_kind = header(FrameKind::Hello, 3, 0).to_vec();
    let short = b"SN".to_vec();

    let cases: [(&str, Vec<u8>); 6] = [
        ("random", random),
        ("truncated", truncated),
        ("oversized", oversized),
        ("trailing", trailing),
        ("wrong kind", wrong_kind),
        ("short header", short),
    ];
    for (i, (name, bytes)) in cases.iter().enumerate() {
        let error = remote_error(raw.exchange(bytes).await);
        match (*name, &error) {
            ("oversized", RemoteError::TooLarge { bytes, max_bytes }) => {
                assert_eq!((*bytes, *max_bytes), (MAX + 1, MAX));
            }
            ("oversized", _) => panic!("oversized: {error:?}"),
            (_, RemoteError::Protocol { .. }) => {}
            _ => panic!("{name}: {error:?}"),
        }
        assert_eq!(server.stats().rejected_frames, i as u64 + 1, "{name}");
    }

    // A well-formed frame for a group not hosted here: answered, counted.
    let mut unknown = header(FrameKind::Control, 99, 1).to_vec();
    unknown.push(0);
    assert_eq!(
        remote_error(raw.exchange(&unknown).await),
        RemoteError::UnknownGroup { group: 99 }
    );
    assert_eq!(server.stats().unknown_targets, 1);

    // The same connection still works, and so does a normal transport.
    let mut good = header(FrameKind::Control, 3, 2).to_vec();
    good.extend_from_slice(b"ok");
    let (head, body) = raw.exchange(&good).await;
    assert_eq!((head.kind, &body[..]), (FrameKind::Ok, &b"ok"[..]));
    let (client, _) = bind(options(ids[1].clone(), any_port()), 10);
    client.set_peer(1, addr);
    assert_eq!(
        client.call(1, control(4, 1, b"fine")).await.unwrap(),
        "fine"
    );
    assert_eq!(server.stats().rejected_frames, 6);
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_peer_comes_back() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let (t2, _) = bind(options(ids[1].clone(), any_port()), 10);
    let addr2 = t2.local_addr().unwrap();
    t1.set_peer(2, addr2);
    assert_eq!(t1.call(2, control(1, 2, b"a")).await.unwrap(), "a");
    t2.shutdown().await;
    drop(t2);
    assert!(t1.call(2, control(1, 2, b"b")).await.is_err());

    // Same address again; the socket may take a moment to be released.
    let mut rebound = None;
    for _ in 0..50 {
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler = Arc::new(TestHandler {
            node: 2,
            groups: 10,
            log,
            slow: None,
        });
        match Transport::bind(options(ids[1].clone(), addr2), handler) {
            Ok(t) => {
                rebound = Some(t);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let t2 = rebound.expect("rebind the same address");
    let mut answered = None;
    for _ in 0..100 {
        match t1.call(2, control(1, 2, b"c")).await {
            Ok(body) => {
                answered = Some(body);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(answered.expect("calls succeed again"), "c");
    assert_eq!(t1.stats().open_per_peer, BTreeMap::from([(2, 1)]));
    t1.shutdown().await;
    t2.shutdown().await;
}

/// A peer that restarted (a new process: another boot id) while the
/// smaller id's connection to its predecessor still looks live, as after a
/// SIGKILL (no close, and no reset the old connection would accept): the
/// smaller id takes the new process's connection at once instead of
/// refusing it until its old one idles out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_accepted_while_its_old_connection_looks_live() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let (t2, _) = bind(options(ids[1].clone(), any_port()), 10);
    t1.set_peer(2, t2.local_addr().unwrap());
    assert_eq!(t1.call(2, control(1, 2, b"a")).await.unwrap(), "a");
    // The successor of node 2 (the old one is left running, silent to us:
    // its connection from node 1 stays open).
    let (t2b, _) = bind(options(ids[1].clone(), any_port()), 10);
    t2b.set_peer(1, t1.local_addr().unwrap());
    let started = std::time::Instant::now();
    let answer = t2b.call(1, control(1, 1, b"b")).await;
    assert_eq!(
        answer.expect("node 1 takes the new process's connection"),
        "b"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // Node 1 now talks to the new process on that connection.
    t1.set_peer(2, t2b.local_addr().unwrap());
    assert_eq!(t1.call(2, control(1, 2, b"c")).await.unwrap(), "c");
    assert_eq!(t1.stats().open_per_peer, BTreeMap::from([(2, 1)]));
    t1.shutdown().await;
    t2.shutdown().await;
    t2b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_does_not_block_control() {
    const BULK: usize = 32 << 20;
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let (t2, log) = bind(options(ids[1].clone(), any_port()), 10);
    t1.set_peer(2, t2.local_addr().unwrap());
    let t1 = Arc::new(t1);
    // Connect first so that the bulk transfer's progress can be observed.
    assert_eq!(t1.call(2, control(1, 2, b"warm")).await.unwrap(), "warm");
    let conn = t1.inner.peers.lock().unwrap()[&2].live_link().unwrap().conn;
    let sent_before = conn.stats().udp_tx.bytes;

    let bulk = {
        let t1 = t1.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let req = Request {
                group: 2,
                target_replica: replica(2, 2),
                kind: MsgKind::Bulk,
                body: Bytes::from(vec![7u8; BULK]),
            };
            let answer = t1.call(2, req).await;
            log.lock().unwrap().push("bulk answered".into());
            answer
        })
    };
    // Wait until the bulk transfer is under way (1 MiB on the wire).
    while conn.stats().udp_tx.bytes < sent_before + (1 << 20) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for i in 0..10 {
        assert_eq!(t1.call(2, control(3, 2, b"ctl")).await.unwrap(), "ctl");
        log.lock().unwrap().push(format!("control {i}"));
    }
    let answer = bulk.await.unwrap().unwrap();
    assert_eq!(answer[..], (BULK as u64).to_le_bytes());
    let log = log.lock().unwrap().clone();
    let bulk_at = log.iter().position(|e| e == "bulk received").unwrap();
    let controls_done = log.iter().position(|e| e == "control 9").unwrap();
    assert!(controls_done < bulk_at, "{log:?}");
    t1.shutdown().await;
    t2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_are_validated() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let mut o = options(ids[0].clone(), any_port());
    o.node_id = 2;
    assert!(matches!(o.validate(), Err(Error::Config(_))));
    let mut o = options(ids[0].clone(), any_port());
    o.message_bytes_max = u64::from(u32::MAX) + 1;
    assert!(matches!(o.validate(), Err(Error::Config(_))));
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let err = t1
        .call(
            2,
            Request {
                body: Bytes::from(vec![0; (64 << 20) + 1]),
                ..control(1, 2, b"")
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");
    t1.shutdown().await;
}

/// Polls `cond` until it holds; panics after 10 s.
async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The lanes of `t`'s live connection to `peer`.
fn lanes(t: &Transport, peer: u64) -> Arc<lane::Lanes> {
    t.inner.peers.lock().unwrap()[&peer]
        .live_link()
        .unwrap()
        .lanes
}

fn count(log: &Mutex<Vec<String>>, entry: &str) -> usize {
    log.lock().unwrap().iter().filter(|e| *e == entry).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_calls_to_one_peer_share_one_lane_and_are_batched() {
    const GROUPS: u64 = 1000;
    let (_ca, ts) = cell(2, GROUPS);
    // Open the lane first, so that the calls below queue up behind the
    // writer rather than behind the lane's opening.
    assert_eq!(ts[0].call(2, control(0, 2, b"warm")).await.unwrap(), "warm");
    let calls = (0..GROUPS).map(|group| {
        let t = &ts[0];
        async move {
            let body = Bytes::from(format!("group {group}"));
            let req = Request {
                group,
                target_replica: replica(group, 2),
                kind: MsgKind::Control,
                body: body.clone(),
            };
            (t.call(2, req).await, body)
        }
    });
    for (got, want) in futures::future::join_all(calls).await {
        assert_eq!(got.unwrap(), want);
    }
    let (caller, answerer) = (ts[0].stats(), ts[1].stats());
    // Every call and every answer went over the one lane each way.
    assert_eq!(caller.control_messages, GROUPS + 1, "{caller:?}");
    assert_eq!(answerer.control_messages, GROUPS + 1, "{answerer:?}");
    assert_eq!((caller.streams, answerer.streams), (1, 1));
    eprintln!(
        "calls: {} in {} writes; answers: {} in {} writes",
        caller.control_messages,
        caller.control_batches,
        answerer.control_messages,
        answerer.control_batches
    );
    assert!(
        caller.control_messages > caller.control_batches,
        "no two calls shared a write: {caller:?}"
    );
    assert_eq!(caller.rejected_frames + answerer.rejected_frames, 0);
    shutdown_all(&ts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_holds_up_no_other_group() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let slow = Some((1, Duration::from_secs(2)));
    let (t2, log2) = bind_slow(options(ids[1].clone(), any_port()), 10, slow);
    t1.set_peer(2, t2.local_addr().unwrap());
    let t1 = Arc::new(t1);
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let slow_call = {
        let (t1, done) = (t1.clone(), done.clone());
        tokio::spawn(async move {
            let answer = t1.call(2, control(1, 2, b"slow")).await;
            done.send(("group 1", answer)).unwrap();
        })
    };
    wait_for("the slow handler to start", || {
        count(&log2, "slow start") == 1
    })
    .await;
    let answer = t1.call(2, control(2, 2, b"fast")).await;
    done.send(("group 2", answer)).unwrap();
    let (first, answer) = finished.recv().await.unwrap();
    assert_eq!((first, answer.unwrap()), ("group 2", Bytes::from("fast")));
    let (second, answer) = finished.recv().await.unwrap();
    assert_eq!((second, answer.unwrap()), ("group 1", Bytes::from("slow")));
    slow_call.await.unwrap();
    // Both calls shared the lane.
    assert_eq!(t1.stats().streams, 1);
    t1.shutdown().await;
    t2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_control_call_is_forgotten_and_its_late_answer_dropped() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let slow = Some((1, Duration::from_millis(500)));
    let (t2, log2) = bind_slow(options(ids[1].clone(), any_port()), 10, slow);
    t1.set_peer(2, t2.local_addr().unwrap());
    assert_eq!(t1.call(2, control(2, 2, b"warm")).await.unwrap(), "warm");
    let lanes = lanes(&t1, 2);
    let call = t1.call(2, control(1, 2, b"late"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err()
    );
    assert_eq!(count(&log2, "slow start"), 1);
    assert_eq!(lanes.waiting_calls(), 0, "the dropped call left its entry");
    // The answer still comes (the answering side cannot know) and goes.
    wait_for("the late answer", || t2.stats().control_messages == 2).await;
    assert_eq!(t1.call(2, control(2, 2, b"after")).await.unwrap(), "after");
    let (s1, s2) = (t1.stats(), t2.stats());
    assert_eq!((s1.rejected_frames, s2.rejected_frames), (0, 0));
    assert_eq!(s1.streams, 1, "the lane survived: {s1:?}");
    assert_eq!(lanes.waiting_calls(), 0);
    t1.shutdown().await;
    t2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_control_calls_fail_when_the_peer_shuts_down() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let slow = Some((1, Duration::from_secs(600)));
    let (t2, log2) = bind_slow(options(ids[1].clone(), any_port()), 10, slow);
    t1.set_peer(2, t2.local_addr().unwrap());
    let t1 = Arc::new(t1);
    assert_eq!(t1.call(2, control(2, 2, b"warm")).await.unwrap(), "warm");
    let lanes = lanes(&t1, 2);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let t1 = t1.clone();
            tokio::spawn(async move { t1.call(2, control(1, 2, b"never")).await })
        })
        .collect();
    wait_for("five slow handlers", || count(&log2, "slow start") == 5).await;
    assert_eq!(lanes.waiting_calls(), 5);
    t2.shutdown().await;
    for call in calls {
        let answer = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("a waiting call hung after its peer shut down")
            .unwrap();
        assert!(
            matches!(answer, Err(Error::ConnectionLost { peer: 2, .. })),
            "{answer:?}"
        );
    }
    assert_eq!(lanes.waiting_calls(), 0);
    t1.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_control_request_takes_a_stream_of_its_own() {
    let (_ca, ts) = cell(2, 10);
    let big = Bytes::from(vec![1u8; (64 << 10) + 1]);
    let req = Request {
        body: big.clone(),
        ..control(1, 2, b"")
    };
    assert_eq!(ts[0].call(2, req).await.unwrap(), big);
    let s = ts[0].stats();
    assert_eq!((s.streams, s.control_messages), (1, 0), "{s:?}");
    assert_eq!(
        ts[0].call(2, control(1, 2, b"small")).await.unwrap(),
        "small"
    );
    let s = ts[0].stats();
    assert_eq!((s.streams, s.control_messages), (2, 1), "{s:?}");
    shutdown_all(&ts).await;
}

/// One frame as a hand-driven peer sees it.
#[derive(Debug)]
struct RawFrame {
    kind: FrameKind,
    group: u64,
    id: u64,
    body: Bytes,
}

/// A frame in the lane layout of `docs/FORMAT.md`: header, then the id
/// for lane-call/ok/err, then the body.
fn lane_frame(kind: FrameKind, group: u64, target: u64, id: u64, body: &[u8]) -> Vec<u8> {
    let header = Header {
        kind,
        group,
        target,
        length: body.len() as u32,
    };
    let mut out = header.encode().to_vec();
    if kind.carries_id() {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

fn lane_open(version: u8) -> Vec<u8> {
    lane_frame(FrameKind::LaneOpen, 0, 0, 0, &[version])
}

fn lane_call(group: u64, id: u64, body: &[u8]) -> Vec<u8> {
    lane_frame(FrameKind::LaneCall, group, replica(group, 1), id, body)
}

fn parse_frames(mut bytes: &[u8]) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let head: &[u8; HEADER_BYTES] = bytes[..HEADER_BYTES].try_into().unwrap();
        let header = Header::decode(head, 1 << 20).unwrap();
        let mut at = HEADER_BYTES;
        let mut id = 0;
        if header.kind.carries_id() {
            id = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            at += 8;
        }
        let end = at + header.length as usize;
        frames.push(RawFrame {
            kind: header.kind,
            group: header.group,
            id,
            body: Bytes::copy_from_slice(&bytes[at..end]),
        });
        bytes = &bytes[end..];
    }
    frames
}

impl RawClient {
    /// Sends `bytes` on a new stream, finishes it, returns the frames of
    /// the answer.
    async fn lane_exchange(&self, bytes: &[u8]) -> Vec<RawFrame> {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        // The server may stop reading early (a bad frame); that is fine.
        let _ = send.write_all(bytes).await;
        let _ = send.finish();
        parse_frames(&recv.read_to_end(1 << 20).await.unwrap())
    }
}

/// The error of a lane's closing `err` frame.
fn lane_refusal(frames: &[RawFrame]) -> RemoteError {
    let last = frames.last().expect("an answer");
    assert_eq!(last.kind, FrameKind::Err, "{frames:?}");
    conn::decode_remote_error(&last.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_on_a_control_lane_are_rejected_and_counted() {
    const MAX: u64 = 1 << 20;
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let mut o1 = options(ids[0].clone(), any_port());
    o1.message_bytes_max = MAX;
    let (server, _) = bind(o1, 10);
    let addr = server.local_addr().unwrap();
    let (raw, answer) = RawClient::connect(&ids[1], addr, 2).await;
    assert_eq!(answer.kind, FrameKind::HelloOk);

    // A well-formed lane: both calls answered by id, in one stream.
    let mut good = lane_open(LANE_VERSION);
    good.extend(lane_call(3, 7, b"seven"));
    good.extend(lane_call(4, 9, b"nine"));
    let frames = raw.lane_exchange(&good).await;
    let mut answers: Vec<_> = frames
        .iter()
        .map(|f| (f.kind, f.group, f.id, f.body.clone()))
        .collect();
    answers.sort_by_key(|a| a.2);
    assert_eq!(
        answers,
        [
            (FrameKind::LaneOk, 3, 7, Bytes::from("seven")),
            (FrameKind::LaneOk, 4, 9, Bytes::from("nine")),
        ]
    );

    let with_open = |bytes: &[u8]| {
        let mut out = lane_open(LANE_VERSION);
        out.extend_from_slice(bytes);
        out
    };
    let mut random = vec![0u8; 500];
    rand::rng().fill_bytes(&mut random);
    random[0] = 0xFF; // never the magic
    let oversized = Header {
        kind: FrameKind::LaneCall,
        group: 3,
        target: replica(3, 1),
        length: MAX as u32 + 1,
    }
    .encode();
    let mut truncated = lane_call(3, 1, b"whole");
    truncated.extend_from_slice(&lane_call(3, 2, &[1; 100])[..HEADER_BYTES + 8 + 10]);
    let answer_kind = lane_frame(FrameKind::LaneOk, 3, replica(3, 1), 1, b"x");
    let plain_control = Header {
        kind: FrameKind::Control,
        group: 3,
        target: replica(3, 1),
        length: 0,
    }
    .encode();
    let cases: [(&str, Vec<u8>); 6] = [
        ("random", with_open(&random)),
        ("oversized", with_open(&oversized)),
        ("truncated", with_open(&truncated)),
        ("answer kind", with_open(&answer_kind)),
        ("plain control frame", with_open(&plain_control)),
        ("lane version 9", lane_open(9)),
    ];
    for (i, (name, bytes)) in cases.iter().enumerate() {
        let frames = raw.lane_exchange(bytes).await;
        let error = lane_refusal(&frames);
        match (*name, &error) {
            ("oversized", RemoteError::TooLarge { bytes, max_bytes }) => {
                assert_eq!((*bytes, *max_bytes), (MAX + 1, MAX));
            }
            ("oversized", _) => panic!("oversized: {error:?}"),
            (_, RemoteError::Protocol { .. }) => {}
            _ => panic!("{name}: {error:?}"),
        }
        if *name == "truncated" {
            // The whole call before the cut was still answered.
            assert_eq!(frames.len(), 2, "{frames:?}");
            assert_eq!((frames[0].kind, frames[0].id), (FrameKind::LaneOk, 1));
        }
        assert_eq!(server.stats().rejected_frames, i as u64 + 1, "{name}");
    }

    // An unknown group on a lane: answered by id, counted, lane goes on.
    let mut unknown = lane_open(LANE_VERSION);
    unknown.extend(lane_call(99, 5, b"?"));
    unknown.extend(lane_call(3, 6, b"fine"));
    let frames = raw.lane_exchange(&unknown).await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    let err = frames.iter().find(|f| f.id == 5).unwrap();
    assert_eq!(err.kind, FrameKind::LaneErr);
    assert_eq!(
        conn::decode_remote_error(&err.body).unwrap(),
        RemoteError::UnknownGroup { group: 99 }
    );
    assert_eq!(server.stats().unknown_targets, 1);

    // The connection still serves lanes, and the node other peers.
    assert_eq!(raw.lane_exchange(&good).await.len(), 2);
    let (client, _) = bind(options(ids[1].clone(), any_port()), 10);
    client.set_peer(1, addr);
    assert_eq!(
        client.call(1, control(4, 1, b"fine")).await.unwrap(),
        "fine"
    );
    assert_eq!(server.stats().rejected_frames, 6);
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bulk_stream_does_not_block_the_control_lane() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let (t1, _) = bind(options(ids[0].clone(), any_port()), 10);
    let t1 = Arc::new(t1);
    // "Node 2" is driven by hand: it reads no more of node 1's bulk call
    // than its header, and answers node 1's control lane.
    let (raw, answer) = RawClient::connect(&ids[1], t1.local_addr().unwrap(), 2).await;
    assert_eq!(answer.kind, FrameKind::HelloOk);
    let bulk = {
        let t1 = t1.clone();
        tokio::spawn(async move {
            let req = Request {
                group: 2,
                target_replica: replica(2, 2),
                kind: MsgKind::Bulk,
                body: Bytes::from(vec![7u8; 32 << 20]),
            };
            t1.call(2, req).await
        })
    };
    let (_bulk_send, mut bulk_recv) = raw.conn.accept_bi().await.unwrap();
    let mut head = [0u8; HEADER_BYTES];
    bulk_recv.read_exact(&mut head).await.unwrap();
    assert_eq!(
        Header::decode(&head, 64 << 20).unwrap().kind,
        FrameKind::Bulk
    );

    let conn = raw.conn.clone();
    let answering = tokio::spawn(async move {
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let mut open = [0u8; HEADER_BYTES + 1];
        recv.read_exact(&mut open).await.unwrap();
        assert_eq!(open[..], lane_open(LANE_VERSION)[..]);
        let mut head = [0u8; HEADER_BYTES + 8];
        while recv.read_exact(&mut head).await.is_ok() {
            let h = Header::decode(head[..HEADER_BYTES].try_into().unwrap(), 1 << 20).unwrap();
            let id = u64::from_le_bytes(head[HEADER_BYTES..].try_into().unwrap());
            let mut body = vec![0; h.length as usize];
            recv.read_exact(&mut body).await.unwrap();
            let answer = lane_frame(FrameKind::LaneOk, h.group, h.target, id, &body);
            send.write_all(&answer).await.unwrap();
        }
    });
    for i in 0..10 {
        let body = Bytes::from(format!("control {i}"));
        let req = Request {
            body: body.clone(),
            ..control(3, 2, b"")
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), t1.call(2, req))
            .await
            .expect("a control call waited for the stalled bulk stream");
        assert_eq!(answer.unwrap(), body);
    }
    assert!(!bulk.is_finished(), "the bulk call's reader never read it");
    raw.conn.close(VarInt::from_u32(0), b"done");
    assert!(bulk.await.unwrap().is_err());
    answering.abort();
    t1.shutdown().await;
}

/// A resolver of a table the test edits, counting its lookups.
#[derive(Debug, Default)]
struct TableResolver {
    table: Mutex<std::collections::HashMap<String, SocketAddr>>,
    lookups: std::sync::atomic::AtomicU64,
}

impl Resolve for TableResolver {
    fn resolve<'a>(&'a self, name: &'a HostPort) -> ResolveFuture<'a> {
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let found = self.table.lock().unwrap().get(&name.to_string()).copied();
        Box::pin(async move {
            found
                .map(|a| vec![a])
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name"))
        })
    }
}

/// A peer known by name is looked up on every dial: when its process
/// moves (a new address behind the same name), the reconnect goes to the
/// new address, with no `set_peer` in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_name_is_resolved_again_on_reconnect() {
    let (_ca, ids) = NodeIdentity::ephemeral_cell(2).unwrap();
    let names = Arc::new(TableResolver::default());
    let mut o1 = options(ids[0].clone(), any_port());
    o1.resolver = names.clone();
    let (t1, _) = bind(o1, 10);
    let name: HostPort = "node2.test:7550".parse().unwrap();
    t1.set_peer(2, name.clone());
    // Not resolvable yet: the dial fails naming the lookup.
    match t1.call(2, control(1, 2, b"x")).await {
        Err(Error::Connect { peer: 2, reason }) => {
            assert!(reason.contains("resolve node2.test:7550"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let (t2a, _) = bind(options(ids[1].clone(), any_port()), 10);
    let at_a = t2a.local_addr().unwrap();
    names.table.lock().unwrap().insert(name.to_string(), at_a);
    let started = std::time::Instant::now();
    let answer = loop {
        match t1.call(2, control(1, 2, b"a")).await {
            Ok(a) => break a,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                tracing::debug!(error = %e, "retry");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(answer, "a");
    assert_eq!(t2a.stats().connections_accepted, 1);
    // Node 2 moves: the old process goes, a new one listens elsewhere and
    // the name now points there.
    t2a.shutdown().await;
    let (t2b, _) = bind(options(ids[1].clone(), any_port()), 10);
    let at_b = t2b.local_addr().unwrap();
    assert_ne!(at_a, at_b);
    names.table.lock().unwrap().insert(name.to_string(), at_b);
    let lookups_before = names.lookups.load(std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    loop {
        match t1.call(2, control(1, 2, b"b")).await {
            Ok(answer) => {
                assert_eq!(answer, "b");
                break;
            }
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "never reached the new address: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        t2b.stats().connections_accepted,
        1,
        "the new process answered"
    );
    assert!(names.lookups.load(std::sync::atomic::Ordering::Relaxed) > lookups_before);
    t1.shutdown().await;
    t2b.shutdown().await;
}

/// The serial of the certificate a fresh handshake to `t` shows.
async fn presented_serial(t: &Transport, dialer: &NodeIdentity) -> String {
    let (client, _) = RawClient::connect(dialer, t.local_addr().unwrap(), dialer.node_id()).await;
    let chain = client
        .conn
        .peer_identity()
        .unwrap()
        .downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
        .unwrap();
    stele_tls::creds::serial_and_expiry(&chain[0]).unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_identity_is_presented_on_new_connections() {
    let (ca, ids) = NodeIdentity::ephemeral_cell(3).unwrap();
    let ts: Vec<Arc<Transport>> = ids[..2]
        .iter()
        .map(|id| Arc::new(bind(options(id.clone(), any_port()), 4).0))
        .collect();
    ts[0].set_peer(2, ts[1].local_addr().unwrap());
    ts[1].set_peer(1, ts[0].local_addr().unwrap());
    assert_eq!(ts[1].call(1, control(3, 1, b"hi")).await.unwrap(), "hi");
    let old = ts[0].certificate_serial();
    assert_eq!(presented_serial(&ts[0], &ids[2]).await, old);

    let rotated = ca.issue(1).unwrap();
    ts[0].reload_identity(&rotated).unwrap();
    let new = ts[0].certificate_serial();
    assert_ne!(new, old);
    assert_eq!(presented_serial(&ts[0], &ids[2]).await, new);
    // The open connection keeps working.
    assert_eq!(
        ts[1].call(1, control(3, 1, b"again")).await.unwrap(),
        "again"
    );

    // Another node's certificate is refused and the current one kept.
    let err = ts[0].reload_identity(&ca.issue(2).unwrap()).unwrap_err();
    assert!(err.to_string().contains("node 2"), "{err}");
    assert_eq!(presented_serial(&ts[0], &ids[2]).await, new);
    shutdown_all(&ts).await;
}
