//! One run: a cell, list-append clients and a nemesis for a set time, then
//! heal, recover, read every key's final list, check, and write the store:
//!
//! ```text
//! <store>/<run>/seed, history.jsonl, nemesis.jsonl, results.json, node<i>.log
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use stele_client::retry::RetryPolicy;
use stele_client::{Client, ClientOptions, ReadOptions};

use crate::cell::{Cell, CellSpec, TimedOut};
use crate::checker::list_append::{self, Report};
use crate::history::{Event, Kind, Op, pair};

/// The namespace every key lives in: one tablet, so the faults that hit its
/// leader hit every operation.
pub const NAMESPACE: &str = "jepsen/la";
/// The set workload's namespace.
pub const SET_NAMESPACE: &str = "jepsen/set";
/// The register workload's namespace.
pub const REGISTER_NAMESPACE: &str = "jepsen/reg";

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Append unique values to keys' lists, read whole lists (linearizable).
    ListAppend,
    /// Insert unique values (each its own key), read the whole namespace
    /// once after healing, with a cold tier so that read covers segments
    /// evicted to the bucket.
    Set,
    /// Each key a register: `Get` reads, unconditional writes, and
    /// compare-and-set by a conditional append on the version read; each
    /// key's history checked for linearizability (`todc-utils`).
    Register,
    /// List-append through two `stele gateway` processes over HTTP, each
    /// append retried through the other gateway under its idempotency key
    /// (`crate::gateway`); implies a controlled cell.
    Gateway,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "list-append" => Ok(Workload::ListAppend),
            "set" => Ok(Workload::Set),
            "register" => Ok(Workload::Register),
            "gateway" => Ok(Workload::Gateway),
            other => Err(format!(
                "unknown workload {other:?}: want list-append, set, register or gateway"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Nemesis {
    None,
    Kill,
    Pause,
    Partition,
    /// Isolates the leader of the workload's tablet (what the negative
    /// control needs to show stale reads).
    PartitionLeader,
    /// SIGKILL the node that leads the workload's tablet.
    KillLeader,
    /// A graceful restart (a rolling-restart step): SIGTERM a node, wait
    /// for it to exit (SIGKILL after ten election timeouts), start it again
    /// at once. Valid whether or not the node hands off its leaderships
    /// on SIGTERM.
    Restart,
    /// A rolling-upgrade step (needs `--old-bin`; nodes start on the older
    /// binary): a graceful restart of a node onto the other binary, this
    /// build if it ran the older one, else back. The cell runs mixed
    /// versions throughout and must lose nothing.
    Upgrade,
    /// Every node hears only its two ring neighbours (four or more
    /// nodes); with three, one node bridges two that cannot hear each other.
    PartitionRing,
    /// A random node drops 30% of its packets (network namespaces only).
    Loss,
    /// SIGKILL the controller (controlled cells); heal restarts it. Tablets
    /// must keep serving without it.
    KillController,
    /// Step a node's wall clock forward or back by seconds to minutes, or
    /// make it run fast (libfaketime); heal sets it right.
    Clock,
    /// Restart a node with a journal fsync (or write) fail point armed a
    /// few dozen groups ahead: the journal must stop and the node refuse,
    /// never acknowledge what did not reach the disk. Heal restarts it
    /// clean.
    FsyncFail,
    /// Membership churn (controlled cells): move a voter of the workload's
    /// tablet (its leader's, half the time) to the node without one, or
    /// hand its leadership to another voter.
    Churn,
    /// Split (controlled cells): split a tablet of the workload's
    /// namespace at a random vshard inside it, under the workload (at most
    /// eight tablets per namespace).
    Split,
    /// Merge (controlled cells): merge two adjacent tablets of the
    /// workload's namespace, under the workload (nothing when one tablet
    /// holds the whole namespace; pair it with `split`).
    Merge,
    /// A power cut of the whole cell: every node killed at once and its
    /// journal cut back to what it had synced; heal restarts them. Nothing
    /// acknowledged may be lost.
    PowerCut,
    /// Stall every request of the cold tier to its S3 server, or answer
    /// each `503 Slow Down` (a cold tier on S3: `--cold` and an S3 server);
    /// heal lets them through.
    S3,
    /// SIGKILL one of the gateways (the `gateway` workload); heal restarts
    /// it on its port. Requests in flight through it are cut off; their
    /// producers retry through another.
    KillGateway,
    /// Every nemesis this machine can run ([`Nemesis::all`]); implies a
    /// controlled cell.
    All,
}

impl Nemesis {
    /// What `all` stands for here: network faults by namespaces only with
    /// `netns`, clock faults only with libfaketime installed, S3 faults
    /// only with an S3 server.
    pub fn all(netns: bool, faketime: bool, s3: bool) -> Vec<Nemesis> {
        let mut v = vec![
            Nemesis::Kill,
            Nemesis::KillLeader,
            Nemesis::Restart,
            Nemesis::Pause,
            Nemesis::Partition,
            Nemesis::PartitionLeader,
            Nemesis::PartitionRing,
            Nemesis::KillController,
            Nemesis::FsyncFail,
            Nemesis::PowerCut,
            Nemesis::Churn,
            Nemesis::Split,
            Nemesis::Merge,
        ];
        if netns {
            v.push(Nemesis::Loss);
        }
        if faketime {
            v.push(Nemesis::Clock);
        }
        if s3 {
            v.push(Nemesis::S3);
        }
        v
    }
}

impl std::str::FromStr for Nemesis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => Nemesis::None,
            "kill" => Nemesis::Kill,
            "pause" => Nemesis::Pause,
            "partition" => Nemesis::Partition,
            "partition-leader" => Nemesis::PartitionLeader,
            "kill-leader" => Nemesis::KillLeader,
            "restart" => Nemesis::Restart,
            "upgrade" => Nemesis::Upgrade,
            "partition-ring" => Nemesis::PartitionRing,
            "loss" => Nemesis::Loss,
            "kill-controller" => Nemesis::KillController,
            "fsync-fail" => Nemesis::FsyncFail,
            "clock" => Nemesis::Clock,
            "churn" => Nemesis::Churn,
            "split" => Nemesis::Split,
            "merge" => Nemesis::Merge,
            "s3" => Nemesis::S3,
            "power-cut" => Nemesis::PowerCut,
            "kill-gateway" => Nemesis::KillGateway,
            "all" => Nemesis::All,
            other => return Err(format!("unknown nemesis {other:?}")),
        })
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub bin: PathBuf,
    pub store: PathBuf,
    pub name: String,
    pub seed: u64,
    pub time_limit: Duration,
    pub nemeses: Vec<Nemesis>,
    pub processes: u64,
    /// Keys written at once.
    pub keys: u64,
    /// A key takes this many appends, then a fresh key takes its slot, so
    /// lists stay short and a long run's history stays checkable.
    pub appends_per_key: u64,
    /// Negative control: nodes serve leader reads without a read index.
    pub unsafe_local_reads: bool,
    /// Negative control: nodes acknowledge without fdatasync (caught by
    /// `power-cut`).
    pub unsafe_skip_fsync: bool,
    /// Negative control: a restarted tablet leader resumes its term
    /// without an election (caught by `power-cut`, whose slow node makes
    /// a leader lose a tail its followers hold).
    pub unsafe_leader_restore: bool,
    /// Negative control: a tablet leader that slept serves reads without
    /// a read index until it loses leadership (caught by a partition of
    /// the leader).
    pub unsafe_wake_reads: bool,
    /// Negative control of the `gateway` workload: appends carry no
    /// Idempotency-Key, so a retry of one whose answer was lost applies it
    /// twice (caught as `duplicate`).
    pub unsafe_gateway_retries: bool,
    /// Four nodes placed by a controller instead of a static three-node
    /// cell (needed for `churn`).
    pub controlled: bool,
    /// Nodes in network namespaces with nftables faults (else loopback and
    /// the transport peer filter).
    pub netns: bool,
    pub workload: Workload,
    /// A cold tier whatever the workload (the set workload always has
    /// one): segments sealed within 2 s and evicted once uploaded, so reads
    /// go to the bucket.
    pub cold: bool,
    /// The cold tier's S3 server (else a `file://` bucket).
    pub s3: Option<crate::cell::S3Server>,
    /// An older `stele` binary for the `upgrade` nemesis.
    pub old_bin: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub name: String,
    pub seed: u64,
    pub nemeses: Vec<Nemesis>,
    pub unsafe_local_reads: bool,
    pub unsafe_skip_fsync: bool,
    pub unsafe_leader_restore: bool,
    pub unsafe_wake_reads: bool,
    pub unsafe_gateway_retries: bool,
    /// Each node's fsync delay in ms, node 1 first (runs with
    /// `power-cut` grade their disks; empty otherwise).
    pub sync_delay_ms: Vec<u64>,
    pub controlled: bool,
    /// How partitions were made.
    pub partition_method: &'static str,
    /// How clients, the controller and operator commands spoke gRPC:
    /// `tls`, or `plaintext` (the upgrade case: its older binary has none).
    pub grpc: &'static str,
    pub workload: Workload,
    pub valid: bool,
    /// The list-append check (empty for the set workload).
    pub report: Report,
    /// The set check (set workload only).
    pub set_report: Option<crate::checker::set::SetReport>,
    /// The register check (register workload only).
    pub register_report: Option<crate::checker::register::RegisterReport>,
    /// Segment objects in the cold tier's bucket at the end (set workload):
    /// the final read found these evicted locally and read them there.
    /// `file://` buckets only.
    pub bucket_segments: Option<usize>,
    /// Where the cold tier was: none, `file`, or `s3` (through the proxy).
    pub cold_tier: &'static str,
    /// Bytes the nodes sent to the S3 server and got back (cold tier on
    /// S3): uploads, and cold reads of evicted segments.
    pub s3_bytes: Option<(u64, u64)>,
    pub faults: usize,
    pub elapsed_s: f64,
}

