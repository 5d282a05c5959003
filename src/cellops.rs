//! Operator subcommands of a controller-managed cell: `stele cell`,
//! `stele node`, `stele tablet`. Tables for people, `--json` for scripts;
//! long operations can be waited on (`--wait`).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

/// Where a local controller listens by default (`stele dev --nodes N`).
pub const DEFAULT_CONTROLLERS: &str = "http://127.0.0.1:7450";

#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The cell's controllers: `URL,...` (any one will do).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_CONTROLLERS, env = "STELE_CONTROLLERS")]
    pub controllers: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CellCommand {
    /// Create the cell: the controller quorum (the controllers listed) and
    /// its tablets, placed as nodes register.
    Init {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 16)]
        tablets: u32,
        /// Voters per tablet: 3 (1 for a one-node cell, 5 for more safety).
        #[arg(long, default_value_t = 3)]
        replication: u32,
        /// Opaque cell id.
        #[arg(long, default_value = "cell")]
        cell_id: String,
    },
    /// Controller quorum, node and tablet counts, open intents.
    Status {
        #[command(flatten)]
        target: Target,
        /// The first controller's own view, even when it does not lead
        /// (it may be behind; health figures are the leader's).
        #[arg(long)]
        local: bool,
    },
    /// Cells as the global directory knows them.
    #[command(flatten)]
    Registry(crate::dirops::CellRegistryCommand),
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Every node with its state, replicas and leaders.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Move every replica and leadership off a node (it stays a member).
    Drain {
        id: u64,
        #[command(flatten)]
        target: Target,
        /// Wait until the node holds no replica.
        #[arg(long)]
        wait: bool,
    },
    /// Drain a node and remove it from the cell for good.
    Decommission {
        id: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Undo a drain: the node takes replicas again.
    Activate {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, Subcommand)]
