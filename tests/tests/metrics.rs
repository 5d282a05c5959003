//! Metrics (issue 20): `/metrics` of a node, a controller and a directory
//! of a small real cell under load. Every series docs/OPERATIONS.md
//! "Metrics" documents is exported by its role (and nothing undocumented
//! is), the series move (appends counted, fsyncs timed, a killed node dead
//! in the controller's gauge within the lease, lookups counted), and every
//! series the Grafana dashboard (docs/grafana/stele.json) queries exists.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use stele_tests::controlled::ControlledCell;
use stele_tests::directory::Directory;
use stele_tests::{Proc, bench, free_port_base, http_get, run};

fn docs(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The per-tablet series of the busiest tablets a node leads.
const HOT: &str = "stele_tablet_hot_";

/// One `/metrics` body.
struct Scrape(String);

impl Scrape {
    fn of(port: u16) -> Scrape {
        Scrape(http_get(port, "/metrics"))
    }

    fn samples(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series, value.parse().ok()?))
            })
    }

    /// Sample names (`stele_x_bucket`, `stele_y`), labels dropped.
    fn names(&self) -> BTreeSet<String> {
        self.samples()
            .map(|(s, _)| s.split('{').next().unwrap().to_string())
            .collect()
    }

    /// The value of one series, spelt as rendered (`name{a="b"}`).
    fn value(&self, series: &str) -> Option<f64> {
        self.samples().find(|(s, _)| *s == series).map(|(_, v)| v)
    }

    fn get(&self, series: &str) -> f64 {
        self.value(series)
            .unwrap_or_else(|| panic!("no series {series} in:\n{}", self.0))
    }
}

/// The rows of the "Metrics" table: (name, type, role).
fn documented() -> Vec<(String, String, String)> {
    let ops = docs("OPERATIONS.md");
    let section = ops
        .split("\n## Metrics\n")
        .nth(1)
        .expect("a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<_> = section
        .lines()
        .filter(|l| l.starts_with("| `stele_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                cells[1].trim_matches('`').to_string(),
                cells[2].to_string(),
                cells[4].to_string(),
            )
        })
        .collect();
    assert!(rows.len() > 50, "too few documented metrics: {rows:?}");
    rows
}

/// What `role`'s scrape lacks of the documented series, and what it
/// exports that is not documented.
fn mismatches(s: &Scrape, role: &str) -> (Vec<String>, Vec<String>) {
    let names = s.names();
    let doc = documented();
    let missing = doc
        .iter()
        .filter(|(_, _, r)| r == role || r == "all")
        // Per-tablet series exist only under load (checked there).
        .filter(|(n, _, _)| !n.starts_with(HOT))
        .map(|(n, t, _)| {
            if t == "histogram" {
                format!("{n}_count")
            } else {
                n.clone()
            }
        })
        .filter(|n| !names.contains(n))
        .collect();
    let known: BTreeSet<&str> = doc.iter().map(|(n, _, _)| n.as_str()).collect();
    let undocumented = names
        .iter()
        .filter(|n| n.starts_with("stele_"))
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !known.contains(n.as_str()) && !known.contains(base)
        })
        .cloned()
        .collect();
    (missing, undocumented)
}

