//! Operator subcommands of the global directory: `stele directory`,
//! `stele ns`, and the directory side of `stele cell` (register, list,
//! retire). Tables for people, `--json` for scripts.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use stele_client::admin::DirectoryAdmin;
use stele_proto::pb;

/// Where a local directory listens by default (`stele dev --cells N`).
pub const DEFAULT_DIRECTORY: &str = "http://127.0.0.1:7450";

#[derive(Debug, Clone, Args)]
pub struct DirTarget {
    /// The directory's members: `URL,...` (any one will do).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_DIRECTORY, env = "STELE_DIRECTORY")]
    pub directory: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DirectoryCommand {
    /// Create the directory quorum from the members listed (once).
    Init {
        #[command(flatten)]
        target: DirTarget,
    },
    /// Members, leader, generation, cell and namespace counts.
    Status {
        #[command(flatten)]
        target: DirTarget,
        /// The first member's own view, even when it does not lead.
        #[arg(long)]
        local: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NsCommand {
    /// Create a namespace (`workspace/project`) on a cell, or on the
    /// least-loaded active cell.
    Create {
        name: String,
        #[arg(long)]
        cell: Option<String>,
        /// Drop records older than this many seconds (0: keep).
        #[arg(long, default_value_t = 0)]
        retention_s: u64,
        /// Soft limit on stored bytes (0: none).
        #[arg(long, default_value_t = 0)]
        size_limit_bytes: u64,
        #[command(flatten)]
        target: DirTarget,
    },
    /// Every namespace, or one cell's.
    List {
        #[arg(long)]
        cell: Option<String>,
        #[command(flatten)]
        target: DirTarget,
    },
    Show {
        name: String,
        #[command(flatten)]
        target: DirTarget,
    },
    /// Change a namespace's policy (its cell never changes).
    Update {
        name: String,
        #[arg(long)]
        retention_s: Option<u64>,
        #[arg(long)]
        size_limit_bytes: Option<u64>,
        #[command(flatten)]
        target: DirTarget,
    },
}

/// `stele cell register|list|retire`: cells as the directory knows them.
#[derive(Debug, Subcommand)]
pub enum CellRegistryCommand {
    /// Add a cell to the directory (or update its controllers and labels).
    Register {
        id: String,
        /// The cell's controllers: `URL,...`.
        #[arg(long, value_delimiter = ',', required = true)]
        controllers: Vec<String>,
        /// `KEY=VALUE` labels (repeatable), e.g. `region=eu-west`.
        #[arg(long = "label")]
        labels: Vec<String>,
        #[command(flatten)]
        target: DirTarget,
    },
    /// Every cell the directory knows, with its namespace count.
    List {
        #[command(flatten)]
        target: DirTarget,
    },
    /// Stop placing namespaces on a cell (only an empty cell retires).
    Retire {
        id: String,
        #[command(flatten)]
        target: DirTarget,
    },
}

fn dir(t: &DirTarget) -> anyhow::Result<DirectoryAdmin> {
    Ok(DirectoryAdmin::new(t.directory.clone())?)
}

fn ns_json(n: &pb::NamespaceRecord) -> serde_json::Value {
    let p = n.policy.unwrap_or_default();
    json!({
        "name": n.name, "cell": n.cell, "controllers": n.controllers, "state": n.state,
        "created_us": n.created_us, "retention_s": p.retention_s,
        "size_limit_bytes": p.size_limit_bytes, "generation": n.generation,
    })
}

fn cell_json(c: &pb::CellRecord) -> serde_json::Value {
    json!({
        "id": c.id, "controllers": c.controllers, "labels": c.labels, "status": c.status,
        "namespaces": c.namespaces, "generation": c.generation,
    })
}

fn print_ns(n: &pb::NamespaceRecord) {
    let p = n.policy.unwrap_or_default();
    println!("namespace   {}", n.name);
    println!(
        "cell        {} (controllers {})",
        n.cell,
        n.controllers.join(",")
    );
    println!("state       {}", n.state);
    println!(
        "retention   {}",
        if p.retention_s == 0 {
            "forever".to_string()
        } else {
            format!("{} s", p.retention_s)
        }
    );
    println!(
        "size limit  {}",
        if p.size_limit_bytes == 0 {
            "none".to_string()
        } else {
            format!("{} bytes", p.size_limit_bytes)
        }
    );
    println!("generation  {}", n.generation);
}

pub async fn run_directory(cmd: DirectoryCommand) -> anyhow::Result<()> {
    match cmd {
        DirectoryCommand::Init { target } => {
            // Each member names its own id.
            let mut members = Vec::new();
            for ep in &target.directory {
                let mut c = pb::directory_client::DirectoryClient::connect(ep.clone())
                    .await
                    .with_context(|| format!("directory member {ep}"))?;
                let st = c
                    .directory_status(pb::DirectoryStatusRequest { local: true })
                    .await
                    .with_context(|| format!("directory member {ep}"))?
                    .into_inner();
                members.push(pb::DirectoryPeer {
                    id: st.member_id,
                    endpoint: ep.clone(),
                });
            }
            let req = pb::DirectoryInitRequest {
                members: members.clone(),
            };
            let mut first =
                pb::directory_client::DirectoryClient::connect(target.directory[0].clone()).await?;
            let resp = first.directory_init(req).await?.into_inner();
            let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
            if target.json {
                println!("{}", json!({"created": resp.created, "members": ids}));
            } else if resp.created {
                println!("directory created: members {ids:?}");
            } else {
                println!("directory already exists; nothing changed");
            }
            Ok(())
        }
        DirectoryCommand::Status { target, local } => {
            let req = pb::DirectoryStatusRequest { local };
            let s = if local {
                pb::directory_client::DirectoryClient::connect(target.directory[0].clone())
                    .await?
                    .directory_status(req)
                    .await?
                    .into_inner()
            } else {
                dir(&target)?
                    .call(|mut c| async move { c.directory_status(req).await })
                    .await?
            };
            if target.json {
                println!(
                    "{}",
                    json!({
                        "member_id": s.member_id, "leader_id": s.leader_id,
                        "leader_endpoint": s.leader_endpoint, "initialized": s.initialized,
                        "generation": s.generation, "cells": s.cells, "namespaces": s.namespaces,
                        "members": s.members.iter().map(|m| json!({"id": m.id, "endpoint": m.endpoint})).collect::<Vec<_>>(),
                    })
                );
            } else {
                println!(
                    "members     {:?}, leader {} at {}",
                    s.members.iter().map(|m| m.id).collect::<Vec<_>>(),
                    s.leader_id,
                    s.leader_endpoint
                );
                println!("generation  {}", s.generation);
                println!("cells       {}", s.cells);
                println!("namespaces  {}", s.namespaces);
            }
            Ok(())
        }
    }
}

pub async fn run_ns(cmd: NsCommand) -> anyhow::Result<()> {
    match cmd {
        NsCommand::Create {
            name,
            cell,
            retention_s,
            size_limit_bytes,
            target,
        } => {
            let req = pb::CreateNamespaceRequest {
                name,
                cell: cell.unwrap_or_default(),
                policy: Some(pb::NamespacePolicy {
                    retention_s,
                    size_limit_bytes,
                }),
            };
            let n = dir(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.create_namespace(req).await }
                })
                .await?;
            if target.json {
                println!("{}", ns_json(&n));
            } else {
                println!("namespace {} created on cell {}", n.name, n.cell);
            }
            Ok(())
        }
        NsCommand::List { cell, target } => {
            let req = pb::ListNamespacesRequest {
                cell: cell.unwrap_or_default(),
            };
            let resp = dir(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.list_namespaces(req).await }
                })
                .await?;
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(resp.namespaces.iter().map(ns_json).collect())
                );
            } else {
                println!("{:<40} {:<16} {:>12}", "namespace", "cell", "retention s");
                for n in &resp.namespaces {
                    println!(
                        "{:<40} {:<16} {:>12}",
                        n.name,
                        n.cell,
                        n.policy.unwrap_or_default().retention_s
                    );
                }
                println!("(generation {})", resp.generation);
            }
            Ok(())
        }
        NsCommand::Show { name, target } => {
            let n = get_namespace(&target, &name).await?;
            if target.json {
                println!("{}", ns_json(&n));
            } else {
                print_ns(&n);
            }
            Ok(())
        }
        NsCommand::Update {
            name,
            retention_s,
            size_limit_bytes,
            target,
        } => {
            let now = get_namespace(&target, &name)
                .await?
                .policy
                .unwrap_or_default();
            let req = pb::UpdateNamespaceRequest {
                name,
                policy: Some(pb::NamespacePolicy {
                    retention_s: retention_s.unwrap_or(now.retention_s),
                    size_limit_bytes: size_limit_bytes.unwrap_or(now.size_limit_bytes),
                }),
            };
            let n = dir(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.update_namespace(req).await }
                })
                .await?;
            if target.json {
                println!("{}", ns_json(&n));
            } else {
                print_ns(&n);
            }
            Ok(())
        }
    }
}

