//! `stele dev`: a single-node cell on embedded defaults (plaintext,
//! loopback), or with `--nodes`/`--cells` a whole cell of child processes
//! (`dev_cell`).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::server::{ControlRoles, run_server};
use crate::tuning::{Tuning, node_options};

#[derive(clap::Args)]
pub struct DevArgs {
    /// Data directory.
    #[arg(long, default_value = "./stele-data")]
    data_dir: PathBuf,
    /// Client API address (loopback only: `dev` serves plaintext).
    #[arg(long, default_value = "127.0.0.1:7450")]
    listen: SocketAddr,
    /// Tablets to create in a new data directory.
    #[arg(long, default_value_t = 16)]
    tablets: u32,
    /// Nodes in the cell: more than one runs each as its own `stele server`
    /// process on consecutive ports, every tablet on every node.
    #[arg(long, default_value_t = 1)]
    nodes: u64,
    /// Cells: more than one runs a directory on --listen and each cell
    /// (`--nodes` nodes, ids c1, c2, ...) on its own ports.
    #[arg(long, default_value_t = 1)]
    cells: u64,
    /// The HTTP status listener (`/metrics`, `/healthz`, `/readyz`) of the
    /// single node (port 0: any free port, printed). In a dev cell every
    /// process gets one on a free port, printed as it starts.
    #[arg(long, default_value = "127.0.0.1:0")]
    http_listen: SocketAddr,
    #[command(flatten)]
    tuning: Tuning,
}

pub async fn run(mut a: DevArgs) -> anyhow::Result<()> {
    if a.tuning.cold.object_store.is_none() {
        // Dev default: a local bucket beside the nodes' data,
        // shared by every node of a dev cell.
        std::fs::create_dir_all(&a.data_dir)?;
        let abs = std::fs::canonicalize(&a.data_dir)?;
        a.tuning.cold.object_store = Some(format!("file://{}", abs.join("bucket").display()));
    }
    anyhow::ensure!(
        a.listen.ip().is_loopback(),
        "stele dev serves plaintext and listens on loopback only; got {}",
        a.listen
    );
    if a.nodes > 1 || a.cells > 1 {
        let mut tuning = a.tuning.to_args();
        if a.cells > 1 {
            // Each cell gets its own id (c1, c2, ...).
            let at = tuning.iter().position(|f| f == "--cell-id");
            if let Some(at) = at {
                tuning.drain(at..at + 2);
            }
        }
        let flags = crate::dev_cell::ChildFlags {
            tablets: a.tablets,
            tuning,
            env: a.tuning.cold.secret_env()?,
        };
        return crate::dev_cell::run(&a.data_dir, a.listen, a.cells, a.nodes, flags).await;
    }
    anyhow::ensure!(
        a.http_listen.ip().is_loopback(),
        "stele dev serves plaintext and listens on loopback only; got --http-listen {}",
        a.http_listen
    );
    let bound =
        crate::http::spawn_with(&a.http_listen.into(), crate::gateway::in_node_router()).await?;
    println!("stele dev: HTTP status (/metrics, /healthz, /readyz) at http://{bound}");
    println!("stele dev: HTTP API at http://{bound}/v1/namespaces/... (OpenAPI: /openapi.json)");
    // A one-node dev cell has nobody to stay compatible with: its leaders
    // coalesce concurrent appends unless told otherwise.
    a.tuning
        .tablet_log_format
        .get_or_insert(stele_proto::formats::LOG_MAX);
    let mut o = node_options(a.data_dir, 1, a.tablets, String::new(), &a.tuning);
    o.tier = a.tuning.cold.open()?;
    let listen = crate::addresses::Endpoint::new(crate::addresses::CLIENT, a.listen.into(), None)?;
    run_server(o, listen, "dev", None, ControlRoles::node_only(), None).await
}

impl DevArgs {
    /// Who this process is to an OpenTelemetry collector (`crate::otel`):
    /// node 1 of its cell; `None` for a dev cell, whose processes are its
    /// children (they get the collector from `dev_cell`).
    pub fn telemetry(&self) -> Option<crate::otel::Identity> {
        (self.nodes <= 1 && self.cells <= 1).then(|| crate::otel::Identity {
            service: "node".into(),
            attributes: vec![
                ("stele.node.id", "1".into()),
                ("stele.cell.id", self.tuning.cold.cell_id.clone()),
            ],
        })
    }
}
