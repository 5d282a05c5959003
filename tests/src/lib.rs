//! Helpers for multi-process tests: start real `stele` processes on
//! loopback, find their endpoints, kill them.
//!
//! The binary is `target/<profile>/stele` of this workspace (build it first
//! with `cargo build --bin stele --features fault-injection`, as
//! `scripts/test` does: the fault tests set the unsafe switches, which a
//! build without the feature refuses), or `$STELE_BIN`.

pub mod bench;
pub mod cell;
pub mod compose;
pub mod controlled;
pub mod directory;
pub mod gateway;
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The workspace's target directory.
pub fn target_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
}

/// Path of the `stele` binary under test.
pub fn stele_bin() -> PathBuf {
    if let Ok(p) = std::env::var("STELE_BIN") {
        return PathBuf::from(p);
    }
    let target = target_dir();
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("stele");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "no stele binary under {}; run `cargo build --bin stele --features fault-injection` (scripts/test does) or set STELE_BIN",
        target.display()
    );
}

/// A running `stele` process.
pub struct Proc {
    pub child: Child,
    pub endpoint: String,
    /// What the process printed on stdout up to its `listening on` line,
    /// that line included.
    pub started: Vec<String>,
    /// Lines the process printed on stderr (collected in the background).
    pub stderr: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `stele <args>` and waits for its "listening on" line.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Result<Proc, String> {
        Proc::start_bin(&stele_bin(), args, envs)
    }

