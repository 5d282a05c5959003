//! `stele intent`: operator intents (moves, transfers, splits, merges):
//! show, wait for, abort.

use std::time::Duration;

use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};
use super::progress::{Wait, Waiting};

#[derive(Debug, Subcommand)]
pub enum IntentCommand {
    /// One intent's kind, state and detail.
    Show {
        id: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until it is done or failed.
        #[command(flatten)]
        wait: Wait,
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
            report_intent(&a, i, &wait, target.json).await
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

/// How an intent reads in one line: `intent 31: split (operator) of
/// tablet 12 — pending (detail)`.
fn describe(i: &pb::Intent) -> String {
    format!(
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
    )
}

/// Polls an intent until it is done or failed, showing its state; past
/// `--timeout` an error that says how far it got (after printing its JSON
/// as it is, with `--json`).
async fn wait_intent(
    a: &Admin,
    mut i: pb::Intent,
    wait: &Wait,
    json_out: bool,
) -> anyhow::Result<pb::Intent> {
    let waiting = Waiting::new(wait.timeout, json_out);
    while !i.done {
        waiting.shown.set(&describe(&i));
        let id = i.id;
        let what = format!("intent {id} ({} of tablet {})", i.kind, i.tablet);
        let how_far = format!(
            "still {}{}",
            i.state,
            if i.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", i.detail)
            }
        );
        let goes_on = format!(
            "the intent goes on in the cell: `stele intent show {id} --wait` waits again, `stele intent abort {id}` gives it up"
        );
        if let Err(e) = waiting
            .next(Duration::from_millis(300), &what, &how_far, &goes_on)
            .await
        {
            if json_out {
                println!("{}", intent_json(&i));
            }
            return Err(e);
        }
        i = a
            .call(|mut c| async move { c.get_intent(pb::GetIntentRequest { id }).await })
            .await?;
    }
    waiting.shown.finish();
    Ok(i)
}

pub async fn report_intent(
    a: &Admin,
    i: pb::Intent,
    wait: &Wait,
    json_out: bool,
) -> anyhow::Result<()> {
    let i = if wait.wait {
        wait_intent(a, i, wait, json_out).await?
    } else {
        i
    };
    if json_out {
        println!("{}", intent_json(&i));
    } else {
        println!("{}", describe(&i));
    }
    anyhow::ensure!(i.state != "failed", "intent {} failed: {}", i.id, i.detail);
    Ok(())
}
