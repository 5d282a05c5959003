//! Health probes (issue 18): `/healthz` and `/readyz` on `--http-listen`,
//! read with `stele health` as a container healthcheck would, and gRPC
//! health on the client port: ready (SERVING) while serving, not ready
//! from the first moment of a graceful stop, nor while a restarted node
//! catches up with its groups, neither alive nor ready once the journal
//! stopped on a device error.

use std::time::{Duration, Instant};

use stele_client::retry::RetryPolicy;
use stele_client::{Client, ClientOptions};
use stele_tests::cell::{client_options, try_local_rows};
use stele_tests::controlled::ControlledCell;
use stele_tests::{NOT_SERVING, Proc, SERVING, free_port_base, grpc_health, health_client, run};
use tonic_health::pb::HealthCheckRequest;

fn start(dir: &std::path::Path, http: u16, envs: &[(&str, &str)]) -> Proc {
    let d = dir.to_str().unwrap();
    let http = format!("127.0.0.1:{http}");
    let args = [
        "server",
        "--node-id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        d,
        "--tablets",
        "2",
        "--disk-reserve-bytes",
        "0",
        "--journal-reserve-bytes",
        "0",
        "--http-listen",
        &http,
        "--shutdown-deadline-ms",
        "4000",
    ];
    Proc::start(&args, envs).unwrap()
}

fn probe(http: u16, path: &str) -> (bool, String) {
    let (ok, out, err) = run(&[
        "health",
        "--addr",
        &format!("http://127.0.0.1:{http}{path}"),
    ]);
    (ok, format!("{out}{err}"))
}

/// [`probe`] off the async runtime.
async fn probe_async(http: u16, path: &'static str) -> (bool, String) {
    tokio::task::spawn_blocking(move || probe(http, path))
        .await
        .unwrap()
}

/// gRPC health of "" and `stele.v1.Data` on `endpoint`.
async fn grpc_both(endpoint: &str) -> [Result<i32, String>; 2] {
    [
        grpc_health(endpoint, "").await,
        grpc_health(endpoint, "stele.v1.Data").await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_ready_then_not_ready_through_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let http = free_port_base(1);
    let mut proc = start(dir.path(), http, &[]);
    assert_eq!(
        probe_async(http, "/readyz").await,
        (true, "200 ready\n".into())
    );
    assert_eq!(
        probe_async(http, "/healthz").await,
        (true, "200 ok\n".into())
    );
    assert_eq!(grpc_both(&proc.endpoint).await, [Ok(SERVING), Ok(SERVING)]);
    // A gRPC health `Watch`, as a load balancer keeps open.
    let mut watch = health_client(&proc.endpoint)
        .await
        .unwrap()
        .watch(HealthCheckRequest {
            service: "stele.v1.Data".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, SERVING);
    // Alone, the node has no one to hand its leaderships to: the stop
    // waits out its deadline, not ready all along, still alive.
    stele_tests::signal(proc.child.id(), libc::SIGTERM);
    let stopping = Instant::now();
    let watched = tokio::time::timeout(Duration::from_secs(2), watch.message())
        .await
        .expect("no gRPC health change within 2 s of SIGTERM")
        .unwrap()
        .unwrap();
    assert_eq!(watched.status, NOT_SERVING, "gRPC health Watch");
    assert_eq!(
        grpc_both(&proc.endpoint).await,
        [Ok(NOT_SERVING), Ok(NOT_SERVING)],
        "gRPC health Check during a graceful stop"
    );
    let (ready, said) = probe_async(http, "/readyz").await;
    assert!(!ready, "ready during a graceful stop: {said}");
    assert!(said.contains("503"), "{said}");
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "not ready only after {:?}",
        stopping.elapsed()
    );
    assert!(
        proc.child.try_wait().unwrap().is_none(),
        "exited before the checks: they saw nothing of the stop"
    );
    assert!(
        probe_async(http, "/healthz").await.0,
        "not alive during a graceful stop"
    );
    // The open Watch ends with the server: it does not hold the stop.
    let ended = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the Watch stream outlived the stop");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    let status = tokio::task::spawn_blocking(move || proc.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_journal_fails_both_probes() {
    let dir = tempfile::tempdir().unwrap();
    let http = free_port_base(1);
    let proc = start(
        dir.path(),
        http,
        &[("STELE_FAILPOINTS", "journal-sync-eio=20")],
    );
    let client = Client::connect(
        &proc.endpoint,
        ClientOptions {
            retry: RetryPolicy {
                attempts_max: 2,
                deadline: Duration::from_millis(300),
                backoff_initial: Duration::from_millis(10),
                backoff_max: Duration::from_millis(50),
            },
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(probe_async(http, "/readyz").await.0);
    assert_eq!(grpc_both(&proc.endpoint).await, [Ok(SERVING), Ok(SERVING)]);
    let mut failed = false;
    for i in 0..200u64 {
        let rec = stele_client::record(format!("k{i}"), i, b"v".to_vec());
        if client.append("health/ns", vec![rec]).await.is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "the injected fault never fired");
    for path in ["/healthz", "/readyz"] {
        let (ok, said) = probe_async(http, path).await;
        assert!(!ok, "{path} passes with the journal stopped: {said}");
        assert!(said.contains("journal stopped"), "{path}: {said}");
    }
    // gRPC health follows within its refresh (200 ms).
    let until = Instant::now() + Duration::from_secs(3);
    let mut now = grpc_both(&proc.endpoint).await;
    while now != [Ok(NOT_SERVING), Ok(NOT_SERVING)] && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = grpc_both(&proc.endpoint).await;
    }
    assert_eq!(
        now,
        [Ok(NOT_SERVING), Ok(NOT_SERVING)],
        "gRPC health with the journal stopped"
    );
}

#[test]
fn bad_probe_addresses_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let (ok, _, err) = run(&[
        "server",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        d.to_str().unwrap(),
        "--http-listen",
        "not an address",
    ]);
    assert!(!ok && err.contains("--http-listen"), "{err}");
    assert!(!d.exists(), "a refused start made its data directory");
    for bad in [
        "ftp://127.0.0.1:1/readyz",
        "http://0.0.0.0:1/readyz",
        "127.0.0.1",
    ] {
        let (ok, _, err) = run(&["health", "--addr", bad]);
        assert!(!ok && err.contains("--addr"), "{bad}: {err}");
    }
    // Nothing listening: a failure, not a hang.
    let port = free_port_base(1);
    let (ok, _, err) = run(&[
        "health",
        "--addr",
        &format!("http://127.0.0.1:{port}/readyz"),
    ]);
    assert!(!ok, "{err}");
}

/// Sends SIGCONT when dropped, so a failing test never leaves a stopped
/// process behind.
struct Frozen(Vec<u32>);

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.0 {
            stele_tests::signal(*pid, libc::SIGCONT);
        }
    }
}

