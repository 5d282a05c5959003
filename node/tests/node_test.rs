//! A node in-process, driven through its gRPC API: appends, conditions,
//! idempotent retries, bad input, seals and restarts.

mod common;
use common::open_when_released;

use std::sync::Arc;
use std::time::Duration;

use stele_node::{Node, NodeOptions};
use stele_proto::pb::data_client::DataClient;
use stele_proto::{Error as ApiError, pb, vshard};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

struct Running {
    node: Arc<Node>,
    client: DataClient<Channel>,
    endpoint: String,
    cancel: CancellationToken,
    server: tokio::task::JoinHandle<stele_node::Result<()>>,
}

fn options(dir: &std::path::Path) -> NodeOptions {
    let mut o = NodeOptions::new(dir.to_path_buf());
    o.initial_tablets = 4;
    o.tablet.memtable_bytes_max = 64 * 1024;
    // Segment counts are checked below; compaction has its own test.
    o.tablet.compact_target_bytes = 0;
    o.journal.frame_payload_bytes_max = 2 << 20;
    o.journal.file_bytes_max = 4 << 20;
    o.batch_bytes_max = 3 << 19;
    o.batch_records_max = 1000;
    o.journal.reserve_bytes = 0;
    o.disk_reserve_bytes = 0;
    o.policy_interval = Duration::from_millis(50);
    o.raft = stele_node::raft::RaftTiming::for_election_timeout(300);
    o
}

