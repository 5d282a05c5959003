//! `stele cell formats`: the gated formats the cell uses, what each member
//! runs, and `enable` to turn a newer version on once every member reads
//! and writes it (the last step of a rolling upgrade, docs/OPERATIONS.md).

use clap::Subcommand;
use serde_json::json;
use stele_proto::formats::{describe, version_of};
use stele_proto::pb;

use super::controllers::{Target, admin};

#[derive(Debug, Subcommand)]
pub enum FormatsCommand {
    /// Turn on version VERSION of format NAME for the whole cell. Refused,
    /// naming them, while any controller or node (not decommissioned)
    /// runs a binary without it. A format never goes back.
    Enable {
        name: String,
        version: u32,
        #[command(flatten)]
        target: Target,
    },
}

/// Prints the cell's formats in use and each member's build.
pub async fn show(target: &Target) -> anyhow::Result<()> {
    let a = admin(target)?;
    let status = a
        .call(|mut c| async move { c.cell_status(pb::CellStatusRequest { local: false }).await })
        .await?;
    let mut controllers = Vec::new();
    for peer in &status.controllers {
        let st = match crate::security::cli_channel(&peer.endpoint, stele_tls::Kind::Controller) {
            Ok(ch) => pb::controller_client::ControllerClient::new(ch)
                .cell_status(pb::CellStatusRequest { local: true })
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.message().to_string()),
            Err(e) => Err(e.to_string()),
        };
        controllers.push((peer.id, st));
    }
    let nodes = super::node::list_nodes(&a).await?;
    let names: Vec<&str> = stele_proto::formats::SUPPORTED
        .iter()
        .map(|(n, _)| *n)
        .collect();
    if target.json {
        let fv = |f: &[pb::FormatVersion]| {
            f.iter()
                .map(|f| json!({"name": f.name, "version": f.version}))
                .collect::<Vec<_>>()
        };
        let in_use: Vec<_> = names
            .iter()
            .map(|n| json!({"name": n, "version": version_of(&status.formats, n)}))
            .collect();
        println!(
            "{}",
            json!({
                "formats": in_use,
                "controllers": controllers.iter().map(|(id, st)| match st {
                    Ok(s) => json!({"id": id, "version": s.controller_version, "formats": fv(&s.controller_formats)}),
                    Err(e) => json!({"id": id, "error": e}),
                }).collect::<Vec<_>>(),
                "nodes": nodes.iter().map(|n| json!({
                    "id": n.id, "state": n.state, "version": n.version, "formats": fv(&n.formats),
                })).collect::<Vec<_>>(),
            })
        );
        return Ok(());
    }
    let mut t = super::table::new(&["format", "in use"], &[1]);
    for n in &names {
        t.add_row(vec![
            n.to_string(),
            version_of(&status.formats, n).to_string(),
        ]);
    }
    super::table::print(&t);
    println!();
    let mut t = super::table::new(&["member", "id", "version", "formats", "state"], &[1]);
    for (id, st) in &controllers {
        t.add_row(match st {
            Ok(s) => vec![
                "controller".to_string(),
                id.to_string(),
                s.controller_version.clone(),
                describe(&s.controller_formats),
                String::new(),
            ],
            Err(e) => vec![
                "controller".to_string(),
                id.to_string(),
                format!("did not answer: {e}"),
                String::new(),
                String::new(),
            ],
        });
    }
    for n in &nodes {
        let version = if n.version.is_empty() {
            "? (no heartbeat yet)"
        } else {
            &n.version
        };
        t.add_row(vec![
            "node".to_string(),
            n.id.to_string(),
            version.to_string(),
            describe(&n.formats),
            n.state.clone(),
        ]);
    }
    super::table::print(&t);
    Ok(())
}

pub async fn run(cmd: FormatsCommand) -> anyhow::Result<()> {
    match cmd {
        FormatsCommand::Enable {
            name,
            version,
            target,
        } => {
            let req = pb::EnableFormatRequest { name, version };
            let resp = admin(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.enable_format(req).await }
                })
                .await?;
            if target.json {
                println!(
                    "{}",
                    json!({"formats": resp.formats.iter().map(|f| json!({"name": f.name, "version": f.version})).collect::<Vec<_>>()})
                );
            } else {
                println!("formats in use: {}", describe(&resp.formats));
            }
            Ok(())
        }
    }
}