impl Results {
    /// The anomalies the checkers named, by kind, with how many of each
    /// (`lost`, `not-prefix`, `set-lost`, `not-linearizable`, ...). A
    /// negative control counts as caught only when this is not empty: a
    /// run that errors, or a register check that did not finish in time,
    /// names nothing, and a harness failure is never a pass.
    pub fn named_anomalies(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for a in &self.report.anomalies {
            *out.entry(a.kind()).or_default() += 1;
        }
        if let Some(s) = &self.set_report {
            for (kind, n) in [
                ("set-lost", s.lost.len()),
                ("set-duplicated", s.duplicated.len()),
                ("set-unexpected", s.unexpected.len()),
                ("set-refused-but-present", s.refused_but_present.len()),
            ] {
                if n > 0 {
                    out.insert(kind, n);
                }
            }
        }
        if let Some(g) = &self.register_report
            && !g.not_linearizable.is_empty()
        {
            out.insert("not-linearizable", g.not_linearizable.len());
        }
        out
    }
}

#[derive(Serialize)]
struct NemesisEvent {
    time_ns: u64,
    action: String,
    nodes: Vec<usize>,
}

pub(crate) struct Recorder {
    started: Instant,
    events: Mutex<Vec<Event>>,
    /// Set by the nemesis while it lets the cell go idle before a fault
    /// (so the workload's tablets hibernate and the fault hits sleeping
    /// groups); clients send nothing new while it is set.
    quiet: AtomicBool,
}

impl Recorder {
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Appends acknowledged at or after `since_ns` (newest events first).
    fn appends_acked_since(&self, since_ns: u64) -> usize {
        let events = self.events.lock().expect("lock");
        events
            .iter()
            .rev()
            .take_while(|e| e.time_ns >= since_ns)
            .filter(|e| e.kind == Kind::Ok && matches!(e.op, Op::Append { .. }))
            .count()
    }

