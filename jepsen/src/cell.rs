//! The cell under test: real `stele server` processes, one per node, peers
//! over QUIC with mutual TLS, gRPC over TLS (but for an upgrade run:
//! [`crate::tls`]), each node's stderr in the run's store.
//!
//! With network namespaces (`CellSpec::netns`, where root, iproute2 and
//! nftables are at hand) every node runs in its own namespace behind a
//! bridge and partitions and packet loss are nftables rules
//! ([`crate::netns`]). Otherwise the nodes share loopback and partitions go
//! through each node's peer filter file (`STELE_PEER_BLOCK_FILE`), and the
//! results say so.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

pub struct CellSpec {
    pub bin: PathBuf,
    /// An older `stele` binary, for a rolling upgrade: every node starts
    /// on it, and [`Cell::upgrade_restart`] moves a node between it and
    /// `bin` (the controller runs `bin`: controllers are upgraded first).
    pub old_bin: Option<PathBuf>,
    pub nodes: usize,
    pub tablets: u32,
    pub election_timeout_ms: u64,
    /// The negative control: nodes serve leader reads without a read index.
    pub unsafe_local_reads: bool,
    /// The other negative control: nodes acknowledge journal writes
    /// without fdatasync (a power cut then loses them).
    pub unsafe_skip_fsync: bool,
    /// The third negative control: a restarted tablet leader resumes its
    /// term without an election (openraft's leader restore).
    pub unsafe_leader_restore: bool,
    /// The fourth negative control: a tablet leader that slept
    /// (hibernation) serves reads without a read index until it loses
    /// leadership, as if its sleep were a lease.
    pub unsafe_wake_reads: bool,
    /// Disks of graded speed: node `n`'s journal holds every group
    /// `(nodes - n) * SYNC_DELAY_STEP_MS` before its fdatasync, so on most
    /// leaders a follower syncs first, and a power cut often finds a
    /// leader whose tail a follower synced and it did not.
    pub graded_fsync: bool,
    /// Run a controller (its own process, never faulted) and let it place
    /// the tablets, instead of a static `--peers` cell.
    pub controlled: bool,
    /// Each node in its own network namespace, faults by nftables.
    pub netns: bool,
    /// A cold tier: a bucket shared by the nodes, segments sealed within
    /// 2 s and evicted once uploaded. A `file://` bucket in the run's
    /// directory, or with `s3`, a bucket on that S3 server.
    pub cold: bool,
    /// An S3 server (moto) for the cold tier, reached through a proxy the
    /// `s3` nemesis stalls and fails.
    pub s3: Option<S3Server>,
    /// libfaketime (`libfaketimeMT.so.1`) preloaded into every node, each
    /// reading its wall-clock offset from a file the clock nemesis writes.
    pub faketime: Option<PathBuf>,
    /// TLS on gRPC (clients, the controller, operator commands); false
    /// only where an older binary without it runs ([`crate::tls`]).
    pub grpc_tls: bool,
}

/// An S3-compatible server and a bucket on it (credentials: any, as moto
/// takes them).
#[derive(Debug, Clone)]
pub struct S3Server {
    /// `host:port` of the server, on loopback.
    pub addr: std::net::SocketAddr,
    pub bucket: String,
}

/// The step between node disks' fsync delays under `graded_fsync`:
/// several times a follower's write, sync and reply on this machine.
pub const SYNC_DELAY_STEP_MS: u64 = 20;

/// Where Debian's `faketime` package puts the multithreaded library.
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Client port of a node in its own namespace (peer port: + 100).
const NS_CLIENT_PORT: u16 = 7450;
/// The controller's port on the bridge address.
const NS_CONTROLLER_PORT: u16 = 7440;

pub struct Cell {
    pub spec: CellSpec,
    pub dir: PathBuf,
    base: u16,
    procs: BTreeMap<usize, Child>,
    paused: Vec<usize>,
    /// Nodes running with fail points armed (restarted clean by `heal`).
    failing: Vec<usize>,
    /// Nodes that run `spec.old_bin`.
    old: std::collections::BTreeSet<usize>,
    controller: Option<Child>,
    net: Option<crate::netns::Netns>,
    /// The proxy between the nodes and the S3 server, and the object-key
    /// prefix of this run.
    s3: Option<(crate::s3proxy::S3Proxy, String)>,
    /// With TLS on gRPC: the client and operator credentials.
    tls: Option<crate::tls::CellTls>,
    /// The `gateway` workload's gateways (restarted by `heal`).
    pub gateways: Option<crate::gateway::Gateways>,
}

