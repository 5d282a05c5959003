//! `stele restore`: rebuild a cell's tablets (or one tablet) from the
//! bucket into a new data directory (`node::tier::restore`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The cell's object store: `s3://bucket/prefix` or `file:///dir`.
    #[arg(long)]
    from: String,
    /// The cell id the objects were written under.
    #[arg(long)]
    cell: String,
    /// Restore only this tablet (default: every tablet of the cell).
    #[arg(long)]
    tablet: Option<u64>,
    /// A new data directory for the restored node.
    #[arg(long)]
    data_dir: PathBuf,
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
    let mut o = stele_node::tier::TierOptions::new(a.from.clone(), a.cell.clone());
    o.s3_endpoint = a.s3_endpoint.clone();
    o.s3_region = a.s3_region;
    o.s3_allow_http = a.s3_allow_http
        || a.s3_endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://127.") || e.starts_with("http://localhost"));
    let tier =
        stele_node::tier::Tier::open(o).with_context(|| format!("object store {}", a.from))?;
    let report = stele_node::tier::restore::restore(&tier, &a.data_dir, a.node_id, a.tablet)
        .await
        .with_context(|| format!("restore cell {} from {}", a.cell, a.from))?;
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
        "restored {} bytes into {}; start it with `stele server --node-id {} --data-dir {}` (every segment checked)",
        report.bytes,
        a.data_dir.display(),
        a.node_id,
        a.data_dir.display()
    );
    Ok(())
}