    /// Waits while the nemesis holds the clients quiet.
    pub(crate) async fn hold(&self) {
        while self.quiet.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Records the start of a read of `key`.
    pub(crate) fn invoke_read(&self, process: u64, key: &str, node: u64) {
        let op = Op::Read {
            key: key.to_string(),
            values: None,
        };
        self.record(process, Kind::Invoke, op, node);
    }

    /// Records the end of a read of `key`: its values, or a failure (a
    /// read changes nothing: a failed one is simply failed).
    pub(crate) fn read_done(&self, process: u64, key: String, values: Option<Vec<u64>>, node: u64) {
        let kind = if values.is_some() {
            Kind::Ok
        } else {
            Kind::Fail
        };
        self.record(process, kind, Op::Read { key, values }, node);
    }

    pub(crate) fn record(&self, process: u64, kind: Kind, op: Op, node: u64) {
        let time_ns = self.now();
        self.events.lock().expect("lock").push(Event {
            process,
            kind,
            op,
            node,
            time_ns,
        });
    }
}

fn client_options(tls: Option<stele_tls::ClientTls>) -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 8,
            deadline: Duration::from_secs(4),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
        },
        request_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
        tls,
        ..ClientOptions::default()
    }
}

/// What a failed call means for the history: a typed refusal wrote
/// nothing (`Fail`); anything else may or may not have taken effect.
fn outcome_of(e: &stele_client::Error) -> Kind {
    match e.api() {
        Some(api) if api.kind() == stele_proto::ErrorKind::Refuse => Kind::Fail,
        _ => Kind::Info,
    }
}

fn values_of(rows: &[stele_client::Row]) -> Vec<u64> {
    rows.iter()
        .filter_map(|r| std::str::from_utf8(&r.value).ok()?.parse().ok())
        .collect()
}

/// How a client finds the cell: a seed node, or the controllers; with
/// the cell's client TLS when its gRPC is TLS.
#[derive(Clone)]
struct Target {
    via: Via,
    tls: Option<stele_tls::ClientTls>,
}

#[derive(Clone)]
enum Via {
    Node(String),
    Controller(String),
}

impl Target {
    /// The controller of a controlled cell, else node `n`.
    fn of(cell: &Cell, n: usize) -> Target {
        let via = if cell.spec.controlled {
            Via::Controller(cell.controller_endpoint())
        } else {
            Via::Node(cell.endpoint(n))
        };
        Target {
            via,
            tls: cell.client_tls(),
        }
    }

    /// The client in `slot`, connecting it first if needed; `None` (after
    /// a short pause) while the cell cannot be reached.
    async fn connected<'a>(&self, slot: &'a mut Option<Client>) -> Option<&'a Client> {
        if slot.is_none() {
            match self.connect().await {
                Ok(c) => *slot = Some(c),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return None;
                }
            }
        }
        slot.as_ref()
    }

    async fn connect(&self) -> stele_client::Result<Client> {
        let opts = client_options(self.tls.clone());
        match &self.via {
            Via::Node(ep) => Client::connect(ep, opts).await,
            Via::Controller(ep) => Client::connect_cell(std::slice::from_ref(ep), opts).await,
        }
    }
}

/// The keys in play: `keys` slots, each holding a key until it has taken
/// `appends_per_key` appends, then a fresh key (`k<slot>-<generation>`).
/// Every key ever used is read at the end.
pub struct KeySpace {
    slots: Vec<Mutex<(u64, u64)>>,
    appends_per_key: u64,
    used: Mutex<std::collections::BTreeSet<String>>,
}

impl KeySpace {
    pub fn new(keys: u64, appends_per_key: u64) -> KeySpace {
        KeySpace {
            slots: (0..keys).map(|_| Mutex::new((0, 0))).collect(),
            appends_per_key: appends_per_key.max(1),
            used: Mutex::new(Default::default()),
        }
    }

    fn name(slot: usize, generation: u64) -> String {
        format!("k{slot}-{generation}")
    }

    /// How many keys are written at once.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The key to append to in `slot` (counting the append).
    pub(crate) fn for_append(&self, slot: usize) -> String {
        let mut s = self.slots[slot].lock().expect("lock");
        if s.1 >= self.appends_per_key {
            *s = (s.0 + 1, 0);
        }
        s.1 += 1;
        let key = KeySpace::name(slot, s.0);
        self.used.lock().expect("lock").insert(key.clone());
        key
    }

    /// The key to read in `slot`.
    pub(crate) fn for_read(&self, slot: usize) -> String {
        let key = KeySpace::name(slot, self.slots[slot].lock().expect("lock").0);
        self.used.lock().expect("lock").insert(key.clone());
        key
    }

    fn used(&self) -> Vec<String> {
        self.used.lock().expect("lock").iter().cloned().collect()
    }
}

