//! `stele node`: the storage nodes of a cell: list, drain, decommission,
//! activate, restart-safe (`node/restart_safe.rs`).

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};
use super::progress::Wait;
use super::table;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Every node with its state, replicas and leaders (decommissioned
    /// nodes only with --all).
    List {
        #[command(flatten)]
        target: Target,
        /// Decommissioned nodes too (gone for good; their ids are kept).
        #[arg(long)]
        all: bool,
    },
    /// Move every replica and leadership off a node (it stays a member).
    Drain {
        id: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the node holds no replica and leads nothing.
        #[command(flatten)]
        wait: Wait,
    },
    /// Drain a node and remove it from the cell for good.
    Decommission {
        id: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the node holds no replica and leads nothing.
        #[command(flatten)]
        wait: Wait,
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

async fn set_state(
    target: &Target,
    id: u64,
    state: &str,
    wait: Option<&Wait>,
) -> anyhow::Result<()> {
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
    if let Some(w) = wait.filter(|w| w.wait) {
        let waiting = super::progress::Waiting::new(w.timeout, target.json);
        loop {
            let nodes = list_nodes(&a).await?;
            let n = nodes.iter().find(|n| n.id == id).context("node vanished")?;
            if n.replicas == 0 && n.leaders == 0 {
                waiting.shown.finish();
                break;
            }
            let how_far = format!("{} replicas, {} leaders left", n.replicas, n.leaders);
            waiting.shown.set(&format!("node {id} {state}: {how_far}"));
            waiting
                .next(
                    Duration::from_millis(500),
                    &format!("node {id} to hold nothing"),
                    &how_far,
                    &format!("node {id} stays {state} and its replicas keep moving off in the cell (`stele node list` shows how far)"),
                )
                .await?;
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

/// `node list` for people.
fn print_nodes(nodes: &[&pb::NodeInfo]) {
    let mut t = table::new(
        &[
            "node",
            "state",
            "zone",
            "rack",
            "replicas",
            "leaders",
            "hb age ms",
            "version",
            "endpoint",
        ],
        &[0, 4, 5, 6],
    );
    for n in nodes {
        t.add_row(vec![
            n.id.to_string(),
            n.state.clone(),
            n.zone.clone(),
            n.rack.clone(),
            n.replicas.to_string(),
            n.leaders.to_string(),
            n.heartbeat_age_ms.to_string(),
            if n.version.is_empty() {
                "?".into()
            } else {
                n.version.clone()
            },
            n.client_endpoint.clone(),
        ]);
    }
    table::print(&t);
}

pub async fn run(cmd: NodeCommand) -> anyhow::Result<()> {
    match cmd {
        NodeCommand::List { target, all } => {
            let nodes = list_nodes(&admin(&target)?).await?;
            // Decommissioned is gone for good: shown only when asked for.
            let shown: Vec<&pb::NodeInfo> = nodes
                .iter()
                .filter(|n| all || n.state != "decommissioned")
                .collect();
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(shown.iter().map(|n| node_json(n)).collect())
                );
            } else {
                print_nodes(&shown);
            }
            Ok(())
        }
        NodeCommand::Drain { id, target, wait } => {
            set_state(&target, id, "draining", Some(&wait)).await
        }
        NodeCommand::Decommission { id, target, wait } => {
            set_state(&target, id, "decommissioned", Some(&wait)).await
        }
        NodeCommand::Activate { id, target } => set_state(&target, id, "active", None).await,
        NodeCommand::RestartSafe(args) => restart_safe::run(args).await,
    }
}

mod restart_safe;