/// Every metric name the dashboard's queries use.
fn dashboard_metrics() -> BTreeSet<String> {
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let json: serde_json::Value = serde_json::from_str(&docs("grafana/stele.json")).unwrap();
    let mut all = Vec::new();
    exprs(&json, &mut all);
    assert!(all.len() > 20, "too few queries in the dashboard: {all:?}");
    let mut names = BTreeSet::new();
    for e in &all {
        let mut rest = e.as_str();
        while let Some(at) = rest.find("stele_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

/// Starts the cell's controller and nodes, each with `--http-listen` on
/// `http + 0` (controller) and `http + n` (node n), and creates the cell.
fn start_cell(cell: &ControlledCell, http: u16) -> (Proc, Vec<Proc>) {
    let ctl = cell.start_controller(1);
    let nodes: Vec<Proc> = (1..=cell.nodes)
        .map(|n| {
            let listen = format!("127.0.0.1:{}", http + n as u16);
            cell.start_node_with(n, &["--http-listen", &listen])
        })
        .collect();
    let (ok, out, err) = run(&[
        "cell",
        "init",
        "--controllers",
        &cell.controllers_arg(),
        "--tablets",
        "4",
        "--replication",
        "3",
    ]);
    assert!(ok, "cell init: {out}{err}");
    cell.wait_settled(Duration::from_secs(60));
    (ctl, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_exports_the_documented_series_and_they_move() {
    let http = free_port_base(5);
    let (ctl_port, dir_port) = (http, http + 4);
    let node_port = |n: u16| http + n;
    let mut cell = ControlledCell::new(1, 3);
    // A cold tier, so the tier's series move too: sealed segments are
    // uploaded, then evicted (no hot age).
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    cell.node_flags = [
        "--object-store",
        &url,
        "--cell-id",
        "c1",
        "--hot-age-s",
        "0",
        // One per-tablet series per node: some node leads two tablets.
        "--metrics-hot-tablets",
        "1",
    ]
    .map(String::from)
    .to_vec();
    cell.controller_flags
        .extend(["--http-listen".into(), format!("127.0.0.1:{ctl_port}")]);
    let (_ctl, mut nodes) = start_cell(&cell, http);
    let dir = Directory::new(1, true);
    let _dir = dir.start_with(1, &["--http-listen", &format!("127.0.0.1:{dir_port}")]);
    dir.json(&["directory", "init"]);
    dir.json(&[
        "cell",
        "register",
        "c1",
        "--controllers",
        &cell.controllers_arg(),
    ]);
    dir.json(&["ns", "create", "w/a", "--cell", "c1"]);
    for _ in 0..3 {
        dir.json(&["ns", "show", "w/a"]);
    }
    let (ok, _, _) = dir.cli(&["ns", "show", "w/none"]);
    assert!(!ok, "a namespace that does not exist was found");

    // Every documented series, by role; nothing undocumented.
    let scrape_nodes = || -> Vec<Scrape> { (1..=3).map(|n| Scrape::of(node_port(n))).collect() };
    let before = scrape_nodes();
    let ctl = Scrape::of(ctl_port);
    let directory = Scrape::of(dir_port);
    for (s, role) in [
        (&before[0], "node"),
        (&ctl, "controller"),
        (&directory, "directory"),
    ] {
        let (missing, undocumented) = mismatches(s, role);
        assert!(missing.is_empty(), "{role} lacks documented {missing:?}");
        assert!(
            undocumented.is_empty(),
            "{role} exports undocumented {undocumented:?}"
        );
    }

    // Every series the dashboard queries is exported by some role.
    let exported: BTreeSet<String> = [&before[0], &ctl, &directory]
        .iter()
        .flat_map(|s| s.names())
        .collect();
    let absent: Vec<_> = dashboard_metrics()
        .into_iter()
        .filter(|m| !m.starts_with(HOT) && !exported.contains(m))
        .collect();
    assert!(
        absent.is_empty(),
        "the dashboard queries {absent:?}, not exported"
    );

    // The cell as the gauges see it.
    assert_eq!(ctl.get("stele_controller_leader"), 1.0);
    assert_eq!(ctl.get("stele_controller_tablets"), 4.0);
    assert_eq!(ctl.get(r#"stele_controller_nodes{state="up"}"#), 3.0);
    assert!(ctl.get("stele_controller_route_generation") > 0.0);
    assert!(ctl.get(r#"stele_controller_heartbeat_seconds_count{result="ok"}"#) > 0.0);
    assert!(ctl.get("stele_controller_plan_seconds_count") > 0.0);
    let sum = |s: &[Scrape], series: &str| s.iter().map(|s| s.get(series)).sum::<f64>();
    assert_eq!(sum(&before, "stele_raft_tablets_hosted"), 12.0);
    // One leader per tablet, once any leader-balancing transfer is done
    // (each replica judges by its own view).
    let settled = Instant::now();
    while sum(&scrape_nodes(), "stele_raft_tablets_led") != 4.0 {
        assert!(
            settled.elapsed() < Duration::from_secs(15),
            "led: {}",
            sum(&scrape_nodes(), "stele_raft_tablets_led")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One connection per pair (the transport's invariant), both ends.
    assert!(before[0].get("stele_peer_connections") >= 2.0);
    assert!(before[0].get("stele_disk_free_bytes") > 0.0);
    assert!(before[0].get("stele_process_resident_memory_bytes") > 0.0);
    assert!(before[0].get("stele_process_open_fds") > 0.0);
    assert_eq!(
        directory.get(r#"stele_directory_namespaces{cell="c1"}"#),
        1.0
    );
    assert!(directory.get(r#"stele_directory_lookups_total{result="found"}"#) >= 3.0);
    assert!(directory.get(r#"stele_directory_lookups_total{result="not_found"}"#) >= 1.0);
    // One cell registered, one namespace created.
    assert_eq!(directory.get("stele_directory_generation"), 2.0);
    assert_eq!(directory.get("stele_directory_cells"), 1.0);

    // Under load: appends counted and timed, fsyncs timed, bytes written.
    // Records of 1 KiB: the tablets' 64 KiB memtables fill and seal.
    let load = bench::start_bench_sized(&cell.node_endpoint(1), "5s", 4, 1024);
    let report = bench::report(load);
    bench::assert_clean(&report, "load");
    let acked = report["records_acked"].as_u64().unwrap() as f64;
    let after = scrape_nodes();
    let grew = |series: &str| sum(&after, series) - sum(&before, series);
    assert!(
        grew("stele_node_appended_records_total") >= acked,
        "{acked} records acknowledged, the counters grew by {}",
        grew("stele_node_appended_records_total")
    );
    assert!(grew(r#"stele_node_append_seconds_count{result="ok"}"#) >= 1.0);
    assert!(grew("stele_node_appended_bytes_total") >= acked * 1024.0);
    for s in &after {
        // Every node journals every record (3 voters): fsyncs on each.
        assert!(s.get("stele_journal_fsync_seconds_count") > 0.0, "{}", s.0);
        assert!(s.get("stele_journal_fsync_seconds_sum") > 0.0);
        assert!(s.get(r#"stele_journal_fsync_seconds_bucket{le="+Inf"}"#) > 0.0);
        assert!(s.get("stele_journal_group_records_count") > 0.0);
        assert!(s.get("stele_tablet_records_applied_total") > 0.0);
    }
    assert!(grew("stele_journal_fsync_seconds_count") > 0.0);
    assert!(grew("stele_journal_written_bytes_total") >= acked * 1024.0);
    assert!(grew("stele_journal_group_bytes_sum") > 0.0);
    assert!(after[0].get(r#"stele_peer_bytes_total{direction="out"}"#) > 0.0);
    // The busiest tablet each node leads, and only that one (the bench's
    // four namespaces may leave a tablet idle: a node that leads only idle
    // ones has none).
    let mut hot_total = 0;
    for s in &after {
        let hot: Vec<(&str, f64)> = s
            .samples()
            .filter(|(n, _)| n.starts_with("stele_tablet_hot_records_per_second{tablet="))
            .collect();
        assert!(hot.len() <= 1, "at most one hot tablet per node: {hot:?}");
        hot_total += hot.len();
        for (series, rate) in hot {
            assert!(rate > 0.0, "{series} {rate}");
            let tablet = series.split('"').nth(1).unwrap();
            let bytes = format!(r#"stele_tablet_hot_segment_bytes{{tablet="{tablet}"}}"#);
            let reads = format!(r#"stele_tablet_hot_reads_per_second{{tablet="{tablet}"}}"#);
            assert!(
                s.value(&bytes).is_some() && s.value(&reads).is_some(),
                "{}",
                s.0
            );
        }
    }
    assert!(hot_total >= 1, "no hot tablet on any node under load");
    let exported: BTreeSet<String> = after.iter().flat_map(|s| s.names()).collect();
    let hot_queried: Vec<String> = dashboard_metrics()
        .into_iter()
        .filter(|m| m.starts_with(HOT))
        .collect();
    assert!(
        !hot_queried.is_empty(),
        "the dashboard shows the hot tablets"
    );
    for m in hot_queried {
        assert!(
            exported.contains(&m),
            "the dashboard queries {m}, not exported"
        );
    }
    // Seals timed and their bytes counted (the sealer runs behind apply).
    let sealing = Instant::now();
    loop {
        let s = scrape_nodes();
        let seals = sum(&s, "stele_tablet_seal_seconds_count");
        if seals > 0.0 {
            assert!(sum(&s, "stele_tablet_sealed_bytes_total") > 0.0);
            break;
        }
        assert!(
            sealing.elapsed() < Duration::from_secs(20),
            "no seal timed after {} records of 1 KiB",
            acked
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Uploaded by their leaders, then evicted.
    let tiering = Instant::now();
    loop {
        let s = scrape_nodes();
        let (up, ev) = (
            sum(&s, "stele_tier_uploads_total"),
            sum(&s, "stele_tier_evictions_total"),
        );
        if up > 0.0 && ev > 0.0 {
            assert!(sum(&s, "stele_tier_uploaded_bytes_total") > 0.0);
            assert!(sum(&s, "stele_tier_manifests_total") > 0.0);
            assert_eq!(sum(&s, "stele_tier_upload_failures_total"), 0.0);
            break;
        }
        assert!(
            tiering.elapsed() < Duration::from_secs(30),
            "uploads {up}, evictions {ev} 30 s after the seals"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A killed node is dead in the controller's gauge within the lease
    // (3 s here; plus a scheduler tick and a scrape).
    nodes.pop().unwrap().kill9();
    let killed = Instant::now();
    let lease = Duration::from_millis(3000);
    loop {
        let s = Scrape::of(ctl_port);
        if s.get(r#"stele_controller_nodes{state="dead"}"#) == 1.0 {
            assert_eq!(s.get(r#"stele_controller_nodes{state="up"}"#), 2.0);
            // Every tablet had a voter on it.
            assert_eq!(s.get("stele_controller_tablets_under_replicated"), 4.0);
            // One voter of three gone: every tablet keeps its majority.
            assert_eq!(s.get("stele_controller_tablets_lost_majority"), 0.0);
            break;
        }
        assert!(
            killed.elapsed() < lease + Duration::from_secs(2),
            "node 3 not dead in the gauge {:?} after the kill:\n{}",
            killed.elapsed(),
            s.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("dead in the gauge after {:?}", killed.elapsed());
}

/// `stele dev` turns the HTTP status listener on at a port it prints, and
/// the node's series are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stele_dev_prints_its_metrics_address() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port_base(1));
    let dev = Proc::start(
        &[
            "dev",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            &listen,
            "--tablets",
            "2",
        ],
        &[],
    )
    .unwrap();
    let line = dev
        .started
        .iter()
        .find(|l| l.contains("HTTP status"))
        .unwrap_or_else(|| panic!("no HTTP status line in {:?}", dev.started));
    let port: u16 = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let s = Scrape::of(port);
    let (mut missing, _) = mismatches(&s, "node");
    // Per follower: a node with no followers has none.
    missing.retain(|m| !m.starts_with("stele_raft_follower_lag_"));
    assert!(missing.is_empty(), "stele dev lacks {missing:?}");
    assert_eq!(s.get("stele_raft_tablets_hosted"), 2.0);
    dev.kill9();
}
