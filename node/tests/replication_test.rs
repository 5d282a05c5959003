//! Three storage nodes in one process, Raft messages looped back in memory
//! (the network seam `raft::router::Peers`), the real journal, catalog and
//! segments on each. Proves replication of the storage engine: a quorum
//! acknowledges, every replica seals the same segment bytes, and a cut-off
//! leader is replaced.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::watch::WatchReceiver;
use stele_node::raft::router::{Lane, Peers, node_of};
use stele_node::{Node, NodeOptions};
use stele_proto::command::{AppendBatch, RecordIn, TabletCommand, TabletResponse};
use stele_proto::vshard;

#[derive(Clone, Default)]
struct LoopPeers {
    nodes: Arc<RwLock<HashMap<u64, Weak<Node>>>>,
    /// Nodes cut off from everyone (their messages and messages to them drop).
    cut: Arc<RwLock<HashSet<u64>>>,
    me: u64,
}

impl LoopPeers {
    fn for_node(&self, me: u64) -> LoopPeers {
        LoopPeers { me, ..self.clone() }
    }
}

impl Peers for LoopPeers {
    fn call(
        &self,
        node: u64,
        group: u64,
        target: u64,
        _lane: Lane,
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + '_>> {
        Box::pin(async move {
            {
                let cut = self.cut.read().unwrap();
                if cut.contains(&node) || cut.contains(&self.me) {
                    return Err("partitioned".into());
                }
            }
            let n = self
                .nodes
                .read()
                .unwrap()
                .get(&node)
                .and_then(Weak::upgrade)
                .ok_or("no such node")?;
            n.handle_raft(group, target, &body).await
        })
    }
}

fn options(dir: &std::path::Path, node: u64) -> NodeOptions {
    let mut o = NodeOptions::new(dir.join(format!("n{node}")));
    o.node_id = node;
    o.cell_nodes = vec![1, 2, 3];
    o.initial_tablets = 2;
    o.tablet.memtable_bytes_max = 32 * 1024;
    // Small segments compact in twos: replicas must agree on those too.
    o.tablet.compact_min_inputs = 2;
    o.journal.reserve_bytes = 0;
    o.disk_reserve_bytes = 0;
    o.policy_interval = Duration::from_millis(50);
    o.raft = stele_node::raft::RaftTiming::for_election_timeout(1500);
    o
}

async fn cell(dir: &std::path::Path, peers: &LoopPeers) -> Vec<Arc<Node>> {
    let mut nodes = Vec::new();
    // Node 1 initializes every group; open it last so its peers listen.
    for id in [2u64, 3, 1] {
        let n = Node::open_with_peers(options(dir, id), Some(peers.for_node(id)))
            .await
            .unwrap();
        peers.nodes.write().unwrap().insert(id, Arc::downgrade(&n));
        nodes.push(n);
    }
    nodes.sort_by_key(|n| n.options.node_id);
    nodes
}

