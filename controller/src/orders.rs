//! What a heartbeat answer orders a node to do: the replicas it hosts,
//! each with its group's desired shape and the split or merge step its
//! leader is to propose.

use stele_proto::pb;

use crate::health::HealthView;
use crate::state::{CellState, IntentKind, IntentState, MergePhase, TabletRec};

/// The assignments of `node`: one per tablet with a replica on it.
pub fn assignments(s: &CellState, health: &HealthView, node: u64) -> Vec<pb::Assignment> {
    let mut assignments = Vec::new();
    for t in s.tablets.values() {
        let Some(r) = s.replica_on(t, node) else {
            continue;
        };
        let split = s
            .intents
            .get(&t.intent)
            .filter(|i| i.state == IntentState::Pending)
            .and_then(|i| match &i.kind {
                IntentKind::Split {
                    at,
                    child,
                    child_replicas,
                    generation,
                    ..
                } => Some(pb::SplitOrder {
                    at: *at,
                    child: *child,
                    child_replicas: child_replicas
                        .iter()
                        .map(|r| pb::ReplicaRef {
                            replica_id: r.replica_id,
                            node: r.node,
                        })
                        .collect(),
                    generation: *generation,
                }),
                _ => None,
            });
        let merge = merge_order(s, t, health.replica_report(t.id, r.replica_id));
        assignments.push(pb::Assignment {
            tablet: t.id,
            replica_id: r.replica_id,
            vshard_lo: t.lo,
            vshard_hi: t.hi,
            range_generation: t.range_generation,
            voters: t
                .voters
                .iter()
                .map(|v| pb::ReplicaRef {
                    replica_id: v.replica_id,
                    node: v.node,
                })
                .collect(),
            initialize: t.initializer == Some(r.replica_id),
            leader_replica: t.leader_replica,
            split,
            merge,
        });
    }
    assignments
}

/// The merge step `t`'s leader is to propose, if any: freeze the absorbed
/// tablet of a merge in its freeze phase; merge into the survivor of one
/// in its merge phase; unfreeze a tablet that reports itself frozen with
/// no merge going on (a merge given up).
fn merge_order(
    s: &CellState,
    t: &TabletRec,
    report: Option<&pb::ReplicaReport>,
) -> Option<pb::MergeOrder> {
    let merge = s
        .intents
        .get(&t.intent)
        .filter(|i| i.state == IntentState::Pending)
        .and_then(|i| match &i.kind {
            IntentKind::Merge {
                absorbed,
                lo,
                hi,
                generation,
                phase,
                ..
            } => Some((i.tablet, *absorbed, *lo, *hi, *generation, *phase)),
            _ => None,
        });
    match merge {
        Some((_, absorbed, lo, hi, _, MergePhase::Freeze | MergePhase::Merge))
            if absorbed == t.id =>
        {
            Some(pb::MergeOrder {
                action: "freeze".into(),
                absorbed,
                vshard_lo: lo,
                vshard_hi: hi,
                generation: 0,
            })
        }
        Some((survivor, absorbed, lo, hi, generation, MergePhase::Merge)) if survivor == t.id => {
            Some(pb::MergeOrder {
                action: "merge".into(),
                absorbed,
                vshard_lo: lo,
                vshard_hi: hi,
                generation,
            })
        }
        Some(_) => None,
        None if report.is_some_and(|r| r.leader && r.frozen) => Some(pb::MergeOrder {
            action: "unfreeze".into(),
            ..Default::default()
        }),
        None => None,
    }
}
