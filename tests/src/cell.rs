//! A three-node cell of real `stele server` processes on loopback, peers
//! over QUIC with mutual TLS: certificates, ports, flags, and the reads a
//! test needs to compare replicas.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use stele_client::ClientOptions;
use stele_client::retry::RetryPolicy;
use stele_proto::pb;

use crate::{Proc, free_port_base, make_certs};

/// Nodes of a [`Cell`] (ids 1..=NODES).
pub const NODES: usize = 3;

/// Certificates, ports and data directories of a three-node cell.
pub struct Cell {
    pub dir: tempfile::TempDir,
    base_port: u16,
    /// Flag values replacing the defaults of [`Cell::args`], or added.
    flags: Vec<(String, String)>,
    peer_filter: bool,
}

impl Cell {
    /// Makes the cell CA and one certificate per node.
    pub fn new() -> Cell {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path(), NODES);
        Cell {
            dir,
            base_port: free_port_base(NODES as u16),
            flags: Vec::new(),
            peer_filter: false,
        }
    }

    /// Sets a server flag (`"--tablets"`, `"1"`) for every node.
    pub fn flag(mut self, name: &str, value: &str) -> Cell {
        self.flags.retain(|(k, _)| k != name);
        self.flags.push((name.to_string(), value.to_string()));
        self
    }

    /// Starts every node with `STELE_PEER_BLOCK_FILE` set to
    /// [`Cell::block_file`], so [`Cell::block`] can partition it.
    pub fn with_peer_filter(mut self) -> Cell {
        self.peer_filter = true;
        self
    }

    fn client_port(&self, n: usize) -> u16 {
        self.base_port + n as u16 - 1
    }

    fn peer_port(&self, n: usize) -> u16 {
        self.base_port + 100 + n as u16 - 1
    }

    pub fn data_dir(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("data{n}"))
    }

    /// Segment files of `tablet` on node `n`.
    pub fn segment_dir(&self, n: usize, tablet: u64) -> PathBuf {
        self.data_dir(n).join("segments").join(tablet.to_string())
    }

    /// Segment files (`*.seg`) of `tablet` on node `n` by name, with their
    /// bytes; empty if the node has none yet.
    pub fn segment_files(
        &self,
        n: usize,
        tablet: u64,
    ) -> std::collections::BTreeMap<String, Vec<u8>> {
        let Ok(dir) = std::fs::read_dir(self.segment_dir(n, tablet)) else {
            return Default::default();
        };
        dir.map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    }

    /// The peer filter file of node `n`.
    pub fn block_file(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("block{n}"))
    }

    /// Makes node `n` drop Raft traffic with `peers` (none: heal). The file
    /// is replaced atomically, so the node never reads half of it.
    pub fn block(&self, n: usize, peers: &[usize]) {
        let path = self.block_file(n);
        if peers.is_empty() {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("remove {}: {e}", path.display()),
            }
            return;
        }
        let text: Vec<String> = peers.iter().map(usize::to_string).collect();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text.join(",")).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// Command-line of node `n`.
    pub fn args(&self, n: usize) -> Vec<String> {
        let d = self.dir.path();
        let peers: Vec<String> = (1..=NODES)
            .filter(|m| *m != n)
            .map(|m| format!("{m}=127.0.0.1:{}", self.peer_port(m)))
            .collect();
        let endpoints: Vec<String> = (1..=NODES)
            .filter(|m| *m != n)
            .map(|m| format!("{m}={}", self.endpoint(m)))
            .collect();
        let mut args: Vec<String> = [
            "server".to_string(),
            "--node-id".into(),
            n.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.client_port(n)),
            "--peer-listen".into(),
            format!("127.0.0.1:{}", self.peer_port(n)),
            "--data-dir".into(),
            self.data_dir(n).to_str().unwrap().into(),
            "--certs".into(),
            d.join(format!("certs{n}")).to_str().unwrap().into(),
            "--peers".into(),
            peers.join(","),
            "--peer-endpoints".into(),
            endpoints.join(","),
        ]
        .to_vec();
        let defaults = [
            ("--tablets", "4"),
            ("--memtable-bytes-max", "65536"),
            ("--election-timeout-ms", "1500"),
            ("--disk-reserve-bytes", "0"),
            ("--journal-reserve-bytes", "0"),
        ];
        for (k, v) in defaults {
            if !self.flags.iter().any(|(f, _)| f == k) {
                args.extend([k.to_string(), v.to_string()]);
            }
        }
        for (k, v) in &self.flags {
            args.extend([k.clone(), v.clone()]);
        }
        args
    }

    /// Starts nodes `nodes` in parallel and waits until each serves.
    pub fn start(&self, nodes: &[usize]) -> HashMap<usize, Proc> {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let args = self.args(*n);
                let block = self.block_file(*n);
                let filter = self.peer_filter;
                let n = *n;
                std::thread::spawn(move || {
                    let a: Vec<&str> = args.iter().map(String::as_str).collect();
                    let block = block.to_str().unwrap().to_string();
                    let envs: Vec<(&str, &str)> = if filter {
                        vec![("STELE_PEER_BLOCK_FILE", block.as_str())]
                    } else {
                        Vec::new()
                    };
                    (
                        n,
                        Proc::start(&a, &envs).unwrap_or_else(|e| panic!("node {n}: {e}")),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Client endpoint of node `n`.
    pub fn endpoint(&self, n: usize) -> String {
        format!("https://127.0.0.1:{}", self.client_port(n))
    }
}

impl Default for Cell {
    fn default() -> Self {
        Cell::new()
    }
}

/// Client options for a cell whose leaders move: patient retries, short
/// per-request timeouts.
pub fn client_options() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 30,
            deadline: Duration::from_secs(20),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
        },
        request_timeout: Duration::from_secs(3),
        tls: Some(crate::tls::client_tls()),
        ..ClientOptions::default()
    }
}

