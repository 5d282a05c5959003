//! `stele cell`: create a controller-managed cell and see its state; the
//! directory side (`register`, `list`, `retire`) is in `registry`.

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};

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
    /// The gated formats the cell uses and what each member runs; with
    /// `enable`, turn a newer format on (the end of a rolling upgrade).
    Formats {
        #[command(subcommand)]
        command: Option<super::formats::FormatsCommand>,
        #[command(flatten)]
        target: Target,
    },
    /// Cells as the global directory knows them.
    #[command(flatten)]
    Registry(super::registry::CellRegistryCommand),
}

pub async fn run(cmd: CellCommand) -> anyhow::Result<()> {
    match cmd {
        CellCommand::Registry(c) => super::registry::run(c).await,
        CellCommand::Formats { command, target } => match command {
            Some(c) => super::formats::run(c).await,
            None => super::formats::show(&target).await,
        },
        CellCommand::Init {
            target,
            tablets,
            replication,
            cell_id,
        } => {
            // Each controller names its own id.
            let mut peers = Vec::new();
            for ep in &target.controllers {
                let mut c = pb::controller_client::ControllerClient::new(
                    crate::security::cli_channel(ep, stele_tls::Kind::Controller)
                        .with_context(|| format!("controller {ep}"))?,
                );
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
            let first =
                Admin::with_tls(vec![target.controllers[0].clone()], crate::security::cli())?;
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
                Admin::with_tls(target.controllers[..1].to_vec(), crate::security::cli())?
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
                        "controller_version": s.controller_version,
                        "formats": s.formats.iter().map(|f| json!({"name": f.name, "version": f.version})).collect::<Vec<_>>(),
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
                println!(
                    "formats     {} (this controller: {}, {})",
                    stele_proto::formats::describe(&s.formats)
                        .replace("none reported (version 1 of each)", "version 1 of each"),
                    s.controller_version,
                    stele_proto::formats::describe(&s.controller_formats)
                );
            }
            Ok(())
        }
    }
}
