//! The client against an in-process fake node: retries keep their batch id,
//! redirects are followed, bad input is refused before sending, and the
//! batcher coalesces.

#[path = "../src/fake.rs"]
#[allow(dead_code)]
mod fake;

use std::time::Duration;

use fake::{FakeNode, Fault};
use stele_client::{
    Batcher, BatcherOptions, Client, ClientOptions, Condition, Error, ReadOptions, RetryPolicy,
    record,
};
use stele_proto::pb::TabletDescriptor;
use stele_proto::vshard::{VSHARD_END, vshard};

const NS: &str = "acme/web";

fn opts() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 6,
            deadline: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
        },
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn tablet(id: u64, lo: u32, hi: u64, generation: u64, leader: &str) -> TabletDescriptor {
    TabletDescriptor {
        id,
        vshard_lo: lo,
        vshard_hi: hi,
        generation,
        leader_node: id,
        leader_endpoint: leader.into(),
        ..Default::default()
    }
}

async fn start(node: &FakeNode) -> (String, Client) {
    let endpoint = node.serve().await.unwrap();
    let client = Client::connect(&endpoint, opts()).await.unwrap();
    (endpoint, client)
}

fn records(n: usize) -> Vec<stele_client::Record> {
    (0..n)
        .map(|i| record(format!("k{i}"), i as u64 + 1, format!("v{i}")))
        .collect()
}

fn all_equal(ids: &[Vec<u8>]) -> bool {
    ids.windows(2).all(|w| w[0] == w[1])
}

#[tokio::test]
async fn unavailable_is_retried_with_the_same_batch_id() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    node.lock()
        .faults
        .extend([Fault::Unavailable, Fault::Unavailable]);
    let positions = client.append(NS, records(3)).await.unwrap();
    let s = node.lock();
    assert_eq!(s.append_requests, 3);
    assert!(all_equal(&s.batch_ids), "{:?}", s.batch_ids);
    assert_eq!(s.batch_ids[0].len(), 16);
    assert_eq!(s.applications, 1);
    let slots: Vec<u32> = positions.iter().map(|p| p.slot).collect();
    assert_eq!(slots, [0, 1, 2], "positions in input order");
}

#[tokio::test]
async fn lost_response_is_retried_and_applied_once() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    node.lock().faults.push_back(Fault::DropAfterApply);
    let out = client
        .append_batch(NS, records(2), None, None)
        .await
        .unwrap();
    assert!(out.duplicate, "the retry found the receipt");
    let s = node.lock();
    assert_eq!((s.append_requests, s.applications), (2, 1));
    assert!(all_equal(&s.batch_ids));
    assert_eq!(s.rows.len(), 2);
    assert_eq!(out.positions, s.receipts.values().next().unwrap().clone());
}

#[tokio::test]
async fn caller_batch_id_is_used() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let id = [7u8; 16];
    let a = client
        .append_batch(NS, records(1), None, Some(id))
        .await
        .unwrap();
    let b = client
        .append_batch(NS, records(1), None, Some(id))
        .await
        .unwrap();
    assert!(!a.duplicate && b.duplicate);
    assert_eq!(a.positions, b.positions);
    assert_eq!(node.lock().batch_ids, [id.to_vec(), id.to_vec()]);
}

#[tokio::test]
async fn not_leader_hint_is_followed() {
    let leader = FakeNode::one_tablet();
    let leader_endpoint = leader.serve().await.unwrap();
    let follower = FakeNode::one_tablet();
    let (_, client) = start(&follower).await;
    follower
        .lock()
        .faults
        .push_back(Fault::NotLeader(leader_endpoint.clone()));
    client.append(NS, records(4)).await.unwrap();
    assert_eq!(follower.lock().applications, 0);
    assert_eq!(leader.lock().applications, 1);
    assert_eq!(
        client.routes().lookup(0).unwrap().leader_endpoint,
        leader_endpoint
    );
    // Later appends go straight to the leader.
    client.append(NS, records(1)).await.unwrap();
    assert_eq!(follower.lock().append_requests, 1);
    assert_eq!(leader.lock().append_requests, 2);
    assert!(all_equal(&[
        follower.lock().batch_ids[0].clone(),
        leader.lock().batch_ids[0].clone()
    ]));
}

#[tokio::test]
async fn stale_generation_is_corrected() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    node.lock().tablets[0].generation = 2;
    client.append(NS, records(2)).await.unwrap();
    let s = node.lock();
    assert_eq!((s.append_requests, s.applications), (2, 1));
    assert_eq!(client.routes().get(1).unwrap().generation, 2);
}