    /// Like [`Proc::start`], with another binary (an older build, for
    /// upgrade tests).
    pub fn start_bin(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> Result<Proc, String> {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| format!("spawn stele: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (err_tx, err_rx) = mpsc::channel();
        // STELE_TEST_LOG_DIR=DIR keeps every process's stderr in
        // DIR/<pid>.log (its command line first), for a failure that only
        // shows under load; the test tempdirs go with the test.
        let mut keep = std::env::var_os("STELE_TEST_LOG_DIR").and_then(|dir| {
            let path = Path::new(&dir).join(format!("{}.log", child.id()));
            let mut f = std::fs::File::create(path).ok()?;
            use std::io::Write;
            writeln!(f, "{} {}", bin.display(), args.join(" ")).ok()?;
            Some(f)
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(f) = keep.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
                let _ = err_tx.send(line);
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining after the caller stops listening: a child whose
            // stdout pipe closes would fail its next write.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut started = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    started.push(line.clone());
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        let endpoint = rest
                            .split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .to_string();
                        return Ok(Proc {
                            child,
                            endpoint,
                            started,
                            stderr: err_rx,
                        });
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    // The process is gone: read its stderr to the end.
                    let mut err = Vec::new();
                    while let Ok(line) = err_rx.recv_timeout(Duration::from_secs(5)) {
                        err.push(line);
                    }
                    return Err(format!(
                        "stele did not come up (exit {status:?}); stderr:\n{}",
                        err.join("\n")
                    ));
                }
            }
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        send_signal(self.child.id(), libc::SIGTERM);
        self.child.wait().expect("wait")
    }

    /// Everything printed on stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to a child process by pid (SIGSTOP, SIGCONT, ...).
pub fn signal(pid: u32, sig: i32) {
    send_signal(pid, sig)
}

#[allow(unsafe_code)]
fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid of a child we own; no memory is touched.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// gRPC health `Check` of `service` ("" for the whole server) on
/// `endpoint`: the status (`ServingStatus as i32`), or why there is none.
pub async fn grpc_health(endpoint: &str, service: &str) -> Result<i32, String> {
    health_client(endpoint)
        .await?
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| e.to_string())
}

/// A gRPC health client of `endpoint`.
pub async fn health_client(
    endpoint: &str,
) -> Result<tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>, String> {
    let tls = tls::client_tls();
    let channel = stele_tls::channel(
        endpoint,
        Some(&tls),
        stele_tls::Kind::Node,
        Duration::from_secs(2),
    )
    .map_err(|e| format!("{endpoint}: {e}"))?;
    Ok(tonic_health::pb::health_client::HealthClient::new(channel))
}

/// gRPC health's SERVING and NOT_SERVING, as [`grpc_health`] returns them.
pub const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
pub const NOT_SERVING: i32 =
    tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// Runs `stele <args>` to completion as the test operator (the test CA's
/// `STELE_CERTS_DIR`) and returns (success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    let dir = tls::test_ca().operator.to_str().unwrap().to_string();
    run_env(args, &[("STELE_CERTS_DIR", &dir)])
}

/// `stele <args>` with no TLS settings at all.
pub fn run_plain(args: &[&str]) -> (bool, String, String) {
    run_env(args, &[])
}

/// `stele <args>` with `envs` set.
pub fn run_env(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(stele_bin())
        .args(args)
        .env_remove("STELE_CERTS_DIR")
        .envs(envs.iter().copied())
        .output()
        .expect("run stele");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Makes a cell CA in `dir/ca` and certificates for nodes `1..=nodes` in
/// `dir/certs<n>`.
pub fn make_certs(dir: &Path, nodes: usize) {
    let ca = dir.join("ca");
    std::fs::create_dir_all(&ca).unwrap();
    for f in ["ca.pem", "ca.key"] {
        std::fs::copy(tls::test_ca().ca.join(f), ca.join(f)).unwrap();
    }
    for n in 1..=nodes {
        let out = dir.join(format!("certs{n}"));
        let (ok, _, err) = run(&[
            "cert",
            "node",
            "--ca",
            ca.to_str().unwrap(),
            "--node-id",
            &n.to_string(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
    }
}

/// A base port `b` with TCP ports `b..b+n` and UDP ports `b+100..b+100+n`
/// free on 127.0.0.1 (the layout `stele dev --nodes n` uses).
pub fn free_port_base(n: u16) -> u16 {
    use std::net::{TcpListener, UdpSocket};
    // Calls in one process (tests of one binary run in parallel threads)
    // start at different attempts, so they never pick the same slot.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let first = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 7;
    for attempt in first..first + 500 {
        // Below the kernel's ephemeral range (32768 and up by default), so
        // outgoing connections of other tests never take a port we pick;
        // in 16-port slots picked by a hash of the pid, so tests running at
        // once (consecutive pids) never get overlapping windows.
        assert!(n <= 16, "a cell of more than 16 ports");
        let h = (u64::from(std::process::id()) ^ (u64::from(attempt) << 32))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let base = 10_000 + ((h >> 40) % 1_375) as u16 * 16;
        let tcp = (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        let udp = (0..n).all(|i| UdpSocket::bind(("127.0.0.1", base + 100 + i)).is_ok());
        if tcp && udp {
            return base;
        }
    }
    panic!("no free loopback ports for a {n}-node cell");
}

/// Every file under `dir`, recursively.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// (segment id, format version) of every published segment file under
/// `dir` (the version is the prologue's, FORMAT.md section 5).
pub fn segments(dir: &Path) -> std::collections::BTreeSet<(String, u32)> {
    walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let v = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
            Some((p.file_stem()?.to_string_lossy().into_owned(), v))
        })
        .collect()
}

/// The version of format `name` in a `formats` list of `stele cell
/// formats --json` (the cell's, or one member's), if the list names it.
pub fn format_version(formats: &serde_json::Value, name: &str) -> Option<u64> {
    formats.as_array()?.iter().find(|f| f["name"] == name)?["version"].as_u64()
}

/// Bytes of the segment objects (`.seg`) under a `file://` bucket.
pub fn bucket_segment_bytes(bucket: &Path) -> u64 {
    walk(bucket)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// How many segment objects a `file://` bucket holds.
pub fn bucket_segment_count(bucket: &Path) -> u64 {
    walk(bucket)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .count() as u64
}

/// A unique value `v<i>-` followed by `len` random alphanumerics: hardly
/// compressible, so bytes on the wire and in segments compare.
pub fn noise_value(i: u64, len: usize) -> String {
    use rand::Rng;
    let noise: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(len)
        .map(char::from)
        .collect();
    format!("v{i:05}-{noise}")
}

/// The body of `GET http://127.0.0.1:<port><path>` (HTTP/1.0, blocking):
/// `/metrics` and the probes of `--http-listen`.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(out)
}

/// The value of one Prometheus series, `name{labels}` exactly as the
/// exposition writes it (`stele_x_bucket{le="1"}`), if the body has it.
pub fn series(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let v = l.strip_prefix(series)?.strip_prefix(' ')?;
        v.trim().parse().ok()
    })
}

/// The value of Prometheus counter `name` with label `method="<method>"`
/// in a `/metrics` body (0 when absent).
pub fn counter(metrics: &str, name: &str, method: &str) -> u64 {
    let want = format!("{name}{{method=\"{method}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}
