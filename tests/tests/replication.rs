//! A three-node cell of real `stele server` processes on loopback, peers
//! over QUIC with mutual TLS: appends survive SIGKILL of the node leading
//! every tablet, a new leader serves, and after the killed node restarts
//! every acknowledged record is on all three replicas exactly once.

use std::collections::HashMap;
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use stele_client::retry::RetryPolicy;
use stele_client::{Client, ClientOptions};
use stele_proto::pb;
use stele_proto::pb::data_client::DataClient;
use stele_tests::{Proc, run};

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cell {
    dir: tempfile::TempDir,
    client_ports: Vec<u16>,
    peer_ports: Vec<u16>,
}

impl Cell {
    fn new() -> Cell {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        assert!(run(&["cert", "init", "--out", ca.to_str().unwrap()]).0);
        for n in 1..=3 {
            let out = dir.path().join(format!("certs{n}"));
            let (ok, _, err) = run(&[
                "cert",
                "node",
                "--ca",
                ca.to_str().unwrap(),
                "--node-id",
                &n.to_string(),
                "--out",
                out.to_str().unwrap(),
            ]);
            assert!(ok, "{err}");
        }
        Cell {
            dir,
            client_ports: (0..3).map(|_| free_tcp()).collect(),
            peer_ports: (0..3).map(|_| free_udp()).collect(),
        }
    }

    fn args(&self, n: usize) -> Vec<String> {
        let d = self.dir.path();
        let peers: Vec<String> = (1..=3)
            .filter(|m| *m != n)
            .map(|m| format!("{m}=127.0.0.1:{}", self.peer_ports[m - 1]))
            .collect();
        let endpoints: Vec<String> = (1..=3)
            .filter(|m| *m != n)
            .map(|m| format!("{m}=http://127.0.0.1:{}", self.client_ports[m - 1]))
            .collect();
        [
            "server".to_string(),
            "--node-id".into(),
            n.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.client_ports[n - 1]),
            "--peer-listen".into(),
            format!("127.0.0.1:{}", self.peer_ports[n - 1]),
            "--data-dir".into(),
            d.join(format!("data{n}")).to_str().unwrap().into(),
            "--certs".into(),
            d.join(format!("certs{n}")).to_str().unwrap().into(),
            "--peers".into(),
            peers.join(","),
            "--peer-endpoints".into(),
            endpoints.join(","),
            "--tablets".into(),
            "4".into(),
            "--memtable-bytes-max".into(),
            "65536".into(),
            "--election-timeout-ms".into(),
            "1500".into(),
            "--disk-reserve-bytes".into(),
            "0".into(),
            "--journal-reserve-bytes".into(),
            "0".into(),
        ]
        .to_vec()
    }

    fn start(&self, nodes: &[usize]) -> HashMap<usize, Proc> {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let args = self.args(*n);
                let n = *n;
                std::thread::spawn(move || {
                    let a: Vec<&str> = args.iter().map(String::as_str).collect();
                    (
                        n,
                        Proc::start(&a, &[]).unwrap_or_else(|e| panic!("node {n}: {e}")),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn endpoint(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.client_ports[n - 1])
    }
}

fn opts() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 30,
            deadline: Duration::from_secs(20),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
        },
        request_timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    }
}

