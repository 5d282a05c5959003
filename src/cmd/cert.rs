//! `stele cert`: the cell CA and node certificates for node-to-node mutual
//! TLS (`stele_node::certs`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum CertCommand {
    /// Create a cell CA (ca.key, ca.pem) in a new directory.
    Init {
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a node certificate (node.key, node.pem, ca.pem) signed by the cell CA.
    Node {
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        node_id: u64,
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(cmd: CertCommand) -> anyhow::Result<()> {
    match cmd {
        CertCommand::Init { out } => {
            stele_node::certs::init_ca(&out)
                .with_context(|| format!("create CA in {}", out.display()))?;
            println!("cell CA written to {}", out.display());
        }
        CertCommand::Node { ca, node_id, out } => {
            stele_node::certs::issue_node(&ca, node_id, &out)
                .with_context(|| format!("issue node {node_id} certificate"))?;
            println!("node {node_id} certificate written to {}", out.display());
        }
    }
    Ok(())
}
