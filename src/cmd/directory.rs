//! `stele directory`: create the global directory quorum and see its
//! state. Also the directory a `stele ns` or `stele cell register|list|retire`
//! talks to (`DirTarget`).

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

/// A leader-following admin client of the target's directory members.
pub fn dir(t: &DirTarget) -> anyhow::Result<DirectoryAdmin> {
    Ok(DirectoryAdmin::with_tls(
        t.directory.clone(),
        crate::security::cli(),
    )?)
}

/// A client of one directory member (not the leader-following one).
fn member(
    ep: &str,
) -> anyhow::Result<pb::directory_client::DirectoryClient<tonic::transport::Channel>> {
    let ch = crate::security::cli_channel(ep, stele_tls::Kind::Directory)
        .with_context(|| format!("directory member {ep}"))?;
    Ok(pb::directory_client::DirectoryClient::new(ch))
}

pub async fn run(cmd: DirectoryCommand) -> anyhow::Result<()> {
    match cmd {
        DirectoryCommand::Init { target } => {
            // Each member names its own id.
            let mut members = Vec::new();
            for ep in &target.directory {
                let mut c = member(ep)?;
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
            let mut first = member(&target.directory[0])?;
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
                member(&target.directory[0])?
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