async fn bounded_scan(endpoint: &str, max_staleness_ms: u64) -> Result<usize, stele_proto::Error> {
    let mut c = DataClient::connect(endpoint.to_string()).await.unwrap();
    c.scan(pb::ScanRequest {
        namespace: "rep/cell".into(),
        limit: 10,
        read: Some(pb::ReadOptions {
            consistency: pb::Consistency::Bounded as i32,
            max_staleness_ms,
            partial: false,
        }),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().rows.len())
    .map_err(|s| stele_proto::Error::from_status(&s))
}

/// Every record of the namespace as one node's own replicas hold it, or
/// the refusal of a replica no leader has contacted yet (just restarted).
async fn local_rows(endpoint: &str) -> Result<Vec<pb::Row>, tonic::Status> {
    let mut c = DataClient::connect(endpoint.to_string()).await.unwrap();
    let mut out = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let resp = c
            .scan(pb::ScanRequest {
                namespace: "rep/cell".into(),
                limit: 1000,
                cursor: cursor.clone(),
                read: Some(pb::ReadOptions {
                    consistency: pb::Consistency::Bounded as i32,
                    max_staleness_ms: 600_000,
                    partial: false,
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(resp.rows);
        if resp.next_cursor.is_empty() {
            return Ok(out);
        }
        cursor = resp.next_cursor;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_new_leader_serves_and_replicas_converge() {
    let cell = Cell::new();
    let mut procs = cell.start(&[1, 2, 3]);
    let client = Client::connect(&cell.endpoint(2), opts()).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..300u64 {
        let v = format!("v{i}-{}", "x".repeat(500));
        client
            .append(
                "rep/cell",
                vec![stele_client::record(
                    format!("k{}", i % 50),
                    i,
                    v.clone().into_bytes(),
                )],
            )
            .await
            .unwrap();
        acked.push(v);
    }
    // Node 1 initialized every group; kill whichever node leads the most.
    let tablets = client.list_tablets().await.unwrap();
    let mut count: HashMap<u64, usize> = HashMap::new();
    for t in &tablets {
        *count.entry(t.leader_node).or_default() += 1;
    }
    let victim = *count.iter().max_by_key(|(_, c)| **c).unwrap().0 as usize;
    assert!(victim >= 1, "no leader known: {tablets:?}");
    procs.remove(&victim).unwrap().kill9();
    let seed = if victim == 2 { 3 } else { 2 };
    let client = Client::connect(&cell.endpoint(seed), opts()).await.unwrap();
    let killed_at = Instant::now();
    loop {
        let ts = client.list_tablets().await.unwrap_or_default();
        if !ts.is_empty()
            && ts
                .iter()
                .all(|t| t.leader_node != 0 && t.leader_node != victim as u64)
        {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no new leaders"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elected = killed_at.elapsed();
    eprintln!("every tablet had a new leader {elected:?} after SIGKILL of node {victim}");
    let mut first_ok = None;
    for i in 300..450u64 {
        let v = format!("v{i}-{}", "x".repeat(500));
        loop {
            match client
                .append(
                    "rep/cell",
                    vec![stele_client::record(
                        format!("k{}", i % 50),
                        i,
                        v.clone().into_bytes(),
                    )],
                )
                .await
            {
                Ok(_) => break,
                Err(e) => {
                    assert!(
                        killed_at.elapsed() < Duration::from_secs(30),
                        "no leader after the kill: {e}"
                    );
                    let _ = client.refresh_routes().await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        first_ok.get_or_insert(killed_at.elapsed());
        acked.push(v);
    }
    let failover = first_ok.unwrap();
    eprintln!("first write acknowledged {failover:?} after SIGKILL of node {victim}");
    // Election timeout T = 1.5 s: a follower campaigns after [T, 2T) without
    // contact, so the bound, one election timeout plus a second, is
    // 2T + 1 s.
    assert!(
        failover < Duration::from_millis(4000),
        "failover took {failover:?}"
    );

    procs.extend(cell.start(&[victim]));
    let mut ok = false;
    for _ in 0..100 {
        let mut all = true;
        for n in 1..=3 {
            let Ok(rows) = local_rows(&cell.endpoint(n)).await else {
                all = false;
                continue;
            };
            let mut seen: HashMap<&[u8], usize> = HashMap::new();
            for r in &rows {
                *seen.entry(&r.value).or_default() += 1;
            }
            assert!(
                seen.values().all(|c| *c == 1),
                "node {n} holds a record twice"
            );
            if acked.iter().any(|v| !seen.contains_key(v.as_bytes())) {
                all = false;
            }
        }
        if all {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "replicas did not converge on every acknowledged record");

    // Bounded-staleness reads on a follower: fresh while the leader talks to
    // it, `TooStale` once the leader has been silent longer than asked.
    let (ns_lo, _) = stele_proto::vshard::namespace_range("rep/cell");
    let client = Client::connect(&cell.endpoint(seed), opts()).await.unwrap();
    let t = client
        .list_tablets()
        .await
        .unwrap()
        .into_iter()
        .find(|t| ns_lo >= t.vshard_lo && u64::from(ns_lo) < t.vshard_hi)
        .unwrap();
    let leader = t.leader_node as usize;
    let follower = (1..=3).find(|n| *n != leader).unwrap();
    assert!(bounded_scan(&cell.endpoint(follower), 2000).await.unwrap() > 0);
    let pid = procs[&leader].child.id();
    stele_tests::signal(pid, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stale = bounded_scan(&cell.endpoint(follower), 300).await;
    stele_tests::signal(pid, libc::SIGCONT);
    assert!(
        matches!(stale, Err(stele_proto::Error::TooStale { .. })),
        "a follower cut off from its leader for 1.2 s answered a 300 ms bounded read: {stale:?}"
    );
    for (_, p) in procs {
        p.terminate();
    }
}
