//! `stele dev --nodes 3`: the one command that runs a replicated cell on
//! loopback, with its controller. It must come up, place every tablet on
//! all three nodes, take writes through any node and through the
//! controller's route map, replicate them, and stop every node it started.

use std::net::TcpListener;
use std::time::Duration;

use stele_client::{Client, ClientOptions};
use stele_proto::pb;
use stele_tests::Proc;

/// The WARN and ERROR lines a process printed so far.
fn warnings(proc: &Proc) -> Vec<String> {
    proc.stderr_lines()
        .into_iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_dev_cell_prints_no_warning() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", stele_tests::free_port_base(1));
    let d = dir.path().to_str().unwrap();
    let proc = Proc::start(&["dev", "--data-dir", d, "--listen", &listen], &[]).unwrap();
    let c = Client::connect(&proc.endpoint, ClientOptions::default())
        .await
        .unwrap();
    for i in 0..10u64 {
        c.append(
            "dev/quiet",
            vec![stele_client::record(format!("k{i}"), i, b"v".to_vec())],
        )
        .await
        .unwrap();
    }
    // An explicit --endpoint wins over a STELE_DIRECTORY in the
    // environment (which names nothing that answers here).
    let ep = proc.endpoint.clone();
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        stele_tests::run_env(
            &[
                "append",
                "--endpoint",
                &ep,
                "--namespace",
                "dev/quiet",
                "--key",
                "direct",
                "--value",
                "v",
            ],
            &[("STELE_DIRECTORY", "http://127.0.0.1:9")],
        )
    })
    .await
    .unwrap();
    assert!(ok, "{out}{err}");
    assert!(err.contains("not routing through the directory"), "{err}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let warnings = warnings(&proc);
    assert!(warnings.is_empty(), "{}", warnings.join("\n"));
    proc.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_nodes_3_runs_a_replicated_cell_and_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let base = stele_tests::free_port_base(3);
    let listen = format!("127.0.0.1:{base}");
    let d = dir.path().to_str().unwrap();
    let args = [
        "dev",
        "--nodes",
        "3",
        "--data-dir",
        d,
        "--listen",
        &listen,
        "--tablets",
        "4",
        "--election-timeout-ms",
        "1000",
    ];
    let proc = Proc::start(&args, &[]).unwrap();
    // Every process's HTTP status listener (/metrics), printed by name.
    let http: Vec<&String> = proc
        .started
        .iter()
        .filter(|l| l.contains("HTTP status at http://127.0.0.1:"))
        .collect();
    assert_eq!(http.len(), 3, "{:?}", proc.started);
    let endpoints: Vec<String> = (0..3)
        .map(|i| format!("http://127.0.0.1:{}", base + i))
        .collect();
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect(&endpoints[2], ClientOptions::default()).await
            && c.list_tablets()
                .await
                .is_ok_and(|ts| ts.len() == 4 && ts.iter().all(|t| t.leader_node != 0))
        {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = client.expect("the dev cell never had leaders for every tablet");
    // A clean start says nothing alarming (openraft's routine start-up
    // chatter is demoted: src/logging.rs).
    let warnings = warnings(&proc);
    assert!(warnings.is_empty(), "{}", warnings.join("\n"));
    for i in 0..20u64 {
        client
            .append(
                "dev/cell",
                vec![stele_client::record(format!("k{i}"), i, b"v".to_vec())],
            )
            .await
            .unwrap();
    }
    // The controller's view, and writes routed by its route map.
    let ctl = endpoints[0].clone();
    let (ok, out, err) = stele_tests::run(&["cell", "status", "--controllers", &ctl, "--json"]);
    assert!(ok, "{err}");
    let cs: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(cs["nodes_up"], 3, "{cs}");
    assert_eq!(cs["tablets"], 4, "{cs}");
    assert_eq!(cs["tablets_unplaced"], 0, "{cs}");
    // Every member runs this build: dev turns on coalesced appends and
    // delta heartbeats.
    let (ok, out, err) = stele_tests::run(&["cell", "formats", "--controllers", &ctl, "--json"]);
    assert!(ok, "{err}");
    let f: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for (name, version) in [("log", 2), ("heartbeat", 2)] {
        let on = f["formats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == name && x["version"] == version);
        assert!(on, "{name} {version} not on in a dev cell: {f}");
    }
    let routed = Client::connect_cell(std::slice::from_ref(&ctl), ClientOptions::default())
        .await
        .unwrap();
    assert_eq!(routed.routes().len(), 4);
    for i in 20..30u64 {
        routed
            .append(
                "dev/cell",
                vec![stele_client::record(format!("k{i}"), i, b"v".to_vec())],
            )
            .await
            .unwrap();
    }
    // Every node holds every record (bounded reads are served locally).
    for e in &endpoints {
        let c = Client::connect(e, ClientOptions::default()).await.unwrap();
        let read = pb::ReadOptions {
            consistency: pb::Consistency::Bounded as i32,
            max_staleness_ms: 600_000,
            partial: false,
        };
        let mut n = 0;
        for _ in 0..50 {
            n = c.scan_all("dev/cell", 0, 0, b"", read).await.unwrap().len();
            if n == 30 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(n, 30, "{e} does not hold every record");
    }
    // At most one QUIC connection per node pair, shared by every tablet
    // group (connections are made on first use: two followers that never
    // exchanged a message have none).
    let mut total = 0;
    for e in &endpoints {
        let c = Client::connect(e, ClientOptions::default()).await.unwrap();
        let st = c.status().await.unwrap();
        assert_eq!(st.tablets, 4);
        assert!(st.peer_connections <= 2, "{e}: {st:?}");
        assert_eq!(st.peers_with_extra_connections, 0, "{e}: {st:?}");
        total += st.peer_connections;
    }
    assert!(
        total >= 4,
        "the leader must reach both followers: {total} connection ends"
    );
    // The operator's view of the same counters, through the CLI. Every node
    // has led a heartbeat round or answered the leader's control messages.
    let (ok, out, err) = stele_tests::run(&["status", "--endpoint", &endpoints[0], "--json"]);
    assert!(ok, "{err}");
    let st: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(st["tablets"], 4, "{st}");
    assert!(st["peer_control_messages"].as_u64().unwrap() > 0, "{st}");
    assert!(
        st["peer_control_messages"].as_u64() >= st["peer_control_batches"].as_u64(),
        "{st}"
    );
    assert!(proc.terminate().success());
    // Every node it started is gone: their client ports are free again.
    for i in 0..3 {
        let mut free = false;
        for _ in 0..50 {
            if TcpListener::bind(("127.0.0.1", base + i)).is_ok() {
                free = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(free, "node {} still listens after stele dev stopped", i + 1);
    }
}

/// `stele dev --cells 2`: a directory and two cells from one command; the
/// CLI, given only the directory, creates namespaces on first use, spreads
/// them over both cells and reads them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cells_2_runs_a_directory_and_two_cells() {
    let dir = tempfile::tempdir().unwrap();
    let base = stele_tests::free_port_base(3);
    let listen = format!("127.0.0.1:{base}");
    let d = dir.path().to_str().unwrap();
    let args = [
        "dev",
        "--cells",
        "2",
        "--data-dir",
        d,
        "--listen",
        &listen,
        "--tablets",
        "2",
        "--election-timeout-ms",
        "1000",
    ];
    let proc = Proc::start(&args, &[]).unwrap();
    let directory = format!("http://{listen}");
    // The directory answers first; the cells register once they are led.
    let mut cells = serde_json::Value::Null;
    for _ in 0..300 {
        let (ok, out, _) = stele_tests::run(&["cell", "list", "--directory", &directory, "--json"]);
        if ok {
            cells = serde_json::from_str(out.trim()).unwrap();
            if cells.as_array().is_some_and(|c| c.len() == 2) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<&str> = cells
        .as_array()
        .expect("the dev cells never registered")
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c1", "c2"]);
    for ns in ["dev/one", "dev/two"] {
        let (ok, out, err) = stele_tests::run(&[
            "append",
            "--directory",
            &directory,
            "--namespace",
            ns,
            "--key",
            "k",
            "--value",
            ns,
        ]);
        assert!(ok, "append {ns}: {out}{err}");
        let (ok, out, err) = stele_tests::run(&[
            "scan",
            "--directory",
            &directory,
            "--namespace",
            ns,
            "--json",
        ]);
        assert!(ok && out.contains(ns), "scan {ns}: {out}{err}");
    }
    let (ok, out, err) = stele_tests::run(&["ns", "list", "--directory", &directory, "--json"]);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let placed: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["cell"].as_str().unwrap()))
        .collect();
    assert_eq!(placed, [("dev/one", "c1"), ("dev/two", "c2")]);
    assert!(proc.terminate().success());
    for port in base..base + 3 {
        let mut free = false;
        for _ in 0..50 {
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                free = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(free, "port {port} still in use after stele dev stopped");
    }
}

/// A node that cannot start (its port is taken) ends `stele dev` with an
/// error naming it, instead of a cell that waits forever for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_stops_with_an_error_when_a_node_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let base = stele_tests::free_port_base(3);
    let _taken = TcpListener::bind(("127.0.0.1", base + 2)).unwrap();
    let mut child = tokio::process::Command::new(stele_tests::stele_bin())
        .args(["dev", "--nodes", "3", "--tablets", "2"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", &format!("127.0.0.1:{base}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>| async move {
        let mut s = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s)
            .await
            .unwrap();
        s
    };
    let out = tokio::spawn(read(Box::new(stdout)));
    let err = tokio::spawn(read(Box::new(stderr)));
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("stele dev still running 60 s after a node failed to start")
        .unwrap();
    let (out, err) = (out.await.unwrap(), err.await.unwrap());
    assert!(!status.success(), "{out}\n{err}");
    assert!(
        err.contains("node 3 exited while the cell was starting"),
        "{out}\n{err}"
    );
    assert!(err.contains("Address already in use"), "{err}");
}