#[tokio::test]
async fn split_resends_parts_with_the_same_batch_id() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let recs = records(40);
    // Split at the median vshard of the records so both children get some.
    let mut vs: Vec<u32> = recs.iter().map(|r| vshard(NS, &r.key)).collect();
    vs.sort();
    let at = vs[20];
    node.lock().tablets = vec![
        tablet(1, 0, u64::from(at), 2, ""),
        tablet(2, at, VSHARD_END, 1, ""),
    ];
    let positions = client.append(NS, recs).await.unwrap();
    let s = node.lock();
    assert_eq!(s.applications, 2, "one application per child");
    assert_eq!(s.rows.len(), 40);
    assert!(all_equal(&s.batch_ids), "every part kept the batch id");
    let tablets: std::collections::BTreeSet<u64> = positions.iter().map(|p| p.tablet).collect();
    assert_eq!(tablets.into_iter().collect::<Vec<_>>(), [1, 2]);
}

#[tokio::test]
async fn atomic_batch_must_route_to_one_tablet() {
    // A namespace's vshards share their high 16 bits: split inside its range.
    let recs = records(40);
    let mut vs: Vec<u32> = recs.iter().map(|r| vshard(NS, &r.key)).collect();
    vs.sort();
    let at = vs[20];
    let node = FakeNode::with_tablets(vec![
        tablet(1, 0, u64::from(at), 1, ""),
        tablet(2, at, VSHARD_END, 1, ""),
    ]);
    let (_, client) = start(&node).await;
    let err = client.append_batch(NS, recs, None, None).await.unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::InvalidArgument { .. })),
        "{err}"
    );
    assert_eq!(node.lock().append_requests, 0);
}

#[tokio::test]
async fn too_large_is_refused_without_sending() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let big = record("k", 1, vec![0u8; 2 * 1024 * 1024]);
    let err = client.append(NS, vec![big]).await.unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::TooLarge { .. })),
        "{err}"
    );
    let err = client
        .append("not-a-namespace", records(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::InvalidArgument { .. })),
        "{err}"
    );
    assert_eq!(node.lock().append_requests, 0);
}

#[tokio::test]
async fn condition_failed_returns_at_once() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let first = client.append(NS, vec![record("k", 1, "a")]).await.unwrap()[0];
    let expect_absent = Condition {
        key: b"k".to_vec(),
        version: None,
    };
    let err = client
        .append_batch(NS, vec![record("k", 2, "b")], Some(expect_absent), None)
        .await
        .unwrap_err();
    match err {
        Error::Api(stele_proto::Error::ConditionFailed { actual }) => {
            assert_eq!(actual, Some(first))
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        node.lock().append_requests,
        2,
        "no retry of a refused batch"
    );
    let expect_first = Condition {
        key: b"k".to_vec(),
        version: Some(first),
    };
    client
        .append_batch(NS, vec![record("k", 2, "b")], Some(expect_first), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn retry_budget_is_bounded() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    node.lock()
        .faults
        .extend(std::iter::repeat_n(Fault::Unavailable, 100));
    let err = client.append(NS, records(1)).await.unwrap_err();
    assert!(matches!(err, Error::Exhausted { attempts: 6, .. }), "{err}");
    assert_eq!(node.lock().append_requests, 6);
}

#[tokio::test]
async fn unreachable_node_fails_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    assert!(Client::connect(&endpoint, opts()).await.is_err());
    assert!(matches!(
        Client::connect("not a url", opts()).await,
        Err(Error::InvalidEndpoint { .. })
    ));
}

#[tokio::test]
async fn reads_and_pagination() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let client_small_pages = Client::connect(
        client.seed_endpoint(),
        ClientOptions {
            page_records: 3,
            ..opts()
        },
    )
    .await
    .unwrap();
    let mut recs = records(10);
    recs.extend((0..5).map(|i| record("k0", 100 + i, format!("again{i}"))));
    client.append(NS, recs).await.unwrap();
    let read = ReadOptions::default();
    let row = client.get(NS, b"k0", read).await.unwrap().unwrap();
    assert_eq!(row.value, b"again4");
    assert!(client.get(NS, b"nope", read).await.unwrap().is_none());

    let all = client_small_pages
        .scan_all(NS, 0, 0, b"", read)
        .await
        .unwrap();
    assert_eq!(all.len(), 15);
    assert!(
        all.windows(2)
            .all(|w| (w[0].ts, &w[0].key) <= (w[1].ts, &w[1].key))
    );
    let k0 = client_small_pages
        .scan_key_all(NS, b"k0", 100, 104, read)
        .await
        .unwrap();
    assert_eq!(k0.len(), 4);
    let page = client.scan(NS, 0, 0, b"k1", 1, None, read).await.unwrap();
    assert_eq!(page.rows.len(), 1);
    assert!(page.next_cursor.is_none(), "only k1 matches the prefix");
    let page = client
        .scan_key(NS, b"k0", 0, 0, 2, None, read)
        .await
        .unwrap();
    assert_eq!(page.rows.len(), 2);
    let next = client
        .scan_key(NS, b"k0", 0, 0, 2, page.next_cursor, read)
        .await
        .unwrap();
    assert_eq!(next.rows[0].ts, 101, "k0 has ts 1, then 100..105");
}

