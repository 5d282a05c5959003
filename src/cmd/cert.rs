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
    /// On a node: make its key (node.key, 0600, never leaves DIR) and a
    /// signing request (node.csr) to carry to the CA host.
    Request {
        #[arg(long)]
        node_id: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// On the CA host: sign a node's request (node.pem, ca.pem into --out).
    Sign {
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        csr: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Validity, days (1 to 3650).
        #[arg(long, default_value_t = stele_node::cert_request::DAYS_DEFAULT)]
        days: u32,
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
        CertCommand::Request { node_id, out } => {
            stele_node::cert_request::request(node_id, &out)
                .with_context(|| format!("request a node {node_id} certificate"))?;
            println!(
                "node {node_id}: key and signing request {} written to {}",
                stele_node::cert_request::NODE_CSR_FILE,
                out.display()
            );
        }
        CertCommand::Sign { ca, csr, out, days } => {
            let node = stele_node::cert_request::sign(&ca, &csr, &out, days)
                .with_context(|| format!("sign {}", csr.display()))?;
            println!(
                "node {node} certificate ({days} days) written to {}",
                out.display()
            );
        }
    }
    Ok(())
}
