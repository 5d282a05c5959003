//! `stele cell register|list|retire`: the directory side of `stele cell`,
//! cells as the global directory knows them.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;
use stele_proto::pb;

use super::directory::{DirTarget, dir};

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

fn cell_json(c: &pb::CellRecord) -> serde_json::Value {
    json!({
        "id": c.id, "controllers": c.controllers, "labels": c.labels, "status": c.status,
        "namespaces": c.namespaces, "generation": c.generation,
    })
}

pub async fn run(cmd: CellRegistryCommand) -> anyhow::Result<()> {
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
                let mut t = super::table::new(
                    &["cell", "status", "namespaces", "labels", "controllers"],
                    &[2],
                );
                for c in &resp.cells {
                    let labels: Vec<String> =
                        c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    t.add_row(vec![
                        c.id.clone(),
                        c.status.clone(),
                        c.namespaces.to_string(),
                        labels.join(","),
                        c.controllers.join(","),
                    ]);
                }
                super::table::print(&t);
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
