//! What a heartbeat answer orders a node to do: the replicas it hosts,
//! each with its group's desired shape and the split or merge step its
//! leader is to propose.

use stele_proto::pb;

use crate::health::HealthView;
use crate::state::{CellState, IntentKind, IntentState, MergePhase, ReplicaRec, TabletRec};

/// The assignments of `node`: one per tablet with a replica on it.
pub fn assignments(s: &CellState, health: &HealthView, node: u64) -> Vec<pb::Assignment> {
    s.tablets
        .values()
        .filter_map(|t| {
            let r = s.replica_on(t, node)?;
            Some(assignment(
                s,
                t,
                r,
                health.replica_report(t.id, r.replica_id),
            ))
        })
        .collect()
}

/// The assignment of `t`'s replica `r`, given what that replica reports
/// (`None`: leave out the order to unfreeze, which depends on it).
pub fn assignment(
    s: &CellState,
    t: &TabletRec,
    r: ReplicaRec,
    report: Option<&pb::ReplicaReport>,
) -> pb::Assignment {
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
    pb::Assignment {
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
        merge: merge_order(s, t, report),
    }
}

/// Whether the replica of `t` that sent `report` is to unfreeze it: it
/// leads, reports itself frozen, and no merge is going on (one given up).
pub fn unfreezes(s: &CellState, t: &TabletRec, report: &pb::ReplicaReport) -> bool {
    merge_order(s, t, Some(report)).is_some_and(|m| m.action == "unfreeze")
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