async fn get_namespace(target: &DirTarget, name: &str) -> anyhow::Result<pb::NamespaceRecord> {
    let req = pb::GetNamespaceRequest {
        name: name.to_string(),
        create_if_missing: false,
    };
    Ok(dir(target)?
        .call(|mut c| {
            let req = req.clone();
            async move { c.get_namespace(req).await }
        })
        .await?)
}

pub async fn run_cell_registry(cmd: CellRegistryCommand) -> anyhow::Result<()> {
    match cmd {
        CellRegistryCommand::Register {
            id,
            controllers,
            labels,
            target,
        } => {
            let mut map = BTreeMap::new();
            for l in &labels {
                let (k, v) = l
                    .split_once('=')
                    .with_context(|| format!("--label {l:?}: want KEY=VALUE"))?;
                map.insert(k.to_string(), v.to_string());
            }
            let req = pb::RegisterCellRequest {
                id,
                controllers,
                labels: map.into_iter().collect(),
            };
            let c = dir(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.register_cell(req).await }
                })
                .await?;
            if target.json {
                println!("{}", cell_json(&c));
            } else {
                println!("cell {} registered ({})", c.id, c.controllers.join(","));
            }
            Ok(())
        }
        CellRegistryCommand::List { target } => {
            let resp = dir(&target)?
                .call(|mut c| async move { c.list_cells(pb::ListCellsRequest {}).await })
                .await?;
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(resp.cells.iter().map(cell_json).collect())
                );
            } else {
                println!(
                    "{:<16} {:<8} {:>10}  {:<24} controllers",
                    "cell", "status", "namespaces", "labels"
                );
                for c in &resp.cells {
                    let labels: Vec<String> =
                        c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    println!(
                        "{:<16} {:<8} {:>10}  {:<24} {}",
                        c.id,
                        c.status,
                        c.namespaces,
                        labels.join(","),
                        c.controllers.join(",")
                    );
                }
            }
            Ok(())
        }
        CellRegistryCommand::Retire { id, target } => {
            let req = pb::RetireCellRequest { id };
            let c = dir(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.retire_cell(req).await }
                })
                .await?;
            if target.json {
                println!("{}", cell_json(&c));
            } else {
                println!("cell {} {}", c.id, c.status);
            }
            Ok(())
        }
    }
}
