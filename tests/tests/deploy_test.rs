//! Deployment: the container cell of `deploy/compose.yaml` under load
//! through a rolling restart, a killed container and a network cut (needs
//! Docker: `scripts/test` runs it whenever a daemon answers); a cell of
//! processes started from config files only, and `stele server --config`
//! refusing bad files; and the files an operator follows
//! (docs/OPERATIONS.md "Deploy a cell", `deploy/walkthrough`,
//! `deploy/stele.service`) kept in step.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stele_tests::Proc;
use stele_tests::compose::{self, ComposeCell, NODES, docker};
use stele_tests::controlled::ControlledCell;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The steps of the "Deploy a cell" section: each `#### title` and the
/// lines of the ```sh block under it.
fn doc_steps() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(root().join("docs/OPERATIONS.md")).unwrap();
    let start = doc
        .find("\n## Deploy a cell\n")
        .expect("docs/OPERATIONS.md has a \"Deploy a cell\" section");
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_block = false;
    for line in section.lines() {
        if let Some(title) = line.strip_prefix("#### ") {
            steps.push((title.to_string(), Vec::new()));
        } else if line == "```sh" && !steps.is_empty() {
            in_block = true;
        } else if line == "```" {
            in_block = false;
        } else if in_block && !line.trim().is_empty() {
            steps.last_mut().unwrap().1.push(line.to_string());
        }
    }
    steps
}

/// The steps of `deploy/walkthrough`: each `step "title"` and the lines
/// after it, up to the next step or the end of the walk-through.
fn script_steps() -> Vec<(String, Vec<String>)> {
    let script = std::fs::read_to_string(root().join("deploy/walkthrough")).unwrap();
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in script.lines() {
        if line == "# end of the walk-through" {
            break;
        }
        if let Some(title) = line
            .strip_prefix("step \"")
            .and_then(|r| r.strip_suffix('"'))
        {
            steps.push((title.to_string(), Vec::new()));
        } else if let Some(last) = steps.last_mut()
            && !line.trim().is_empty()
        {
            last.1.push(line.to_string());
        }
    }
    steps
}

#[test]
fn walkthrough_runs_the_documented_steps() {
    let doc = doc_steps();
    let script = script_steps();
    let titles = |s: &[(String, Vec<String>)]| s.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    assert!(
        titles(&doc).len() >= 6,
        "the walk-through has its steps: {:?}",
        titles(&doc)
    );
    for want in [
        "build-image",
        "stele:dev cert",
        "up -d",
        "readyz",
        "append",
        "down -v",
    ] {
        assert!(
            doc.iter().flat_map(|(_, l)| l).any(|l| l.contains(want)),
            "a step of the walk-through runs {want:?}"
        );
    }
    assert_eq!(
        titles(&doc),
        titles(&script),
        "docs/OPERATIONS.md and deploy/walkthrough name the same steps"
    );
    for ((title, d), (_, s)) in doc.iter().zip(&script) {
        assert_eq!(
            d, s,
            "step {title:?}: deploy/walkthrough runs the document's commands, line for line"
        );
    }
}

