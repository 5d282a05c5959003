//! `stele node`: the storage nodes of a cell: list, drain, decommission,
//! activate, restart-safe (`node/restart_safe.rs`).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};

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
    /// Prepare a node for a restart: refused (nothing changed) if its
    /// absence would cost a tablet its quorum, else every leadership it
    /// holds moves to caught-up voters elsewhere.
    RestartSafe(restart_safe::RestartSafeArgs),
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
        "version": n.version,
        "formats": n.formats.iter().map(|f| json!({"name": f.name, "version": f.version})).collect::<Vec<_>>(),
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

pub async fn run(cmd: NodeCommand) -> anyhow::Result<()> {
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
                    "{:>5}  {:<14} {:<8} {:<8} {:>8} {:>8} {:>9}  {:<22} endpoint",
                    "node", "state", "zone", "rack", "replicas", "leaders", "hb age ms", "version"
                );
                for n in &nodes {
                    println!(
                        "{:>5}  {:<14} {:<8} {:<8} {:>8} {:>8} {:>9}  {:<22} {}",
                        n.id,
                        n.state,
                        n.zone,
                        n.rack,
                        n.replicas,
                        n.leaders,
                        n.heartbeat_age_ms,
                        if n.version.is_empty() {
                            "?"
                        } else {
                            &n.version
                        },
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
        NodeCommand::RestartSafe(args) => restart_safe::run(args).await,
    }
}

mod restart_safe;
