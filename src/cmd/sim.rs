//! `stele sim nodes`: one process that plays hundreds of storage nodes
//! against real controller processes, to measure the controllers at a
//! cell's full size on one machine (docs/BENCHMARKS.md, "Controller at
//! full size").
//!
//! ```text
//! per simulated node, every --heartbeat-ms (spread over the interval):
//!   heartbeat: registration, a report per replica (delta heartbeats as
//!   the real agent sends them: stele_node::agent_sync), a load window
//!   answer: host what is assigned, drop what is retired; where it leads
//!   a group, set the group's voters to the desired ones and hand the
//!   lead to the desired leader at once (a real group takes a round trip)
//! groups (one shared table): voters, leader, term; a group whose leader's
//!   node is dead is led by its first live voter at the next heartbeat of
//!   that voter's node (a real election takes one or two timeouts), and
//!   only while most of its voters live: a group without a majority
//!   neither elects nor changes its voters, as a Raft group cannot
//! --watchers W: W clients watch the route map (`WatchRoutes`); the
//!   report gives how long a pushed change took from the leader filing it
//!   to a watcher receiving it
//! --kill K: once every tablet is led, K nodes holding replicas (the
//!   highest ids of those) stop heartbeating; the report says when the
//!   first replacement was assigned and when every group they were in
//!   that kept a majority had its voters on live nodes only, and how many
//!   lost their majority (nothing but an operator's restore brings those
//!   back)
//! ```
//!
//! Nothing here stores data or runs Raft: it measures the controller's
//! side (heartbeats, placement, repair), not the nodes'.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use stele_client::admin::Admin;
use stele_node::agent_sync::{HeartbeatState, Taken};
use stele_proto::pb;

#[derive(clap::Subcommand)]
pub enum SimCommand {
    /// Play `--count` storage nodes against the controllers.
    Nodes(NodesArgs),
}

#[derive(clap::Args, Clone)]
pub struct NodesArgs {
    /// Simulated nodes (ids --first-id and up).
    #[arg(long, default_value_t = 400)]
    count: u64,
    #[arg(long, default_value_t = 1)]
    first_id: u64,
    /// The controllers (`http://host:port`, comma-separated; plaintext).
    #[arg(long, value_delimiter = ',', required = true)]
    controllers: Vec<String>,
    /// Heartbeat period of each node, as a real node's `--heartbeat-ms`.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Zones the nodes are spread over, round robin.
    #[arg(long, default_value_t = 3)]
    zones: u64,
    /// Stop after this many seconds and print the report.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Once every tablet is led and --kill-after-s passed, stop this many
    /// nodes (the highest ids of those holding replicas) and measure the
    /// repair.
    #[arg(long, default_value_t = 0)]
    kill: u64,
    #[arg(long, default_value_t = 30)]
    kill_after_s: u64,
    /// Clients watching the route map (`WatchRoutes`), each on its own
    /// stream: the report says how long after the leader filed a change
    /// it reached them.
    #[arg(long, default_value_t = 1)]
    watchers: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// One tablet's group as the simulation keeps it.
#[derive(Debug, Clone, Default)]
struct Group {
    voters: BTreeSet<u64>,
    leader: Option<u64>,
    term: u64,
    range_generation: u64,
}

#[derive(Default)]
struct Node {
    alive: bool,
    /// Hosted replicas: tablet → replica id.
    replicas: BTreeMap<u64, u64>,
    state: HeartbeatState,
}

/// Heartbeat figures of the whole run.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    failed: u64,
    resyncs: u64,
    full: u64,
    delta: u64,
    request_bytes: u64,
    answer_bytes: u64,
    /// When the first replacement replica was assigned after the kill.
    first_replacement: Option<Instant>,
    /// Pushed route messages: from the leader filing the earliest change
    /// a message carries to a watcher receiving it; before the kill, from
    /// the kill until every repairable tablet is on live voters, after.
    route_latencies_us: [Vec<u64>; 3],
    route_changes: u64,
}

/// The nodes killed and when, with the tablets they held then and each
/// one's voter nodes then.
struct Killed {
    at: Instant,
    dead: BTreeSet<u64>,
    tablets: BTreeMap<u64, BTreeSet<u64>>,
    /// Of those, the ones whose group lost most of its voters.
    lost_majority: BTreeSet<u64>,
}