/// One client process: appends unique values to random keys and reads
/// whole lists, one operation at a time, seeded at node `seed_node`.
async fn client_process(
    p: u64,
    seed_node: usize,
    endpoint: Target,
    keys: Arc<KeySpace>,
    seed: u64,
    stop_at: Instant,
    rec: Arc<Recorder>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (p * 0x9e37_79b9));
    let mut client: Option<Client> = None;
    let mut next = 0u64;
    while Instant::now() < stop_at {
        rec.hold().await;
        let Some(c) = endpoint.connected(&mut client).await else {
            continue;
        };
        let slot = rng.random_range(0..keys.slots.len());
        if rng.random_bool(0.5) {
            let key = keys.for_append(slot);
            next += 1;
            let value = p * 1_000_000 + next;
            let op = Op::Append {
                key: key.clone(),
                value,
            };
            rec.record(p, Kind::Invoke, op.clone(), seed_node as u64);
            // One ts for every record: ScanKey then orders by position.
            let r = c
                .append(
                    NAMESPACE,
                    vec![stele_client::record(key, 1, value.to_string().into_bytes())],
                )
                .await;
            let kind = match &r {
                Ok(_) => Kind::Ok,
                Err(e) => outcome_of(e),
            };
            rec.record(p, kind, op, seed_node as u64);
        } else {
            let key = keys.for_read(slot);
            let node = seed_node as u64;
            rec.invoke_read(p, &key, node);
            let r = c
                .scan_key_all(NAMESPACE, key.as_bytes(), 0, 0, ReadOptions::default())
                .await;
            rec.read_done(p, key, r.ok().map(|rows| values_of(&rows)), node);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// One client process of the register workload: reads a key's latest
/// value (`Get`), writes it, or compare-and-sets it on the version it last
/// read, one operation at a time.
async fn register_process(
    p: u64,
    seed_node: usize,
    endpoint: Target,
    keys: Arc<KeySpace>,
    seed: u64,
    stop_at: Instant,
    rec: Arc<Recorder>,
) {
    use std::collections::HashMap;
    let mut rng = StdRng::seed_from_u64(seed ^ (p * 0x7e6));
    let mut client: Option<Client> = None;
    let mut next = 0u64;
    // The value and version this process last read, by key.
    let mut seen: HashMap<String, (Option<u64>, Option<stele_client::Position>)> = HashMap::new();
    while Instant::now() < stop_at {
        rec.hold().await;
        let Some(c) = endpoint.connected(&mut client).await else {
            continue;
        };
        let slot = rng.random_range(0..keys.slots.len());
        let choice = rng.random_range(0..3);
        let read_key = keys.for_read(slot);
        if choice == 0 || (choice == 2 && !seen.contains_key(&read_key)) {
            let key = read_key;
            let inv = Op::RegRead {
                key: key.clone(),
                value: None,
            };
            rec.record(p, Kind::Invoke, inv.clone(), seed_node as u64);
            match c
                .get(REGISTER_NAMESPACE, key.as_bytes(), ReadOptions::default())
                .await
            {
                Ok(row) => {
                    let value = row
                        .as_ref()
                        .and_then(|r| std::str::from_utf8(&r.value).ok()?.parse().ok());
                    let version = row.as_ref().and_then(|r| r.position);
                    seen.insert(key.clone(), (value, version));
                    rec.record(
                        p,
                        Kind::Ok,
                        Op::RegRead {
                            key,
                            value: Some(value),
                        },
                        seed_node as u64,
                    );
                }
                Err(_) => rec.record(p, Kind::Fail, inv, seed_node as u64),
            }
        } else {
            let key = keys.for_append(slot);
            next += 1;
            let value = p * 1_000_000 + next;
            let record = stele_client::record(key.clone(), 1, value.to_string().into_bytes());
            let (op, expect) = match seen.get(&key) {
                Some((from, version)) if choice == 2 => (
                    Op::RegCas {
                        key: key.clone(),
                        from: *from,
                        to: value,
                    },
                    Some(stele_client::Condition {
                        key: key.clone().into_bytes(),
                        version: *version,
                    }),
                ),
                _ => (
                    Op::RegWrite {
                        key: key.clone(),
                        value,
                    },
                    None,
                ),
            };
            rec.record(p, Kind::Invoke, op.clone(), seed_node as u64);
            let r = c
                .append_batch(REGISTER_NAMESPACE, vec![record], expect, None)
                .await;
            let kind = match &r {
                Ok(_) => Kind::Ok,
                Err(e) => outcome_of(e),
            };
            rec.record(p, kind, op, seed_node as u64);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// One client process of the set workload: inserts unique values, each
/// under its own key, one at a time; reads nothing until the end.
async fn set_process(
    p: u64,
    seed_node: usize,
    endpoint: Target,
    seed: u64,
    stop_at: Instant,
    rec: Arc<Recorder>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (p * 0x5e7));
    let mut client: Option<Client> = None;
    let mut next = 0u64;
    while Instant::now() < stop_at {
        rec.hold().await;
        let Some(c) = endpoint.connected(&mut client).await else {
            continue;
        };
        next += 1;
        let value = p * 1_000_000 + next;
        let op = Op::Append {
            key: "set".into(),
            value,
        };
        rec.record(p, Kind::Invoke, op.clone(), seed_node as u64);
        let r = c
            .append(
                SET_NAMESPACE,
                vec![stele_client::record(
                    format!("e{value}"),
                    1,
                    value.to_string().into_bytes(),
                )],
            )
            .await;
        let kind = match &r {
            Ok(_) => Kind::Ok,
            Err(e) => outcome_of(e),
        };
        rec.record(p, kind, op, seed_node as u64);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
    }
}

/// The whole set, read once (linearizable `Scan` of the namespace) after
/// the cell recovered; much of it from segments evicted to the bucket.
async fn final_set_read(cell: &Cell) -> anyhow::Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let target = Target::of(cell, 1);
        let got = async {
            let c = target.connect().await?;
            c.scan_all(SET_NAMESPACE, 0, 0, b"", ReadOptions::default())
                .await
        }
        .await;
        match got {
            Ok(rows) => return Ok(values_of(&rows)),
            Err(e) => {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the cell did not recover: final set read: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Runs the nemesis until `stop_at`: one fault at a time, each held for a
/// few election timeouts, then healed.
async fn nemesis(
    cell: &mut Cell,
    namespace: &str,
    nemeses: &[Nemesis],
    seed: u64,
    stop_at: Instant,
    rec: &Recorder,
    log: &mut Vec<NemesisEvent>,
) -> anyhow::Result<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let nodes = cell.spec.nodes;
    let t = cell.spec.election_timeout_ms;
    // The workload's tablet: what the leader-targeted faults and churn hit.
    let (ns_lo, _) = stele_proto::vshard::namespace_range(namespace);
    let mut faults = 0;
    let active: Vec<Nemesis> = nemeses
        .iter()
        .copied()
        .filter(|n| *n != Nemesis::None)
        .collect();
    tokio::time::sleep(Duration::from_millis(2 * t)).await;
    while !active.is_empty() && Instant::now() + Duration::from_millis(3 * t) < stop_at {
        let which = active[rng.random_range(0..active.len())];
        if which == Nemesis::PartitionLeader {
            // Cut off a sleeping leader: the clients pause for two
            // election timeouts, long enough for the workload's tablets
            // to hibernate, and come back once the leader is cut off, so
            // their first requests wake it on the wrong side.
            rec.quiet.store(true, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2 * t)).await;
        }
        let victim = match which {
            Nemesis::PartitionLeader | Nemesis::KillLeader => {
                cell.leader_of(ns_lo).await.unwrap_or(1)
            }
            // Half the restarts hit the workload tablet's leader: what a
            // leadership hand-off on SIGTERM is for.
            Nemesis::Restart | Nemesis::Upgrade if rng.random_bool(0.5) => {
                cell.leader_of(ns_lo).await.unwrap_or(1)
            }
            _ => rng.random_range(1..=nodes),
        };
        let hold = Duration::from_millis(rng.random_range(2 * t..4 * t));
        // Each fault: (what was done, to which nodes), held, then healed.
        let (action, victims) = match which {
            Nemesis::Kill | Nemesis::KillLeader => {
                cell.kill(victim);
                ("kill".to_string(), vec![victim])
            }
            Nemesis::Restart => {
                let deadline = Duration::from_millis(10 * t);
                let how = tokio::task::block_in_place(|| cell.graceful_restart(victim, deadline))?;
                (format!("restart ({how})"), vec![victim])
            }
            Nemesis::Upgrade => {
                let deadline = Duration::from_millis(10 * t);
                let how = tokio::task::block_in_place(|| cell.upgrade_restart(victim, deadline))?;
                (how, vec![victim])
            }
            Nemesis::Pause => {
                cell.pause(victim);
                ("pause".to_string(), vec![victim])
            }
            Nemesis::Partition | Nemesis::PartitionLeader => {
                cell.isolate(&[victim])?;
                ("isolate".to_string(), vec![victim])
            }
            Nemesis::PartitionRing => (cell.ring(victim)?.to_string(), vec![victim]),
            Nemesis::Clock => {
                let spec = match rng.random_range(0..3) {
                    0 => format!("+{}s", rng.random_range(5..300)),
                    1 => format!("-{}s", rng.random_range(5..120)),
                    _ => format!("+0 x{}", rng.random_range(2..6)),
                };
                if !cell.set_clock(victim, &spec)? {
                    anyhow::bail!(
                        "the clock nemesis needs libfaketime ({})",
                        crate::cell::FAKETIME_LIB
                    );
                }
                (format!("clock {spec}"), vec![victim])
            }
            Nemesis::FsyncFail => {
                let point = if rng.random_bool(0.5) {
                    "journal-sync-eio"
                } else {
                    "journal-write-eio"
                };
                let nth = rng.random_range(5..60);
                cell.restart_with_failpoints(victim, &format!("{point}={nth}"))?;
                let action = if point == "journal-sync-eio" {
                    "fsync-fail"
                } else {
                    "write-fail"
                };
                (action.to_string(), vec![victim])
            }
            Nemesis::S3 => {
                let stall = rng.random_bool(0.5);
                if !cell.s3_fault(stall) {
                    anyhow::bail!(
                        "the s3 nemesis needs a cold tier on S3 (--cold and an S3 server)"
                    );
                }
                let action = if stall { "s3-stall" } else { "s3-503" };
                (action.to_string(), Vec::new())
            }
            Nemesis::PowerCut => {
                // Cut a cell that is writing again since the last fault:
                // a cut of an idle cell loses no unsynced tail, and the
                // slow node's leaders only lag while they write.
                let since = log.last().map_or(0, |e| e.time_ns);
                let writing_by = Instant::now() + Duration::from_millis(5 * t);
                while rec.appends_acked_since(since) < 10 && Instant::now() < writing_by {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Journals that skip fdatasync (the negative control) hold
                // on disk what the kernel wrote back: here, each journal
                // as it is now. Appends acknowledged from now until the
                // cut live only in memory, and the cut takes them from
                // every node at once: the lost writes the checker must
                // name. (Cut back to the synced lengths alone, the file
                // headers when nothing is synced, a cell also loses every
                // vote and every membership not yet sealed, and has so far
                // never elected again: a run without a verdict.)
                let written = if cell.spec.unsafe_skip_fsync {
                    let written = cell.journal_lengths()?;
                    let at = rec.now();
                    let acked_by = Instant::now() + Duration::from_millis(5 * t);
                    while rec.appends_acked_since(at) < 10 && Instant::now() < acked_by {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    written
                } else {
                    BTreeMap::new()
                };
                let cut = tokio::task::block_in_place(|| cell.power_cut_to(&written))?;
                (
                    format!("power-cut ({cut} unsynced journal bytes lost)"),
                    (1..=nodes).collect(),
                )
            }
            Nemesis::KillGateway => {
                let Some(g) = cell.gateways.as_mut() else {
                    anyhow::bail!("kill-gateway needs the gateway workload");
                };
                let i = rng.random_range(0..g.len());
                g.kill(i);
                ("kill-gateway".to_string(), vec![i + 1])
            }
            Nemesis::KillController => {
                if !cell.kill_controller() {
                    anyhow::bail!("kill-controller needs a controlled cell (--controlled)");
                }
                ("kill-controller".to_string(), Vec::new())
            }
            Nemesis::Loss => {
                if !cell.loss(victim, 30)? {
                    anyhow::bail!("the loss nemesis needs network namespaces (--net netns)");
                }
                ("loss-30%".to_string(), vec![victim])
            }
            Nemesis::Churn | Nemesis::Split | Nemesis::Merge => {
                let done = tokio::task::block_in_place(|| match which {
                    Nemesis::Split => split(cell, namespace, &mut rng),
                    Nemesis::Merge => merge(cell, namespace, &mut rng),
                    _ => churn(cell, ns_lo, &mut rng),
                });
                log.push(NemesisEvent {
                    time_ns: rec.now(),
                    action: done,
                    nodes: Vec::new(),
                });
                faults += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(t..3 * t))).await;
                continue;
            }
            Nemesis::None | Nemesis::All => continue,
        };
        rec.quiet.store(false, Ordering::Relaxed);
        faults += 1;
        log.push(NemesisEvent {
            time_ns: rec.now(),
            action,
            nodes: victims.clone(),
        });
        tokio::time::sleep(hold.min(stop_at.saturating_duration_since(Instant::now()))).await;
        cell.heal()?;
        log.push(NemesisEvent {
            time_ns: rec.now(),
            action: "heal".into(),
            nodes: victims,
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(t..3 * t))).await;
    }
    Ok(faults)
}

/// How an operator call that did not succeed is logged: `unknown` when it
/// was killed at its deadline ([`TimedOut`]: a `--wait` that ran out, whose
/// intent may still be open and may yet complete), else `refused` (the
/// command failed: the controller refused or gave up the intent).
fn failed(e: &anyhow::Error) -> &'static str {
    if e.is::<TimedOut>() {
        "unknown"
    } else {
        "refused"
    }
}

/// The tablets (id, lo, hi) overlapping the namespace's vshards, by lo.
fn namespace_tablets(cell: &Cell, namespace: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let (ns_lo, ns_hi) = stele_proto::vshard::namespace_range(namespace);
    let tablets = match cell.operator(&["tablet", "list"]) {
        Ok(serde_json::Value::Array(ts)) => ts,
        other => return Err(format!("tablet list failed: {other:?}")),
    };
    let mut ranges: Vec<(u64, u64, u64)> = tablets
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap_or(0),
                t["vshard_lo"].as_u64().unwrap_or(0),
                t["vshard_hi"].as_u64().unwrap_or(0),
            )
        })
        .filter(|(_, lo, hi)| *lo < ns_hi && *hi > u64::from(ns_lo))
        .collect();
    ranges.sort_by_key(|r| r.1);
    Ok(ranges)
}

