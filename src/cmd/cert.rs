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
    /// Issue a server certificate (node.key, node.pem, ca.pem) naming each
    /// role of one process: a node, a controller, a directory member, or
    /// several (one process that is node 1 and controller 1).
    Issue {
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        node_id: Option<u64>,
        #[arg(long)]
        controller_id: Option<u64>,
        #[arg(long)]
        directory_id: Option<u64>,
        #[arg(long)]
        out: PathBuf,
        /// Validity, days (1 to 3650).
        #[arg(long, default_value_t = stele_node::certs::DAYS_DEFAULT)]
        days: u32,
    },
    /// Issue an operator certificate (operator.key, operator.pem, ca.pem)
    /// for the operator API (`--certs-dir` of the CLI).
    Operator {
        #[arg(long)]
        ca: PathBuf,
        /// Who holds it: 1 to 63 of a-z, 0-9 and '-'.
        #[arg(long)]
        name: String,
        #[arg(long)]
        out: PathBuf,
        /// Validity, days (1 to 3650).
        #[arg(long, default_value_t = stele_node::certs::DAYS_DEFAULT)]
        days: u32,
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
        CertCommand::Issue {
            ca,
            node_id,
            controller_id,
            directory_id,
            out,
            days,
        } => {
            use stele_tls::Role;
            let roles: Vec<Role> = [
                node_id.map(Role::Node),
                controller_id.map(Role::Controller),
                directory_id.map(Role::Directory),
            ]
            .into_iter()
            .flatten()
            .collect();
            anyhow::ensure!(
                !roles.is_empty(),
                "give at least one of --node-id, --controller-id, --directory-id"
            );
            stele_node::certs::issue(&ca, &roles, days, &out).context("issue certificate")?;
            let names: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
            println!(
                "certificate for {} ({days} days) written to {}",
                names.join(", "),
                out.display()
            );
        }
        CertCommand::Operator {
            ca,
            name,
            out,
            days,
        } => {
            let role = stele_tls::Role::Operator(name.clone());
            stele_node::certs::issue(&ca, &[role], days, &out)
                .with_context(|| format!("issue operator {name:?} certificate"))?;
            println!(
                "operator {name} certificate ({days} days) written to {}",
                out.display()
            );
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
