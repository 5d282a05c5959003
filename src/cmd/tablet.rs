//! `stele tablet`: the tablets of a cell: list, show, move, split, merge,
//! transfer leadership. Changes are intents (`intent`), waited on with
//! `--wait`.

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;
use stele_client::admin::Admin;
use stele_proto::pb;

use super::controllers::{Target, admin};
use super::intent::{intent_json, report_intent};
use super::progress::Wait;
use super::table;

#[derive(Debug, Subcommand)]
pub enum TabletCommand {
    /// Every tablet with its range, generation, replicas and leader.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// One tablet: range, generation, leader, replicas, open intent, and
    /// the last split or merge that changed it with its reason.
    Show {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
    /// Move one voter of a tablet from one node to another.
    Move {
        id: u64,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        to: u64,
        /// Refuse unless the tablet is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the intent is done or failed.
        #[command(flatten)]
        wait: Wait,
    },
    /// Split a tablet in two on the same nodes: it keeps `[lo, at)`, a new
    /// tablet takes `[at, hi)`. Writes pause briefly; nothing is lost or
    /// doubled.
    Split {
        id: u64,
        /// The new tablet's first vshard (default: the middle of the range).
        #[arg(long)]
        at: Option<u32>,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Refuse unless the tablet is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the intent is done or failed.
        #[command(flatten)]
        wait: Wait,
    },
    /// Merge two adjacent tablets into one: the one with the larger id
    /// absorbs the other. The absorbed tablet's replicas first move onto
    /// the survivor's nodes; writes to its range pause while it freezes
    /// and is adopted; nothing is lost or doubled.
    Merge {
        a: u64,
        b: u64,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Refuse unless tablet `a` is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation_a: u64,
        /// Refuse unless tablet `b` is still at this generation.
        #[arg(long, default_value_t = 0)]
        expect_generation_b: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the intent is done or failed.
        #[command(flatten)]
        wait: Wait,
    },
    /// Hand a tablet's leadership to its voter on another node.
    TransferLeader {
        id: u64,
        #[arg(long)]
        to: u64,
        #[command(flatten)]
        target: Target,
        /// --wait: until the intent is done or failed.
        #[command(flatten)]
        wait: Wait,
    },
}

pub async fn list_tablets(a: &Admin, only: Option<u64>) -> anyhow::Result<Vec<pb::CellTablet>> {
    Ok(a.call(|mut c| async move {
        c.list_cell_tablets(pb::ListCellTabletsRequest { tablet: only })
            .await
    })
    .await?
    .tablets)
}

fn tablet_json(t: &pb::CellTablet) -> serde_json::Value {
    json!({
        "id": t.id, "vshard_lo": t.vshard_lo, "vshard_hi": t.vshard_hi,
        "generation": t.generation, "leader_node": t.leader_node, "intent": t.intent,
        "replicas": t.replicas.iter().map(|r| json!({"replica_id": r.replica_id, "node": r.node, "role": r.role})).collect::<Vec<_>>(),
        "last_change": t.last_change.as_ref().map(intent_json),
    })
}

/// `tablet show` for people: range, generation, leader, the open intent
/// (`open`, when it could be read), replicas, and the last split or merge
/// with its reason (an intent's kind reads `split (REASON)`).
fn show_text(t: &pb::CellTablet, open: Option<&pb::Intent>) -> String {
    let mut out = format!(
        "tablet {} [{}, {})\ngeneration {}\nleader     node {}\n",
        t.id, t.vshard_lo, t.vshard_hi, t.generation, t.leader_node
    );
    let intent = match open {
        _ if t.intent == 0 => "none".to_string(),
        Some(i) if i.id == t.intent => format!("{}: {} — {}", i.id, i.kind, i.state),
        _ => t.intent.to_string(),
    };
    out += &format!("intent     {intent}\n");
    for r in &t.replicas {
        out += &format!(
            "replica    {} on node {} ({})\n",
            r.replica_id, r.node, r.role
        );
    }
    if let Some(i) = &t.last_change {
        out += &format!("changed    by intent {}: {} — {}\n", i.id, i.kind, i.state);
    }
    out
}

pub async fn run(cmd: TabletCommand) -> anyhow::Result<()> {
    match cmd {
        TabletCommand::List { target } => {
            let tablets = list_tablets(&admin(&target)?, None).await?;
            if target.json {
                println!(
                    "{}",
                    serde_json::Value::Array(tablets.iter().map(tablet_json).collect())
                );
            } else {
                let mut tab = table::new(
                    &[
                        "tablet",
                        "vshard lo",
                        "vshard hi",
                        "gen",
                        "leader",
                        "intent",
                        "voters",
                    ],
                    &[0, 1, 2, 3, 4, 5],
                );
                for t in &tablets {
                    let voters: Vec<String> = t
                        .replicas
                        .iter()
                        .map(|r| {
                            if r.role == "voter" {
                                r.node.to_string()
                            } else {
                                format!("{}({})", r.node, r.role)
                            }
                        })
                        .collect();
                    tab.add_row(vec![
                        t.id.to_string(),
                        t.vshard_lo.to_string(),
                        t.vshard_hi.to_string(),
                        t.generation.to_string(),
                        t.leader_node.to_string(),
                        t.intent.to_string(),
                        voters.join(","),
                    ]);
                }
                table::print(&tab);
            }
            Ok(())
        }
        TabletCommand::Show { id, target } => {
            let a = admin(&target)?;
            let tablets = list_tablets(&a, Some(id)).await?;
            let t = tablets.first().context("no such tablet")?;
            if target.json {
                println!("{}", tablet_json(t));
            } else {
                // The open intent's kind, reason and state; its id alone
                // if it closed (or cannot be read) meanwhile.
                let open =
                    match t.intent {
                        0 => None,
                        i => a
                            .call(|mut c| async move {
                                c.get_intent(pb::GetIntentRequest { id: i }).await
                            })
                            .await
                            .ok(),
                    };
                print!("{}", show_text(t, open.as_ref()));
            }
            Ok(())
        }
        TabletCommand::Move {
            id,
            from,
            to,
            expect_generation,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::MoveTabletRequest {
                tablet: id,
                from,
                to,
                expect_generation,
            };
            let i = a
                .call(|mut c| async move { c.move_tablet(req).await })
                .await?;
            report_intent(&a, i, &wait, target.json).await
        }
        TabletCommand::Split {
            id,
            at,
            dry_run,
            expect_generation,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::SplitTabletRequest {
                tablet: id,
                at: at.unwrap_or(0),
                dry_run,
                expect_generation,
            };
            let i = a
                .call(|mut c| async move { c.split_tablet(req).await })
                .await?;
            if dry_run {
                if target.json {
                    println!("{}", intent_json(&i));
                } else {
                    println!(
                        "plan: split tablet {} [{}, {}) at {}: tablet {} keeps [{}, {}), new tablet {} takes [{}, {}) on the same nodes",
                        i.tablet,
                        i.vshard_lo,
                        i.vshard_hi,
                        i.at,
                        i.tablet,
                        i.vshard_lo,
                        i.at,
                        i.child,
                        i.at,
                        i.vshard_hi
                    );
                }
                return Ok(());
            }
            report_intent(&a, i, &wait, target.json).await
        }
        TabletCommand::Merge {
            a: ta,
            b: tb,
            dry_run,
            expect_generation_a,
            expect_generation_b,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::MergeTabletsRequest {
                a: ta,
                b: tb,
                dry_run,
                expect_generation_a,
                expect_generation_b,
            };
            let i = a
                .call(|mut c| async move { c.merge_tablets(req).await })
                .await?;
            if dry_run {
                if target.json {
                    println!("{}", intent_json(&i));
                } else {
                    println!(
                        "plan: merge tablet {} [{}, {}) into tablet {}; {}",
                        i.absorbed,
                        i.vshard_lo,
                        i.vshard_hi,
                        i.tablet,
                        if i.detail == "colocating" {
                            "the absorbed tablet's replicas move onto its nodes first"
                        } else {
                            "their replicas are on the same nodes"
                        }
                    );
                }
                return Ok(());
            }
            report_intent(&a, i, &wait, target.json).await
        }
        TabletCommand::TransferLeader {
            id,
            to,
            target,
            wait,
        } => {
            let a = admin(&target)?;
            let req = pb::TransferLeaderRequest { tablet: id, to };
            let i = a
                .call(|mut c| async move { c.transfer_leader(req).await })
                .await?;
            report_intent(&a, i, &wait, target.json).await
        }
    }
}

#[cfg(test)]
mod tests {
    use stele_proto::pb;

    #[test]
    fn show_names_the_open_intent_and_the_last_change_with_their_reasons() {
        let split = |id: u64, reason: &str, state: &str| pb::Intent {
            id,
            kind: format!("split ({reason})"),
            reason: reason.into(),
            state: state.into(),
            ..Default::default()
        };
        let t = pb::CellTablet {
            id: 12,
            vshard_lo: 0,
            vshard_hi: 100,
            generation: 3,
            leader_node: 2,
            intent: 31,
            last_change: Some(split(30, "auto: 1.2 GiB sealed", "done")),
            ..Default::default()
        };
        let text = super::show_text(&t, Some(&split(31, "operator", "pending")));
        assert!(
            text.contains("intent     31: split (operator) — pending\n"),
            "{text}"
        );
        assert!(
            text.contains("changed    by intent 30: split (auto: 1.2 GiB sealed) — done\n"),
            "{text}"
        );
        // Closed meanwhile or unreadable: the id alone; none open: none.
        assert!(super::show_text(&t, None).contains("intent     31\n"));
        let idle = pb::CellTablet { intent: 0, ..t };
        assert!(super::show_text(&idle, None).contains("intent     none\n"));
    }
}