/// One split of a tablet of the workload's namespace; what was done.
fn split(cell: &Cell, namespace: &str, rng: &mut StdRng) -> String {
    let (ns_lo, ns_hi) = stele_proto::vshard::namespace_range(namespace);
    let ranges = match namespace_tablets(cell, namespace) {
        Ok(r) => r,
        Err(e) => return format!("split: {e}"),
    };
    if ranges.len() >= 8 {
        return "split: the namespace has eight tablets already".into();
    }
    // A random point of the namespace, then a cut inside its tablet's part
    // of the namespace.
    let v = rng.random_range(u64::from(ns_lo)..ns_hi);
    let Some((id, lo, hi)) = ranges.into_iter().find(|(_, lo, hi)| *lo <= v && v < *hi) else {
        return "split: no tablet holds the namespace".into();
    };
    let (start, end) = ((lo + 1).max(u64::from(ns_lo)), hi.min(ns_hi));
    if start >= end {
        return "split: range too small".into();
    }
    let at = rng.random_range(start..end);
    let (id, at) = (id.to_string(), at.to_string());
    let args = ["tablet", "split", &id, "--at", &at, "--wait"];
    match cell.operator(&args) {
        Ok(v) => format!("split: {} -> {}", args.join(" "), v["state"]),
        Err(e) => format!("split: {} {}: {e}", args.join(" "), failed(&e)),
    }
}

