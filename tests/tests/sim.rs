//! `stele sim nodes` against a real controller, at a size a test affords:
//! eight simulated nodes take the placement of 24 tablets, lead them, and
//! after one of them stops, the controller moves its voters away and the
//! simulation reports every group back on live voters. The report is what
//! `scripts/sim-bench` publishes at 400 nodes (docs/BENCHMARKS.md).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stele_tests::controlled::ControlledCell;
use stele_tests::{run, stele_bin};

#[test]
fn simulated_nodes_take_tablets_and_a_lost_one_is_repaired() {
    let mut cell = ControlledCell::new(1, 0);
    // The simulator speaks plaintext.
    cell.plaintext = true;
    cell.controller_flags = [
        "--lease-ms",
        "2000",
        "--repair-grace-ms",
        "500",
        "--max-intents",
        "64",
    ]
    .map(String::from)
    .to_vec();
    let _ctl = cell.start_controller(1);
    let controllers = cell.controllers_arg();

    // Hostile arguments: refused before anything starts.
    for (args, says) in [
        (&["--count", "2", "--kill", "2"][..], "--kill"),
        (&["--count", "0"][..], "--count"),
        (
            &["--count", "2", "--heartbeat-ms", "0"][..],
            "--heartbeat-ms",
        ),
    ] {
        let mut a = vec!["sim", "nodes", "--controllers", &controllers];
        a.extend(args);
        let (ok, out, err) = run(&a);
        assert!(!ok, "{args:?} accepted: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
    }

    let sim = Command::new(stele_bin())
        .args([
            "sim",
            "nodes",
            "--count",
            "8",
            "--controllers",
            &controllers,
            "--seconds",
            "30",
            "--kill",
            "1",
            "--kill-after-s",
            "8",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the simulator");
    let started = Instant::now();
    let init = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--controllers", &controllers]);
        loop {
            let (ok, _, err) = run(&a);
            if ok {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{args:?}: {err}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    init(&["cell", "init", "--tablets", "24", "--replication", "3"]);
    // Refused until every simulated node has reported its build.
    init(&["cell", "formats", "enable", "heartbeat", "2"]);
    let out = sim.wait_with_output().expect("the simulator ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(r["tablets"], 24, "{r}");
    assert!(
        r["all_led_s"].as_f64().is_some(),
        "not every tablet led: {r}"
    );
    assert!(r["killed_tablets"].as_u64().unwrap() > 0, "{r}");
    // One node of three voters each: every group kept its majority.
    assert_eq!(r["lost_majority"], 0, "{r}");
    assert!(
        r["first_replacement_s"].as_f64().is_some(),
        "no replacement assigned: {r}\n{err}"
    );
    assert!(
        r["repaired_s"].as_f64().is_some() && r["unrepaired"] == 0,
        "not repaired: {r}\n{err}"
    );
    // Deltas both ways once the format is on.
    assert!(
        r["answers_delta"].as_u64().unwrap() > r["answers_full"].as_u64().unwrap(),
        "{r}"
    );
    // The watcher saw the placement, the elections and the repair
    // pushed: at least every tablet once, and changes after the first.
    assert!(r["route_changes"].as_u64().unwrap() >= 24, "{r}");
    assert!(r["route_messages"].as_u64().unwrap() > 0, "{r}");
    let beats = r["heartbeats"].as_u64().unwrap();
    assert!(beats > 8 * 20, "{r}");
    assert!(r["heartbeats_failed"].as_u64().unwrap() * 10 < beats, "{r}");
}
