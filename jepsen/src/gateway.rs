//! The `gateway` workload: list-append through `stele gateway` processes
//! over HTTP, as a producer in any language would write, with the
//! `kill-gateway` nemesis killing one mid-request.
//!
//! ```text
//! client p ─POST records (Idempotency-Key p-n)─▶ gateway A ─gRPC─▶ leaders
//!    │ no answer in time, 5xx, 429, connection lost
//!    └─ the same request, the same key ─▶ gateway B (then A, ...)
//! ```
//!
//! An append is `ok` on a 200, `fail` on a refusal when no earlier try of
//! it may have been applied, else `info`. Reads are a key's timeline
//! (linearizable), paged. The checker is the list-append one: a retry
//! applied twice is a `duplicate`, an acknowledged append missing is
//! `lost`. The negative control (`--unsafe-gateway-retries`) sends no
//! Idempotency-Key, so a retry after an answer that was lost is a second
//! append, which the checker must name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::history::{Kind, Op};
use crate::run::{KeySpace, NAMESPACE, Recorder};

/// Gateways in front of a controlled cell, each on a fixed loopback port
/// (a restarted one comes back where its clients look for it).
pub struct Gateways {
    bin: PathBuf,
    dir: PathBuf,
    controllers: String,
    /// `STELE_CERTS_DIR` of a cell with TLS on gRPC: the runner's operator.
    certs: Option<PathBuf>,
    ports: Vec<u16>,
    procs: Vec<Option<Child>>,
}

/// How long one try of an append may take: shorter than many appends
/// take under load, so tries are abandoned while their batch is on its way
/// to the log, and retries are frequent (what idempotency keys are for;
/// without them, the negative control, such retries apply twice).
const APPEND_TRY: Duration = Duration::from_millis(100);
/// How long one read may take.
const READ_TRY: Duration = Duration::from_secs(2);
/// One append's tries, across gateways, before it is left `info`.
const TRIES: u32 = 10;

impl Gateways {
    /// Starts `n` gateways of the cell at `controllers` and waits until
    /// each is ready.
    pub fn start(
        bin: &Path,
        dir: &Path,
        controllers: String,
        certs: Option<PathBuf>,
        n: usize,
    ) -> anyhow::Result<Gateways> {
        let mut ports = Vec::new();
        for _ in 0..n {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            ports.push(l.local_addr()?.port());
        }
        let mut g = Gateways {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            controllers,
            certs,
            procs: (0..n).map(|_| None).collect(),
            ports,
        };
        for i in 0..n {
            g.start_one(i)?;
        }
        Ok(g)
    }

    pub fn ports(&self) -> Vec<u16> {
        self.ports.clone()
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    fn start_one(&mut self, i: usize) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("gateway{}.log", i + 1)))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            "gateway",
            "--controllers",
            &self.controllers,
            "--http-listen",
            &format!("127.0.0.1:{}", self.ports[i]),
        ])
        .env_remove("STELE_CERTS_DIR")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        if let Some(c) = &self.certs {
            cmd.env("STELE_CERTS_DIR", c);
        }
        self.procs[i] = Some(cmd.spawn()?);
        let ready_by = Instant::now() + Duration::from_secs(30);
        while !ready(self.ports[i]) {
            anyhow::ensure!(
                Instant::now() < ready_by,
                "gateway {} did not become ready; see {}",
                i + 1,
                self.dir.join(format!("gateway{}.log", i + 1)).display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// SIGKILL gateway `i` (whatever it has in flight is cut off).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts every gateway that is not running.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        for i in 0..self.procs.len() {
            if self.procs[i].is_none() {
                self.start_one(i)?;
            }
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}

impl Drop for Gateways {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET /readyz` answers 200.
fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = "GET /readyz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

/// One HTTP/1.1 exchange on a fresh connection, within `timeout`:
/// the status and body, or why there is none (the request may or may not
/// have reached the cell).
async fn call(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(body).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
        let head_end = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("no end of head")?;
        let status = std::str::from_utf8(&out[..head_end])
            .ok()
            .and_then(|h| h.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or("no status")?;
        Ok((status, out[head_end + 4..].to_vec()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// One client process of the gateway workload: appends unique values to
/// random keys and reads whole lists through the gateways at `ports`,
/// starting at gateway `p % ports` and moving on when one fails.
pub(crate) async fn gateway_process(
    p: u64,
    ports: Vec<u16>,
    keys: Arc<KeySpace>,
    seed: u64,
    stop_at: Instant,
    rec: Arc<Recorder>,
    idempotent: bool,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (p * 0x9e37_79b9) ^ 0x6a7e);
    let mut at = p as usize % ports.len();
    let mut next = 0u64;
    // The "node" of a history event: the gateway a client started at.
    let node = at as u64 + 1;
    let records = format!("/v1/namespaces/{NAMESPACE}/records");
    while Instant::now() < stop_at {
        rec.hold().await;
        let slot = rng.random_range(0..keys.slots());
        if rng.random_bool(0.5) {
            let key = keys.for_append(slot);
            next += 1;
            let value = p * 1_000_000 + next;
            let op = Op::Append {
                key: key.clone(),
                value,
            };
            rec.record(p, Kind::Invoke, op.clone(), node);
            // One ts for every record: the timeline is then by position.
            let body =
                serde_json::json!({"key": key, "value": value.to_string(), "ts": 1}).to_string();
            let idem = format!("p{p}-{next}");
            let mut headers = vec![("Content-Type", "application/json")];
            if idempotent {
                headers.push(("Idempotency-Key", idem.as_str()));
            }
            let mut maybe_applied = false;
            let mut kind = Kind::Info;
            for _ in 0..TRIES {
                let sent = call(
                    ports[at],
                    "POST",
                    &records,
                    &headers,
                    body.as_bytes(),
                    APPEND_TRY,
                );
                match sent.await {
                    Ok((200, _)) => {
                        kind = Kind::Ok;
                        break;
                    }
                    // Refused before anything was sent: nothing written by
                    // this try.
                    Ok((429, _)) => {}
                    Ok((s, _)) if s >= 500 => maybe_applied = true,
                    // A typed refusal of the request itself: it wrote
                    // nothing, unless an earlier try may have.
                    Ok(_) => {
                        kind = if maybe_applied {
                            Kind::Info
                        } else {
                            Kind::Fail
                        };
                        break;
                    }
                    Err(_) => maybe_applied = true,
                }
                at = (at + 1) % ports.len();
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..50))).await;
            }
            rec.record(p, kind, op, node);
        } else {
            let key = keys.for_read(slot);
            rec.invoke_read(p, &key, node);
            let values = read_list(ports[at], &key).await.ok();
            if values.is_none() {
                at = (at + 1) % ports.len();
            }
            rec.read_done(p, key, values, node);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// A key's values in timeline order, every page (linearizable reads).
async fn read_list(port: u16, key: &str) -> Result<Vec<u64>, String> {
    let mut values = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/namespaces/{NAMESPACE}/keys/{key}/records?limit=1000");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, body) = call(port, "GET", &path, &[], b"", READ_TRY).await?;
        if status != 200 {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        let page: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        for row in page["rows"].as_array().ok_or("no rows")? {
            let v = row["value"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("a value that is not one of ours: {row}"))?;
            values.push(v);
        }
        match page["next_cursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
            _ => return Ok(values),
        }
    }
}