/// One merge of two adjacent tablets of the workload's namespace; what
/// was done.
fn merge(cell: &Cell, namespace: &str, rng: &mut StdRng) -> String {
    let ranges = match namespace_tablets(cell, namespace) {
        Ok(r) => r,
        Err(e) => return format!("merge: {e}"),
    };
    if ranges.len() < 2 {
        return "merge: one tablet holds the namespace".into();
    }
    let i = rng.random_range(0..ranges.len() - 1);
    let (a, b) = (ranges[i].0.to_string(), ranges[i + 1].0.to_string());
    let args = ["tablet", "merge", &a, &b, "--wait"];
    match cell.operator(&args) {
        Ok(v) => format!("merge: {} -> {}", args.join(" "), v["state"]),
        Err(e) => format!("merge: {} {}: {e}", args.join(" "), failed(&e)),
    }
}

/// One membership change of the workload's tablet; what was done.
fn churn(cell: &Cell, ns_lo: u32, rng: &mut StdRng) -> String {
    let tablets = match cell.operator(&["tablet", "list"]) {
        Ok(serde_json::Value::Array(ts)) => ts,
        other => return format!("churn: tablet list failed: {other:?}"),
    };
    let Some(t) = tablets.iter().find(|t| {
        t["vshard_lo"].as_u64().unwrap_or(0) <= u64::from(ns_lo)
            && u64::from(ns_lo) < t["vshard_hi"].as_u64().unwrap_or(0)
    }) else {
        return "churn: workload tablet not found".into();
    };
    let id = t["id"].as_u64().unwrap_or(0).to_string();
    let voters: Vec<u64> = t["replicas"]
        .as_array()
        .map(|rs| rs.iter().filter_map(|r| r["node"].as_u64()).collect())
        .unwrap_or_default();
    let leader = t["leader_node"].as_u64().unwrap_or(0);
    let free: Vec<u64> = (1..=cell.spec.nodes as u64)
        .filter(|n| !voters.contains(n))
        .collect();
    let args: Vec<String> = if rng.random_bool(0.7) && !free.is_empty() {
        let from = if rng.random_bool(0.5) && leader != 0 {
            leader
        } else {
            voters[rng.random_range(0..voters.len())]
        };
        let to = free[rng.random_range(0..free.len())];
        vec![
            "tablet".into(),
            "move".into(),
            id,
            "--from".into(),
            from.to_string(),
            "--to".into(),
            to.to_string(),
            "--wait".into(),
        ]
    } else {
        let others: Vec<u64> = voters.iter().copied().filter(|v| *v != leader).collect();
        if others.is_empty() {
            return "churn: no other voter".into();
        }
        let to = others[rng.random_range(0..others.len())];
        vec![
            "tablet".into(),
            "transfer-leader".into(),
            id,
            "--to".into(),
            to.to_string(),
            "--wait".into(),
        ]
    };
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match cell.operator(&a) {
        Ok(v) => format!("churn: {} -> {}", args.join(" "), v["state"]),
        Err(e) => format!("churn: {} {}: {e}", args.join(" "), failed(&e)),
    }
}