struct Sim {
    groups: HashMap<u64, Group>,
    nodes: HashMap<u64, Node>,
    tally: Tally,
    zones: u64,
    killed: Option<Killed>,
    repaired: bool,
}

/// The node that hosts replica `r` (the controller's numbering).
fn node_of(r: u64) -> u64 {
    stele_controller::state::node_of(r)
}

impl Sim {
    fn registration(&self, id: u64) -> pb::NodeRegistration {
        pb::NodeRegistration {
            id,
            client_endpoint: format!("http://127.0.0.1:{}", 20000 + id),
            peer_endpoint: format!("127.0.0.1:{}", 40000 + id),
            zone: format!("z{}", id % self.zones),
            rack: String::new(),
            capacity: 1,
            version: stele_proto::formats::binary_version().into(),
            formats: stele_proto::formats::supported_pb(),
        }
    }

    fn alive(&self, node: u64) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.alive)
    }

    /// Whether voter `v` of tablet `t` lives: its node is alive and hosts
    /// that replica.
    fn voter_lives(&self, t: u64, v: u64) -> bool {
        self.nodes
            .get(&node_of(v))
            .is_some_and(|n| n.alive && n.replicas.get(&t) == Some(&v))
    }

    /// Whether most of tablet `t`'s voters live: only then can its group
    /// elect a leader or commit a change of voters.
    fn live_majority(&self, t: u64, g: &Group) -> bool {
        let live = g.voters.iter().filter(|&&v| self.voter_lives(t, v)).count();
        live * 2 > g.voters.len()
    }

    /// Node `id`'s next heartbeat.
    fn request(&mut self, id: u64) -> pb::HeartbeatRequest {
        self.elect(id);
        let node = &self.nodes[&id];
        let reports: Vec<pb::ReplicaReport> = node
            .replicas
            .iter()
            .map(|(&tablet, &rid)| {
                let g = self.groups.get(&tablet).cloned().unwrap_or_default();
                pb::ReplicaReport {
                    tablet,
                    replica_id: rid,
                    leader: g.leader == Some(rid),
                    term: g.term,
                    applied_index: g.term + 1,
                    voters: g.voters.iter().copied().collect(),
                    range_generation: g.range_generation,
                    published_generation: g.range_generation,
                    ..Default::default()
                }
            })
            .collect();
        let mut req = pb::HeartbeatRequest {
            node: Some(self.registration(id)),
            load: Some(pb::NodeLoad {
                window_ms: 1000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let node = self.nodes.get_mut(&id).expect("a simulated node");
        node.state.request(reports, &mut req);
        req
    }

    /// Groups with a replica on `id` whose leader is gone: the first live
    /// voter that holds its replica leads, in a new term.
    fn elect(&mut self, id: u64) {
        let tablets: Vec<u64> = self.nodes[&id].replicas.keys().copied().collect();
        for t in tablets {
            let Some(g) = self.groups.get(&t) else {
                continue;
            };
            if g.leader.is_some_and(|l| self.alive(node_of(l))) || !self.live_majority(t, g) {
                continue;
            }
            let next = g.voters.iter().copied().find(|&v| self.voter_lives(t, v));
            if next.is_some_and(|v| node_of(v) == id) {
                let g = self.groups.get_mut(&t).expect("the group");
                g.leader = next;
                g.term += 1;
            }
        }
    }

    /// Takes node `id`'s answer; false if it asks for the full reports.
    fn answer(&mut self, id: u64, r: &pb::HeartbeatResponse) -> bool {
        let node = self.nodes.get_mut(&id).expect("a simulated node");
        if node.state.answer(r) == Taken::Resync {
            self.tally.resyncs += 1;
            return false;
        }
        match &r.sync {
            Some(s) if s.delta => self.tally.delta += 1,
            _ => self.tally.full += 1,
        }
        let assignments = node.state.assignments();
        for rr in r.retire.iter().filter(|rr| rr.node == id) {
            node.replicas.retain(|_, rid| *rid != rr.replica_id);
        }
        for a in &assignments {
            let node = self.nodes.get_mut(&id).expect("a simulated node");
            if let std::collections::btree_map::Entry::Vacant(e) = node.replicas.entry(a.tablet) {
                e.insert(a.replica_id);
                // A replacement: a replica of a tablet the killed nodes
                // held, on a node that was not its voter then.
                if let Some(k) = &self.killed
                    && self.tally.first_replacement.is_none()
                    && k.tablets
                        .get(&a.tablet)
                        .is_some_and(|was| !was.contains(&id))
                {
                    self.tally.first_replacement = Some(Instant::now());
                }
            }
            if node.replicas.get(&a.tablet) != Some(&a.replica_id) {
                continue;
            }
            let desired: BTreeSet<u64> = a.voters.iter().map(|v| v.replica_id).collect();
            let g = self.groups.entry(a.tablet).or_default();
            if g.voters.is_empty() {
                if !a.initialize {
                    continue;
                }
                // The initializer starts the group and leads it.
                g.voters = desired.clone();
                g.leader = Some(a.replica_id);
                g.term = 1;
            }
            g.range_generation = g.range_generation.max(a.range_generation);
            if g.leader != Some(a.replica_id) {
                continue;
            }
            // Without most of its voters a group commits nothing: no
            // change of voters, no hand-off.
            let g = g.clone();
            if !self.live_majority(a.tablet, &g) {
                continue;
            }
            if g.voters != desired {
                self.groups.get_mut(&a.tablet).expect("the group").voters = desired.clone();
            }
            let want = a.leader_replica;
            if want != 0 && want != a.replica_id && desired.contains(&want) {
                if self.voter_lives(a.tablet, want) {
                    let g = self.groups.get_mut(&a.tablet).expect("the group");
                    g.leader = Some(want);
                    g.term += 1;
                }
            } else if !desired.contains(&a.replica_id) {
                // Removed itself: the group elects among what is left.
                let g = self.groups.get_mut(&a.tablet).expect("the group");
                g.leader = None;
            }
        }
        true
    }

    /// Every group has a leader on a live node.
    fn all_led(&self) -> bool {
        !self.groups.is_empty()
            && self
                .groups
                .values()
                .all(|g| g.leader.is_some_and(|l| self.alive(node_of(l))))
    }

    /// Of the tablets the killed nodes held that kept a majority, those
    /// not yet on live voters only.
    fn unrepaired(&self) -> Vec<u64> {
        let Some(k) = &self.killed else {
            return Vec::new();
        };
        k.tablets
            .keys()
            .filter(|t| !k.lost_majority.contains(t))
            .filter(|t| {
                self.groups
                    .get(t)
                    .is_none_or(|g| g.voters.iter().any(|v| k.dead.contains(&node_of(*v))))
            })
            .copied()
            .collect()
    }

    /// How tablet `t` stands, for the report: its voters and leader (as
    /// node ids) and the live nodes hosting a replica of it.
    fn describe(&self, t: u64) -> serde_json::Value {
        let g = self.groups.get(&t).cloned().unwrap_or_default();
        let hosts: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.alive && n.replicas.contains_key(&t))
            .map(|(id, _)| *id)
            .collect();
        serde_json::json!({
            "tablet": t,
            "voter_nodes": g.voters.iter().map(|v| node_of(*v)).collect::<Vec<_>>(),
            "leader_node": g.leader.map(node_of),
            "term": g.term,
            "live_hosts": hosts,
        })
    }
}

fn controllers(endpoints: &[String]) -> anyhow::Result<Admin> {
    let mut c = Admin::new(endpoints.to_vec())?;
    c.request_timeout = Duration::from_secs(5);
    c.rounds_max = 1;
    c.deadline = Duration::MAX;
    c.round_pause = Duration::ZERO;
    Ok(c)
}

/// One simulated node's loop until `stop`.
async fn run_node(
    sim: Arc<Mutex<Sim>>,
    admin: Arc<Admin>,
    id: u64,
    every: Duration,
    stop: Instant,
) {
    // Spread the nodes over the interval, as real nodes started apart are.
    let offset = every.mul_f64((id % 997) as f64 / 997.0);
    tokio::time::sleep(offset).await;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < stop {
        tick.tick().await;
        for _ in 0..2 {
            let req = {
                let mut s = sim.lock().expect("lock poisoned");
                if !s.alive(id) {
                    return;
                }
                s.request(id)
            };
            let started = Instant::now();
            let reply = admin
                .call(|mut c| {
                    let mut request = tonic::Request::new(req.clone());
                    request.set_timeout(Duration::from_secs(5));
                    async move { c.heartbeat(request).await }
                })
                .await;
            let took = started.elapsed();
            let mut s = sim.lock().expect("lock poisoned");
            match reply {
                Ok(r) => {
                    s.tally.latencies_us.push(took.as_micros() as u64);
                    s.tally.request_bytes += req.encoded_len() as u64;
                    s.tally.answer_bytes += r.encoded_len() as u64;
                    if !s.answer(id, &r) {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::debug!(node = id, error = %e, "simulated heartbeat failed");
                    s.tally.failed += 1;
                }
            }
            break;
        }
    }
}

/// One route watcher until `stop`: reopens its stream whenever it ends.
async fn run_watcher(sim: Arc<Mutex<Sim>>, admin: Arc<Admin>, stop: Instant) {
    let mut generation = 0;
    while Instant::now() < stop {
        let opened = admin
            .call(|mut c| async move {
                c.watch_routes(pb::WatchRoutesRequest {
                    since_generation: generation,
                })
                .await
            })
            .await;
        let Ok(mut stream) = opened else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            let left = stop.saturating_duration_since(Instant::now());
            let Ok(Ok(Some(msg))) = tokio::time::timeout(left, stream.message()).await else {
                break;
            };
            generation = generation.max(msg.generation);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            let mut s = sim.lock().expect("lock poisoned");
            s.tally.route_changes += (msg.tablets.len() + msg.removed.len()) as u64;
            if msg.filed_at_unix_us > 0 {
                let took = now.saturating_sub(msg.filed_at_unix_us);
                let phase = match (&s.killed, s.repaired) {
                    (None, _) => 0,
                    (Some(_), false) => 1,
                    (Some(_), true) => 2,
                };
                s.tally.route_latencies_us[phase].push(took);
            }
        }
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub async fn run(cmd: SimCommand) -> anyhow::Result<()> {
    let SimCommand::Nodes(a) = cmd;
    anyhow::ensure!(a.count > 0, "--count must be at least 1");
    anyhow::ensure!(a.kill < a.count, "--kill must be less than --count");
    anyhow::ensure!(a.heartbeat_ms > 0, "--heartbeat-ms must be positive");
    anyhow::ensure!(a.zones > 0, "--zones must be at least 1");
    let admin = Arc::new(controllers(&a.controllers)?);
    let ids: Vec<u64> = (a.first_id..a.first_id + a.count).collect();
    let sim = Arc::new(Mutex::new(Sim {
        groups: HashMap::new(),
        nodes: ids
            .iter()
            .map(|&id| {
                (
                    id,
                    Node {
                        alive: true,
                        ..Default::default()
                    },
                )
            })
            .collect(),
        tally: Tally::default(),
        zones: a.zones,
        killed: None,
        repaired: false,
    }));
    let started = Instant::now();
    let stop = started + Duration::from_secs(a.seconds);
    let every = Duration::from_millis(a.heartbeat_ms);
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| tokio::spawn(run_node(sim.clone(), admin.clone(), id, every, stop)))
        .collect();
    // Each watcher on a thread and runtime of its own, as a real client is:
    // not queued behind the simulated nodes' tasks.
    let watchers: Vec<_> = (0..a.watchers)
        .map(|_| {
            let (sim, endpoints) = (sim.clone(), a.controllers.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let admin = Arc::new(controllers(&endpoints)?);
                rt.block_on(run_watcher(sim, admin, stop));
                Ok(())
            })
        })
        .collect();
    let mut led_at = None;
    let mut repaired_at = None;
    while Instant::now() < stop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut s = sim.lock().expect("lock poisoned");
        if led_at.is_none() && s.all_led() {
            led_at = Some(Instant::now());
            eprintln!(
                "sim: {} groups led after {:.1} s",
                s.groups.len(),
                started.elapsed().as_secs_f64()
            );
        }
        let kill_at = started + Duration::from_secs(a.kill_after_s);
        if a.kill > 0 && s.killed.is_none() && led_at.is_some() && Instant::now() >= kill_at {
            // Nodes that registered after the cell placed its tablets
            // hold none: the victims are the highest ids that hold some.
            let dead: BTreeSet<u64> = ids
                .iter()
                .rev()
                .filter(|n| !s.nodes[n].replicas.is_empty())
                .take(a.kill as usize)
                .copied()
                .collect();
            let tablets: BTreeMap<u64, BTreeSet<u64>> = dead
                .iter()
                .flat_map(|n| s.nodes[n].replicas.keys().copied().collect::<Vec<_>>())
                .map(|t| {
                    let voters = s
                        .groups
                        .get(&t)
                        .map(|g| g.voters.iter().map(|v| node_of(*v)).collect())
                        .unwrap_or_default();
                    (t, voters)
                })
                .collect();
            for n in &dead {
                s.nodes.get_mut(n).expect("a node").alive = false;
            }
            let lost_majority: BTreeSet<u64> = tablets
                .keys()
                .filter(|t| s.groups.get(t).is_none_or(|g| !s.live_majority(**t, g)))
                .copied()
                .collect();
            eprintln!(
                "sim: killed {} nodes holding {} tablets ({} of them lost a majority)",
                dead.len(),
                tablets.len(),
                lost_majority.len()
            );
            s.killed = Some(Killed {
                at: Instant::now(),
                dead,
                tablets,
                lost_majority,
            });
        }
        if repaired_at.is_none() && s.killed.is_some() && s.unrepaired().is_empty() {
            repaired_at = Some(Instant::now());
            s.repaired = true;
            eprintln!("sim: every group of the killed nodes is on live voters");
        }
    }
    for t in tasks {
        t.await?;
    }
    for w in watchers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a route watcher panicked"))??;
    }
    let mut s = sim.lock().expect("lock poisoned");
    let mut lat = std::mem::take(&mut s.tally.latencies_us);
    lat.sort_unstable();
    let beats = lat.len().max(1) as u64;
    let mut routes = std::mem::take(&mut s.tally.route_latencies_us);
    for r in &mut routes {
        r.sort_unstable();
    }
    let route_ms = |r: &[u64]| {
        serde_json::json!({
            "messages": r.len(),
            "p50": percentile(r, 0.50) as f64 / 1000.0,
            "p99": percentile(r, 0.99) as f64 / 1000.0,
            "max": r.last().copied().unwrap_or(0) as f64 / 1000.0,
        })
    };
    let killed_at = s.killed.as_ref().map(|k| k.at);
    let since_kill = |t: Option<Instant>| {
        t.zip(killed_at)
            .map(|(t, k)| t.duration_since(k).as_secs_f64())
    };
    let replicas: usize = s.nodes.values().map(|n| n.replicas.len()).sum();
    let unrepaired = s.unrepaired();
    let report = serde_json::json!({
        "nodes": a.count,
        "tablets": s.groups.len(),
        "replicas": replicas,
        "seconds": a.seconds,
        "heartbeats": lat.len(),
        "heartbeats_failed": s.tally.failed,
        "resyncs": s.tally.resyncs,
        "answers_full": s.tally.full,
        "answers_delta": s.tally.delta,
        "heartbeat_ms_p50": percentile(&lat, 0.50) as f64 / 1000.0,
        "heartbeat_ms_p99": percentile(&lat, 0.99) as f64 / 1000.0,
        "heartbeat_ms_max": lat.last().copied().unwrap_or(0) as f64 / 1000.0,
        "request_bytes_mean": s.tally.request_bytes / beats,
        "answer_bytes_mean": s.tally.answer_bytes / beats,
        "all_led_s": led_at.map(|t| t.duration_since(started).as_secs_f64()),
        "killed": a.kill,
        "killed_tablets": s.killed.as_ref().map_or(0, |k| k.tablets.len()),
        "lost_majority": s.killed.as_ref().map_or(0, |k| k.lost_majority.len()),
        "first_replacement_s": since_kill(s.tally.first_replacement),
        "repaired_s": since_kill(repaired_at),
        "unrepaired": unrepaired.len(),
        "unrepaired_first": unrepaired.iter().take(5).map(|t| s.describe(*t)).collect::<Vec<_>>(),
        "route_watchers": a.watchers,
        "route_messages": routes.iter().map(Vec::len).sum::<usize>(),
        "route_changes": s.tally.route_changes,
        "route_delta_ms_before_kill": route_ms(&routes[0]),
        "route_delta_ms_repair": route_ms(&routes[1]),
        "route_delta_ms_after_repair": route_ms(&routes[2]),
    });
    if a.json {
        println!("{report}");
    } else {
        for (k, v) in report.as_object().expect("an object") {
            println!("{k:>22}  {v}");
        }
    }
    Ok(())
}
