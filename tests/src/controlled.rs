//! A controller-managed cell of real processes on loopback: `C` controllers
//! (`stele server --roles controller`) and `N` storage nodes that register
//! with them, plus a writer that appends unique records throughout a test
//! and the check that every acknowledged record is there exactly once.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stele_client::Client;

use crate::{Proc, free_port_base, make_certs, run, stele_bin};

pub struct ControlledCell {
    pub dir: tempfile::TempDir,
    pub controllers: usize,
    pub nodes: usize,
    base: u16,
    /// Zone label of each node (index n - 1).
    pub zones: Vec<String>,
    /// Extra controller flags (`--lease-ms`, ...).
    pub controller_flags: Vec<String>,
    /// Extra node flags (`--directory`, `--cell-id`, ...).
    pub node_flags: Vec<String>,
    /// A host name every process advertises (`--advertise`,
    /// `--peer-advertise`) and everyone dials, while listening on
    /// 127.0.0.1; `None`: the listen address is advertised.
    pub advertise: Option<String>,
    /// Every node's `--election-timeout-ms`.
    pub election_timeout_ms: u64,
    /// The binary a process runs, by name (`ctl1`, `node2`), when not the
    /// one under test: an older build in upgrade tests.
    pub binaries: HashMap<String, PathBuf>,
    /// Serve gRPC in plaintext (`--insecure-plaintext`; builds before TLS
    /// take no such flag and are plaintext anyway): upgrade tests from
    /// such builds. Otherwise every listener is TLS.
    pub plaintext: bool,
    /// `start` turns on delta heartbeats (`stele cell formats enable
    /// heartbeat 2`) when every process runs the binary under test. On
    /// unless a test clears it.
    pub heartbeat_deltas: bool,
}