/// A node restarted behind its cell serves at once but is not ready (HTTP
/// 503 "catching up", gRPC NOT_SERVING) until each replica it hosts heard
/// from its leader and applied what that leader had committed. The other
/// voters are frozen for a while, so "behind" lasts long enough to see:
/// the node remembers its groups' old leader, but none reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_not_ready_until_it_caught_up() {
    const NS: &str = "catchup/ns";
    let mut cell = ControlledCell::new(1, 3);
    // The controller neither repairs nor rebalances around the frozen nodes.
    cell.controller_flags = [
        "--lease-ms",
        "30000",
        "--repair-grace-ms",
        "30000",
        "--leader-balance-ms",
        "0",
    ]
    .map(String::from)
    .to_vec();
    let (_ctl, mut nodes) = cell.start(2);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let behind = nodes.remove(&3).unwrap();
    let status = tokio::task::spawn_blocking(move || behind.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let written: Vec<String> = (0..40).map(|i| format!("while-down-{i}")).collect();
    for (i, v) in written.iter().enumerate() {
        let rec = stele_client::record(format!("k{i}"), 1, v.clone().into_bytes());
        client.append(NS, vec![rec]).await.unwrap();
    }
    let frozen = Frozen(nodes.values().map(|p| p.child.id()).collect());
    for pid in &frozen.0 {
        stele_tests::signal(*pid, libc::SIGSTOP);
    }
    let http = free_port_base(1);
    let listen = format!("127.0.0.1:{http}");
    let node3 =
        tokio::task::block_in_place(|| cell.start_node_with(3, &["--http-listen", &listen]));
    let endpoint = node3.endpoint.clone();
    let frozen_at = Instant::now();
    while frozen_at.elapsed() < Duration::from_secs(3) {
        let (ok, said) = probe_async(http, "/readyz").await;
        assert!(
            !ok && said.contains("catching up"),
            "/readyz while behind: {said}"
        );
        assert_eq!(
            grpc_both(&endpoint).await,
            [Ok(NOT_SERVING), Ok(NOT_SERVING)],
            "gRPC health while behind ({said})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        probe_async(http, "/healthz").await.0,
        "not alive while catching up"
    );
    drop(frozen);
    let thawed = Instant::now();
    loop {
        let (ok, said) = probe_async(http, "/readyz").await;
        if ok {
            assert_eq!(said, "200 ready\n");
            break;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(30),
            "not ready 30 s after its peers came back: {said}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("caught up {:?} after the thaw", thawed.elapsed());
    // Ready means caught up: what was written while it was down is here.
    let rows = try_local_rows(&endpoint, NS).await.unwrap();
    let values: std::collections::HashSet<String> = rows
        .iter()
        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
        .collect();
    let missing: Vec<&String> = written.iter().filter(|v| !values.contains(*v)).collect();
    assert!(missing.is_empty(), "ready but missing {missing:?}");
    // gRPC health follows within its refresh.
    let until = Instant::now() + Duration::from_secs(2);
    let mut now = grpc_both(&endpoint).await;
    while now != [Ok(SERVING), Ok(SERVING)] && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = grpc_both(&endpoint).await;
    }
    assert_eq!(
        now,
        [Ok(SERVING), Ok(SERVING)],
        "gRPC health once caught up"
    );
    assert!(
        node3.stderr_lines().iter().any(|l| l.contains("caught up")),
        "no caught-up line logged"
    );
}