async fn start(opts: NodeOptions) -> Running {
    let controlled = opts.controlled;
    let node = open_when_released(opts).await;
    // A controlled node's replicas wait for their controller and peers.
    if !controlled {
        node.wait_ready(Duration::from_secs(20))
            .await
            .expect("ready");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(stele_node::service::serve_on(
        node.clone(),
        listener,
        cancel.clone(),
    ));
    let client = loop {
        match DataClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    Running {
        node,
        client,
        endpoint: format!("http://{addr}"),
        cancel,
        server,
    }
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.server.await;
        self.node.shutdown().await;
    }

    async fn tablets(&mut self) -> Vec<pb::TabletDescriptor> {
        self.client
            .list_tablets(pb::ListTabletsRequest {})
            .await
            .unwrap()
            .into_inner()
            .tablets
    }

    async fn route(&mut self, ns: &str, key: &[u8]) -> pb::TabletDescriptor {
        let v = vshard::vshard(ns, key);
        self.tablets()
            .await
            .into_iter()
            .find(|t| v >= t.vshard_lo && u64::from(v) < t.vshard_hi)
            .unwrap()
    }

    async fn append(
        &mut self,
        ns: &str,
        batch_id: u128,
        records: Vec<(&[u8], u64, Vec<u8>)>,
        expect: Option<pb::Condition>,
    ) -> Result<pb::AppendResponse, ApiError> {
        let t = self.route(ns, records[0].0).await;
        let req = pb::AppendRequest {
            tablet: t.id,
            generation: t.generation,
            batch_id: batch_id.to_be_bytes().to_vec(),
            namespace: ns.to_string(),
            records: records
                .into_iter()
                .map(|(k, ts, v)| pb::Record {
                    key: k.to_vec(),
                    ts,
                    value: v,
                    routing_key: None,
                })
                .collect(),
            expect,
        };
        self.client
            .append(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ApiError::from_status(&s))
    }

    async fn scan_key(&mut self, ns: &str, key: &[u8]) -> Vec<pb::Row> {
        let mut out = Vec::new();
        let mut cursor = Vec::new();
        loop {
            let resp = self
                .client
                .scan_key(pb::ScanKeyRequest {
                    namespace: ns.into(),
                    key: key.to_vec(),
                    limit: 7,
                    cursor: cursor.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            out.extend(resp.rows);
            if resp.next_cursor.is_empty() {
                return out;
            }
            cursor = resp.next_cursor;
        }
    }

    async fn scan(&mut self, ns: &str) -> Vec<pb::Row> {
        let mut out = Vec::new();
        let mut cursor = Vec::new();
        loop {
            let resp = self
                .client
                .scan(pb::ScanRequest {
                    namespace: ns.into(),
                    limit: 50,
                    cursor: cursor.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            out.extend(resp.rows);
            if resp.next_cursor.is_empty() {
                return out;
            }
            cursor = resp.next_cursor;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_seal_and_survive_restart_replaying_only_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = start(options(dir.path())).await;
    let value = vec![7u8; 1000];
    // Enough to seal each tablet's 64 KiB memtable several times.
    for i in 0..400u64 {
        let key = format!("k{}", i % 20);
        r.append(
            "acme/web",
            1000 + u128::from(i),
            vec![(key.as_bytes(), i, value.clone())],
            None,
        )
        .await
        .unwrap();
    }
    // Wait for the policy to seal what is over the threshold.
    let mut sealed = 0;
    for _ in 0..100 {
        sealed = r.tablets().await.iter().map(|t| t.segments).sum::<u32>();
        if sealed >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sealed >= 3, "expected seals, got {sealed} segments");
    let before = r.scan("acme/web").await;
    assert_eq!(before.len(), 400);
    assert_eq!(r.scan_key("acme/web", b"k3").await.len(), 20);
    let status = r
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.records_appended, 400);
    r.stop().await;

    let mut r = start(options(dir.path())).await;
    let after = r.scan("acme/web").await;
    assert_eq!(after, before, "rows changed across restart");
    let replayed = r
        .node
        .stats
        .replayed_frames
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "replayed {replayed} skipped {}",
        r.node
            .stats
            .skipped_frames
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(
        replayed < 400,
        "restart replayed {replayed} frames: the whole history, not the tail"
    );
    // A retry of a batch applied before the restart is a duplicate.
    let dup = r
        .append("acme/web", 1000, vec![(b"k0", 0, value.clone())], None)
        .await
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!(r.scan_key("acme/web", b"k0").await.len(), 20);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_batch_applies_once_and_conditions_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = start(options(dir.path())).await;
    let first = r
        .append(
            "a/b",
            1,
            vec![(b"x", 10, b"one".to_vec()), (b"x", 11, b"two".to_vec())],
            None,
        )
        .await
        .unwrap();
    assert!(!first.duplicate);
    let again = r
        .append(
            "a/b",
            1,
            vec![(b"x", 10, b"one".to_vec()), (b"x", 11, b"two".to_vec())],
            None,
        )
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.positions, first.positions);
    assert_eq!(r.scan_key("a/b", b"x").await.len(), 2);

    let version = first.positions[1];
    // Right version: applies.
    let ok = r
        .append(
            "a/b",
            2,
            vec![(b"x", 12, b"three".to_vec())],
            Some(pb::Condition {
                key: b"x".to_vec(),
                version: Some(version),
            }),
        )
        .await
        .unwrap();
    // Stale version: fails with the actual one, applies nothing.
    let err = r
        .append(
            "a/b",
            3,
            vec![(b"x", 13, b"four".to_vec())],
            Some(pb::Condition {
                key: b"x".to_vec(),
                version: Some(version),
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ApiError::ConditionFailed {
            actual: Some(ok.positions[0])
        }
    );
    // "Must not exist" on an existing key fails; on a new key holds.
    let err = r
        .append(
            "a/b",
            4,
            vec![(b"x", 14, vec![])],
            Some(pb::Condition {
                key: b"x".to_vec(),
                version: None,
            }),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::ConditionFailed { .. }));
    r.append(
        "a/b",
        5,
        vec![(b"y", 14, vec![])],
        Some(pb::Condition {
            key: b"y".to_vec(),
            version: None,
        }),
    )
    .await
    .unwrap();
    assert_eq!(r.scan_key("a/b", b"x").await.len(), 3);
    let got = r
        .client
        .get(pb::GetRequest {
            namespace: "a/b".into(),
            key: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.row.unwrap().value, b"three");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_typed_errors_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = start(options(dir.path())).await;
    let applied_before: u64 = r.tablets().await.iter().map(|t| t.applied_index).sum();
    let big_value = vec![0u8; 1024 * 1024 + 1];
    let err = r
        .append("a/b", 1, vec![(b"k", 1, big_value)], None)
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::TooLarge { .. }), "{err:?}");
    let err = r
        .append("a/b", 2, vec![(b"k", 1, vec![0; 1024 * 1024]); 9], None)
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::TooLarge { .. }), "{err:?}");
    let big_key = vec![b'k'; 4097];
    let t = r.route("a/b", b"k").await;
    let bad = |f: &dyn Fn(&mut pb::AppendRequest)| {
        let mut req = pb::AppendRequest {
            tablet: t.id,
            generation: t.generation,
            batch_id: vec![0; 16],
            namespace: "a/b".into(),
            records: vec![pb::Record {
                key: b"k".to_vec(),
                ts: 1,
                value: vec![],
                routing_key: None,
            }],
            expect: None,
        };
        f(&mut req);
        req
    };
    let cases: Vec<(pb::AppendRequest, &str)> = vec![
        (bad(&|r| r.records[0].key.clear()), "InvalidArgument"),
        (bad(&|r| r.records[0].key = big_key.clone()), "TooLarge"),
        (bad(&|r| r.namespace = "no-slash".into()), "InvalidArgument"),
        (bad(&|r| r.namespace = "a/b/c".into()), "InvalidArgument"),
        (bad(&|r| r.batch_id = vec![1; 3]), "InvalidArgument"),
        (bad(&|r| r.records.clear()), "InvalidArgument"),
        (bad(&|r| r.generation += 1), "StaleRoute"),
        (bad(&|r| r.tablet = 999), "TabletNotFound"),
    ];
    for (req, want) in cases {
        let err = ApiError::from_status(&r.client.append(req).await.unwrap_err());
        let got = format!("{err:?}");
        assert!(got.starts_with(want), "want {want}, got {got}");
    }
    // A record routed to the wrong tablet: StaleRoute with the descriptor.
    let other = r
        .tablets()
        .await
        .into_iter()
        .find(|x| x.id != t.id)
        .unwrap();
    let mut req = bad(&|_| {});
    req.tablet = other.id;
    req.generation = other.generation;
    let err = ApiError::from_status(&r.client.append(req).await.unwrap_err());
    assert!(matches!(err, ApiError::StaleRoute { descriptor } if descriptor.id == other.id));
    // Garbage cursor.
    let err = r
        .client
        .scan(pb::ScanRequest {
            namespace: "a/b".into(),
            cursor: vec![0xff, 0x00, 0x13],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(
        ApiError::from_status(&err),
        ApiError::InvalidArgument { .. }
    ));
    // A node without controllers has no route map to relay.
    let err = r
        .client
        .get_routes(pb::GetRoutesRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(ApiError::from_status(&err), ApiError::InvalidArgument { ref field, .. } if field == "routes"),
        "{err:?}"
    );
    let err = r
        .client
        .watch_routes(pb::WatchRoutesRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            ApiError::from_status(&err),
            ApiError::InvalidArgument { .. }
        ),
        "{err:?}"
    );
    let applied_after: u64 = r.tablets().await.iter().map(|t| t.applied_index).sum();
    assert_eq!(
        applied_after, applied_before,
        "a refused request reached a tablet log"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_full_refuses_writes_keeps_reads_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.disk_reserve_bytes = 64 << 20;
    opts.journal.reserve_bytes = 16 << 20;
    let faults = opts.journal.faults.clone();
    let mut r = start(opts).await;
    r.append("a/b", 1, vec![(b"k", 1, b"v".to_vec())], None)
        .await
        .unwrap();
    // The disk fills to just under the node's reserve.
    faults.set_free_bytes(Some(60 << 20));
    let applied_before: u64 = r.tablets().await.iter().map(|t| t.applied_index).sum();
    let err = r
        .append("a/b", 2, vec![(b"k", 2, b"v".to_vec())], None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApiError::StorageFull { free_bytes, reserve_bytes } if free_bytes == 60 << 20 && reserve_bytes == 64 << 20),
        "{err:?}"
    );
    let applied_after: u64 = r.tablets().await.iter().map(|t| t.applied_index).sum();
    assert_eq!(
        applied_after, applied_before,
        "StorageFull must be decided before any write"
    );
    assert_eq!(
        r.scan_key("a/b", b"k").await.len(),
        1,
        "reads must still work"
    );
    assert!(
        r.node.journal.stats().stopped.is_none(),
        "a full disk must not stop the journal"
    );
    // Space returns: writes are taken again, no restart needed.
    faults.set_free_bytes(None);
    r.append("a/b", 2, vec![(b"k", 2, b"v".to_vec())], None)
        .await
        .unwrap();
    assert_eq!(r.scan_key("a/b", b"k").await.len(), 2);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_segment_block_is_reported_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = start(options(dir.path())).await;
    let value = vec![9u8; 2000];
    for i in 0..200u64 {
        r.append(
            "acme/seg",
            5000 + u128::from(i),
            vec![(b"same-key", i, value.clone())],
            None,
        )
        .await
        .unwrap();
    }
    let t = r.route("acme/seg", b"same-key").await;
    for _ in 0..100 {
        if r.tablets()
            .await
            .iter()
            .any(|x| x.id == t.id && x.segments > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    r.stop().await;
    // Flip one byte in the first block of the tablet's first segment (the
    // blocks start right after the 20-byte prologue and the CBOR header).
    let seg_dir = dir.path().join("segments").join(t.id.to_string());
    let seg = std::fs::read_dir(&seg_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a sealed segment");
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() / 4;
    bytes[at] ^= 0x5a;
    std::fs::write(&seg, &bytes).unwrap();

    let mut r = start(options(dir.path())).await;
    let err = r
        .client
        .scan_key(pb::ScanKeyRequest {
            namespace: "acme/seg".into(),
            key: b"same-key".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let err = ApiError::from_status(&err);
    match &err {
        ApiError::Unavailable { reason } => assert!(reason.contains("corrupt"), "{reason}"),
        other => panic!("corruption not reported: {other:?}"),
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_grpc_tools_work_health_and_reflection() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let dir = tempfile::tempdir().unwrap();
    let r = start(options(dir.path())).await;
    let channel = tonic::transport::Endpoint::from_shared(r.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: "stele.v1.Data".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);

    let mut refl = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("no service list: {resp:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"stele.v1.Data".to_string()), "{names:?}");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_holding_back_journal_trim_is_force_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    // No size seals: only the journal bound can seal.
    o.tablet.memtable_bytes_max = 1 << 30;
    o.journal.file_bytes_max = 3 << 20;
    o.journal_retained_bytes_max = 6 << 20;
    let mut r = start(o).await;
    // One small record in tablet A, then megabytes into tablet B.
    r.append("quiet/ns", 1, vec![(b"q", 1, b"small".to_vec())], None)
        .await
        .unwrap();
    let quiet = r.route("quiet/ns", b"q").await;
    let busy_key = (0..1000)
        .map(|i| format!("b{i}"))
        .find(|k| futures_like_route(&quiet, "busy/ns", k.as_bytes()))
        .expect("a key in another tablet");
    let value = vec![1u8; 200_000];
    for i in 0..100u64 {
        r.append(
            "busy/ns",
            100 + u128::from(i),
            vec![(busy_key.as_bytes(), i, value.clone())],
            None,
        )
        .await
        .unwrap();
    }
    let mut sealed = false;
    for _ in 0..100 {
        let t = r
            .tablets()
            .await
            .into_iter()
            .find(|t| t.id == quiet.id)
            .unwrap();
        if t.segments > 0 {
            sealed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        sealed,
        "the quiet tablet holding the oldest journal file was never force-sealed"
    );
    let mut retained = u64::MAX;
    for _ in 0..100 {
        retained = r.node.journal.stats().retained_bytes;
        if retained <= 9 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        retained <= 9 << 20,
        "journal not trimmed back toward its bound: {retained} bytes"
    );
    assert_eq!(r.scan_key("quiet/ns", b"q").await.len(), 1);
    r.stop().await;
}

/// True when `key` of `ns` routes outside tablet `t`.
fn futures_like_route(t: &pb::TabletDescriptor, ns: &str, key: &[u8]) -> bool {
    let v = vshard::vshard(ns, key);
    !(v >= t.vshard_lo && u64::from(v) < t.vshard_hi)
}

/// Waits until this node's replica of `tablet` leads its group.
async fn wait_leading(node: &Node, tablet: u64) {
    for _ in 0..200 {
        if node.replica(tablet).is_some_and(|r| r.is_leader()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("replica of tablet {tablet} never led");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_come_and_go_and_ids_are_never_reused() {
    use stele_node::replicas::ReplicaSpec;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.controlled = true;
    let mut r = start(opts.clone()).await;
    assert!(
        r.tablets().await.is_empty(),
        "a controlled node starts empty"
    );
    let spec = |replica_id: u64| ReplicaSpec {
        tablet: 7,
        replica_id,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        range_generation: 3,
    };
    let first = (1 << 16) | 1;
    r.node
        .create_replica(&spec(first), Some(&[first]))
        .await
        .unwrap();
    wait_leading(&r.node, 7).await;
    for i in 0..30u64 {
        r.append(
            "life/ns",
            i as u128,
            vec![(b"k", i + 1, b"old".to_vec())],
            None,
        )
        .await
        .unwrap();
    }
    assert_eq!(r.scan("life/ns").await.len(), 30);
    // Moved away: the replica, its rows and its files are gone.
    let seg_dir = dir.path().join("segments").join("7");
    assert!(r.node.remove_replica(7, first).await.unwrap());
    assert!(r.tablets().await.is_empty());
    assert!(!seg_dir.exists());
    let err = r
        .client
        .append(pb::AppendRequest {
            tablet: 7,
            generation: 3,
            batch_id: 99u128.to_be_bytes().to_vec(),
            namespace: "life/ns".into(),
            records: vec![pb::Record {
                key: b"k".to_vec(),
                ts: 1,
                value: b"x".to_vec(),
                routing_key: None,
            }],
            expect: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            ApiError::from_status(&err),
            ApiError::TabletNotFound { tablet: 7 }
        ),
        "{err:?}"
    );
    // Its id is never served again, nor is another node's id.
    let again = r.node.create_replica(&spec(first), Some(&[first])).await;
    assert!(
        matches!(
            again,
            Err(stele_node::Error::ReplicaRefused {
                refusal: stele_node::error::Refusal::Tombstoned,
                ..
            })
        ),
        "a tombstoned replica id was recreated"
    );
    let foreign = (9 << 16) | 2;
    assert!(r.node.create_replica(&spec(foreign), None).await.is_err());
    // The tablet comes back under a new id, empty, even across a restart
    // before it hears from any leader (the journal still holds the first
    // replica's frames).
    let waiting = (2 << 16) | 1;
    r.node.create_replica(&spec(waiting), None).await.unwrap();
    r.stop().await;
    let mut r = start(opts.clone()).await;
    let t = r.tablets().await;
    assert_eq!(t.len(), 1);
    assert_eq!(
        t[0].last_log_index, 0,
        "a new replica inherited a log: {t:?}"
    );
    assert!(r.node.replica(7).unwrap().log.is_empty());
    assert!(r.node.remove_replica(7, waiting).await.unwrap());
    let second = (3 << 16) | 1;
    r.node
        .create_replica(&spec(second), Some(&[second]))
        .await
        .unwrap();
    wait_leading(&r.node, 7).await;
    for i in 0..5u64 {
        r.append(
            "life/ns",
            1000 + i as u128,
            vec![(b"k", i + 1, b"new".to_vec())],
            None,
        )
        .await
        .unwrap();
    }
    assert_eq!(r.scan("life/ns").await.len(), 5);
    r.stop().await;
    // After a restart the journal still holds the first replica's frames;
    // they must not come back.
    let mut r = start(opts).await;
    wait_leading(&r.node, 7).await;
    let rows = r.scan("life/ns").await;
    assert_eq!(rows.len(), 5, "frames of the removed replica replayed");
    assert!(rows.iter().all(|row| row.value == b"new"));
    assert_eq!(r.node.replica(7).unwrap().replica_id, second);
    r.stop().await;
}

/// `wait_ready` waits for every replica the node hosts, but a replica
/// removed while it waits (as the absorbed side of a merge is, when the
/// merge publishes during a start) is not a failure; one that stays and
/// never hears from a leader still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ready_skips_a_replica_removed_while_it_waits() {
    use stele_node::replicas::ReplicaSpec;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.controlled = true;
    let r = start(opts).await;
    let spec = |tablet: u64, replica_id: u64| ReplicaSpec {
        tablet,
        replica_id,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        range_generation: 1,
    };
    // Replicas that wait to hear from a leader never become ready.
    let (a, b) = ((1 << 16) | 1, (2 << 16) | 1);
    r.node.create_replica(&spec(7, a), None).await.unwrap();
    let not_ready = r.node.wait_ready(Duration::from_millis(300)).await;
    assert!(
        format!("{not_ready:?}").contains("tablet 7 not ready"),
        "{not_ready:?}"
    );
    let node = r.node.clone();
    let waiting = tokio::spawn(async move { node.wait_ready(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    assert!(r.node.remove_replica(7, a).await.unwrap());
    let ready = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("wait_ready still waiting for a removed replica")
        .unwrap();
    assert!(ready.is_ok(), "{ready:?}");
    // A replica still hosted that never hears from a leader still fails it.
    r.node.create_replica(&spec(8, b), None).await.unwrap();
    let not_ready = r.node.wait_ready(Duration::from_millis(300)).await;
    assert!(
        format!("{not_ready:?}").contains("tablet 8 not ready"),
        "{not_ready:?}"
    );
    r.stop().await;
}

/// A namespace whose vshards lie in `[lo, hi)`.
fn namespace_in(tag: &str, lo: u32, hi: u64) -> String {
    (0..)
        .map(|i| format!("{tag}/n{i}"))
        .find(|ns| {
            let (a, b) = vshard::namespace_range(ns);
            a >= lo && b <= hi
        })
        .unwrap()
}

/// Waits until tablet `id`'s replica here has published its frozen state.
async fn wait_frozen(node: &Node, id: u64) {
    for _ in 0..500 {
        if let Some(r) = node.replica(id) {
            let d = r.tablet.read();
            if d.published.frozen && d.frozen.is_empty() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("tablet {id} never published its freeze");
}

/// `Freeze` then `Merge` on one node: the frozen tablet refuses writes,
/// the survivor takes its range, rows (in position order), receipts and
/// segment files; the absorbed replica's rows and files are gone once the
/// merge's seal publishes; and a restart before that publish replays the
/// merge from the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_adopts_a_frozen_tablet_and_survives_restart() {
    use stele_proto::command::TabletCommand;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.initial_tablets = 2;
    let mut r = start(opts.clone()).await;
    let ts = r.tablets().await;
    let (t1, t2) = (&ts[0], &ts[1]);
    assert_eq!((t1.id, t2.id), (1, 2));
    let ns1 = namespace_in("m", t1.vshard_lo, t1.vshard_hi);
    let ns2 = namespace_in("m", t2.vshard_lo, t2.vshard_hi);
    for i in 0..40u64 {
        r.append(
            &ns1,
            1000 + u128::from(i),
            vec![(b"k", 7, format!("a{i}").into_bytes())],
            None,
        )
        .await
        .unwrap();
        r.append(
            &ns2,
            2000 + u128::from(i),
            vec![(b"k", 7, format!("b{i}").into_bytes())],
            None,
        )
        .await
        .unwrap();
    }
    let kept = r
        .append(&ns1, 1000, vec![(b"k", 7, b"a0".to_vec())], None)
        .await
        .unwrap();
    assert!(kept.duplicate);

    // Freeze tablet 1: sealed, then no writes.
    let rep1 = r.node.replica(1).unwrap();
    rep1.raft
        .client_write(TabletCommand::Freeze { generation: 0 })
        .await
        .unwrap();
    wait_frozen(&r.node, 1).await;
    let refused = r
        .append(&ns1, 5000, vec![(b"k", 7, b"late".to_vec())], None)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ApiError::StaleRoute { .. }),
        "{refused:?}"
    );
    // Frozen for good: also after a restart.
    drop(rep1);
    r.stop().await;
    let mut r = start(opts.clone()).await;
    let refused = r
        .append(&ns1, 5000, vec![(b"k", 7, b"late".to_vec())], None)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ApiError::StaleRoute { .. }),
        "{refused:?}"
    );
    let rep1 = r.node.replica(1).unwrap();
    // A merge that is not adjacent, or of the tablet into itself, is
    // refused at apply and changes nothing.
    let rep2 = r.node.replica(2).unwrap();
    let stale = rep2
        .raft
        .client_write(TabletCommand::Merge {
            absorbed: 1,
            lo: 5,
            hi: 9,
            generation: 10,
        })
        .await
        .unwrap();
    assert!(
        matches!(
            stale.data,
            stele_proto::command::TabletResponse::Rejected { .. }
        ),
        "{:?}",
        stale.data
    );
    assert_eq!(rep2.tablet.range(), (t2.vshard_lo, t2.vshard_hi));

    // Merge tablet 1 into tablet 2, with its seal failing until the
    // restart: the restart replays the merge from the journal.
    stele_node::tablet::seal::fail_next_seals(u64::MAX);
    rep2.raft
        .client_write(TabletCommand::Merge {
            absorbed: 1,
            lo: t1.vshard_lo,
            hi: t1.vshard_hi,
            generation: 10,
        })
        .await
        .unwrap();
    assert_eq!(rep2.tablet.range(), (0, 1 << 32));
    // Readable at once, before the merge's seal publishes or not.
    for _ in 0..3 {
        // Writes to the absorbed range now go to the survivor: same ts,
        // later position (tablet 2 > tablet 1).
        let t = pb::TabletDescriptor {
            id: 2,
            generation: 10,
            ..Default::default()
        };
        let mut c = r.client.clone();
        let resp = c
            .append(pb::AppendRequest {
                tablet: t.id,
                generation: t.generation,
                batch_id: 1000u128.to_be_bytes().to_vec(),
                namespace: ns1.clone(),
                records: vec![pb::Record {
                    key: b"k".to_vec(),
                    ts: 7,
                    value: b"a0".to_vec(),
                    routing_key: None,
                }],
                expect: None,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            resp.duplicate,
            "a batch of the absorbed tablet applied again"
        );
        assert_eq!(resp.positions, kept.positions);
    }
    let mut c = r.client.clone();
    c.append(pb::AppendRequest {
        tablet: 2,
        generation: 10,
        batch_id: 7777u128.to_be_bytes().to_vec(),
        namespace: ns1.clone(),
        records: vec![pb::Record {
            key: b"k".to_vec(),
            ts: 7,
            value: b"after".to_vec(),
            routing_key: None,
        }],
        expect: None,
    })
    .await
    .unwrap();
    let check = |rows: Vec<pb::Row>, ns: &str| {
        let values: Vec<String> = rows
            .iter()
            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
            .collect();
        let tag = if ns == ns1 { "a" } else { "b" };
        let mut want: Vec<String> = (0..40).map(|i| format!("{tag}{i}")).collect();
        if ns == ns1 {
            want.push("after".into());
        }
        assert_eq!(values, want, "{ns}");
    };
    // The merge's seal has not published: the absorbed replica is whole.
    assert!(rep2.tablet.read().published.lo > 0);
    assert!(dir.path().join("segments").join("1").exists());
    drop((rep1, rep2));
    r.stop().await;
    stele_node::tablet::seal::fail_next_seals(0);
    let mut r = start(opts.clone()).await;
    check(r.scan_key(&ns1, b"k").await, &ns1);
    check(r.scan_key(&ns2, b"k").await, &ns2);
    assert_eq!(r.scan(&ns1).await.len(), 41);
    // Once the merge has published, the absorbed replica's catalog rows
    // and files are gone.
    for _ in 0..500 {
        if r.node.replica(1).is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(r.node.replica(1).is_none());
    assert!(!dir.path().join("segments").join("1").exists());
    let ts = r.tablets().await;
    assert_eq!(ts.len(), 1, "{ts:?}");
    assert_eq!(
        (ts[0].id, ts[0].vshard_lo, ts[0].vshard_hi),
        (2, 0, 1 << 32)
    );
    let again = r
        .append(&ns1, 1000, vec![(b"k", 7, b"a0".to_vec())], None)
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.positions, kept.positions);
    r.stop().await;
    // And once more from the published state alone.
    let mut r = start(opts).await;
    check(r.scan_key(&ns1, b"k").await, &ns1);
    check(r.scan_key(&ns2, b"k").await, &ns2);
    r.stop().await;
}

/// Compaction under writes, through the policy: runs of small segments are
/// rewritten as one, every row stays readable exactly once (Scan, ScanKey,
/// Get), the replaced files are gone, and a restart reads the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_segments_compact_into_one_and_rows_stay_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.initial_tablets = 1;
    opts.tablet.memtable_bytes_max = 8 * 1024;
    opts.tablet.compact_target_bytes = 1 << 20;
    opts.tablet.compact_min_inputs = 4;
    let mut r = start(opts.clone()).await;
    let value = vec![3u8; 500];
    for i in 0..600u64 {
        let key = format!("k{}", i % 30);
        r.append(
            "acme/db",
            5000 + u128::from(i),
            vec![(key.as_bytes(), i / 30, value.clone())],
            None,
        )
        .await
        .unwrap();
    }
    let rep = r.node.replica(1).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while rep
        .tablet
        .stats
        .compactions
        .load(std::sync::atomic::Ordering::Relaxed)
        < 2
    {
        assert!(std::time::Instant::now() < deadline, "no compaction");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let check = |rows: &[pb::Row]| {
        let mut seen = std::collections::BTreeSet::new();
        for row in rows {
            assert!(seen.insert((row.key.clone(), row.ts)), "twice: {row:?}");
        }
        assert_eq!(rows.len(), 600);
    };
    let all = r.scan("acme/db").await;
    check(&all);
    let k3 = r.scan_key("acme/db", b"k3").await;
    assert_eq!(
        k3.iter().map(|r| r.ts).collect::<Vec<_>>(),
        (0..20).collect::<Vec<u64>>(),
        "a key's rows in order"
    );
    // Only published segments' files remain, and fewer than were sealed.
    let seg_dir = dir.path().join("segments").join("1");
    let (files, named, seals) = {
        let d = rep.tablet.read();
        let files = std::fs::read_dir(&seg_dir).unwrap().count();
        (
            files,
            d.segments.len(),
            rep.tablet
                .stats
                .seals_published
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    };
    assert_eq!(files, named, "replaced files are deleted");
    assert!(
        named < seals as usize,
        "{named} segments after {seals} seals"
    );
    // A retried batch is still a duplicate.
    let dup = r
        .append("acme/db", 5000, vec![(b"k0", 0, value.clone())], None)
        .await
        .unwrap();
    assert!(dup.duplicate);
    drop(rep);
    r.stop().await;
    let mut r = start(opts).await;
    let again = r.scan("acme/db").await;
    assert_eq!(again, all, "rows changed across restart");
    r.stop().await;
}

/// Waits until `pred` holds of tablet `id`'s replica here.
async fn wait_for(
    node: &Node,
    id: u64,
    what: &str,
    pred: impl Fn(&stele_node::raft::Replica) -> bool,
) {
    for _ in 0..1500 {
        if let Some(r) = node.replica(id)
            && pred(&r)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("tablet {id}: {what}");
}

/// Splits tablet 1 at `at` in-process: tablet 2 takes `[at, hi)`, with
/// this node's replica its one voter.
async fn split_tablet_1(node: &Node, at: u32) {
    node.replica(1)
        .unwrap()
        .raft
        .client_write(stele_proto::command::TabletCommand::Split {
            at,
            child: 2,
            child_replicas: vec![stele_node::raft::router::replica_id(
                2,
                node.options.node_id,
            )],
            generation: 2,
        })
        .await
        .unwrap();
}

/// The `keep` of a segment reference.
type Keep = Option<Vec<(u32, u64)>>;

/// The segments of tablet `id`'s replica here that hold rows it does not
/// read, and the keep of each segment it names.
fn unread(node: &Node, id: u64) -> (Vec<String>, Vec<Keep>) {
    let r = node.replica(id).unwrap();
    let range = r.tablet.range();
    let d = r.tablet.read();
    let unread = d
        .segments
        .iter()
        .filter(|(s, reader)| {
            let h = reader.header();
            s.holds_unread((h.vshard_lo, h.vshard_hi), range)
        })
        .map(|(s, _)| s.id.clone())
        .collect();
    (
        unread,
        d.segments.iter().map(|(s, _)| s.keep.clone()).collect(),
    )
}

/// Rewriting a segment shared since a split on one side only (a trim),
/// then merging the halves back: each side goes on reading only its own
/// rows of what it shares, so no row comes back twice (Scan, ScanKey),
/// also after a restart; then the policy trims what the merged tablet
/// still holds of rows it does not read, and every row stays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_segment_trimmed_on_one_side_merges_back_without_doubles() {
    use stele_proto::command::{SealReason, TabletCommand};
    const AT: u32 = 1 << 31;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.initial_tablets = 1;
    opts.tablet.memtable_bytes_max = 16 * 1024;
    let mut r = start(opts.clone()).await;
    let low = namespace_in("t", 0, u64::from(AT));
    let high = namespace_in("t", AT, 1 << 32);
    let value = vec![5u8; 300];
    let mut batch = 0u128;
    for i in 0..200u64 {
        for ns in [&low, &high] {
            batch += 1;
            let key = format!("k{}", i % 10);
            r.append(ns, batch, vec![(key.as_bytes(), i, value.clone())], None)
                .await
                .unwrap();
        }
    }
    r.node.seal(1, SealReason::Operator).await.unwrap();
    wait_for(&r.node, 1, "seal published", |rep| {
        rep.tablet.read().frozen.is_empty()
    })
    .await;
    let shared_before = r.node.replica(1).unwrap().tablet.read().segments.len();
    assert!(shared_before >= 2, "{shared_before} segments");

    // Split at AT: tablet 2 takes the high half, sharing every segment.
    split_tablet_1(&r.node, AT).await;
    wait_for(&r.node, 2, "child leads", |rep| rep.is_leader()).await;
    let (unread2, _) = unread(&r.node, 2);
    assert_eq!(unread2.len(), shared_before, "every shared segment");

    // The child trims its copy of the first shared segment: its own rows,
    // in a file of its own; the parent's copy is untouched.
    let first = unread2[0].clone();
    r.node.compact(2, vec![first.clone()]).await.unwrap();
    wait_for(&r.node, 2, "trim published", |rep| {
        rep.tablet
            .stats
            .compactions
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    })
    .await;
    let (unread2, _) = unread(&r.node, 2);
    assert!(!unread2.contains(&first), "trimmed: {unread2:?}");
    assert_eq!(unread2.len(), shared_before - 1);
    assert!(
        unread(&r.node, 1).0.contains(&first),
        "the parent's copy stays"
    );
    assert!(
        dir.path()
            .join("segments/1")
            .join(format!("{first}.seg"))
            .exists()
    );
    assert!(
        !dir.path()
            .join("segments/2")
            .join(format!("{first}.seg"))
            .exists()
    );
    let rows_of = |id: u64| -> std::collections::BTreeMap<String, u64> {
        let rep = r.node.replica(id).unwrap();
        let d = rep.tablet.read();
        d.segments
            .iter()
            .map(|(s, _)| (s.id.clone(), s.rows))
            .collect()
    };
    let (parent, child) = (rows_of(1), rows_of(2));
    let output: Vec<u64> = child
        .iter()
        .filter(|(id, _)| !parent.contains_key(*id))
        .map(|(_, rows)| *rows)
        .collect();
    assert_eq!(output.len(), 1, "{child:?}");
    assert!(
        output[0] < parent[&first],
        "the trim keeps only the child's rows: {} of {}",
        output[0],
        parent[&first]
    );

    let check = |rows: &[pb::Row], what: &str| {
        let mut seen = std::collections::BTreeSet::new();
        for row in rows {
            assert!(
                seen.insert((row.key.clone(), row.ts)),
                "{what}: twice: {row:?}"
            );
        }
        assert_eq!(rows.len(), 200, "{what}");
    };
    let check_all = async |r: &mut Running, when: &str| {
        for ns in [&low, &high] {
            check(&r.scan(ns).await, &format!("{when}: scan {ns}"));
            let k = r.scan_key(ns, b"k3").await;
            assert_eq!(
                k.iter().map(|row| row.ts).collect::<Vec<_>>(),
                (0..200).filter(|i| i % 10 == 3).collect::<Vec<u64>>(),
                "{when}: scan_key {ns}"
            );
        }
    };
    check_all(&mut r, "split").await;

    // Merge 1 into 2 (the larger id survives).
    r.node
        .replica(1)
        .unwrap()
        .raft
        .client_write(TabletCommand::Freeze { generation: 3 })
        .await
        .unwrap();
    wait_frozen(&r.node, 1).await;
    r.node
        .replica(2)
        .unwrap()
        .raft
        .client_write(TabletCommand::Merge {
            absorbed: 1,
            lo: 0,
            hi: u64::from(AT),
            generation: 4,
        })
        .await
        .unwrap();
    assert_eq!(r.node.replica(2).unwrap().tablet.range(), (0, 1 << 32));
    check_all(&mut r, "merged").await;
    wait_for(&r.node, 2, "merge published", |rep| {
        rep.tablet.read().published.lo == 0
    })
    .await;
    // The parent's copy of the trimmed segment is read for the low half
    // only; the segments both named are read whole again.
    let (unread2, keeps) = unread(&r.node, 2);
    assert_eq!(unread2, vec![first.clone()], "{keeps:?}");
    assert_eq!(keeps.iter().filter(|k| k.is_some()).count(), 1, "{keeps:?}");
    r.stop().await;

    // From the published state alone; then the policy trims the rest.
    opts.tablet.compact_target_bytes = 64 << 20;
    let mut r = start(opts).await;
    check_all(&mut r, "restarted").await;
    for _ in 0..500 {
        if unread(&r.node, 2).0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(unread(&r.node, 2).0, Vec::<String>::new());
    check_all(&mut r, "trimmed").await;
    r.stop().await;
}

/// Regression tests for two bugs the jepsen `split` nemesis found. A key
/// read that waited while a split moved its key to the child read the
/// parent's shrunken range and answered with no rows, as if complete; it
/// must be refused (`StaleRoute`) so the client routes again. And a key's
/// rows from before the split (the parent's positions, high log indices)
/// came after the child's (low indices): positions order by tablet first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_reads_across_a_split_are_neither_empty_nor_out_of_order() {
    const AT: u32 = 1 << 31;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.initial_tablets = 1;
    let mut r = start(opts.clone()).await;
    let high = namespace_in("o", AT, 1 << 32);
    for i in 0..30u64 {
        r.append(
            &high,
            100 + u128::from(i),
            vec![(b"k", 7, format!("v{i}").into_bytes())],
            None,
        )
        .await
        .unwrap();
    }
    // A key read that waits after its barrier, while the split applies.
    let fail_points = r.node.options.fail_points.clone();
    fail_points.delay_key_reads(1500);
    let mut c = r.client.clone();
    let ns = high.clone();
    let read = tokio::spawn(async move {
        c.scan_key(pb::ScanKeyRequest {
            namespace: ns,
            key: b"k".to_vec(),
            limit: 100,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| ApiError::from_status(&s))
    });
    // The read passed its barrier and waits: now the split cuts under it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fail_points.key_reads_delayed() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the key read never reached its delay"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    split_tablet_1(&r.node, AT).await;
    let got = read.await.unwrap();
    fail_points.delay_key_reads(0);
    assert!(
        matches!(got, Err(ApiError::StaleRoute { .. })),
        "a read the split cut under answered {got:?}"
    );
    wait_for(&r.node, 2, "child leads", |rep| rep.is_leader()).await;
    // The child's own rows, at the same ts, come after the parent's.
    for i in 30..35u64 {
        r.append(
            &high,
            100 + u128::from(i),
            vec![(b"k", 7, format!("v{i}").into_bytes())],
            None,
        )
        .await
        .unwrap();
    }
    let values: Vec<String> = r
        .scan_key(&high, b"k")
        .await
        .iter()
        .map(|row| String::from_utf8_lossy(&row.value).into_owned())
        .collect();
    assert_eq!(values, (0..35).map(|i| format!("v{i}")).collect::<Vec<_>>());
    r.stop().await;
}

/// One concurrent round of `coalesce_round`: each batch's outcome, by
/// batch number.
type Outcomes = Vec<(u64, Result<pb::AppendResponse, ApiError>)>;

/// 48 two-record batches to one tablet at once, every 8th with a
/// condition that cannot hold (a version no key has).
async fn coalesce_round(r: &mut Running, ns: &str) -> Outcomes {
    let t = r.route(ns, b"k0").await;
    let mut tasks = Vec::new();
    for n in 0..48u64 {
        let mut client = r.client.clone();
        let expect = (n % 8 == 7).then(|| pb::Condition {
            key: b"k0".to_vec(),
            version: Some(pb::Position {
                tablet: t.id,
                index: 1 << 40,
                slot: 0,
            }),
        });
        let req = pb::AppendRequest {
            tablet: t.id,
            generation: t.generation,
            batch_id: (7_000 + u128::from(n)).to_be_bytes().to_vec(),
            namespace: ns.into(),
            records: (0..2u64)
                .map(|i| pb::Record {
                    key: format!("k{}", n % 5).into_bytes(),
                    ts: n * 10 + i,
                    value: format!("v{n}.{i}").into_bytes(),
                    routing_key: Some(b"one tablet".to_vec()),
                })
                .collect(),
            expect,
        };
        tasks.push(tokio::spawn(async move {
            let r = client.append(req).await;
            (
                n,
                r.map(|r| r.into_inner())
                    .map_err(|s| ApiError::from_status(&s)),
            )
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_to_a_tablet_share_an_entry_and_apply_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.initial_tablets = 1;
    o.log_format = stele_proto::formats::LOG_MAX;
    o.append_in_flight = 1;
    let ns = "acme/coalesce";
    let mut r = start(o.clone()).await;
    let first = coalesce_round(&mut r, ns).await;
    let mut by_index: std::collections::BTreeMap<u64, usize> = Default::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut applied = std::collections::BTreeMap::new();
    for (n, outcome) in &first {
        if n % 8 == 7 {
            // Refused whether or not a batch writing `k0` came first
            // (`actual` is `None` when none had).
            assert!(
                matches!(outcome, Err(ApiError::ConditionFailed { .. })),
                "batch {n}: {outcome:?}"
            );
            continue;
        }
        let resp = outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("batch {n}: {e}"));
        assert!(!resp.duplicate, "batch {n}");
        assert_eq!(resp.positions.len(), 2, "batch {n}");
        *by_index.entry(resp.positions[0].index).or_default() += 1;
        for p in &resp.positions {
            assert!(
                seen.insert((p.index, p.slot)),
                "a position given twice: {p:?}"
            );
        }
        // A batch's records sit in one entry, in order.
        assert_eq!(resp.positions[0].index, resp.positions[1].index);
        assert_eq!(resp.positions[0].slot + 1, resp.positions[1].slot);
        applied.insert(*n, resp.positions.clone());
    }
    assert_eq!(applied.len(), 42);
    let shared = by_index.values().filter(|c| **c > 1).count();
    assert!(
        shared > 0,
        "nothing was coalesced: one entry per batch ({by_index:?})"
    );
    let rows = |rows: Vec<pb::Row>| -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut v: Vec<_> = rows.into_iter().map(|r| (r.key, r.value)).collect();
        v.sort();
        v
    };
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = applied
        .keys()
        .flat_map(|n| {
            (0..2).map(move |i| {
                (
                    format!("k{}", n % 5).into_bytes(),
                    format!("v{n}.{i}").into_bytes(),
                )
            })
        })
        .collect();
    want.sort();
    assert_eq!(rows(r.scan(ns).await), want, "each applied batch once");

    // Retried, each applied batch answers with its own positions, and
    // the refused ones are refused again.
    let check_retry = |round: Outcomes| {
        for (n, outcome) in round {
            match applied.get(&n) {
                Some(positions) => {
                    let resp = outcome.unwrap_or_else(|e| panic!("retry of {n}: {e}"));
                    assert!(resp.duplicate, "retry of {n} applied again");
                    assert_eq!(&resp.positions, positions, "retry of {n}");
                }
                None => assert!(
                    matches!(outcome, Err(ApiError::ConditionFailed { .. })),
                    "retry of {n}: {outcome:?}"
                ),
            }
        }
    };
    check_retry(coalesce_round(&mut r, ns).await);
    assert_eq!(rows(r.scan(ns).await), want);
    r.stop().await;

    // Replayed from the journal after a restart: the same rows, and the
    // receipts still answer.
    let mut r = start(o).await;
    assert_eq!(rows(r.scan(ns).await), want, "rows after restart");
    check_retry(coalesce_round(&mut r, ns).await);
    r.stop().await;
}