/// Every key's final list, read linearizably once the cell recovered.
async fn final_reads(cell: &Cell, keys: &[String]) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    let deadline = Instant::now() + Duration::from_secs(60 + keys.len() as u64 / 10);
    let mut finals = BTreeMap::new();
    let mut client: Option<Client> = None;
    for (k, key) in keys.iter().enumerate() {
        loop {
            let n = 1 + (k % cell.spec.nodes);
            let target = Target::of(cell, n);
            let got = async {
                if client.is_none() {
                    client = Some(target.connect().await?);
                }
                let c = client.as_ref().expect("connected above");
                c.scan_key_all(NAMESPACE, key.as_bytes(), 0, 0, ReadOptions::default())
                    .await
            }
            .await;
            match got {
                Ok(rows) => {
                    finals.insert(key.clone(), values_of(&rows));
                    break;
                }
                Err(e) => {
                    client = None;
                    anyhow::ensure!(
                        Instant::now() < deadline,
                        "the cell did not recover: final read of {key}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
    Ok(finals)
}

/// Every node's own copy of every key, once the cell is quiet: a `ScanKey`
/// sent to the node itself with bounded consistency and no staleness
/// limit, which a node answers from its local replica, leader or not.
/// Nodes holding no replica of a key's tablet are skipped, and so is a copy
/// that cannot be read in three tries (the result counts the copies read).
async fn replica_copies(cell: &Cell, keys: &[String]) -> Vec<(usize, String, Vec<u64>)> {
    use stele_proto::pb;
    let mut copies = Vec::new();
    for n in 1..=cell.spec.nodes {
        // A node that does not answer is skipped (the channel is lazy).
        let Ok(mut client) = cell.data_client(n) else {
            continue;
        };
        if client.status(pb::StatusRequest {}).await.is_err() {
            continue;
        }
        'key: for key in keys {
            let mut values = Vec::new();
            let mut cursor = Vec::new();
            let mut failures = 0;
            loop {
                let req = pb::ScanKeyRequest {
                    namespace: NAMESPACE.into(),
                    key: key.as_bytes().to_vec(),
                    routing_key: None,
                    ts_from: 0,
                    ts_to: 0,
                    limit: 1_000,
                    cursor: cursor.clone(),
                    read: Some(pb::ReadOptions {
                        consistency: pb::Consistency::Bounded as i32,
                        max_staleness_ms: u64::MAX,
                        partial: false,
                    }),
                };
                match client.scan_key(req).await {
                    Ok(page) => {
                        let page = page.into_inner();
                        values.extend(page.rows.iter().filter_map(|r| {
                            std::str::from_utf8(&r.value).ok()?.parse::<u64>().ok()
                        }));
                        if page.next_cursor.is_empty() {
                            copies.push((n, key.clone(), values));
                            continue 'key;
                        }
                        cursor = page.next_cursor;
                    }
                    Err(status) => match stele_proto::Error::from_status(&status) {
                        stele_proto::Error::Incomplete { .. }
                        | stele_proto::Error::StaleRoute { .. }
                        | stele_proto::Error::TabletNotFound { .. } => continue 'key,
                        _ => {
                            failures += 1;
                            if failures == 3 {
                                continue 'key;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    },
                }
            }
        }
    }
    copies
}

/// `.seg` files under `dir`.
fn count_segments(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                count_segments(&p)
            } else {
                usize::from(p.extension().is_some_and(|x| x == "seg"))
            }
        })
        .sum()
}

fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for i in items {
        serde_json::to_writer(&mut f, i)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}

pub async fn run(opts: &RunOptions) -> anyhow::Result<Results> {
    let dir = opts.store.join(&opts.name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("seed"), opts.seed.to_string())?;
    let started = Instant::now();
    let upgrade = opts.nemeses.contains(&Nemesis::Upgrade);
    anyhow::ensure!(
        !upgrade || opts.old_bin.is_some(),
        "the upgrade nemesis needs an older stele binary (--old-bin)"
    );
    // Gateways route by the controllers' map: a controlled cell.
    let controlled = opts.controlled || opts.workload == Workload::Gateway;
    let spec = CellSpec {
        bin: opts.bin.clone(),
        old_bin: opts.old_bin.clone().filter(|_| upgrade),
        nodes: if controlled { 4 } else { 3 },
        tablets: 2,
        election_timeout_ms: 1000,
        unsafe_local_reads: opts.unsafe_local_reads,
        unsafe_skip_fsync: opts.unsafe_skip_fsync,
        unsafe_leader_restore: opts.unsafe_leader_restore,
        unsafe_wake_reads: opts.unsafe_wake_reads,
        // Under power cuts the disks differ in speed: a cut then often
        // finds a leader whose last groups a follower synced first.
        graded_fsync: opts.nemeses.contains(&Nemesis::PowerCut),
        controlled,
        netns: opts.netns,
        cold: opts.cold || opts.workload == Workload::Set,
        s3: opts.s3.clone(),
        faketime: opts
            .nemeses
            .contains(&Nemesis::Clock)
            .then(|| PathBuf::from(crate::cell::FAKETIME_LIB))
            .filter(|p| p.exists()),
        // The older binary has no TLS on gRPC: that cell is plaintext.
        grpc_tls: !upgrade,
    };
    let nodes = spec.nodes;
    let mut cell = Cell::start(spec, &dir, opts.seed)?;
    for n in 1..=nodes {
        anyhow::ensure!(
            cell.wait_serving(n, Duration::from_secs(30)).await,
            "node {n} did not come up; see {}",
            dir.join(format!("node{n}.log")).display()
        );
    }
    // A cell meant to run TLS must: a client without the cell CA, and a
    // plaintext one, are refused.
    cell.check_tls(1)
        .await
        .context("the cell's gRPC is not the TLS it should be")?;
    if opts.workload == Workload::Gateway {
        cell.gateways = Some(crate::gateway::Gateways::start(
            &opts.bin,
            &dir,
            cell.controller_endpoint(),
            cell.operator_certs(),
            2,
        )?);
    }
    let namespace = match opts.workload {
        Workload::ListAppend | Workload::Gateway => NAMESPACE,
        Workload::Set => SET_NAMESPACE,
        Workload::Register => REGISTER_NAMESPACE,
    };
    let (ns_lo, _) = stele_proto::vshard::namespace_range(namespace);
    let elect = Instant::now();
    while cell.leader_of(ns_lo).await.is_none() {
        anyhow::ensure!(
            elect.elapsed() < Duration::from_secs(30),
            "no leader elected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rec = Arc::new(Recorder {
        quiet: AtomicBool::new(false),
        started: Instant::now(),
        events: Mutex::new(Vec::new()),
    });
    let stop_at = Instant::now() + opts.time_limit;
    let keys = Arc::new(KeySpace::new(opts.keys, opts.appends_per_key));
    let mut clients = Vec::new();
    for p in 0..opts.processes {
        let seed_node = 1 + (p as usize % nodes);
        let target = Target::of(&cell, seed_node);
        clients.push(match opts.workload {
            Workload::ListAppend => tokio::spawn(client_process(
                p,
                seed_node,
                target,
                keys.clone(),
                opts.seed,
                stop_at,
                rec.clone(),
            )),
            Workload::Register => tokio::spawn(register_process(
                p,
                seed_node,
                target,
                keys.clone(),
                opts.seed,
                stop_at,
                rec.clone(),
            )),
            Workload::Set => tokio::spawn(set_process(
                p,
                seed_node,
                target,
                opts.seed,
                stop_at,
                rec.clone(),
            )),
            Workload::Gateway => tokio::spawn(crate::gateway::gateway_process(
                p,
                cell.gateways
                    .as_ref()
                    .map(|g| g.ports())
                    .unwrap_or_default(),
                keys.clone(),
                opts.seed,
                stop_at,
                rec.clone(),
                !opts.unsafe_gateway_retries,
            )),
        });
    }
    let mut log = Vec::new();
    let faults = nemesis(
        &mut cell,
        namespace,
        &opts.nemeses,
        opts.seed,
        stop_at,
        &rec,
        &mut log,
    )
    .await?;
    for c in clients {
        c.await.context("client process panicked")?;
    }
    cell.heal()?;
    // Written before the final reads: a cell that never recovers still
    // leaves its history and faults for the post-mortem.
    let events = rec.events.lock().expect("lock").clone();
    write_jsonl(&dir.join("history.jsonl"), &events)?;
    write_jsonl(&dir.join("nemesis.jsonl"), &log)?;
    let (finals, set_final) = match opts.workload {
        Workload::ListAppend | Workload::Gateway => (final_reads(&cell, &keys.used()).await?, None),
        Workload::Set => (BTreeMap::new(), Some(final_set_read(&cell).await?)),
        Workload::Register => (BTreeMap::new(), None),
    };
    let copies = match opts.workload {
        Workload::ListAppend | Workload::Gateway => {
            std::fs::write(dir.join("finals.json"), serde_json::to_vec(&finals)?)?;
            replica_copies(&cell, &keys.used()).await
        }
        _ => Vec::new(),
    };
    cell.stop();
    let ops = pair(&events).map_err(|e| anyhow::anyhow!("history does not pair: {e:?}"))?;
    let register_report = (opts.workload == Workload::Register)
        .then(|| crate::checker::register::check(&ops, Duration::from_secs(60)));
    let (report, set_report) = match &set_final {
        None if register_report.is_some() => (Report::default(), None),
        None => {
            let mut report = list_append::check(
                &ops,
                &finals,
                list_append::Options {
                    linearizable_reads: true,
                },
            );
            report.replica_copies_checked = copies.len();
            report
                .anomalies
                .extend(list_append::diverged(&finals, &copies));
            (report, None)
        }
        Some(values) => (
            Report::default(),
            Some(crate::checker::set::check(&ops, values)),
        ),
    };
    let results = Results {
        name: opts.name.clone(),
        seed: opts.seed,
        nemeses: opts.nemeses.clone(),
        unsafe_local_reads: opts.unsafe_local_reads,
        unsafe_skip_fsync: opts.unsafe_skip_fsync,
        unsafe_leader_restore: opts.unsafe_leader_restore,
        unsafe_wake_reads: opts.unsafe_wake_reads,
        unsafe_gateway_retries: opts.unsafe_gateway_retries,
        sync_delay_ms: if cell.spec.graded_fsync {
            (1..=cell.spec.nodes)
                .map(|n| cell.sync_delay_ms(n))
                .collect()
        } else {
            Vec::new()
        },
        controlled,
        partition_method: cell.partition_method(),
        grpc: if cell.grpc_tls() { "tls" } else { "plaintext" },
        workload: opts.workload,
        valid: report.valid()
            && set_report.as_ref().is_none_or(|r| r.valid())
            && register_report.as_ref().is_none_or(|r| r.valid()),
        bucket_segments: set_report
            .as_ref()
            .filter(|_| cell.s3_bytes().is_none())
            .map(|_| count_segments(&dir.join("bucket"))),
        cold_tier: match (cell.spec.cold, cell.s3_bytes().is_some()) {
            (false, _) => "none",
            (true, false) => "file",
            (true, true) => "s3",
        },
        s3_bytes: cell.s3_bytes(),
        report,
        set_report,
        register_report,
        faults,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_call_cut_off_at_its_deadline_is_unknown_not_refused() {
        let timed_out = anyhow::Error::new(TimedOut {
            program: "stele".into(),
            args: vec!["tablet".into(), "move".into(), "--wait".into()],
            after: Duration::from_secs(300),
        });
        assert_eq!(failed(&timed_out), "unknown");
        assert_eq!(
            failed(&timed_out.context("wrapped")),
            "unknown",
            "a TimedOut under context is still one"
        );
        assert_eq!(
            failed(&anyhow::anyhow!("stele [..]: error: intent 29 failed")),
            "refused"
        );
    }
}
