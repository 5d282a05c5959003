//! `stele bench --verify --json` as a background client load: started,
//! ended by SIGTERM (it stops sending, then verifies), and its report
//! checked: zero errors and every acknowledged record read back once.

use std::process::{Child, Command, Stdio};

use crate::stele_bin;

/// Starts `stele bench --verify --json` against `endpoint` in the
/// background, one record per request, `concurrency` requests in flight.
pub fn start_bench(endpoint: &str, duration: &str, concurrency: usize) -> Child {
    start_bench_sized(endpoint, duration, concurrency, 64)
}

/// [`start_bench`] with records of `record_bytes`.
pub fn start_bench_sized(
    endpoint: &str,
    duration: &str,
    concurrency: usize,
    record_bytes: usize,
) -> Child {
    Command::new(stele_bin())
        .args([
            "bench",
            "--verify",
            "--json",
            "--endpoint",
            endpoint,
            "--batch-records",
            "1",
            "--concurrency",
            &concurrency.to_string(),
            "--namespaces",
            "4",
            "--record-bytes",
            &record_bytes.to_string(),
            "--duration",
            duration,
        ])
        .env("STELE_CERTS_DIR", &crate::tls::test_ca().operator)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stele bench")
}

/// Waits for a bench to finish and returns its report; the process must
/// have exited successfully (it fails when a record is lost or duplicated).
pub fn report(bench: Child) -> serde_json::Value {
    let out = bench.wait_with_output().expect("wait for bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({:?}): {stdout}{stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"))
}

/// Zero errors, something acknowledged, and every acknowledged record read
/// back once.
pub fn assert_clean(r: &serde_json::Value, what: &str) {
    let acked = r["records_acked"].as_u64().unwrap();
    assert!(
        acked >= 50,
        "{what}: too little traffic to mean anything: {r}"
    );
    assert_eq!(r["errors"], 0, "{what}: {r}");
    assert_verified(r, what);
}

/// Every acknowledged record read back exactly once (errors allowed).
pub fn assert_verified(r: &serde_json::Value, what: &str) {
    let acked = r["records_acked"].as_u64().unwrap();
    let v = &r["verify"];
    assert_eq!(v["acked"].as_u64(), Some(acked), "{what}: {r}");
    assert_eq!(v["lost"], 0, "{what}: {r}");
    assert_eq!(v["duplicated"], 0, "{what}: {r}");
    assert_eq!(v["found_once"].as_u64(), Some(acked), "{what}: {r}");
}

/// Ends a background bench the way an operator would (SIGTERM).
pub fn sigterm(bench: &Child) {
    crate::signal(bench.id(), libc::SIGTERM);
}
