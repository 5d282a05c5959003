//! `stele ns`: namespaces, through the directory: create, list, show,
//! update.

use clap::Subcommand;
use serde_json::json;
use stele_proto::pb;

use super::directory::{DirTarget, dir};

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

fn ns_json(n: &pb::NamespaceRecord) -> serde_json::Value {
    let p = n.policy.unwrap_or_default();
    json!({
        "name": n.name, "cell": n.cell, "controllers": n.controllers, "state": n.state,
        "created_us": n.created_us, "retention_s": p.retention_s,
        "size_limit_bytes": p.size_limit_bytes, "generation": n.generation,
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

pub async fn run(cmd: NsCommand) -> anyhow::Result<()> {
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
                let mut t = super::table::new(&["namespace", "cell", "retention s"], &[2]);
                for n in &resp.namespaces {
                    t.add_row(vec![
                        n.name.clone(),
                        n.cell.clone(),
                        n.policy.unwrap_or_default().retention_s.to_string(),
                    ]);
                }
                super::table::print(&t);
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
