//! `stele restore`: rebuild a cell's tablets (or one tablet) from the
//! bucket into a new data directory for one static node
//! (`node::tier::restore`); `stele restore cell|directory` rebuild a whole
//! managed cell or the directory (`restore_cell`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct RestoreArgs {
    #[command(subcommand)]
    whole: Option<super::restore_cell::RestoreCommand>,
    /// The cell's object store: `s3://bucket/prefix` or `file:///dir`.
    #[arg(long, required = true)]
    from: Option<String>,
    /// The cell id the objects were written under.
    #[arg(long, required = true)]
    cell: Option<String>,
    /// Restore only this tablet (default: every tablet of the cell).
    #[arg(long)]
    tablet: Option<u64>,
    /// A new data directory for the restored node.
    #[arg(long, required = true)]
    data_dir: Option<PathBuf>,
    /// Node id of the restored node (every restored tablet has one voter on it).
    #[arg(long, default_value_t = 1)]
    node_id: u64,
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long)]
    s3_region: Option<String>,
    #[arg(long)]
    s3_allow_http: bool,
}

pub async fn run(a: RestoreArgs) -> anyhow::Result<()> {
    if let Some(whole) = a.whole {
        return super::restore_cell::run(whole).await;
    }
    let (Some(from), Some(cell), Some(data_dir)) = (a.from, a.cell, a.data_dir) else {
        anyhow::bail!("stele restore needs --from, --cell and --data-dir (or `cell`, `directory`)");
    };
    let mut o = stele_node::tier::TierOptions::new(from.clone(), cell.clone());
    o.s3_endpoint = a.s3_endpoint.clone();
    o.s3_region = a.s3_region;
    o.s3_allow_http = a.s3_allow_http
        || a.s3_endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://127.") || e.starts_with("http://localhost"));
    let tier = stele_node::tier::Tier::open(o).with_context(|| format!("object store {from}"))?;
    let progress = super::progress::Progress::bytes(&format!("restoring cell {cell}"), false);
    let report =
        stele_node::tier::restore::restore(&tier, &data_dir, a.node_id, a.tablet, &progress)
            .await
            .with_context(|| format!("restore cell {cell} from {from}"));
    match &report {
        Ok(_) => progress.finish(),
        Err(_) => progress.abandon(),
    }
    let report = report?;
    for (tablet, generation, segments, rows, checkpoint) in &report.tablets {
        println!(
            "tablet {tablet}: manifest {generation}, {segments} segments, {rows} rows, checkpoint {checkpoint}"
        );
    }
    if !report.empty_tablets.is_empty() {
        println!(
            "new empty tablets for ranges without a manifest: {:?}",
            report.empty_tablets
        );
    }
    println!(
        "restored {} bytes into {}; start it with `stele server --node-id {} --data-dir {} --listen HOST:PORT --object-store {from} --cell-id {cell}` (every segment checked)",
        report.bytes,
        data_dir.display(),
        a.node_id,
        data_dir.display()
    );
    Ok(())
}