/// A base port with `n` TCP ports and `n` UDP ports 100 above free, below
/// the ephemeral range.
fn free_base(n: u16, seed: u64) -> u16 {
    use std::net::{TcpListener, UdpSocket};
    for attempt in 0..500u64 {
        // 16-port slots below the ephemeral range, picked by a hash.
        let h = (seed ^ (attempt << 32) ^ u64::from(std::process::id()))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let base = 10_000 + ((h >> 40) % 1_375) as u16 * 16;
        let tcp = (0..=n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        let udp = (0..n).all(|i| UdpSocket::bind(("127.0.0.1", base + 100 + i)).is_ok());
        if tcp && udp {
            return base;
        }
    }
    panic!("no free loopback ports");
}

/// How long one `stele` CLI call of the runner (an operator command such as
/// `tablet move --wait`, `cert`, an attempt at `cell init`) may take before
/// the child is killed and the call ends in [`TimedOut`].
///
/// 2.5 times the controller's intent timeout (120 s, not configurable):
/// the controller gives up a move, split or merge phase that makes no
/// progress after 120 s, and a merge has two such phases (co-locate, then
/// freeze), so every failure the controller itself reaches comes back
/// before this deadline, as a definite refusal. What is left is a call that
/// can never return (a `tablet move --wait` whose group already took its
/// new voter and lost its quorum: the controller never rolls that back),
/// which without a deadline hung a one-hour soak. A healthy call takes a
/// few election timeouts (1 s in the runs): seconds.
pub const OPERATOR_DEADLINE: Duration = Duration::from_secs(300);

/// How long the output pipes of a child that exited at (or just before) its
/// deadline may take to reach end-of-file.
const PIPE_GRACE: Duration = Duration::from_secs(1);

/// A CLI call that did not finish within its deadline: the child was
/// killed and reaped. Whatever it asked for may or may not have happened
/// (a `--wait` that ran out, not a refusal).
#[derive(Debug, thiserror::Error)]
#[error("{program} {args:?} timed out after {after:?}")]
pub struct TimedOut {
    pub program: String,
    pub args: Vec<String>,
    pub after: Duration,
}

impl TimedOut {
    fn of(cmd: &Command, after: Duration) -> TimedOut {
        TimedOut {
            program: program_name(cmd),
            args: cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            after,
        }
    }
}

/// The file name of `cmd`'s program (`stele`, not its whole path).
fn program_name(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    program
        .file_name()
        .unwrap_or(program.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// Runs `cmd` to completion as [`Command::output`] does, but for at most
/// `deadline`: past it the child is killed (by its own pid) and reaped, and
/// the call fails with [`TimedOut`]. Stdin is null; stdout and stderr are
/// read on their own threads while the child runs, so it never blocks on a
/// full pipe.
pub fn output_within(cmd: &mut Command, deadline: Duration) -> anyhow::Result<Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", program_name(cmd)))?;
    wait_output_within(child, deadline).map_err(|e| match e {
        Wait::TimedOut(after) => TimedOut::of(cmd, after).into(),
        Wait::Failed(e) => e.context(format!("run {}", program_name(cmd))),
    })
}

/// Why [`wait_output_within`] returned no output.
#[derive(Debug)]
enum Wait {
    /// The deadline passed (the child killed and reaped, or its pipes
    /// still open after it exited).
    TimedOut(Duration),
    Failed(anyhow::Error),
}

/// The output of `child` (spawned with piped stdout and stderr) once it
/// exits, or [`Wait::TimedOut`] after `deadline`, with the child killed and
/// reaped. Separate from [`output_within`] so a test knows the pid.
fn wait_output_within(mut child: Child, deadline: Duration) -> Result<Output, Wait> {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        drain(out, 0, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        drain(err, 1, tx);
    } else {
        drop(tx);
    }
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= deadline => {
                // Only this child, by its own pid; a reader thread ends
                // when the pipe closes.
                let _ = child.kill();
                let _ = child.wait();
                return Err(Wait::TimedOut(deadline));
            }
            Ok(None) => {
                std::thread::sleep(pause.min(deadline.saturating_sub(started.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Wait::Failed(anyhow::Error::new(e).context("wait")));
            }
        }
    };
    // The pipes end with the child, unless something it started holds them.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let until = started + deadline.max(started.elapsed() + PIPE_GRACE);
    for _ in 0..2 {
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok((0, read)) => stdout = read.map_err(|e| Wait::Failed(e.into()))?,
            Ok((_, read)) => stderr = read.map_err(|e| Wait::Failed(e.into()))?,
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(Wait::TimedOut(deadline)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Reads `pipe` to its end on a thread of its own; sends `(which, bytes)`.
fn drain<R: Read + Send + 'static>(
    mut pipe: R,
    which: usize,
    tx: mpsc::Sender<(usize, std::io::Result<Vec<u8>>)>,
) {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let read = pipe.read_to_end(&mut buf).map(|_| buf);
        let _ = tx.send((which, read));
    });
}

fn run(bin: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = output_within(Command::new(bin).args(args), OPERATOR_DEADLINE)?;
    anyhow::ensure!(
        out.status.success(),
        "stele {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[allow(unsafe_code)]
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process this runner started; no memory
    // is involved.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

impl Cell {
    /// Makes certificates and starts every node; returns once each answers.
    pub fn start(spec: CellSpec, dir: &Path, seed: u64) -> anyhow::Result<Cell> {
        std::fs::create_dir_all(dir)?;
        // Absolute, so the bucket's file:// URL and every node's paths hold
        // whatever directory a node process runs in.
        let dir = &std::path::absolute(dir)?;
        let tls =
            crate::tls::make_certs(dir, spec.nodes, spec.grpc_tls, |args| run(&spec.bin, args))?;
        let net = if spec.netns {
            Some(crate::netns::Netns::create(spec.nodes, seed)?)
        } else {
            None
        };
        let (spec_old, spec_nodes) = (spec.old_bin.clone(), spec.nodes);
        let mut cell = Cell {
            base: if net.is_some() {
                0
            } else {
                free_base(spec.nodes as u16, seed)
            },
            spec,
            dir: dir.to_path_buf(),
            procs: BTreeMap::new(),
            paused: Vec::new(),
            failing: Vec::new(),
            old: match &spec_old {
                Some(_) => (1..=spec_nodes).collect(),
                None => Default::default(),
            },
            controller: None,
            net,
            s3: None,
            tls,
            gateways: None,
        };
        if let (true, Some(server)) = (cell.spec.cold, &cell.spec.s3) {
            // Nodes in namespaces reach the runner on the bridge.
            let listen: std::net::SocketAddr = match &cell.net {
                Some(net) => format!("{}:0", net.gateway()).parse()?,
                None => "127.0.0.1:0".parse()?,
            };
            let proxy = crate::s3proxy::S3Proxy::start(listen, server.addr)?;
            let prefix = format!("jepsen-{seed}-{}", std::process::id());
            cell.s3 = Some((proxy, prefix));
        }
        if cell.spec.controlled {
            cell.start_controller()?;
        }
        for n in 1..=cell.spec.nodes {
            cell.start_node(n)?;
        }
        if cell.spec.controlled {
            // Wait for the controller, then create the cell.
            let tablets = cell.spec.tablets.to_string();
            cell.operator_until_ok(
                &["cell", "init", "--tablets", &tablets, "--replication", "3"],
                Instant::now() + Duration::from_secs(30),
            )?;
            if cell.coalesces() {
                // Refused until every node has reported its build in a
                // heartbeat. Delta heartbeats too: the churn the nemeses
                // make (moves, splits, merges, kills) runs over them.
                for (name, version) in [("log", "2"), ("heartbeat", "2")] {
                    cell.operator_until_ok(
                        &["cell", "formats", "enable", name, version],
                        Instant::now() + Duration::from_secs(30),
                    )?;
                }
            }
        }
        Ok(cell)
    }

    /// Starts (or restarts) the controller process; its log is appended.
    fn start_controller(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("controller.log"))?;
        let listen = match &self.net {
            Some(net) => format!("{}:{NS_CONTROLLER_PORT}", net.gateway()),
            None => format!("127.0.0.1:{}", self.controller_port()),
        };
        let mut cmd = Command::new(&self.spec.bin);
        cmd.args(["server", "--roles", "controller", "--controller-id", "1"])
            .args(["--listen", &listen]);
        match &self.tls {
            Some(tls) => cmd.arg("--certs").arg(&tls.controller_dir),
            // Plaintext only beside an older binary without gRPC TLS.
            None => cmd.arg("--insecure-plaintext"),
        };
        let child = cmd
            .arg("--data-dir")
            .arg(self.dir.join("controller"))
            .args(["--lease-ms", "4000", "--repair-grace-ms", "600000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start the controller")?;
        self.controller = Some(child);
        Ok(())
    }

    fn clock_file(&self, n: usize) -> PathBuf {
        self.dir.join(format!("clock{n}"))
    }

    /// Sets node `n`'s wall clock to `spec` (libfaketime syntax: `+90s`,
    /// `-30s`, `+0 x2`); read by the node within a second. False without
    /// libfaketime.
    pub fn set_clock(&self, n: usize, spec: &str) -> anyhow::Result<bool> {
        if self.spec.faketime.is_none() {
            return Ok(false);
        }
        let tmp = self.clock_file(n).with_extension("tmp");
        std::fs::write(&tmp, format!("{spec}\n"))?;
        std::fs::rename(&tmp, self.clock_file(n))?;
        Ok(true)
    }

    /// SIGKILLs the controller (controlled cells); `heal` restarts it.
    pub fn kill_controller(&mut self) -> bool {
        match self.controller.take() {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
                true
            }
            None => false,
        }
    }

    fn controller_port(&self) -> u16 {
        self.base + self.spec.nodes as u16
    }

    pub fn controller_endpoint(&self) -> String {
        let scheme = crate::tls::scheme(&self.tls);
        match &self.net {
            Some(net) => format!("{scheme}://{}:{NS_CONTROLLER_PORT}", net.gateway()),
            None => format!("{scheme}://127.0.0.1:{}", self.controller_port()),
        }
    }

    /// `STELE_CERTS_DIR` of the runner's operator, when gRPC is TLS.
    pub fn operator_certs(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|t| t.operator_dir.clone())
    }

    /// Whether gRPC is TLS in this cell.
    pub fn grpc_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The data clients' TLS (the cell CA, no certificate); `None` when
    /// gRPC is plaintext.
    pub fn client_tls(&self) -> Option<stele_tls::ClientTls> {
        self.tls.as_ref().map(|t| t.client.clone())
    }

    /// A raw data-API client of node `n`, as a data client of the cell.
    pub fn data_client(
        &self,
        n: usize,
    ) -> anyhow::Result<stele_proto::pb::data_client::DataClient<tonic::transport::Channel>> {
        crate::tls::data_client(&self.endpoint(n), self.client_tls().as_ref())
    }

    /// Checks that gRPC really is TLS, and that it refuses what it must:
    /// node `n` answers a client with the cell CA, and refuses a client
    /// that trusts another CA and a plaintext client. Ok without TLS.
    pub async fn check_tls(&self, n: usize) -> anyhow::Result<()> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let status = || stele_proto::pb::StatusRequest {};
        self.data_client(n)?
            .status(status())
            .await
            .context("a client with the cell CA")?;
        let mut foreign = crate::tls::data_client(&self.endpoint(n), Some(&tls.foreign))?;
        anyhow::ensure!(
            foreign.status(status()).await.is_err(),
            "node {n} answered a client that does not trust the cell CA"
        );
        let plain = format!("http://{}", self.client_addr(n));
        anyhow::ensure!(
            crate::tls::data_client(&plain, None)?
                .status(status())
                .await
                .is_err(),
            "node {n} answered plaintext gRPC"
        );
        Ok(())
    }

    /// `stele ARGS --controllers ...` as the operator, retried until it
    /// succeeds or `deadline` passes (each attempt bounded by what is left
    /// of the wait, at least 5 s): for idempotent commands the cell may
    /// refuse while it starts (`cell init`, `cell formats enable`).
    fn operator_until_ok(&self, args: &[&str], deadline: Instant) -> anyhow::Result<()> {
        loop {
            let attempt = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(5));
            let out = output_within(
                self.operator_command()
                    .args(args)
                    .args(["--controllers", &self.controller_endpoint()]),
                attempt,
            );
            let failed = match out {
                Ok(out) if out.status.success() => return Ok(()),
                Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
                Err(e) if e.is::<TimedOut>() => e.to_string(),
                Err(e) => return Err(e),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "stele {}: {failed}",
                args.join(" ")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether this cell's nodes coalesce appends (log format 2): not in
    /// an upgrade (a node on the older binary cannot read an
    /// `AppendMany`).
    fn coalesces(&self) -> bool {
        self.spec.old_bin.is_none()
    }

    /// A `stele` CLI command as the runner's operator (its certificate
    /// when gRPC is TLS).
    fn operator_command(&self) -> Command {
        let mut cmd = Command::new(&self.spec.bin);
        if let Some(tls) = &self.tls {
            cmd.env("STELE_CERTS_DIR", &tls.operator_dir);
        }
        cmd
    }

    /// How partitions are made, for the results.
    pub fn partition_method(&self) -> &'static str {
        if self.net.is_some() {
            "network namespaces behind a bridge, nftables rules"
        } else {
            "loopback, transport peer filter (no network namespaces or nftables here)"
        }
    }

    /// Runs an operator command against the controller; its JSON output.
    /// A command still running after [`OPERATOR_DEADLINE`] is killed and
    /// fails with [`TimedOut`] (its outcome unknown).
    pub fn operator(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let out = output_within(
            self.operator_command().args(args).args([
                "--controllers",
                &self.controller_endpoint(),
                "--json",
            ]),
            OPERATOR_DEADLINE,
        )?;
        anyhow::ensure!(
            out.status.success(),
            "stele {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Node `n`'s fsync delay (`graded_fsync`), in ms.
    pub fn sync_delay_ms(&self, n: usize) -> u64 {
        if self.spec.graded_fsync {
            (self.spec.nodes - n) as u64 * SYNC_DELAY_STEP_MS
        } else {
            0
        }
    }

    pub fn endpoint(&self, n: usize) -> String {
        format!(
            "{}://{}",
            crate::tls::scheme(&self.tls),
            self.client_addr(n)
        )
    }

    fn client_addr(&self, n: usize) -> String {
        match &self.net {
            Some(net) => format!("{}:{NS_CLIENT_PORT}", net.ip(n)),
            None => format!("127.0.0.1:{}", self.base + n as u16 - 1),
        }
    }

    fn peer_addr(&self, n: usize) -> String {
        match &self.net {
            Some(net) => format!("{}:{}", net.ip(n), NS_CLIENT_PORT + 100),
            None => format!("127.0.0.1:{}", self.base + 100 + n as u16 - 1),
        }
    }

    fn block_file(&self, n: usize) -> PathBuf {
        self.dir.join(format!("block{n}"))
    }

    pub fn start_node(&mut self, n: usize) -> anyhow::Result<()> {
        self.start_node_with(n, None)
    }

    /// Restarts node `n` with `STELE_FAILPOINTS=<failpoints>` (e.g.
    /// `journal-sync-eio=40`: its 40th group fsync fails, and the journal
    /// must stop rather than acknowledge); `heal` restarts it without.
    pub fn restart_with_failpoints(&mut self, n: usize, failpoints: &str) -> anyhow::Result<()> {
        self.kill(n);
        self.start_node_with(n, Some(failpoints))?;
        self.failing.push(n);
        Ok(())
    }

    fn start_node_with(&mut self, n: usize, failpoints: Option<&str>) -> anyhow::Result<()> {
        let nodes = self.spec.nodes;
        let peers: Vec<String> = (1..=nodes)
            .filter(|m| *m != n)
            .map(|m| format!("{m}={}", self.peer_addr(m)))
            .collect();
        let endpoints: Vec<String> = (1..=nodes)
            .filter(|m| *m != n)
            .map(|m| format!("{m}={}", self.endpoint(m)))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node{n}.log")))?;
        let bin = match &self.spec.old_bin {
            Some(old) if self.old.contains(&n) => old,
            _ => &self.spec.bin,
        };
        let mut cmd = match &self.net {
            Some(net) => net.command(n, bin),
            None => Command::new(bin),
        };
        cmd.arg("server");
        if self.tls.is_none() && !self.old.contains(&n) {
            // Plaintext gRPC beside an older binary (see `crate::tls`);
            // builds from before TLS take no such flag and are plaintext
            // anyway.
            cmd.arg("--insecure-plaintext");
        }
        if self.spec.controlled {
            cmd.args(["--controllers", &self.controller_endpoint()])
                .args(["--heartbeat-ms", "500"]);
        } else {
            cmd.args(["--peers", &peers.join(",")])
                .args(["--peer-endpoints", &endpoints.join(",")])
                .args(["--tablets", &self.spec.tablets.to_string()]);
        }
        cmd.args(["--node-id", &n.to_string()])
            .args(["--listen", &self.client_addr(n)])
            .args(["--peer-listen", &self.peer_addr(n)])
            .arg("--data-dir")
            .arg(self.dir.join(format!("data{n}")))
            .arg("--certs")
            .arg(crate::tls::node_dir(&self.dir, n))
            .args([
                "--election-timeout-ms",
                &self.spec.election_timeout_ms.to_string(),
            ])
            .args(["--memtable-bytes-max", "65536"])
            .args(["--disk-reserve-bytes", "0", "--journal-reserve-bytes", "0"])
            .env("STELE_PEER_BLOCK_FILE", self.block_file(n))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.coalesces() {
            // Coalesced appends (log format 2), as many as possible per
            // entry: one proposal of a tablet out at a time. A static
            // cell sets its format here; a controlled one enables it
            // after `cell init`.
            cmd.args(["--append-in-flight", "1"]);
            if !self.spec.controlled {
                cmd.args(["--tablet-log-format", "2"]);
            }
        }
        if self.spec.unsafe_local_reads {
            cmd.env("STELE_UNSAFE_LOCAL_READS", "1");
        }
        if self.spec.unsafe_leader_restore {
            cmd.env("STELE_UNSAFE_LEADER_RESTORE", "1");
        }
        if self.spec.unsafe_wake_reads {
            cmd.env("STELE_UNSAFE_WAKE_READS", "1");
        }
        if !self.old.contains(&n) {
            // Groups hibernate as soon as they are quiet at a heartbeat
            // round, so every run puts tablets to sleep and wakes them
            // under its faults (builds from before hibernation take no
            // such flag).
            cmd.args(["--hibernate-after-ms", "1"]);
        }
        // Every node records its synced journal lengths, for power cuts.
        let mut points = vec!["journal-sync-marks"];
        if self.spec.unsafe_skip_fsync {
            points.push("journal-skip-sync");
        }
        let delay = self.sync_delay_ms(n);
        let delay_point = format!("journal-sync-delay-ms={delay}");
        if delay > 0 {
            points.push(&delay_point);
        }
        points.extend(failpoints);
        cmd.env("STELE_FAILPOINTS", points.join(","));
        if let Some(lib) = &self.spec.faketime {
            // Only the wall clock moves: monotonic time (timers, Raft
            // timeouts) is left alone, as on a real machine whose clock is
            // stepped or slewed.
            let file = self.clock_file(n);
            if !file.exists() {
                std::fs::write(&file, "+0\n")?;
            }
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &file)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if self.spec.cold {
            match (&self.s3, &self.spec.s3) {
                (Some((proxy, prefix)), Some(server)) => {
                    cmd.arg("--object-store")
                        .arg(format!("s3://{}/{prefix}", server.bucket))
                        .arg("--s3-endpoint")
                        .arg(format!("http://{}", proxy.addr()))
                        .args(["--s3-allow-http", "--s3-region", "us-east-1"])
                        // Secrets go by environment: a flag is refused.
                        .env("STELE_S3_ACCESS_KEY_ID", "jepsen")
                        .env("STELE_S3_SECRET_ACCESS_KEY", "jepsen");
                }
                _ => {
                    cmd.arg("--object-store")
                        .arg(format!("file://{}", self.dir.join("bucket").display()));
                }
            }
            cmd.args(["--cell-id", "jepsen", "--hot-age-s", "0"])
                .args(["--memtable-age-max-s", "2"]);
        }
        let child = cmd.spawn().with_context(|| format!("start node {n}"))?;
        self.procs.insert(n, child);
        Ok(())
    }

    /// Waits until node `n` answers gRPC (its tablets may still elect).
    pub async fn wait_serving(&self, n: usize, timeout: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Ok(mut c) = self.data_client(n)
                && c.status(stele_proto::pb::StatusRequest {}).await.is_ok()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// A graceful restart of node `n`: SIGTERM, wait for it to exit (a node
    /// may hand off its leaderships first), SIGKILL if it has not exited by
    /// `deadline`, then start it again at once. Says how it stopped.
    pub fn graceful_restart(&mut self, n: usize, deadline: Duration) -> anyhow::Result<String> {
        let Some(mut child) = self.procs.remove(&n) else {
            return Ok("not running".into());
        };
        if self.paused.contains(&n) {
            signal(child.id(), libc::SIGCONT);
            self.paused.retain(|p| *p != n);
        }
        let started = Instant::now();
        signal(child.id(), libc::SIGTERM);
        let how = loop {
            if let Some(status) = child.try_wait()? {
                break format!("exited {status} after {} ms", started.elapsed().as_millis());
            }
            if started.elapsed() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break format!("no exit within {} ms: SIGKILL", deadline.as_millis());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.start_node(n)?;
        Ok(how)
    }

    /// A rolling-upgrade step: node `n` restarts gracefully (as
    /// [`Cell::graceful_restart`]) onto the other binary, the newer if it
    /// ran the older, else back to the older (no gated format is enabled,
    /// so a mixed cell may go either way). Says which way and how it
    /// stopped.
    pub fn upgrade_restart(&mut self, n: usize, deadline: Duration) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.spec.old_bin.is_some(),
            "the upgrade nemesis needs an older binary (--old-bin)"
        );
        let way = if self.old.remove(&n) {
            "upgrade"
        } else {
            self.old.insert(n);
            "downgrade"
        };
        let how = self.graceful_restart(n, deadline)?;
        Ok(format!("{way} ({how})"))
    }

    pub fn kill(&mut self, n: usize) {
        if let Some(mut c) = self.procs.remove(&n) {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused.retain(|p| *p != n);
    }

    /// Every node's journal files with their lengths now: for a cell whose
    /// journals skip fdatasync, what the kernel has written back of them
    /// by a later [`Cell::power_cut_to`].
    pub fn journal_lengths(&self) -> anyhow::Result<BTreeMap<PathBuf, u64>> {
        let mut out = BTreeMap::new();
        for n in 1..=self.spec.nodes {
            let journal = self.dir.join(format!("data{n}")).join("journal");
            for entry in std::fs::read_dir(&journal)
                .with_context(|| format!("list {}", journal.display()))?
            {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "wal") {
                    out.insert(path.clone(), std::fs::metadata(&path)?.len());
                }
            }
        }
        Ok(out)
    }

    /// A power cut of the whole cell: every node SIGKILLed at once, then
    /// each journal file cut back to the length its node last synced
    /// (`journal/SYNCED`, written by the `journal-sync-marks` fail point):
    /// what a machine loses of writes it never synced. `heal` restarts
    /// them. Returns the bytes cut.
    pub fn power_cut(&mut self) -> anyhow::Result<u64> {
        self.power_cut_to(&BTreeMap::new())
    }

    /// [`Cell::power_cut`] on disks that had also written back `written`
    /// (file lengths from [`Cell::journal_lengths`] taken a moment before):
    /// each journal file keeps the longer of its synced length and its
    /// length in `written`, and loses the rest.
    pub fn power_cut_to(&mut self, written: &BTreeMap<PathBuf, u64>) -> anyhow::Result<u64> {
        for n in 1..=self.spec.nodes {
            self.kill(n);
        }
        let mut cut = 0;
        for n in 1..=self.spec.nodes {
            let journal = self.dir.join(format!("data{n}")).join("journal");
            let marks = std::fs::read_to_string(journal.join("SYNCED")).unwrap_or_default();
            for line in marks.lines() {
                let Some((seq, len)) = line.split_once(' ') else {
                    continue;
                };
                let (Ok(seq), Ok(len)) = (seq.parse::<u64>(), len.trim().parse::<u64>()) else {
                    continue;
                };
                let path = journal.join(format!("{seq:020}.wal"));
                let len = len.max(written.get(&path).copied().unwrap_or(0));
                let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
                    continue;
                };
                let now = file.metadata()?.len();
                if now > len {
                    file.set_len(len)?;
                    cut += now - len;
                }
            }
        }
        Ok(cut)
    }

    pub fn pause(&mut self, n: usize) {
        if let Some(c) = self.procs.get(&n) {
            signal(c.id(), libc::SIGSTOP);
            self.paused.push(n);
        }
    }

    pub fn resume(&mut self, n: usize) {
        if let Some(c) = self.procs.get(&n) {
            signal(c.id(), libc::SIGCONT);
        }
        self.paused.retain(|p| *p != n);
    }

    /// Cuts `side` off from every other node (both directions).
    pub fn isolate(&self, side: &[usize]) -> anyhow::Result<()> {
        for n in 1..=self.spec.nodes {
            let blocked: Vec<usize> = if side.contains(&n) {
                (1..=self.spec.nodes)
                    .filter(|m| !side.contains(m))
                    .collect()
            } else {
                side.to_vec()
            };
            self.block(n, &blocked)?;
        }
        Ok(())
    }

    /// Every node hears only its two neighbours on a ring: overlapping
    /// majorities with five nodes; with four, each node misses the one
    /// opposite. With three (where a ring is no cut at all), a bridge:
    /// `via` hears both others, which do not hear each other.
    pub fn ring(&self, via: usize) -> anyhow::Result<&'static str> {
        let nodes = self.spec.nodes;
        if nodes < 4 {
            for n in 1..=nodes {
                let blocked: Vec<usize> = if n == via {
                    Vec::new()
                } else {
                    (1..=nodes).filter(|m| *m != n && *m != via).collect()
                };
                self.block(n, &blocked)?;
            }
            return Ok("bridge");
        }
        for n in 1..=nodes {
            let prev = if n == 1 { nodes } else { n - 1 };
            let next = if n == nodes { 1 } else { n + 1 };
            let blocked: Vec<usize> = (1..=nodes)
                .filter(|m| *m != n && *m != prev && *m != next)
                .collect();
            self.block(n, &blocked)?;
        }
        Ok("ring")
    }

    /// Node `n` drops `percent` of its packets (network namespaces only).
    pub fn loss(&self, n: usize, percent: u32) -> anyhow::Result<bool> {
        match &self.net {
            Some(net) => {
                net.loss(n, percent)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Node `n` exchanges nothing with `peers` (replacing its earlier rule).
    fn block(&self, n: usize, peers: &[usize]) -> anyhow::Result<()> {
        if let Some(net) = &self.net {
            return net.block(n, peers);
        }
        let blocked: Vec<String> = peers.iter().map(usize::to_string).collect();
        let tmp = self.block_file(n).with_extension("tmp");
        std::fs::write(&tmp, blocked.join(","))?;
        std::fs::rename(&tmp, self.block_file(n))?;
        Ok(())
    }

    /// Stalls (`stall`) or fails every request to the cold tier's S3
    /// server until `heal`. False without a cold tier on S3.
    pub fn s3_fault(&self, stall: bool) -> bool {
        match &self.s3 {
            Some((proxy, _)) => {
                proxy.set(if stall {
                    crate::s3proxy::Mode::Stall
                } else {
                    crate::s3proxy::Mode::Fail
                });
                true
            }
            None => false,
        }
    }

    /// Bytes the nodes sent to the S3 server and got back, with a cold
    /// tier on S3.
    pub fn s3_bytes(&self) -> Option<(u64, u64)> {
        self.s3.as_ref().map(|(proxy, _)| proxy.bytes())
    }

    /// Heals every partition, pause and S3 fault; restarts killed nodes.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        if let Some(net) = &self.net {
            net.heal()?;
        }
        if let Some((proxy, _)) = &self.s3 {
            proxy.set(crate::s3proxy::Mode::Pass);
        }
        for n in 1..=self.spec.nodes {
            self.set_clock(n, "+0")?;
        }
        for n in 1..=self.spec.nodes {
            match std::fs::remove_file(self.block_file(n)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        for n in self.paused.clone() {
            self.resume(n);
        }
        for n in std::mem::take(&mut self.failing) {
            self.kill(n);
        }
        for n in 1..=self.spec.nodes {
            if !self.procs.contains_key(&n) {
                self.start_node(n)?;
            }
        }
        if self.spec.controlled && self.controller.is_none() {
            self.start_controller()?;
        }
        if let Some(g) = &mut self.gateways {
            g.heal()?;
        }
        Ok(())
    }

    pub fn is_up(&self, n: usize) -> bool {
        self.procs.contains_key(&n)
    }

    /// The node each node itself says leads `tablet`, if they agree on one.
    pub async fn leader_of(&self, tablet_for_vshard: u32) -> Option<usize> {
        for n in 1..=self.spec.nodes {
            if !self.is_up(n) || self.paused.contains(&n) {
                continue;
            }
            let Ok(mut c) = self.data_client(n) else {
                continue;
            };
            let Ok(r) = c.list_tablets(stele_proto::pb::ListTabletsRequest {}).await else {
                continue;
            };
            let t = r.into_inner().tablets.into_iter().find(|t| {
                t.vshard_lo <= tablet_for_vshard && u64::from(tablet_for_vshard) < t.vshard_hi
            });
            if let Some(t) = t
                && t.leader_node == n as u64
            {
                return Some(n);
            }
        }
        None
    }

    pub fn stop(&mut self) {
        if let Some(g) = &mut self.gateways {
            g.stop();
        }
        for n in self.paused.clone() {
            self.resume(n);
        }
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (_, mut c) in std::mem::take(&mut self.procs) {
            signal(c.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piped(cmd: &mut Command) -> Child {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    }

    #[test]
    fn a_child_past_its_deadline_is_killed_and_reaped() {
        let child = piped(Command::new("sleep").arg("30"));
        let pid = child.id();
        let started = Instant::now();
        let got = wait_output_within(child, Duration::from_secs(1));
        let took = started.elapsed();
        assert!(
            matches!(got, Err(Wait::TimedOut(d)) if d == Duration::from_secs(1)),
            "{got:?}"
        );
        assert!(took < Duration::from_secs(5), "took {took:?}");
        // Killed and reaped: not even a zombie is left.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} is still there"
        );
    }

    #[test]
    fn a_timeout_is_a_typed_error_naming_the_command() {
        let started = Instant::now();
        let e = output_within(
            Command::new("sleep").args(["30", "5"]),
            Duration::from_secs(1),
        )
        .expect_err("sleep 30 within 1 s");
        assert!(started.elapsed() < Duration::from_secs(5));
        let t = e.downcast_ref::<TimedOut>().expect("a TimedOut");
        assert_eq!(t.program, "sleep");
        assert_eq!(t.args, ["30", "5"]);
        assert_eq!(e.to_string(), r#"sleep ["30", "5"] timed out after 1s"#);
    }

    #[test]
    fn a_fast_child_gives_its_output_and_status() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(20),
        )
        .expect("sh");
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn output_larger_than_a_pipe_buffer_is_drained() {
        // 64 KiB fill a Linux pipe: a child whose pipes were not read while
        // it runs would block here until killed at the deadline.
        let started = Instant::now();
        let out = output_within(
            Command::new("sh").args([
                "-c",
                "head -c 200000 /dev/zero; head -c 300000 /dev/zero >&2",
            ]),
            Duration::from_secs(20),
        )
        .expect("head");
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), 200_000);
        assert_eq!(out.stderr.len(), 300_000);
        assert!(out.stdout.iter().chain(&out.stderr).all(|b| *b == 0));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn pipes_held_open_by_a_grandchild_do_not_outlast_the_deadline() {
        // `sh` exits at once; the `sleep` it leaves behind holds stdout.
        let started = Instant::now();
        let e = output_within(
            Command::new("sh").args(["-c", "sleep 4 & echo started"]),
            Duration::from_secs(1),
        )
        .expect_err("stdout open past the deadline");
        assert!(e.is::<TimedOut>(), "{e:#}");
        assert!(started.elapsed() < Duration::from_millis(3_500));
    }
}
