//! The cell's certificates, and TLS on its gRPC.
//!
//! ```text
//! <run>/ca/                     the cell CA (stele cert init)
//! <run>/certs<n>/               node n: node-<n>.stele (QUIC and gRPC)
//! <run>/certs-controller/       controller-1.stele (controlled cells)
//! <run>/operator/               operator-jepsen.stele: the runner's CLI calls
//! <run>/foreign-ca/             a CA the cell does not trust (the self-check)
//! ```
//!
//! Node-to-node QUIC is mutual TLS in every run. gRPC (clients, the
//! controller, operator commands) is TLS too, except in the `upgrade` case:
//! its older binary has no TLS on gRPC, so that cell's gRPC is plaintext
//! throughout (`--insecure-plaintext` on the nodes of this build and on the
//! controller). Data clients trust the cell CA and present the operator
//! certificate (the data API over TLS wants a token or a certificate, and
//! static cells have no controller to issue tokens); so do the runner's
//! operator commands (`cell init`, moves, splits, merges).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use stele_tls::{ClientTls, Credentials, Files, Kind};
use tonic::transport::Channel;

/// The name on the runner's operator certificate.
const OPERATOR_NAME: &str = "jepsen";

/// How long a raw gRPC client of the runner waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The TLS side of a cell whose gRPC is TLS.
pub struct CellTls {
    /// `operator.pem`, `operator.key`, `ca.pem`: `STELE_CERTS_DIR` of the
    /// runner's CLI calls.
    pub operator_dir: PathBuf,
    /// The controller's certificate directory (`--certs`).
    pub controller_dir: PathBuf,
    /// Trusts the cell CA, presents nothing: the data clients.
    pub client: ClientTls,
    /// Trusts only a CA the cell does not know.
    pub foreign: ClientTls,
}

/// The directory of node `n`'s certificate.
pub fn node_dir(dir: &Path, n: usize) -> PathBuf {
    dir.join(format!("certs{n}"))
}

/// Makes the cell CA and every node's certificate; with `grpc_tls`, also
/// the controller's, the runner's operator certificate and a foreign CA.
/// `run` runs one `stele` CLI command to success.
pub fn make_certs(
    dir: &Path,
    nodes: usize,
    grpc_tls: bool,
    run: impl Fn(&[&str]) -> anyhow::Result<()>,
) -> anyhow::Result<Option<CellTls>> {
    let path = |p: &Path| p.to_str().expect("UTF-8 run directory").to_string();
    let ca = path(&dir.join("ca"));
    run(&["cert", "init", "--out", &ca])?;
    for n in 1..=nodes {
        let out = path(&node_dir(dir, n));
        run(&[
            "cert",
            "issue",
            "--ca",
            &ca,
            "--node-id",
            &n.to_string(),
            "--out",
            &out,
        ])?;
    }
    if !grpc_tls {
        return Ok(None);
    }
    let controller_dir = dir.join("certs-controller");
    let operator_dir = dir.join("operator");
    let foreign_ca = dir.join("foreign-ca");
    run(&[
        "cert",
        "issue",
        "--ca",
        &ca,
        "--controller-id",
        "1",
        "--out",
        &path(&controller_dir),
    ])?;
    run(&[
        "cert",
        "operator",
        "--ca",
        &ca,
        "--name",
        OPERATOR_NAME,
        "--out",
        &path(&operator_dir),
    ])?;
    run(&["cert", "init", "--out", &path(&foreign_ca)])?;
    let client = Credentials::load(Files::in_dir(&operator_dir, "operator"))
        .with_context(|| format!("load the operator identity from {}", operator_dir.display()))?;
    let foreign = Credentials::load(Files::roots_only(&foreign_ca))
        .with_context(|| format!("load the foreign CA from {}", foreign_ca.display()))?;
    Ok(Some(CellTls {
        operator_dir,
        controller_dir,
        client: ClientTls::new(client),
        foreign: ClientTls::new(foreign),
    }))
}

/// `https://` for a cell with TLS on gRPC, else `http://`.
pub fn scheme(tls: &Option<CellTls>) -> &'static str {
    if tls.is_some() { "https" } else { "http" }
}

/// A lazily connected data-API client of one node (`https://` with
/// `tls`), as a data client of the cell.
pub fn data_client(
    endpoint: &str,
    tls: Option<&ClientTls>,
) -> anyhow::Result<stele_proto::pb::data_client::DataClient<Channel>> {
    let channel = stele_tls::channel(endpoint, tls, Kind::Node, CONNECT_TIMEOUT)?;
    Ok(stele_proto::pb::data_client::DataClient::new(channel).max_decoding_message_size(64 << 20))
}
