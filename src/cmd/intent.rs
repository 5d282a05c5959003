//! `stele intent`: operator intents (moves, transfers, splits, merges):
//! show, wait for, abort.

use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};

#[derive(Debug, Subcommand)]
pub enum IntentCommand {
    /// One intent's kind, state and detail.
    Show {
        id: u64,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        wait: bool,
    },
    /// Give up an intent before its point of no return (a move before the
    /// group's voters change, a split before the group applies it).
    Abort {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
}

pub async fn run(cmd: IntentCommand) -> anyhow::Result<()> {
    match cmd {
        IntentCommand::Show { id, target, wait } => {
            let a = admin(&target)?;
            let i = a
                .call(|mut c| async move { c.get_intent(pb::GetIntentRequest { id }).await })
                .await?;
            report_intent(&a, i, wait, target.json).await
        }
        IntentCommand::Abort { id, target } => {
            let a = admin(&target)?;
            let i = a
                .call(|mut c| async move { c.abort_intent(pb::AbortIntentRequest { id }).await })
                .await?;
            if target.json {
                println!("{}", intent_json(&i));
            } else {
                println!("intent {}: {} ({})", i.id, i.state, i.detail);
            }
            Ok(())
        }
    }
}

pub fn intent_json(i: &pb::Intent) -> serde_json::Value {
    json!({
        "id": i.id, "kind": i.kind, "tablet": i.tablet, "from": i.from, "to": i.to,
        "state": i.state, "detail": i.detail, "done": i.done, "generation": i.generation,
        "at": i.at, "child": i.child, "vshard_lo": i.vshard_lo, "vshard_hi": i.vshard_hi,
        "reason": i.reason, "absorbed": i.absorbed,
    })
}

/// Polls an intent until it is done or failed, showing its state.
async fn wait_intent(a: &Admin, mut i: pb::Intent, quiet: bool) -> anyhow::Result<pb::Intent> {
    let started = Instant::now();
    while !i.done {
        if !quiet {
            eprint!(
                "\r  intent {}: {} ({:.0} s)   ",
                i.id,
                i.state,
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let id = i.id;
        i = a
            .call(|mut c| async move { c.get_intent(pb::GetIntentRequest { id }).await })
            .await?;
    }
    if !quiet {
        eprintln!();
    }
    Ok(i)
}

pub async fn report_intent(
    a: &Admin,
    i: pb::Intent,
    wait: bool,
    json_out: bool,
) -> anyhow::Result<()> {
    let i = if wait {
        wait_intent(a, i, json_out).await?
    } else {
        i
    };
    if json_out {
        println!("{}", intent_json(&i));
    } else {
        println!(
            "intent {}: {} of tablet {} — {}{}",
            i.id,
            i.kind,
            i.tablet,
            i.state,
            if i.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", i.detail)
            }
        );
    }
    anyhow::ensure!(i.state != "failed", "intent {} failed: {}", i.id, i.detail);
    Ok(())
}