impl ControlledCell {
    /// Certificates for `nodes` nodes; zones `z1..` unless set later.
    pub fn new(controllers: usize, nodes: usize) -> ControlledCell {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path(), nodes);
        for c in 1..=controllers {
            let out = dir.path().join(format!("certs-ctl{c}"));
            let (ok, _, err) = run(&[
                "cert",
                "issue",
                "--ca",
                dir.path().join("ca").to_str().unwrap(),
                "--controller-id",
                &c.to_string(),
                "--out",
                out.to_str().unwrap(),
            ]);
            assert!(ok, "controller {c} certificate: {err}");
        }
        ControlledCell {
            dir,
            controllers,
            nodes,
            base: free_port_base((controllers + nodes) as u16),
            zones: (1..=nodes).map(|n| format!("z{n}")).collect(),
            controller_flags: vec![
                "--lease-ms".into(),
                "3000".into(),
                "--repair-grace-ms".into(),
                "1000".into(),
            ],
            node_flags: Vec::new(),
            election_timeout_ms: 1500,
            advertise: None,
            binaries: HashMap::new(),
            plaintext: false,
            heartbeat_deltas: true,
        }
    }

    fn scheme(&self) -> &str {
        if self.plaintext { "http" } else { "https" }
    }

    /// The TLS flags of process `name`: its certificate, or plaintext.
    fn tls_flags(&self, name: &str, certs: &str) -> Vec<String> {
        if !self.plaintext {
            let dir = self.dir.path().join(certs);
            return vec!["--certs".into(), dir.to_str().unwrap().into()];
        }
        if self.binaries.contains_key(name) {
            // An older build: plaintext, and no such flag.
            Vec::new()
        } else {
            vec!["--insecure-plaintext".into()]
        }
    }

    /// The host others dial: the advertised name, or 127.0.0.1.
    fn dial_host(&self) -> &str {
        self.advertise.as_deref().unwrap_or("127.0.0.1")
    }

    /// `--advertise HOST:port` (and `--peer-advertise`) when advertising.
    fn advertise_flags(&self, port: u16, peer: bool) -> Vec<String> {
        let Some(host) = &self.advertise else {
            return Vec::new();
        };
        let mut f = vec!["--advertise".into(), format!("{host}:{port}")];
        if peer {
            f.extend(["--peer-advertise".into(), format!("{host}:{}", port + 100)]);
        }
        f
    }

    /// The binary process `name` runs.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.binaries.get(name).cloned().unwrap_or_else(stele_bin)
    }

    pub fn controller_endpoint(&self, c: usize) -> String {
        format!(
            "{}://{}:{}",
            self.scheme(),
            self.dial_host(),
            self.base + c as u16 - 1
        )
    }

    /// Every controller endpoint, comma-separated (the CLI's --controllers).
    pub fn controllers_arg(&self) -> String {
        (1..=self.controllers)
            .map(|c| self.controller_endpoint(c))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn controller_endpoints(&self) -> Vec<String> {
        (1..=self.controllers)
            .map(|c| self.controller_endpoint(c))
            .collect()
    }

    fn node_port(&self, n: usize) -> u16 {
        self.base + (self.controllers + n) as u16 - 1
    }

    pub fn node_endpoint(&self, n: usize) -> String {
        format!(
            "{}://{}:{}",
            self.scheme(),
            self.dial_host(),
            self.node_port(n)
        )
    }

    pub fn data_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn start_controller(&self, c: usize) -> Proc {
        let mut args: Vec<String> = vec![
            "server".into(),
            "--roles".into(),
            "controller".into(),
            "--controller-id".into(),
            c.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.base + c as u16 - 1),
            "--data-dir".into(),
            self.data_dir(&format!("ctl{c}")).to_str().unwrap().into(),
        ];
        args.extend(self.advertise_flags(self.base + c as u16 - 1, false));
        args.extend(self.tls_flags(&format!("ctl{c}"), &format!("certs-ctl{c}")));
        args.extend(self.controller_flags.iter().cloned());
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Proc::start_bin(&self.binary(&format!("ctl{c}")), &a, &[])
            .unwrap_or_else(|e| panic!("controller {c}: {e}"))
    }

    pub fn start_node(&self, n: usize) -> Proc {
        self.start_node_with(n, &[])
    }

    /// [`ControlledCell::start_node`] with `extra` flags for this node
    /// alone (`--http-listen`, ...).
    pub fn start_node_with(&self, n: usize, extra: &[&str]) -> Proc {
        let mut args: Vec<String> = vec![
            "server".into(),
            "--node-id".into(),
            n.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.node_port(n)),
            "--peer-listen".into(),
            format!("127.0.0.1:{}", self.node_port(n) + 100),
            "--data-dir".into(),
            self.data_dir(&format!("node{n}")).to_str().unwrap().into(),
            "--certs".into(),
            self.dir
                .path()
                .join(format!("certs{n}"))
                .to_str()
                .unwrap()
                .into(),
            "--controllers".into(),
            self.controllers_arg(),
            "--zone".into(),
            self.zones[n - 1].clone(),
            "--heartbeat-ms".into(),
            "500".into(),
            "--election-timeout-ms".into(),
            self.election_timeout_ms.to_string(),
            "--memtable-bytes-max".into(),
            "65536".into(),
            "--disk-reserve-bytes".into(),
            "0".into(),
            "--journal-reserve-bytes".into(),
            "0".into(),
        ];
        args.extend(self.advertise_flags(self.node_port(n), true));
        if self.plaintext {
            args.extend(self.tls_flags(&format!("node{n}"), ""));
        }
        args.extend(self.node_flags.iter().cloned());
        args.extend(extra.iter().map(|f| f.to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Proc::start_bin(&self.binary(&format!("node{n}")), &a, &[])
            .unwrap_or_else(|e| panic!("node {n}: {e}"))
    }

    /// Starts every controller and node, creates the cell and waits until
    /// every tablet has its voters and a leader.
    pub fn start(&self, tablets: u32) -> (HashMap<usize, Proc>, HashMap<usize, Proc>) {
        let controllers: HashMap<usize, Proc> = (1..=self.controllers)
            .map(|c| (c, self.start_controller(c)))
            .collect();
        // A controlled node listens at once (its replicas come later).
        let nodes: HashMap<usize, Proc> =
            (1..=self.nodes).map(|n| (n, self.start_node(n))).collect();
        let replication = if self.nodes >= 3 { "3" } else { "1" };
        let (ok, out, err) = run(&[
            "cell",
            "init",
            "--controllers",
            &self.controllers_arg(),
            "--tablets",
            &tablets.to_string(),
            "--replication",
            replication,
        ]);
        assert!(ok, "cell init: {out}{err}");
        self.wait_settled(Duration::from_secs(60));
        // Every node has reported its build by now (the gate needs that).
        if self.heartbeat_deltas && self.binaries.is_empty() {
            let v = stele_proto::formats::HEARTBEAT_MAX.to_string();
            let (ok, out, err) = self.cli(&["cell", "formats", "enable", "heartbeat", &v]);
            assert!(ok, "enable heartbeat deltas: {out}{err}");
        }
        (controllers, nodes)
    }

    /// `stele tablet list --json`.
    pub fn tablets(&self) -> Vec<serde_json::Value> {
        self.json(&["tablet", "list"])
    }

    /// `stele node list --json`.
    pub fn node_list(&self) -> Vec<serde_json::Value> {
        self.json(&["node", "list"])
    }

    /// Runs an operator command with `--controllers ... --json` and parses
    /// its output.
    pub fn json<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> T {
        let (ok, out, err) = self.cli(args);
        assert!(ok, "{args:?}: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }

    /// [`ControlledCell::json`] for a topology command, retried while the
    /// tablet is busy with another intent (a leader-balance transfer), as an
    /// operator would.
    pub fn json_retrying_busy(&self, args: &[&str]) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let (ok, out, err) = self.cli(args);
            if ok {
                return serde_json::from_str(&out)
                    .unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
            }
            assert!(
                err.contains("in progress") && started.elapsed() < Duration::from_secs(30),
                "{args:?}: {out}{err}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `stele tablet move ID --from F --to T --wait`, retried while the
    /// tablet is busy; the finished intent.
    pub fn move_tablet(&self, id: u64, from: u64, to: u64) -> serde_json::Value {
        let (id, from, to) = (id.to_string(), from.to_string(), to.to_string());
        let i = self.json_retrying_busy(&[
            "tablet", "move", &id, "--from", &from, "--to", &to, "--wait",
        ]);
        assert_eq!(i["state"], "done", "{i}");
        i
    }

    /// `stele tablet split ID --at AT --wait` of the tablet holding `at`,
    /// retried while busy.
    pub fn split_at(&self, at: u32) {
        let t = self
            .tablets()
            .into_iter()
            .find(|t| {
                let lo = t["vshard_lo"].as_u64().unwrap();
                let hi = t["vshard_hi"].as_u64().unwrap();
                lo < u64::from(at) && u64::from(at) < hi
            })
            .expect("a tablet holds the split point");
        let id = t["id"].as_u64().unwrap().to_string();
        let i =
            self.json_retrying_busy(&["tablet", "split", &id, "--at", &at.to_string(), "--wait"]);
        assert_eq!(i["state"], "done", "{i}");
    }

    /// Moves the `n`th tablet of `namespace` off its leader's node, to a
    /// node that holds none of it.
    pub fn move_leader_away(&self, namespace: &str, n: usize) {
        let (lo, hi) = stele_proto::vshard::namespace_range(namespace);
        let t = self
            .tablets()
            .into_iter()
            .filter(|t| {
                t["vshard_lo"].as_u64().unwrap() < hi
                    && t["vshard_hi"].as_u64().unwrap() > u64::from(lo)
            })
            .nth(n)
            .expect("a tablet of the namespace");
        let from = t["leader_node"].as_u64().unwrap();
        let voters = voter_nodes(&t);
        let to = (1..=self.nodes as u64)
            .find(|x| !voters.contains(x))
            .expect("a node without the tablet");
        self.move_tablet(t["id"].as_u64().unwrap(), from, to);
    }

    /// A key of `namespace` in each tablet's range, for every tablet that
    /// holds part of it: (tablet, key).
    pub fn key_per_tablet(&self, namespace: &str) -> Vec<(u64, String)> {
        self.tablets()
            .iter()
            .filter_map(|t| {
                let (lo, hi) = (
                    t["vshard_lo"].as_u64().unwrap(),
                    t["vshard_hi"].as_u64().unwrap(),
                );
                (0..200_000)
                    .map(|i| format!("probe-{i}"))
                    .find(|k| {
                        let v = u64::from(stele_proto::vshard::vshard(namespace, k.as_bytes()));
                        lo <= v && v < hi
                    })
                    .map(|k| (t["id"].as_u64().unwrap(), k))
            })
            .collect()
    }

    /// Runs an operator command with `--controllers ... --json`.
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let ctl = self.controllers_arg();
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--controllers", &ctl, "--json"]);
        run(&a)
    }

    /// Waits until every tablet has `replication` voters, none leaving, a
    /// leader, and no open intent.
    pub fn wait_settled(&self, timeout: Duration) {
        let started = Instant::now();
        loop {
            let (ok, out, _) = self.cli(&["tablet", "list"]);
            if ok && let Ok(ts) = serde_json::from_str::<Vec<serde_json::Value>>(&out) {
                let settled = !ts.is_empty()
                    && ts.iter().all(|t| {
                        let replicas = t["replicas"].as_array().unwrap();
                        replicas.len() == 3.min(self.nodes)
                            && replicas.iter().all(|r| r["role"] == "voter")
                            && t["leader_node"].as_u64().unwrap_or(0) != 0
                            && t["intent"].as_u64() == Some(0)
                    });
                if settled {
                    return;
                }
            }
            assert!(
                started.elapsed() < timeout,
                "cell not settled after {timeout:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The voters' nodes of a tablet in `tablet list --json` output.
pub fn voter_nodes(t: &serde_json::Value) -> Vec<u64> {
    t["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["role"] == "voter")
        .map(|r| r["node"].as_u64().unwrap())
        .collect()
}

/// Appends unique records from `workers` tasks until stopped, through a
/// client that routes by the controllers' route map.
pub struct Writer {
    stop: Arc<AtomicBool>,
    pub acked: Arc<Mutex<Vec<String>>>,
    pub indeterminate: Arc<Mutex<Vec<String>>>,
    /// The longest single append (with the client's retries) since the
    /// last [`Writer::take_longest`]: the write stall a client saw.
    longest: Arc<Mutex<Duration>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub namespace: String,
}

impl Writer {
    pub async fn start(client: Client, namespace: &str, workers: usize) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let indeterminate = Arc::new(Mutex::new(Vec::new()));
        let longest = Arc::new(Mutex::new(Duration::ZERO));
        let mut tasks = Vec::new();
        for w in 0..workers {
            let (stop, acked, ind, client, longest) = (
                stop.clone(),
                acked.clone(),
                indeterminate.clone(),
                client.clone(),
                longest.clone(),
            );
            let ns = namespace.to_string();
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let v = format!("w{w}-{i}");
                    let rec = stele_client::record(
                        format!("k{w}-{}", i % 64),
                        i + 1,
                        v.clone().into_bytes(),
                    );
                    let sent = Instant::now();
                    let result = client.append(&ns, vec![rec]).await;
                    {
                        let mut l = longest.lock().unwrap();
                        *l = (*l).max(sent.elapsed());
                    }
                    match result {
                        Ok(_) => acked.lock().unwrap().push(v),
                        Err(e) => {
                            if ind.lock().unwrap().len() < 3 {
                                eprintln!("writer {w}: append {v} failed: {e}");
                            }
                            ind.lock().unwrap().push(v)
                        }
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        Writer {
            stop,
            acked,
            indeterminate,
            longest,
            tasks,
            namespace: namespace.into(),
        }
    }

    /// The longest append since the last call, and starts over.
    pub fn take_longest(&self) -> Duration {
        std::mem::take(&mut *self.longest.lock().unwrap())
    }

    /// The longest append since the last [`Writer::take_longest`], read
    /// after the writer stopped (an append stalled at the stop counts).
    pub fn longest_handle(&self) -> Arc<Mutex<Duration>> {
        self.longest.clone()
    }

    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Stops the workers and checks, through `client`, that every
    /// acknowledged record is present exactly once and nothing else is
    /// (an indeterminate append may be present, once).
    pub async fn stop_and_check(self, client: &Client) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let rows = client
            .scan_all(
                &self.namespace,
                0,
                0,
                b"",
                stele_client::ReadOptions::default(),
            )
            .await
            .expect("read back");
        let mut seen: HashMap<String, usize> = HashMap::new();
        for r in &rows {
            *seen
                .entry(String::from_utf8_lossy(&r.value).into_owned())
                .or_default() += 1;
        }
        let acked = self.acked.lock().unwrap().clone();
        let maybe: HashSet<String> = self.indeterminate.lock().unwrap().iter().cloned().collect();
        let lost: Vec<&String> = acked.iter().filter(|v| !seen.contains_key(*v)).collect();
        assert!(lost.is_empty(), "acknowledged records lost: {lost:?}");
        let doubled: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(doubled.is_empty(), "records doubled: {doubled:?}");
        let acked_set: HashSet<&String> = acked.iter().collect();
        let phantom: Vec<&String> = seen
            .keys()
            .filter(|v| !acked_set.contains(v) && !maybe.contains(*v))
            .collect();
        assert!(phantom.is_empty(), "records never written: {phantom:?}");
        acked.len()
    }
}
