//! Versions and the format gate as an operator meets them: every member
//! reports its build; `stele cell formats enable segment 2` is refused,
//! naming the member, while one runs a binary without it (here a node that
//! registers as a binary from before the gate would: no formats), and for
//! a format or version nobody knows; once every member has it, the cell
//! turns it on, new seals write format 2 on every replica with the same
//! bytes, and a node without it is refused from then on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_tests::bench::{assert_clean, report, start_bench};
use stele_tests::controlled::ControlledCell;
use stele_tests::{format_version, segments};

/// A heartbeat as a node on a binary from before the gate sends it: no
/// version, no formats.
fn old_heartbeat(controller: &str, node: u64) -> Result<pb::HeartbeatResponse, tonic::Status> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = pb::controller_client::ControllerClient::connect(controller.to_string())
            .await
            .unwrap();
        c.heartbeat(pb::HeartbeatRequest {
            node: Some(pb::NodeRegistration {
                id: node,
                client_endpoint: "http://127.0.0.1:9".into(),
                peer_endpoint: "127.0.0.1:9".into(),
                capacity: 1,
                ..Default::default()
            }),
            replicas: Vec::new(),
            token_epoch: None,
            load: None,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
    })
}

fn this_version() -> String {
    let (ok, out, err) = stele_tests::run(&["--version"]);
    assert!(ok, "{err}");
    out.trim().trim_start_matches("stele ").to_string()
}

#[test]
fn formats_are_gated_until_every_member_supports_them() {
    let mut cell = ControlledCell::new(1, 3);
    // Heartbeats as nodes of older builds, sent by hand: plaintext (the
    // gate is about formats, not identities; TLS has tests of its own).
    cell.plaintext = true;
    // Nodes of older builds must be able to join: no format they lack is
    // on (delta heartbeats would refuse them, as they should).
    cell.heartbeat_deltas = false;
    // Seals every second, so a short load leaves segments to look at.
    cell.node_flags
        .extend(["--memtable-age-max-s".into(), "1".into()]);
    let (_controllers, _nodes) = cell.start(4);
    let seed = cell.node_endpoint(1);
    let version = this_version();
    assert!(
        version.starts_with("0.") && version.contains('('),
        "{version}"
    );

    let f: serde_json::Value = cell.json(&["cell", "formats"]);
    assert_eq!(format_version(&f["formats"], "segment"), Some(1), "{f}");
    assert_eq!(f["controllers"][0]["version"], version.as_str(), "{f}");
    for n in f["nodes"].as_array().unwrap() {
        assert_eq!(n["version"], version.as_str(), "{f}");
        assert_eq!(format_version(&n["formats"], "segment"), Some(2), "{f}");
    }

    // Load before: every seal writes format 1.
    let r = report(start_bench(&seed, "4s", 8));
    assert_clean(&r, "before enabling");
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<_> = (1..=3)
        .map(|n| segments(&cell.data_dir(&format!("node{n}"))))
        .collect();
    assert!(
        before.iter().all(|s| !s.is_empty()),
        "no seal happened: the test would show nothing: {before:?}"
    );
    assert!(before.iter().flatten().all(|(_, v)| *v == 1), "{before:?}");

    // Hostile requests: refused, typed, nothing changed.
    for (args, want) in [
        (&["segment", "3"][..], "not a version this controller knows"),
        (&["segment", "0"][..], "not a version this controller knows"),
        (&["log", "3"][..], "not a version this controller knows"),
        (&["journal", "2"][..], "no gated format"),
    ] {
        let mut a = vec!["cell", "formats", "enable"];
        a.extend(args);
        let (ok, out, err) = cell.cli(&a);
        assert!(!ok, "{args:?} accepted: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
    }

    // A node on a binary without format 2 joins: enabling is refused and
    // names it.
    old_heartbeat(&cell.controller_endpoint(1), 9).expect("an old node may join");
    let (ok, out, err) = cell.cli(&["cell", "formats", "enable", "segment", "2"]);
    assert!(!ok, "enabled with an old node in the cell: {out}");
    assert!(
        err.contains("node 9 runs") && err.contains("not every member"),
        "{err}"
    );
    let f: serde_json::Value = cell.json(&["cell", "formats"]);
    assert_eq!(
        format_version(&f["formats"], "segment"),
        Some(1),
        "a refusal changed the cell: {f}"
    );

    // Gone for good: decommissioned, it no longer counts.
    let (ok, out, err) = cell.cli(&["node", "decommission", "9"]);
    assert!(ok, "{out}{err}");
    let f: serde_json::Value = cell.json(&["cell", "formats", "enable", "segment", "2"]);
    assert_eq!(format_version(&f["formats"], "segment"), Some(2), "{f}");
    // Again: a no-op. Down again: refused.
    cell.json::<serde_json::Value>(&["cell", "formats", "enable", "segment", "2"]);
    let (ok, _, err) = cell.cli(&["cell", "formats", "enable", "segment", "1"]);
    assert!(!ok && err.contains("never goes back"), "{err}");

    // From now on a binary without format 2 is refused at its heartbeat.
    let refused = old_heartbeat(&cell.controller_endpoint(1), 9).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("segment format 2"),
        "{}",
        refused.message()
    );

    // Load after: new seals write format 2, each the same bytes (same id)
    // on every replica; the format 1 segments stay readable.
    let r = report(start_bench(&seed, "4s", 8));
    assert_clean(&r, "after enabling");
    let started = Instant::now();
    loop {
        let after: Vec<BTreeSet<String>> = (1..=3)
            .map(|n| {
                segments(&cell.data_dir(&format!("node{n}")))
                    .into_iter()
                    .filter(|(_, v)| *v == 2)
                    .map(|(id, _)| id)
                    .collect()
            })
            .collect();
        let same = after.iter().all(|s| !s.is_empty() && *s == after[0]);
        if same {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "format 2 segments differ between replicas (or none): {after:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out, err) =
        stele_tests::run(&["tablet", "list", "--controllers", &cell.controllers_arg()]);
    assert!(ok, "{out}{err}");
}