/// Every record of `namespace` as one node's own replicas hold it (a
/// bounded-staleness scan, which any replica answers from its local state).
pub async fn local_rows(endpoint: &str, namespace: &str) -> Vec<pb::Row> {
    try_local_rows(endpoint, namespace).await.unwrap()
}

/// [`local_rows`], or the node's refusal: a replica that has not heard
/// from any leader yet (just after a partition heals) refuses bounded reads.
pub async fn try_local_rows(
    endpoint: &str,
    namespace: &str,
) -> Result<Vec<pb::Row>, tonic::Status> {
    let mut c = crate::tls::data_client(endpoint);
    let mut out = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let resp = c
            .scan(pb::ScanRequest {
                namespace: namespace.into(),
                limit: 1000,
                cursor: cursor.clone(),
                read: Some(pb::ReadOptions {
                    consistency: pb::Consistency::Bounded as i32,
                    max_staleness_ms: 600_000,
                    partial: false,
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(resp.rows);
        if resp.next_cursor.is_empty() {
            return Ok(out);
        }
        cursor = resp.next_cursor;
    }
}

/// How many times each value appears among `rows`.
pub fn value_counts(rows: &[pb::Row]) -> HashMap<Vec<u8>, usize> {
    let mut seen = HashMap::new();
    for r in rows {
        *seen.entry(r.value.clone()).or_default() += 1;
    }
    seen
}

/// The tablet whose range holds `namespace` (its first vshard), as node
/// `endpoint` describes it.
pub async fn tablet_of(endpoint: &str, namespace: &str) -> pb::TabletDescriptor {
    let (lo, _) = stele_proto::vshard::namespace_range(namespace);
    let mut c = crate::tls::data_client(endpoint);
    c.list_tablets(pb::ListTabletsRequest {})
        .await
        .unwrap()
        .into_inner()
        .tablets
        .into_iter()
        .find(|t| lo >= t.vshard_lo && u64::from(lo) < t.vshard_hi)
        .expect("a tablet covers the namespace")
}

/// The Status of node `endpoint`.
pub async fn status(endpoint: &str) -> pb::StatusResponse {
    let mut c = crate::tls::data_client(endpoint);
    c.status(pb::StatusRequest {}).await.unwrap().into_inner()
}
