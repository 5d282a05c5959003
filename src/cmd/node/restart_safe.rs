//! `stele node restart-safe N`: the controller checks that restarting node
//! N keeps every tablet's quorum (refusing, with nothing changed, if not),
//! moves every leadership N holds to a caught-up voter elsewhere and keeps
//! leader balancing from handing any back for `--hold`. With `--wait` the
//! command asks again until N leads nothing, then says it is safe.

use std::time::Duration;

use clap::Args;
use serde_json::json;
use stele_proto::pb;

use super::super::controllers::{Target, admin};
use super::super::duration::{parse_duration, parse_timeout};
use super::super::progress::Waiting;

#[derive(Debug, Args)]
pub struct RestartSafeArgs {
    /// The node to restart.
    pub id: u64,
    #[command(flatten)]
    pub target: Target,
    /// Wait until the node leads nothing.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long and exit nonzero (the
    /// transfers started go on in the cell).
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = parse_timeout, requires = "wait")]
    pub timeout: Duration,
    /// How long leader balancing gives the node no leadership, so it can
    /// be stopped and started again.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub hold: Duration,
}

pub async fn run(args: RestartSafeArgs) -> anyhow::Result<()> {
    let a = admin(&args.target)?;
    let req = pb::RestartSafeRequest {
        node: args.id,
        hold_ms: args.hold.as_millis().max(1) as u64,
    };
    let waiting = Waiting::new(args.timeout, args.target.json || !args.wait);
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
        let out_of_time = waiting.elapsed() >= args.timeout;
        if safe || !args.wait || out_of_time {
            waiting.shown.finish();
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
            if safe || !args.wait {
                return Ok(());
            }
        }
        let how_far = format!(
            "still leads {} tablet(s) {:?}{}",
            r.leading.len(),
            r.leading,
            if r.waiting.is_empty() {
                String::new()
            } else {
                format!(" (waiting: {})", r.waiting.join("; "))
            }
        );
        waiting.shown.set(&format!("node {}: {how_far}", args.id));
        waiting
            .next(
                Duration::from_millis(300),
                &format!("node {} to lead nothing", args.id),
                &how_far,
                &format!(
                    "the leader transfers started go on in the cell and leader balancing keeps leaderships off node {} for --hold",
                    args.id
                ),
            )
            .await?;
    }
}