#[test]
fn systemd_unit_verifies_and_is_hardened() {
    let unit = std::fs::read_to_string(root().join("deploy/stele.service")).unwrap();
    for want in [
        "ExecStart=/usr/local/bin/stele server --config /etc/stele/stele.toml",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/stele",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=\n",
        "LimitNOFILE=",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=",
    ] {
        assert!(unit.contains(want), "deploy/stele.service has {want:?}");
    }
    // systemd checks it as systemd would load it, with the binary under
    // test in place of the installed one.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stele.service");
    let bin = stele_tests::stele_bin();
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/stele", bin.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) checks the unit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {err}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "systemd-analyze security: exposure above 2.0:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `stele server --config FILE`, expected to refuse: its exit status and
/// stderr, or a panic when it is still running after 20 s.
fn refused(file: &Path) -> String {
    let mut child = Command::new(stele_tests::stele_bin())
        .args(["server", "--config"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(!status.success(), "{} was accepted: {err}", file.display());
            return err;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stele server --config {} started", file.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn server_config_refuses_unknown_keys_bad_values_and_unspecified_advertise() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = stele_tests::free_port_base(1);
    let base = format!(
        "node_id = 1\ndata_dir = {:?}\ntablets = 2\n",
        data.to_str().unwrap()
    );
    let certs = dir.path().join("certs1");
    stele_tests::make_certs(dir.path(), 1);
    let cases: [(&str, String, &[&str]); 4] = [
        (
            "unknown key",
            format!("{base}listen = \"127.0.0.1:{port}\"\nno_such_key = 1\n"),
            &["no_such_key"],
        ),
        (
            "bad value",
            format!("{base}listen = \"127.0.0.1:{port}\"\nheartbeat_ms = \"often\"\n"),
            &["heartbeat_ms"],
        ),
        (
            "unspecified client address without advertise",
            format!("{base}listen = \"0.0.0.0:{port}\"\n"),
            &["advertise"],
        ),
        (
            "unspecified peer address without peer advertise",
            format!(
                "{base}listen = \"127.0.0.1:{port}\"\npeer_listen = \"0.0.0.0:{}\"\ncerts = {:?}\ncontrollers = [\"http://127.0.0.1:1\"]\n",
                port + 100,
                certs.to_str().unwrap()
            ),
            &["peer", "advertise"],
        ),
    ];
    for (what, text, names) in cases {
        let file = dir.path().join("stele.toml");
        std::fs::write(&file, &text).unwrap();
        let err = refused(&file);
        for name in names {
            assert!(
                err.contains(name),
                "{what}: the refusal names {name:?}: {err}"
            );
        }
        assert!(
            !data.exists(),
            "{what}: a refused start leaves no data directory"
        );
    }
}

/// A controller's and a node's config file for the loopback cell.
fn write_configs(cell: &ControlledCell) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let port_of = |ep: String| ep.split("://").nth(1).unwrap().to_string();
    let controllers: Vec<String> = cell
        .controller_endpoints()
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    for c in 1..=cell.controllers {
        let text = format!(
            "roles = [\"controller\"]\ncontroller_id = {c}\nlisten = {:?}\ndata_dir = {:?}\ncerts = {:?}\nlease_ms = 3000\nrepair_grace_ms = 1000\n",
            port_of(cell.controller_endpoint(c)),
            cell.data_dir(&format!("ctl{c}")).to_str().unwrap(),
            cell.dir
                .path()
                .join(format!("certs-ctl{c}"))
                .to_str()
                .unwrap(),
        );
        let f = cell.dir.path().join(format!("ctl{c}.toml"));
        std::fs::write(&f, text).unwrap();
        files.push(f);
    }
    for n in 1..=cell.nodes {
        let listen = port_of(cell.node_endpoint(n));
        let port: u16 = listen.rsplit(':').next().unwrap().parse().unwrap();
        let text = format!(
            "roles = [\"node\"]\nnode_id = {n}\nlisten = {listen:?}\npeer_listen = \"127.0.0.1:{}\"\ndata_dir = {:?}\ncerts = {:?}\ncontrollers = [{}]\nzone = \"z{n}\"\nheartbeat_ms = 500\nelection_timeout_ms = 1500\n",
            port + 100,
            cell.data_dir(&format!("node{n}")).to_str().unwrap(),
            cell.dir.path().join(format!("certs{n}")).to_str().unwrap(),
            controllers.join(", "),
        );
        let f = cell.dir.path().join(format!("node{n}.toml"));
        std::fs::write(&f, text).unwrap();
        files.push(f);
    }
    files
}

#[test]
fn cell_of_processes_from_config_files_only() {
    let cell = ControlledCell::new(3, 3);
    let files = write_configs(&cell);
    // No flag but --config, and no STELE_ variable from this environment.
    let procs: Vec<Proc> = files
        .iter()
        .map(|f| {
            Proc::start(&["server", "--config", f.to_str().unwrap()], &[])
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect();
    let (ok, out, err) = stele_tests::run(&[
        "cell",
        "init",
        "--controllers",
        &cell.controllers_arg(),
        "--tablets",
        "4",
    ]);
    assert!(ok, "cell init: {out}{err}");
    cell.wait_settled(Duration::from_secs(60));
    let (ok, out, err) = stele_tests::run(&[
        "append",
        "--endpoint",
        &cell.node_endpoint(2),
        "--namespace",
        "cfg/files",
        "--key",
        "k",
        "--value",
        "from-config",
    ]);
    assert!(ok, "append: {out}{err}");
    let (ok, out, err) = stele_tests::run(&[
        "scan",
        "--endpoint",
        &cell.node_endpoint(3),
        "--namespace",
        "cfg/files",
        "--key",
        "k",
        "--json",
    ]);
    assert!(ok && out.contains("from-config"), "scan: {out}{err}");
    drop(procs);
}

/// What `stele bench --verify --json` reports, by name; a missing field is
/// a failure naming it.
fn bench_field(report: &serde_json::Value, name: &str) -> u64 {
    report[name]
        .as_u64()
        .or_else(|| report[name].as_f64().map(|f| f as u64))
        .unwrap_or_else(|| panic!("bench report has no {name:?}: {report}"))
}

/// Stops a background bench (SIGTERM: it stops early, verifies, reports)
/// and returns its report.
fn stop_bench(name: &str, child: std::process::Child) -> serde_json::Value {
    docker(&["kill", "-s", "SIGTERM", name]);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "bench {name} printed no report: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bench {name}: {e}: {line}"))
}

/// A verified bench report: records were acknowledged, and every one of
/// them was read back exactly once (`verify` of `stele bench --verify`).
fn assert_verified(phase: &str, r: &serde_json::Value) {
    let acked = bench_field(r, "records_acked");
    assert!(acked > 0, "{phase}: no load: {r}");
    assert_eq!(
        r["interrupted"], true,
        "{phase}: the bench ran until SIGTERM: {r}"
    );
    let v = &r["verify"];
    assert_eq!(bench_field(v, "acked"), acked, "{phase}: {r}");
    assert_eq!(
        bench_field(v, "found_once"),
        acked,
        "{phase}: every acknowledged record read back exactly once: {r}"
    );
    assert_eq!(bench_field(v, "lost"), 0, "{phase}: {r}");
    assert_eq!(bench_field(v, "duplicated"), 0, "{phase}: {r}");
}

fn bench_args() -> Vec<&'static str> {
    vec![
        "bench",
        "--endpoint",
        "https://node1:7450",
        "--verify",
        "--json",
        "--duration",
        "10m",
        "--concurrency",
        "8",
        "--batch-records",
        "1",
        "--namespaces",
        "4",
    ]
}

#[test]
#[ignore = "needs Docker: scripts/test runs it"]
fn compose_cell_under_load_through_rolling_restart_kill_and_network_cut() {
    assert!(
        compose::docker_answers(),
        "no Docker daemon answers `docker info`"
    );
    let started = Instant::now();
    let cell = ComposeCell::build();
    cell.compose(&["up", "-d"]);
    for s in compose::CONTROLLERS.iter().chain(NODES.iter()) {
        let id = cell.container(s);
        // Configured by the mounted file alone.
        let cmd = docker(&["inspect", "-f", "{{json .Config.Cmd}}", &id]);
        assert_eq!(
            cmd.trim(),
            r#"["server","--config","/etc/stele/stele.toml"]"#,
            "{s}"
        );
        let env = docker(&["inspect", "-f", "{{json .Config.Env}}", &id]);
        assert!(!env.contains("STELE_"), "{s} has no STELE_ variable: {env}");
        // Published on the host's loopback only.
        let ports = docker(&["port", &id]);
        assert!(
            !ports.trim().is_empty() && ports.lines().all(|l| l.contains("-> 127.0.0.1:")),
            "{s} publishes on 127.0.0.1 only: {ports}"
        );
    }
    for s in compose::CONTROLLERS {
        cell.wait_http(s, "/healthz", Duration::from_secs(60));
    }
    let init = Instant::now();
    loop {
        let (ok, out, err) = cell.cli(&[
            "cell",
            "init",
            "--controllers",
            "https://ctl1:7400,https://ctl2:7400,https://ctl3:7400",
            "--tablets",
            "4",
            "--replication",
            "3",
        ]);
        if ok {
            break;
        }
        assert!(
            init.elapsed() < Duration::from_secs(60),
            "cell init: {out}{err}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    cell.wait_all_ready(Duration::from_secs(90));
    eprintln!("cell ready in {:?}", started.elapsed());
    // Every gRPC listener is TLS: the same call answers over https with
    // the cell CA and is refused in plaintext.
    let (ok, out, err) = cell.cli(&["status", "--endpoint", "https://node1:7450"]);
    assert!(ok, "status over TLS: {out}{err}");
    let (ok, out, err) = cell.cli(&["status", "--endpoint", "http://node1:7450"]);
    assert!(!ok, "node1 answered plaintext gRPC: {out}{err}");

    // Rolling restart under load: each node in turn gets SIGTERM (the
    // graceful stop), must exit cleanly, and is back and ready before the
    // next. Not one client error.
    let bench1 = format!("{}-bench1", cell.project);
    let load = cell.spawn_cli(&bench1, &bench_args());
    std::thread::sleep(Duration::from_secs(5));
    for s in NODES {
        let id = cell.container(s);
        let t = Instant::now();
        docker(&["kill", "-s", "SIGTERM", &id]);
        let code = docker(&["wait", &id]);
        assert_eq!(
            code.trim(),
            "0",
            "{s} exits cleanly on SIGTERM; logs:\n{}",
            cell.logs(s)
        );
        eprintln!("{s}: graceful stop in {:?}", t.elapsed());
        cell.compose(&["start", s]);
        cell.wait_all_ready(Duration::from_secs(90));
        eprintln!("{s}: back and ready after {:?}", t.elapsed());
    }
    std::thread::sleep(Duration::from_secs(3));
    let rolling = stop_bench(&bench1, load);
    eprintln!("rolling restart: {rolling}");
    assert_eq!(
        bench_field(&rolling, "errors"),
        0,
        "no client error during the rolling restart: {rolling}"
    );
    assert_verified("rolling restart", &rolling);
    eprintln!(
        "longest write stall of the rolling restart: {} ms",
        bench_field(&rolling, "max_stall_ms")
    );

    // Faults under load: a container killed outright, then a node cut off
    // the network and back. Errors are allowed here; losing or doubling
    // an acknowledged record is not.
    let bench2 = format!("{}-bench2", cell.project);
    let load = cell.spawn_cli(&bench2, &bench_args());
    std::thread::sleep(Duration::from_secs(5));
    let killed = cell.container("node2");
    docker(&["kill", &killed]);
    std::thread::sleep(Duration::from_secs(3));
    cell.compose(&["start", "node2"]);
    cell.wait_all_ready(Duration::from_secs(90));
    let cut = cell.container("node3");
    let network = cell.network();
    docker(&["network", "disconnect", &network, &cut]);
    std::thread::sleep(Duration::from_secs(8));
    docker(&["network", "connect", "--alias", "node3", &network, &cut]);
    cell.wait_all_ready(Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(3));
    let faults = stop_bench(&bench2, load);
    eprintln!("kill and network cut: {faults}");
    assert_verified("kill and network cut", &faults);

    // The directory member of the `multicell` profile joins the same
    // network and forms its quorum.
    cell.compose(&["--profile", "multicell", "up", "-d", "dir1"]);
    cell.wait_http("dir1", "/healthz", Duration::from_secs(60));
    let (ok, out, err) = cell.cli(&["directory", "init", "--directory", "https://dir1:7440"]);
    assert!(ok, "directory init: {out}{err}");
    let (ok, out, err) = cell.cli(&["directory", "status", "--directory", "https://dir1:7440"]);
    assert!(ok, "directory status: {out}{err}");
    eprintln!("whole test: {:?}", started.elapsed());
}