async fn leader_of(nodes: &[Arc<Node>], tablet: u64, not: Option<u64>) -> Arc<Node> {
    for _ in 0..200 {
        for n in nodes {
            if Some(n.options.node_id) == not {
                continue;
            }
            if n.replica(tablet).unwrap().is_leader() {
                return n.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader for tablet {tablet}");
}

fn batch(ns: &str, id: u64, key: &str) -> TabletCommand {
    TabletCommand::Append(AppendBatch {
        namespace: ns.into(),
        batch_id: [0, id],
        records: vec![RecordIn {
            key: key.as_bytes().to_vec(),
            ts: id,
            value: vec![7; 1000],
            vshard: vshard::vshard(ns, key.as_bytes()),
        }],
        expect: None,
        proposed_at_us: id,
    })
}

/// A key of `ns` that lands in tablet `t`.
fn key_in(nodes: &[Arc<Node>], ns: &str, t: u64) -> String {
    let tablet = &nodes[0].replica(t).unwrap().tablet;
    (0..10_000)
        .map(|i| format!("k{i}"))
        .find(|k| tablet.contains(vshard::vshard(ns, k.as_bytes())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_agree_on_segments_and_survive_a_cut_leader() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,openraft=error")
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let peers = LoopPeers::default();
    let nodes = cell(dir.path(), &peers).await;
    let tablet = 1;
    let key = key_in(&nodes, "rep/ns", tablet);
    for i in 1..=150u64 {
        // As a client would: find the leader, retry the same batch id on a
        // leader change (receipts make the retry safe).
        let mut tries = 0;
        loop {
            let leader = leader_of(&nodes, tablet, None).await;
            match leader
                .replica(tablet)
                .unwrap()
                .raft
                .client_write(batch("rep/ns", i, &key))
                .await
            {
                Ok(resp) => {
                    assert!(matches!(resp.data, TabletResponse::Appended { .. }));
                    break;
                }
                Err(e) => {
                    tries += 1;
                    assert!(tries < 20, "write {i} keeps failing: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    let leader = leader_of(&nodes, tablet, None).await;
    // Every replica applies everything and seals the same segments.
    let mut same = false;
    for _ in 0..200 {
        let ids: Vec<Vec<String>> = nodes
            .iter()
            .map(|n| {
                let replica = n.replica(tablet).unwrap();
                let data = replica.tablet.read();
                data.segments.iter().map(|(r, _)| r.id.clone()).collect()
            })
            .collect();
        let compacted = nodes.iter().all(|n| {
            n.replica(tablet)
                .unwrap()
                .tablet
                .stats
                .compactions
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        });
        if compacted && !ids[0].is_empty() && ids.iter().all(|x| *x == ids[0]) {
            same = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        same,
        "replicas did not converge on identical segment ids after a compaction on each"
    );
    for n in &nodes {
        let mut rows = 0;
        for _ in 0..200 {
            rows = {
                let replica = n.replica(tablet).unwrap();
                replica
                    .tablet
                    .scan_key_unlocked("rep/ns", key.as_bytes(), 0, u64::MAX, None, 1000)
                    .unwrap()
                    .0
                    .len()
            };
            if rows == 150 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(rows, 150, "node {} is missing rows", n.options.node_id);
    }

    // Cut the leader off: it acknowledges nothing; the others elect and serve.
    let old = leader.options.node_id;
    peers.cut.write().unwrap().insert(old);
    let stuck = tokio::time::timeout(
        Duration::from_secs(2),
        leader
            .replica(tablet)
            .unwrap()
            .raft
            .client_write(batch("rep/ns", 1000, &key)),
    )
    .await;
    assert!(
        !matches!(stuck, Ok(Ok(_))),
        "a cut-off leader acknowledged a write"
    );
    let mut tries = 0;
    let new = loop {
        let new = leader_of(&nodes, tablet, Some(old)).await;
        assert_ne!(new.options.node_id, old);
        match new
            .replica(tablet)
            .unwrap()
            .raft
            .client_write(batch("rep/ns", 151, &key))
            .await
        {
            Ok(resp) => {
                assert!(matches!(resp.data, TabletResponse::Appended { .. }));
                break new;
            }
            Err(e) => {
                tries += 1;
                assert!(tries < 20, "the majority side cannot write: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let leader_hint = new
        .replica(tablet)
        .unwrap()
        .raft
        .metrics()
        .borrow_watched()
        .current_leader
        .map(node_of);
    assert_eq!(leader_hint, Some(new.options.node_id));

    // Heal: the old leader steps down and converges.
    peers.cut.write().unwrap().clear();
    let mut converged = false;
    for _ in 0..200 {
        let r = leader.replica(tablet).unwrap();
        let (rows, _) = r
            .tablet
            .scan_key_unlocked("rep/ns", key.as_bytes(), 0, u64::MAX, None, 10_000)
            .unwrap();
        if !r.is_leader() && rows.iter().any(|row| row.ts == 151) {
            converged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !converged {
        for n in &nodes {
            let m = n
                .replica(tablet)
                .unwrap()
                .raft
                .metrics()
                .borrow_watched()
                .clone();
            eprintln!(
                "node {}: state {:?} term {} leader {:?} last_log {:?} applied {:?} snapshot {:?} purged {:?}",
                n.options.node_id,
                m.state,
                m.current_term,
                m.current_leader,
                m.last_log_index,
                m.last_applied,
                m.snapshot,
                m.purged
            );
        }
    }
    assert!(converged, "old leader did not step down and catch up");
    let fetched: u64 = nodes
        .iter()
        .map(|n| {
            n.stats
                .segments_fetched
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    eprintln!("segments fetched for snapshot installs: {fetched}");
    for n in &nodes {
        n.shutdown().await;
    }
}