#[tokio::test]
async fn batcher_coalesces_concurrent_appends() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let batcher = Batcher::new(
        client,
        BatcherOptions {
            linger: Duration::from_millis(20),
            batch_records_max: 64,
            ..Default::default()
        },
    );
    let futures: Vec<_> = (0..200)
        .map(|i| batcher.append(NS, record(format!("k{i}"), 1, "v")))
        .collect();
    let positions = futures::future::join_all(futures).await;
    let positions: Vec<_> = positions.into_iter().map(Result::unwrap).collect();
    let unique: std::collections::HashSet<_> =
        positions.iter().map(|p| (p.index, p.slot)).collect();
    assert_eq!(unique.len(), 200, "every record got its own position");
    {
        let s = node.lock();
        assert!(
            s.append_requests <= 8,
            "{} requests for 200 records",
            s.append_requests
        );
        assert!(
            s.batch_sizes.iter().all(|&n| n <= 64),
            "{:?}",
            s.batch_sizes
        );
        assert_eq!(s.rows.len(), 200);
    }
    // A bad record fails alone, before the queue.
    let err = batcher.append(NS, record("", 1, "v")).await.unwrap_err();
    assert_eq!(err.kind(), stele_proto::ErrorKind::Refuse);
    batcher.close().await;
}

#[tokio::test]
async fn batcher_flushes_on_close() {
    let node = FakeNode::one_tablet();
    let (_, client) = start(&node).await;
    let batcher = Batcher::new(
        client,
        BatcherOptions {
            linger: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let pending = tokio::spawn(batcher.append(NS, record("k", 1, "v")));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(node.lock().append_requests, 0, "still lingering");
    batcher.close().await;
    pending.await.unwrap().unwrap();
    assert_eq!(node.lock().applications, 1);
}

/// A cell whose tablets are not placed yet (the node lists none): an
/// append keeps its batch and retries within the budget until a tablet
/// covers it, rather than failing at once with "no tablet covers vshard".
#[tokio::test]
async fn an_append_waits_for_a_route_within_the_budget() {
    let node = FakeNode::with_tablets(Vec::new());
    let endpoint = node.serve().await.unwrap();
    let client = Client::connect(
        &endpoint,
        ClientOptions {
            retry: RetryPolicy {
                attempts_max: u32::MAX,
                ..opts().retry
            },
            ..opts()
        },
    )
    .await
    .unwrap();
    let placer = node.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        placer.lock().tablets = vec![TabletDescriptor {
            id: 1,
            vshard_lo: 0,
            vshard_hi: VSHARD_END,
            generation: 1,
            leader_node: 1,
            ..Default::default()
        }];
    });
    let positions = client
        .append(NS, vec![record("k", 1, b"v".to_vec())])
        .await
        .unwrap();
    assert_eq!(positions.len(), 1);
    assert_eq!(node.lock().applications, 1);
}

#[tokio::test]
async fn a_client_through_nodes_takes_routes_from_the_first_node_that_answers() {
    let node = FakeNode::one_tablet();
    let live = node.serve().await.unwrap();
    node.lock().tablets[0].leader_endpoint = live.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);

    let client = Client::connect_nodes(&[dead.clone(), live.clone()], opts())
        .await
        .unwrap();
    let routes = client.routes();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes.get(1).unwrap().leader_endpoint, live);
    client.append(NS, records(3)).await.unwrap();
    assert_eq!(node.lock().rows.len(), 3);
    // The watch opens at the node that answered and applies its map.
    let at = std::time::Instant::now();
    while !client.route_stats().watching || client.route_stats().pushed == 0 {
        assert!(
            at.elapsed() < Duration::from_secs(10),
            "{:?}",
            client.route_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // No node at all, or none that answers: typed errors, nothing sent.
    let err = Client::connect_nodes(&[], opts()).await.unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::InvalidArgument { .. })),
        "{err}"
    );
    assert!(Client::connect_nodes(&[dead], opts()).await.is_err());
    assert!(matches!(
        Client::connect_nodes(&["not a url".to_string()], opts()).await,
        Err(Error::InvalidEndpoint { .. })
    ));
}