pub enum TabletCommand {
    /// Every tablet with its range, generation, replicas and leader.
    List {
        #[command(flatten)]
        target: Target,
    },
    Show {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
    /// Move one voter of a tablet from one node to another.
    Move {
        id: u64,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        to: u64,
        /// Refuse unless the tablet is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Split a tablet in two on the same nodes: it keeps `[lo, at)`, a new
    /// tablet takes `[at, hi)`. Writes pause briefly; nothing is lost or
    /// doubled.
    Split {
        id: u64,
        /// The new tablet's first vshard (default: the middle of the range).
        #[arg(long)]
        at: Option<u32>,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Refuse unless the tablet is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Merge two adjacent tablets into one: the one with the larger id
    /// absorbs the other. The absorbed tablet's replicas first move onto
    /// the survivor's nodes; writes to its range pause while it freezes
    /// and is adopted; nothing is lost or doubled.
    Merge {
        a: u64,
        b: u64,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Refuse unless tablet `a` is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation_a: u64,
        /// Refuse unless tablet `b` is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation_b: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Hand a tablet's leadership to its voter on another node.
    TransferLeader {
        id: u64,
        #[arg(long)]
        to: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum IntentCommand {
    /// One intent's kind, state and detail.
    Show {
        id: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Give up an intent before its point of no return (a move before the
    /// group's voters change, a split before the group applies it).
    Abort {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
}

pub async fn run_intent(cmd: IntentCommand) -> anyhow::Result<()> {
    match cmd {
        IntentCommand::Show { id, target, wait } => {
            let a = admin(&target)?;
            let i = a
                .call(|mut c| async move { c.get_intent(pb::GetIntentRequest { id }).await })
                .await?;
            report_intent(&a, i, wait, target.json).await
        }
        IntentCommand::Abort { id, target } => {
            let a = admin(&target)?;
            let i = a
                .call(|mut c| async move { c.abort_intent(pb::AbortIntentRequest { id }).await })
                .await?;
            if target.json {
                println!("{}", intent_json(&i));
            } else {
                println!("intent {}: {} ({})", i.id, i.state, i.detail);
            }
            Ok(())
        }
    }
}

fn admin(t: &Target) -> anyhow::Result<Admin> {
    Ok(Admin::new(t.controllers.clone())?)
}

pub async fn run_cell(cmd: CellCommand) -> anyhow::Result<()> {
    match cmd {
        CellCommand::Registry(c) => crate::dirops::run_cell_registry(c).await,
        CellCommand::Init {
            target,
            tablets,
            replication,
            cell_id,
        } => {
            // Each controller names its own id.
            let mut peers = Vec::new();
            for ep in &target.controllers {
                let mut c = pb::controller_client::ControllerClient::connect(ep.clone())
                    .await
                    .with_context(|| format!("controller {ep}"))?;
                let st = c
                    .cell_status(pb::CellStatusRequest { local: true })
                    .await
                    .with_context(|| format!("controller {ep}"))?
                    .into_inner();
                peers.push(pb::ControllerPeer {
                    id: st.controller_id,
                    endpoint: ep.clone(),
                });
            }
            let mut ids: Vec<u64> = peers.iter().map(|p| p.id).collect();
            ids.sort_unstable();
            ids.dedup();
            anyhow::ensure!(
                ids.len() == peers.len(),
                "two controllers share an id: {peers:?}"
            );
            // Initialize through the first; it becomes a member of the new
            // quorum and proposes the cell.
            let first = Admin::new(vec![target.controllers[0].clone()])?;
            let req = pb::InitRequest {
                controllers: peers.clone(),
                tablets,
                replication,
                cell_id,
            };
            let resp = match first
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.init(req).await }
                })
                .await
            {
                Ok(r) => r,
                // Another controller leads: ask it (it is a member now).
                Err(_) => {
                    admin(&target)?
                        .call(|mut c| {
                            let req = req.clone();
                            async move { c.init(req).await }
                        })
                        .await?
                }
            };
            if target.json {
                println!("{}", json!({"created": resp.created, "controllers": ids}));
            } else if resp.created {
                println!(
                    "cell created: {tablets} tablets, replication {replication}, controllers {ids:?}"
                );
            } else {
                println!("cell already exists with this shape; nothing changed");
            }
            Ok(())
        }
        CellCommand::Status { target, local } => {
            let a = if local {
                Admin::new(target.controllers[..1].to_vec())?
            } else {
                admin(&target)?
            };
            let s = a
                .call(|mut c| async move { c.cell_status(pb::CellStatusRequest { local }).await })
                .await?;
            if target.json {
                println!(
                    "{}",
                    json!({
                        "controller_id": s.controller_id,
                        "leader_id": s.leader_id,
                        "leader_endpoint": s.leader_endpoint,
                        "initialized": s.initialized,
                        "cell_id": s.cell_id,
                        "replication": s.replication,
                        "nodes_up": s.nodes_up,
                        "nodes_total": s.nodes_total,
                        "tablets": s.tablets,
                        "tablets_unplaced": s.tablets_unplaced,
                        "under_replicated": s.under_replicated,
                        "intents_open": s.intents_open,
                        "route_generation": s.route_generation,
                        "controllers": s.controllers.iter().map(|c| json!({"id": c.id, "endpoint": c.endpoint})).collect::<Vec<_>>(),
                    })
                );
            } else {
                println!("cell {} (replication {})", s.cell_id, s.replication);
                println!(
                    "controllers {:?}, leader {} at {}",
                    s.controllers.iter().map(|c| c.id).collect::<Vec<_>>(),
                    s.leader_id,
                    s.leader_endpoint
                );
                println!("nodes       {} up of {}", s.nodes_up, s.nodes_total);
                println!(
                    "tablets     {} ({} unplaced, {} under-replicated)",
                    s.tablets, s.tablets_unplaced, s.under_replicated
                );
                println!("intents     {} open", s.intents_open);
                println!("routes      generation {}", s.route_generation);
            }
            Ok(())
        }
    }
}

pub async fn list_nodes(a: &Admin) -> anyhow::Result<Vec<pb::NodeInfo>> {
    Ok(
        a.call(|mut c| async move { c.list_nodes(pb::ListNodesRequest {}).await })
            .await?
            .nodes,
    )
}

fn node_json(n: &pb::NodeInfo) -> serde_json::Value {
    json!({
        "id": n.id, "state": n.state, "zone": n.zone, "rack": n.rack,
        "capacity": n.capacity, "replicas": n.replicas, "leaders": n.leaders,
        "client_endpoint": n.client_endpoint, "peer_endpoint": n.peer_endpoint,
        "heartbeat_age_ms": n.heartbeat_age_ms,
    })
}

async fn set_state(target: &Target, id: u64, state: &str, wait: bool) -> anyhow::Result<()> {
    let a = admin(target)?;
    let req = pb::SetNodeStateRequest {
        node: id,
        state: state.into(),
    };
    a.call(|mut c| {
        let req = req.clone();
        async move { c.set_node_state(req).await }
    })
    .await?;
    if !target.json {
        println!("node {id}: {state}");
    }
    if wait {
        let started = Instant::now();
        loop {
            let nodes = list_nodes(&a).await?;
            let n = nodes.iter().find(|n| n.id == id).context("node vanished")?;
            if !target.json {
                eprint!(
                    "\r  {} replicas, {} leaders left ({:.0} s)   ",
                    n.replicas,
                    n.leaders,
                    started.elapsed().as_secs_f64()
                );
            }
            if n.replicas == 0 && n.leaders == 0 {
                if !target.json {
                    eprintln!();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if target.json {
        let nodes = list_nodes(&a).await?;
        if let Some(n) = nodes.iter().find(|n| n.id == id) {
            println!("{}", node_json(n));
        }
    }
    Ok(())
}

pub async fn run_node(cmd: NodeCommand) -> anyhow::Result<()> {
    match cmd {
        NodeCommand::List { target } => {
            let nodes = list_nodes(&admin(&target)?).await?;
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(nodes.iter().map(node_json).collect())
                );
            } else {
                println!(
                    "{:>5}  {:<14} {:<8} {:<8} {:>8} {:>8} {:>9}  endpoint",
                    "node", "state", "zone", "rack", "replicas", "leaders", "hb age ms"
                );
                for n in &nodes {
                    println!(
                        "{:>5}  {:<14} {:<8} {:<8} {:>8} {:>8} {:>9}  {}",
                        n.id,
                        n.state,
                        n.zone,
                        n.rack,
                        n.replicas,
                        n.leaders,
                        n.heartbeat_age_ms,
                        n.client_endpoint
                    );
                }
            }
            Ok(())
        }
        NodeCommand::Drain { id, target, wait } => set_state(&target, id, "draining", wait).await,
        NodeCommand::Decommission { id, target, wait } => {
            set_state(&target, id, "decommissioned", wait).await
        }
        NodeCommand::Activate { id, target } => set_state(&target, id, "active", false).await,
    }
}

pub async fn list_tablets(a: &Admin, only: Option<u64>) -> anyhow::Result<Vec<pb::CellTablet>> {
    Ok(a.call(|mut c| async move {
        c.list_cell_tablets(pb::ListCellTabletsRequest { tablet: only })
            .await
    })
    .await?
    .tablets)
}

fn tablet_json(t: &pb::CellTablet) -> serde_json::Value {
    json!({
        "id": t.id, "vshard_lo": t.vshard_lo, "vshard_hi": t.vshard_hi,
        "generation": t.generation, "leader_node": t.leader_node, "intent": t.intent,
        "replicas": t.replicas.iter().map(|r| json!({"replica_id": r.replica_id, "node": r.node, "role": r.role})).collect::<Vec<_>>(),
        "last_change": t.last_change.as_ref().map(intent_json),
    })
}

fn intent_json(i: &pb::Intent) -> serde_json::Value {
    json!({
        "id": i.id, "kind": i.kind, "tablet": i.tablet, "from": i.from, "to": i.to,
        "state": i.state, "detail": i.detail, "done": i.done, "generation": i.generation,
        "at": i.at, "child": i.child, "vshard_lo": i.vshard_lo, "vshard_hi": i.vshard_hi,
        "reason": i.reason, "absorbed": i.absorbed,
    })
}

/// Polls an intent until it is done or failed, showing its state.
async fn wait_intent(a: &Admin, mut i: pb::Intent, quiet: bool) -> anyhow::Result<pb::Intent> {
    let started = Instant::now();
    while !i.done {
        if !quiet {
            eprint!(
                "\r  intent {}: {} ({:.0} s)   ",
                i.id,
                i.state,
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let id = i.id;
        i = a
            .call(|mut c| async move { c.get_intent(pb::GetIntentRequest { id }).await })
            .await?;
    }
    if !quiet {
        eprintln!();
    }
    Ok(i)
}

async fn report_intent(a: &Admin, i: pb::Intent, wait: bool, json_out: bool) -> anyhow::Result<()> {
    let i = if wait {
        wait_intent(a, i, json_out).await?
    } else {
        i
    };
    if json_out {
        println!("{}", intent_json(&i));
    } else {
        println!(
            "intent {}: {} of tablet {} — {}{}",
            i.id,
            i.kind,
            i.tablet,
            i.state,
            if i.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", i.detail)
            }
        );
    }
    anyhow::ensure!(i.state != "failed", "intent {} failed: {}", i.id, i.detail);
    Ok(())
}

pub async fn run_tablet(cmd: TabletCommand) -> anyhow::Result<()> {
    match cmd {
        TabletCommand::List { target } => {
            let tablets = list_tablets(&admin(&target)?, None).await?;
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(tablets.iter().map(tablet_json).collect())
                );
            } else {
                println!(
                    "{:>6}  {:>10} {:>10} {:>5} {:>6} {:>6}  voters",
                    "tablet", "vshard lo", "vshard hi", "gen", "leader", "intent"
                );
                for t in &tablets {
                    let voters: Vec<String> = t
                        .replicas
                        .iter()
                        .map(|r| {
                            if r.role == "voter" {
                                r.node.to_string()
                            } else {
                                format!("{}({})", r.node, r.role)
                            }
                        })
                        .collect();
                    println!(
                        "{:>6}  {:>10} {:>10} {:>5} {:>6} {:>6}  {}",
                        t.id,
                        t.vshard_lo,
                        t.vshard_hi,
                        t.generation,
                        t.leader_node,
                        t.intent,
                        voters.join(",")
                    );
                }
            }
            Ok(())
        }
        TabletCommand::Show { id, target } => {
            let tablets = list_tablets(&admin(&target)?, Some(id)).await?;
            let t = tablets.first().context("no such tablet")?;
            if target.json {
                println!("{}", tablet_json(t));
            } else {
                println!("tablet {} [{}, {})", t.id, t.vshard_lo, t.vshard_hi);
                println!("generation {}", t.generation);
                println!("leader     node {}", t.leader_node);
                println!(
                    "intent     {}",
                    if t.intent == 0 {
                        "none".into()
                    } else {
                        t.intent.to_string()
                    }
                );
                for r in &t.replicas {
                    println!(
                        "replica    {} on node {} ({})",
                        r.replica_id, r.node, r.role
                    );
                }
                if let Some(i) = &t.last_change {
                    println!("changed    by intent {}: {} — {}", i.id, i.kind, i.state);
                }
            }
            Ok(())
        }
        TabletCommand::Move {
            id,
            from,
            to,
            expect_generation,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::MoveTabletRequest {
                tablet: id,
                from,
                to,
                expect_generation,
            };
            let i = a
                .call(|mut c| async move { c.move_tablet(req).await })
                .await?;
            report_intent(&a, i, wait, target.json).await
        }
        TabletCommand::Split {
            id,
            at,
            dry_run,
            expect_generation,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::SplitTabletRequest {
                tablet: id,
                at: at.unwrap_or(0),
                dry_run,
                expect_generation,
            };
            let i = a
                .call(|mut c| async move { c.split_tablet(req).await })
                .await?;
            if dry_run {
                if target.json {
                    println!("{}", intent_json(&i));
                } else {
                    println!(
                        "plan: split tablet {} [{}, {}) at {}: tablet {} keeps [{}, {}), new tablet {} takes [{}, {}) on the same nodes",
                        i.tablet,
                        i.vshard_lo,
                        i.vshard_hi,
                        i.at,
                        i.tablet,
                        i.vshard_lo,
                        i.at,
                        i.child,
                        i.at,
                        i.vshard_hi
                    );
                }
                return Ok(());
            }
            report_intent(&a, i, wait, target.json).await
        }
        TabletCommand::Merge {
            a: ta,
            b: tb,
            dry_run,
            expect_generation_a,
            expect_generation_b,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::MergeTabletsRequest {
                a: ta,
                b: tb,
                dry_run,
                expect_generation_a,
                expect_generation_b,
            };
            let i = a
                .call(|mut c| async move { c.merge_tablets(req).await })
                .await?;
            if dry_run {
                if target.json {
                    println!("{}", intent_json(&i));
                } else {
                    println!(
                        "plan: merge tablet {} [{}, {}) into tablet {}; {}",
                        i.absorbed,
                        i.vshard_lo,
                        i.vshard_hi,
                        i.tablet,
                        if i.detail == "colocating" {
                            "the absorbed tablet's replicas move onto its nodes first"
                        } else {
                            "their replicas are on the same nodes"
                        }
                    );
                }
                return Ok(());
            }
            report_intent(&a, i, wait, target.json).await
        }
        TabletCommand::TransferLeader {
            id,
            to,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::TransferLeaderRequest { tablet: id, to };
            let i = a
                .call(|mut c| async move { c.transfer_leader(req).await })
                .await?;
            report_intent(&a, i, wait, target.json).await
        }
    }
}
