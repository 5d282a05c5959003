//! Health probes (issue 18): `/healthz` and `/readyz` on `--http-listen`,
//! read with `stele health` as a container healthcheck would: ready while
//! serving, not ready from the first moment of a graceful stop, neither
//! alive nor ready once the journal stopped on a device error.

use std::time::{Duration, Instant};

use stele_client::retry::RetryPolicy;
use stele_client::{Client, ClientOptions};
use stele_tests::{Proc, free_port_base, run};

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

#[test]
fn probes_answer_ready_then_not_ready_through_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let http = free_port_base(1);
    let mut proc = start(dir.path(), http, &[]);
    assert_eq!(probe(http, "/readyz"), (true, "200 ready\n".into()));
    assert_eq!(probe(http, "/healthz"), (true, "200 ok\n".into()));
    // Alone, the node has no one to hand its leaderships to: the stop
    // waits out its deadline, not ready all along, still alive.
    stele_tests::signal(proc.child.id(), libc::SIGTERM);
    let stopping = Instant::now();
    let (ready, said) = loop {
        let r = probe(http, "/readyz");
        if !r.0 || stopping.elapsed() > Duration::from_secs(3) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!ready, "ready during a graceful stop: {said}");
    assert!(said.contains("503"), "{said}");
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "not ready only after {:?}",
        stopping.elapsed()
    );
    assert!(
        probe(http, "/healthz").0,
        "not alive during a graceful stop"
    );
    let status = proc.child.wait().unwrap();
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
    assert!(
        tokio::task::spawn_blocking(move || probe(http, "/readyz").0)
            .await
            .unwrap()
    );
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
        let (ok, said) = tokio::task::spawn_blocking(move || probe(http, path))
            .await
            .unwrap();
        assert!(!ok, "{path} passes with the journal stopped: {said}");
        assert!(said.contains("journal stopped"), "{path}: {said}");
    }
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
