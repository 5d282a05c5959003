//! `stele server --config FILE`, `STELE_*` environment variables and the
//! secrets rule, driven through the real binary (docs/OPERATIONS.md
//! "Configuration"):
//!
//! - a flag beats its environment variable, which beats the file, which
//!   beats the default (seen in `stele status`);
//! - an unknown key, a bad value (in the file or the environment) and a
//!   secret in the file are refused naming the key, and nothing starts;
//! - `stele config default | stele config check` round trip, with every
//!   flag of `stele server --help` a key of the default file;
//! - a managed cell (a controller, three nodes) started from config files
//!   only serves appends;
//! - an S3 key on the command line is refused without repeating it, and
//!   `stele dev` hands the keys to its node processes by environment, never
//!   on their command lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use stele_client::Client;
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer};
use stele_tests::{Proc, free_port_base, run, stele_bin};

/// One cell at a time: `free_port_base` picks ports by process id, so
/// tests of one process running at once would pick the same ones.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs `stele <args>` with extra environment variables to completion.
fn stele_env(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(stele_bin());
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run stele")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `tablets` of `stele status` at `endpoint`.
fn status_tablets(endpoint: &str) -> u64 {
    let (ok, out, err) = run(&["status", "--endpoint", endpoint, "--json"]);
    assert!(ok, "status: {err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    s["tablets"].as_u64().unwrap()
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_base(4);
    // Each start gets its own port and data directory (a new data
    // directory takes `tablets` from the settings; an old one keeps its
    // own).
    let start = |case: u16, envs: &[(&str, &str)], flags: &[&str]| -> (Proc, String) {
        let data = dir.path().join(format!("d{case}"));
        let file = write(
            dir.path(),
            &format!("c{case}.toml"),
            &format!(
                "node_id = 1\nlisten = \"127.0.0.1:{}\"\ndata_dir = {:?}\ntablets = 4\n",
                base + case,
                data.to_str().unwrap()
            ),
        );
        let mut args = vec!["server", "--config", file.to_str().unwrap()];
        args.extend(flags);
        let p = Proc::start(&args, envs).unwrap();
        let ep = p.endpoint.clone();
        (p, ep)
    };
    // No key, no variable, no flag: the default (16).
    let data = dir.path().join("d3");
    let p = Proc::start(
        &[
            "server",
            "--node-id",
            "1",
            "--listen",
            &format!("127.0.0.1:{}", base + 3),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(status_tablets(&p.endpoint), 16, "the default");
    drop(p);
    let (p, ep) = start(0, &[], &[]);
    assert_eq!(status_tablets(&ep), 4, "the file beats the default");
    drop(p);
    let (p, ep) = start(1, &[("STELE_TABLETS", "5")], &[]);
    assert_eq!(status_tablets(&ep), 5, "the environment beats the file");
    drop(p);
    let (p, ep) = start(2, &[("STELE_TABLETS", "5")], &["--tablets", "6"]);
    assert_eq!(status_tablets(&ep), 6, "the flag beats the environment");
    drop(p);
}

#[test]
fn unknown_keys_and_bad_values_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let head = format!(
        "listen = \"127.0.0.1:1\"\ndata_dir = {:?}\n",
        data.to_str().unwrap()
    );
    let cases = [
        (
            "heartbeat_msec = 500\n",
            "unknown key \"heartbeat_msec\" (did you mean heartbeat_ms?)",
        ),
        (
            "heartbeat_ms = \"x\"\n",
            "key heartbeat_ms: invalid value \"x\"",
        ),
        (
            "merge_below_percent = 51\n",
            "key merge_below_percent: invalid value \"51\": 51 is not in 0..=50",
        ),
        (
            "auto_create_namespaces = \"yes\"\n",
            "key auto_create_namespaces: want true or false",
        ),
        (
            "controllers = 5.5\n",
            "key controllers: want a string or an integer, got a float",
        ),
        ("peers = [\"nope\"]\n", "key peers: invalid value \"nope\""),
        (
            "append_in_flight = 0\n",
            "key append_in_flight: invalid value \"0\": 0 is not in 1..=1024",
        ),
        (
            "tablet_log_format = 3\n",
            "key tablet_log_format: invalid value \"3\": 3 is not in 1..=2",
        ),
    ];
    for (i, (line, want)) in cases.iter().enumerate() {
        let file = write(
            dir.path(),
            &format!("bad{i}.toml"),
            &format!("{head}{line}"),
        );
        let f = file.to_str().unwrap();
        for args in [vec!["server", "--config", f], vec!["config", "check", f]] {
            let o = stele_env(&args, &[]);
            let err = stderr(&o);
            assert!(!o.status.success(), "{args:?} accepted {line}");
            assert!(err.contains(want), "{args:?} with {line}: {err}");
            assert!(err.contains(f), "{args:?}: the file is not named: {err}");
        }
    }
    // A bad value from the environment names the variable.
    let ok_file = write(dir.path(), "ok.toml", &head);
    let o = stele_env(
        &["server", "--config", ok_file.to_str().unwrap()],
        &[("STELE_HEARTBEAT_MS", "soon")],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("environment variable STELE_HEARTBEAT_MS: invalid value \"soon\""),
        "{}",
        stderr(&o)
    );
    // A missing required setting names its key and variable.
    let empty = write(dir.path(), "empty.toml", "");
    let o = stele_env(&["config", "check", empty.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("listen (--listen, STELE_LISTEN)"),
        "{}",
        stderr(&o)
    );
    // Retention without a bucket would drop nothing: refused, not ignored.
    let o = stele_env(
        &[
            "server",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            data.to_str().unwrap(),
            "--retention",
            "acme/web=60",
        ],
        &[],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--retention acme/web=60 needs --object-store"),
        "{}",
        stderr(&o)
    );
    assert!(!data.exists(), "a refused start created its data directory");
}

#[test]
fn config_default_is_every_key_and_config_check_accepts_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (ok, text, err) = run(&["config", "default"]);
    assert!(ok, "{err}");
    let file = write(dir.path(), "default.toml", &text);
    let (ok, out, err) = run(&["config", "check", file.to_str().unwrap()]);
    assert!(ok, "config check refused `config default`: {err}\n{text}");
    assert!(out.starts_with("ok"), "{out}");
    // Every flag of `stele server` is a key of the default file (set or
    // commented out), but the secrets and --config itself.
    let (ok, help, _) = run(&["server", "--help"]);
    assert!(ok);
    let flags: Vec<String> = help
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|f| f.trim_end_matches([',', '.', ')', '`']).to_string())
        .filter(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .collect();
    assert!(
        flags.len() > 30,
        "too few flags in --help to mean anything: {flags:?}"
    );
    for f in flags {
        let key = f.replace('-', "_");
        if ["help", "config", "s3_access_key_id", "s3_secret_access_key"].contains(&key.as_str()) {
            continue;
        }
        let listed = text
            .lines()
            .any(|l| l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} = ")));
        assert!(listed, "--{f} has no key {key} in `stele config default`");
        assert!(
            text.contains(&format!("STELE_{}", key.to_uppercase())),
            "{key}: no variable"
        );
    }
    // The server starts on it (its example address and directory replaced
    // by flags, which beat the file).
    let base = free_port_base(1);
    let data = dir.path().join("data");
    let p = Proc::start(
        &[
            "server",
            "--config",
            file.to_str().unwrap(),
            "--node-id",
            "1",
            "--listen",
            &format!("127.0.0.1:{base}"),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(status_tablets(&p.endpoint), 16);
}

/// `ControlledCell::start_controller` and `start_node`, as config files.
fn controller_toml(cell: &ControlledCell, c: usize) -> String {
    let listen = cell
        .controller_endpoint(c)
        .split("://")
        .nth(1)
        .unwrap()
        .to_string();
    format!(
        "roles = [\"controller\"]\ncontroller_id = {c}\nlisten = \"{listen}\"\ndata_dir = {:?}\ncerts = {:?}\nlease_ms = 3000\nrepair_grace_ms = 1000\n",
        cell.data_dir(&format!("ctl{c}")).to_str().unwrap(),
        cell.dir
            .path()
            .join(format!("certs-ctl{c}"))
            .to_str()
            .unwrap()
    )
}

fn node_toml(cell: &ControlledCell, n: usize) -> String {
    let listen = cell
        .node_endpoint(n)
        .split("://")
        .nth(1)
        .unwrap()
        .to_string();
    let (host, port) = listen.rsplit_once(':').unwrap();
    let peer = format!("{host}:{}", port.parse::<u16>().unwrap() + 100);
    let controllers: Vec<String> = cell
        .controller_endpoints()
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    format!(
        "node_id = {n}\nlisten = \"{listen}\"\npeer_listen = \"{peer}\"\ndata_dir = {:?}\ncerts = {:?}\n\
         controllers = [{}]\nzone = \"{}\"\nheartbeat_ms = 500\nelection_timeout_ms = 1500\n\
         memtable_bytes_max = 65536\ndisk_reserve_bytes = 0\njournal_reserve_bytes = 0\n",
        cell.data_dir(&format!("node{n}")).to_str().unwrap(),
        cell.dir.path().join(format!("certs{n}")).to_str().unwrap(),
        controllers.join(", "),
        cell.zones[n - 1],
    )
}

#[test]
fn a_managed_cell_started_from_config_files_only_serves_appends() {
    let _serial = serial();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(managed_cell_from_config_files());
}

async fn managed_cell_from_config_files() {
    let cell = ControlledCell::new(1, 3);
    let mut procs = Vec::new();
    let mut start = |name: String, toml: String| {
        let file = write(cell.dir.path(), &format!("{name}.toml"), &toml);
        let p = Proc::start(&["server", "--config", file.to_str().unwrap()], &[])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        procs.push(p);
    };
    start("ctl1".into(), controller_toml(&cell, 1));
    for n in 1..=3 {
        start(format!("node{n}"), node_toml(&cell, n));
    }
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
    // The nodes registered with the zones their files gave.
    let mut zones: Vec<String> = cell
        .node_list()
        .iter()
        .map(|n| n["zone"].as_str().unwrap().to_string())
        .collect();
    zones.sort();
    assert_eq!(zones, ["z1", "z2", "z3"]);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "cfg/cell", 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let acked = writer.stop_and_check(&client).await;
    assert!(acked >= 20, "too few appends to mean anything: {acked}");
}

#[test]
fn a_secret_on_the_command_line_is_refused_without_repeating_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let secret = "Sup3rS3cretValue-4711";
    let d = data.to_str().unwrap();
    let common = ["--listen", "127.0.0.1:1", "--data-dir", d];
    for (sub, flag) in [
        ("server", "--s3-secret-access-key"),
        ("server", "--s3-access-key-id"),
        ("dev", "--s3-secret-access-key"),
    ] {
        for form in [
            vec![flag.to_string(), secret.to_string()],
            vec![format!("{flag}={secret}")],
        ] {
            let mut args: Vec<&str> = vec![sub];
            args.extend(common);
            args.extend(form.iter().map(String::as_str));
            let o = stele_env(&args, &[]);
            let err = stderr(&o);
            assert!(!o.status.success(), "{args:?} accepted a secret flag");
            let env = format!("STELE_{}", flag[2..].replace('-', "_").to_uppercase());
            assert!(err.contains(flag) && err.contains(&env), "{args:?}: {err}");
            assert!(!err.contains(secret), "{args:?} repeated the secret: {err}");
            assert!(!String::from_utf8_lossy(&o.stdout).contains(secret));
        }
    }
    // Nor in the config file.
    let file = write(
        dir.path(),
        "s.toml",
        &format!(
            "listen = \"127.0.0.1:1\"\ndata_dir = {d:?}\ns3_secret_access_key = \"{secret}\"\n"
        ),
    );
    for args in [
        vec!["server", "--config", file.to_str().unwrap()],
        vec!["config", "check", file.to_str().unwrap()],
    ] {
        let o = stele_env(&args, &[]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} accepted a secret key");
        assert!(
            err.contains("key s3_secret_access_key is a secret"),
            "{err}"
        );
        assert!(!err.contains(secret), "{args:?} repeated the secret: {err}");
    }
    // A file named in the config must exist: the check reads it as the
    // server would.
    let file = write(
        dir.path(),
        "f.toml",
        &format!(
            "listen = \"127.0.0.1:1\"\ndata_dir = {d:?}\ns3_secret_access_key_file = {:?}\n",
            dir.path().join("missing").to_str().unwrap()
        ),
    );
    let (ok, _, err) = run(&["config", "check", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("s3_secret_access_key_file"), "{err}");
    assert!(!data.exists(), "a refused start created its data directory");
}

/// The pids of the live children of `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().map(Result::unwrap) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn dev_hands_s3_keys_to_its_nodes_by_environment_only() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let id = "AKIDdevCellTest0042";
    let secret = "devCellSecret-9f8e7d6c";
    // Given to `dev` in files, so a key in a child's environment can only
    // have come from `dev` (not inherited from this test).
    let id_file = write(dir.path(), "id", &format!("{id}\n"));
    let secret_file = write(dir.path(), "secret", secret);
    let base = free_port_base(2);
    let dev = Proc::start(
        &[
            "dev",
            "--nodes",
            "2",
            "--tablets",
            "2",
            "--listen",
            &format!("127.0.0.1:{base}"),
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--s3-access-key-id-file",
            id_file.to_str().unwrap(),
            "--s3-secret-access-key-file",
            secret_file.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    let children = children_of(dev.child.id());
    assert_eq!(children.len(), 2, "dev's node processes: {children:?}");
    for pid in children {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains(" server "), "not a node: {cmdline}");
        assert!(
            !cmdline.contains(secret) && !cmdline.contains(id),
            "an S3 key on a node's command line: {cmdline}"
        );
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ: Vec<String> = String::from_utf8_lossy(&environ)
            .split('\0')
            .map(str::to_string)
            .collect();
        assert!(
            environ.contains(&format!("STELE_S3_SECRET_ACCESS_KEY={secret}")),
            "node {pid} did not get the secret key in its environment"
        );
        assert!(
            environ.contains(&format!("STELE_S3_ACCESS_KEY_ID={id}")),
            "node {pid} did not get the key id in its environment"
        );
    }
}

/// `stele completions SHELL` prints a script a shell takes; duration flags
/// are humantime's and a bad `--timeout` is refused by clap, naming it,
/// before anything is called.
#[test]
fn completions_and_bad_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, mark) in [
        ("bash", "_stele"),
        ("zsh", "#compdef stele"),
        ("fish", "complete -c stele"),
    ] {
        let (ok, script, err) = stele_tests::run_plain(&["completions", shell]);
        assert!(ok, "{shell}: {err}");
        assert!(script.contains(mark), "{shell}: {script}");
        for sub in [
            "restart-safe",
            "transfer-leader",
            "decommission",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell} script without {sub}");
        }
    }
    let (_, script, _) = stele_tests::run_plain(&["completions", "bash"]);
    let file = write(dir.path(), "stele.bash", &script);
    let sourced = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p stele", file.display()))
        .output()
        .expect("bash");
    assert!(
        sourced.status.success() && String::from_utf8_lossy(&sourced.stdout).contains("_stele"),
        "bash: {}",
        stderr(&sourced)
    );
    let (ok, _, err) = stele_tests::run_plain(&["completions", "tcsh"]);
    assert!(
        !ok && err.contains("tcsh") && err.contains("bash, zsh, fish"),
        "{err}"
    );

    // Nothing listens at this address: a refusal here comes from clap.
    let nowhere = ["--controllers", "http://127.0.0.1:1"];
    for (timeout, why) in [
        ("0", "more than zero"),
        ("0s", "more than zero"),
        ("garbage", "not a duration"),
        ("10x", "not a duration"),
    ] {
        let mut a = vec!["tablet", "split", "1", "--wait", "--timeout", timeout];
        a.extend(nowhere);
        let (ok, _, err) = stele_tests::run_plain(&a);
        assert!(!ok, "--timeout {timeout} accepted");
        assert!(
            err.contains("--timeout") && err.contains(why),
            "{timeout}: {err}"
        );
    }
    let mut a = vec!["node", "drain", "7", "--timeout", "5s"];
    a.extend(nowhere);
    let (ok, _, err) = stele_tests::run_plain(&a);
    assert!(
        !ok && err.contains("--wait"),
        "--timeout without --wait: {err}"
    );
}
