//! `stele node restart-safe N`: the controller checks that restarting node
//! N keeps every tablet's quorum (refusing, with nothing changed, if not),
//! moves every leadership N holds to a caught-up voter elsewhere and keeps
//! leader balancing from handing any back for `--hold`. With `--wait` the
//! command asks again until N leads nothing, then says it is safe.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use stele_proto::pb;

use super::super::bench::parse_duration;
use super::super::controllers::{Target, admin};

#[derive(Debug, Args)]
pub struct RestartSafeArgs {
    /// The node to restart.
    pub id: u64,
    #[command(flatten)]
    pub target: Target,
    /// Wait until the node leads nothing.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit nonzero) after this long.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// How long leader balancing gives the node no leadership, so it can
    /// be stopped and started again.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub hold: Duration,
}

pub async fn run(args: RestartSafeArgs) -> anyhow::Result<()> {
    let a = admin(&args.target)?;
    let req = pb::RestartSafeRequest {
        node: args.id,
        hold_ms: args.hold.as_millis().max(1) as u64,
    };
    let started = Instant::now();
    let mut transfers = 0usize;
    loop {
        let r = a
            .call(|mut c| async move { c.restart_safe(req).await })
            .await?;
        transfers += r.transfers.len();
        if !args.target.json {
            for i in &r.transfers {
                println!(
                    "tablet {}: leadership to node {} (intent {})",
                    i.tablet, i.to, i.id
                );
            }
        }
        let safe = r.leading.is_empty();
        if safe || !args.wait || started.elapsed() >= args.timeout {
            if args.target.json {
                println!(
                    "{}",
                    json!({
                        "node": args.id, "safe": safe, "leading": r.leading,
                        "transfers": transfers, "waiting": r.waiting,
                    })
                );
            } else if safe {
                println!("node {}: leads nothing; safe to restart", args.id);
            } else {
                println!(
                    "node {}: still leads {} tablet(s) {:?}{}",
                    args.id,
                    r.leading.len(),
                    r.leading,
                    if r.waiting.is_empty() {
                        String::new()
                    } else {
                        format!("; waiting: {}", r.waiting.join("; "))
                    }
                );
            }
            anyhow::ensure!(
                safe || !args.wait,
                "node {} still leads {} tablet(s) after {:?}",
                args.id,
                r.leading.len(),
                args.timeout
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
