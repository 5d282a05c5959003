//! A rolling upgrade as docs/OPERATIONS.md "Upgrade a cell" orders it, from
//! an older build (`STELE_OLD_BIN`; `scripts/upgrade-test [REV]` builds
//! one and runs this) to the binary under test, under a client load:
//! controllers one at a time, then each node after `stele node
//! restart-safe`; the mixed cell keeps serving; segment format 2 is
//! refused until the last node runs the new binary, and no replica writes
//! it before; then enabled, every replica writes it. Then log format 2:
//! concurrent appends coalesce into one entry, and a node restarted after
//! replays a log of both formats. At the end every acknowledged record is
//! read back exactly once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stele_tests::bench::{assert_verified, report, sigterm, start_bench};
use stele_tests::controlled::ControlledCell;
use stele_tests::{format_version, segments, series};

fn old_bin() -> PathBuf {
    let p = std::env::var("STELE_OLD_BIN")
        .expect("STELE_OLD_BIN names the older stele binary (scripts/upgrade-test builds one)");
    let p = PathBuf::from(p);
    assert!(p.exists(), "STELE_OLD_BIN {} does not exist", p.display());
    p
}

fn version_of(bin: &std::path::Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("stele ")
        .to_string()
}

/// Every format version of every segment on every node.
fn versions_on_disk(cell: &ControlledCell) -> Vec<u32> {
    (1..=cell.nodes)
        .flat_map(|n| segments(&cell.data_dir(&format!("node{n}"))))
        .map(|(_, v)| v)
        .collect()
}

fn node_version(cell: &ControlledCell, n: usize) -> String {
    cell.node_list()
        .into_iter()
        .find(|x| x["id"].as_u64() == Some(n as u64))
        .map(|x| x["version"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < timeout, "{what}: not after {timeout:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn enable_refused(cell: &ControlledCell, naming: &str) {
    let (ok, out, err) = cell.cli(&["cell", "formats", "enable", "segment", "2"]);
    assert!(!ok, "segment 2 enabled in a mixed cell: {out}");
    assert!(
        err.contains(naming),
        "refusal does not name {naming}: {err}"
    );
}

#[test]
#[ignore = "needs an older binary in STELE_OLD_BIN: scripts/upgrade-test runs it"]
fn rolling_upgrade_from_the_previous_build_under_load() {
    let old = old_bin();
    let new_version = version_of(&stele_tests::stele_bin());
    assert_ne!(version_of(&old), new_version, "the old binary is this one");
    let mut cell = ControlledCell::new(3, 3);
    // The old build predates TLS on gRPC: the cell runs plaintext.
    cell.plaintext = true;
    cell.node_flags
        .extend(["--memtable-age-max-s".into(), "1".into()]);
    for name in ["ctl1", "ctl2", "ctl3", "node1", "node2", "node3"] {
        cell.binaries.insert(name.into(), old.clone());
    }
    let (mut controllers, mut nodes) = cell.start(4);
    let load = start_bench(&cell.node_endpoint(1), "10m", 8);
    std::thread::sleep(Duration::from_secs(3));

    // Controllers first, one at a time.
    for c in 1..=3 {
        let status = controllers.remove(&c).unwrap().terminate();
        eprintln!("controller {c} (old) stopped: {status}");
        cell.binaries.remove(&format!("ctl{c}"));
        controllers.insert(c, cell.start_controller(c));
        wait_for("controller quorum back", Duration::from_secs(30), || {
            cell.cli(&["cell", "status"]).0
        });
    }
    enable_refused(&cell, "node 1 runs");

    let mut http_ports = Vec::new();
    // Then the nodes: restart-safe, stop, start the new binary, wait until
    // it reports the new build and every tablet has its voters again.
    for n in 1..=3 {
        let t = Instant::now();
        let (ok, out, err) = cell.cli(&[
            "node",
            "restart-safe",
            &n.to_string(),
            "--wait",
            "--timeout",
            "30s",
        ]);
        assert!(ok, "restart-safe {n}: {out}{err}");
        let status = nodes.remove(&n).unwrap().terminate();
        eprintln!("node {n} (old) stopped: {status}");
        cell.binaries.remove(&format!("node{n}"));
        // The new build with metrics on, and one append entry in flight
        // per tablet, so concurrent appends coalesce once log 2 is on.
        let port = stele_tests::free_port_base(1);
        let listen = format!("127.0.0.1:{port}");
        http_ports.push(port);
        nodes.insert(
            n,
            cell.start_node_with(n, &["--http-listen", &listen, "--append-in-flight", "1"]),
        );
        wait_for(
            "node reports the new build",
            Duration::from_secs(30),
            || node_version(&cell, n) == new_version,
        );
        cell.wait_settled(Duration::from_secs(60));
        eprintln!("node {n} upgraded in {:?}", t.elapsed());
        if n < 3 {
            // Still one node without format 2: refused, and no replica
            // has written a format 2 segment.
            enable_refused(&cell, "node 3 runs");
            let v = versions_on_disk(&cell);
            assert!(!v.is_empty(), "no segments: the check would mean nothing");
            assert!(v.iter().all(|&v| v == 1), "format 2 used early: {v:?}");
        }
    }

    // Every member upgraded: the format goes up, and new seals use it.
    let f: serde_json::Value = cell.json(&["cell", "formats", "enable", "segment", "2"]);
    assert_eq!(format_version(&f["formats"], "segment"), Some(2), "{f}");
    wait_for(
        "a format 2 segment on every node",
        Duration::from_secs(30),
        || {
            (1..=3).all(|n| {
                segments(&cell.data_dir(&format!("node{n}")))
                    .iter()
                    .any(|(_, v)| *v == 2)
            })
        },
    );

    // Then the log format: coalesced entries (AppendMany) from now on,
    // next to the format 1 entries the old binary wrote. A burst of
    // concurrent appends, each acknowledged one read back once; a node
    // restarted after replays the mixed log.
    let f: serde_json::Value = cell.json(&["cell", "formats", "enable", "log", "2"]);
    assert_eq!(format_version(&f["formats"], "log"), Some(2), "{f}");
    std::thread::sleep(Duration::from_secs(2));
    let burst = report(start_bench(&cell.node_endpoint(2), "4s", 48));
    assert_verified(&burst, "appends coalesced after log 2");
    assert_eq!(burst["errors"], 0, "{burst}");
    let coalesced: f64 = http_ports
        .iter()
        .map(|&p| {
            let m = stele_tests::http_get(p, "/metrics");
            let all = series(&m, "stele_tablet_append_entry_batches_count").unwrap_or(0.0);
            let one =
                series(&m, "stele_tablet_append_entry_batches_bucket{le=\"1\"}").unwrap_or(0.0);
            all - one
        })
        .sum();
    assert!(
        coalesced > 0.0,
        "no entry carried more than one batch after log 2 was enabled"
    );
    let (ok, out, err) = cell.cli(&["node", "restart-safe", "1", "--wait", "--timeout", "30s"]);
    assert!(ok, "restart-safe 1: {out}{err}");
    let status = nodes.remove(&1).unwrap().terminate();
    eprintln!("node 1 stopped after log 2: {status}");
    nodes.insert(1, cell.start_node(1));
    cell.wait_settled(Duration::from_secs(60));

    sigterm(&load);
    let r = report(load);
    eprintln!("upgrade under load: {r}");
    assert_verified(&r, "rolling upgrade");
    assert!(
        r["records_acked"].as_u64().unwrap() >= 100,
        "too little load to mean anything: {r}"
    );
    assert_eq!(r["errors"], 0, "client errors during the upgrade: {r}");
}
