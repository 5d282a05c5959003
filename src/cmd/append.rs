//! `stele append`: append one record and print its position.

use anyhow::Context;
use clap::Args;
use stele_client::{Position, record};

use super::client::{client_for, now_us, position_json, position_text};

/// `stele append`: append one record and print its position.
#[derive(Debug, Clone, Args)]
pub struct AppendArgs {
    /// A node of the cell (default http://127.0.0.1:7450, unless a
    /// directory is given). Given, it wins over `STELE_DIRECTORY`.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Route through the global directory instead (`URL,...`): the
    /// namespace's cell is looked up there (`--endpoint` is ignored).
    #[arg(long, value_delimiter = ',', env = "STELE_DIRECTORY")]
    pub directory: Vec<String>,
    /// `workspace/project`.
    #[arg(long)]
    pub namespace: String,
    #[arg(long)]
    pub key: String,
    #[arg(long)]
    pub value: String,
    /// Microseconds since the Unix epoch; default now.
    #[arg(long)]
    pub ts: Option<u64>,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Appends one record; returns its position.
pub async fn append_one(args: &AppendArgs) -> anyhow::Result<(u64, Position)> {
    let client = client_for(args.endpoint.as_deref(), &args.directory, &args.namespace).await?;
    let ts = args.ts.unwrap_or_else(now_us);
    let positions = client
        .append(
            &args.namespace,
            vec![record(args.key.as_bytes(), ts, args.value.as_bytes())],
        )
        .await?;
    let pos = positions
        .into_iter()
        .next()
        .context("no position returned")?;
    Ok((ts, pos))
}

pub async fn run(args: AppendArgs) -> anyhow::Result<()> {
    let (ts, pos) = append_one(&args).await?;
    if args.json {
        let mut v = position_json(&pos);
        v["ts"] = ts.into();
        println!("{v}");
    } else {
        println!(
            "appended {}/{} ts {ts} at position {}",
            args.namespace,
            args.key,
            position_text(Some(&pos))
        );
    }
    Ok(())
}
