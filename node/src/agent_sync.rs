//! Heartbeat deltas, the node's side (docs/ARCHITECTURE.md, "Heartbeat
//! deltas"): the reports the controller holds, so a heartbeat sends only
//! those that changed, and the assignments the node was given, which
//! answers change a few at a time.
//!
//! ```text
//! request(reports, req)     reports: every replica's, built afresh
//!   the cell's heartbeat format is 2 and the controller acknowledged an
//!   earlier heartbeat ─▶ only the reports changed since it, and the
//!   tablets gone; otherwise all of them
//! answer(resp) ─▶ Taken
//!   Resync: the controller did not hold the base; nothing of it taken:
//!   send the full reports at once
//!   Taken: the reports acknowledged, the assignments brought to the
//!   answer's generation (a delta applied, or a full list put in place)
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};

use stele_proto::pb;

/// What a heartbeat answer did.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Applied; act on [`HeartbeatState::assignments`].
    Taken,
    /// The controller refused a delta it had no base for: send again at
    /// once, in full.
    Resync,
}

pub struct HeartbeatState {
    /// The next heartbeat's number. It starts at a random point so a
    /// restarted node never repeats a number a controller may hold.
    next_seq: u64,
    /// The reports the controller holds, and the heartbeat that sent them.
    acked: Option<(u64, HashMap<u64, pb::ReplicaReport>)>,
    /// The reports of the latest heartbeat sent, until it is answered.
    sent: Option<(u64, HashMap<u64, pb::ReplicaReport>)>,
    /// The cell takes delta reports (its heartbeat format is 2).
    deltas: bool,
    generation: u64,
    assignments: BTreeMap<u64, pb::Assignment>,
    unfreeze: BTreeSet<u64>,
}

impl Default for HeartbeatState {
    fn default() -> Self {
        HeartbeatState {
            // Far from wrapping, never 0 (which means "full").
            next_seq: (rand::random::<u64>() >> 2) | 1,
            acked: None,
            sent: None,
            deltas: false,
            generation: 0,
            assignments: BTreeMap::new(),
            unfreeze: BTreeSet::new(),
        }
    }
}

impl HeartbeatState {
    /// Fills `req`'s reports from `reports` (every replica's), only the
    /// changed ones when the cell and the controller allow it.
    pub fn request(&mut self, reports: Vec<pb::ReplicaReport>, req: &mut pb::HeartbeatRequest) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let all: HashMap<u64, pb::ReplicaReport> =
            reports.into_iter().map(|r| (r.tablet, r)).collect();
        req.report_seq = seq;
        // Assignment deltas are asked for under the same gate as report
        // deltas, so a cell without the format runs the full exchange.
        req.assignments_held = self.deltas.then_some(self.generation);
        match &self.acked {
            Some((base, held)) if self.deltas => {
                req.report_base = *base;
                req.replicas = all
                    .values()
                    .filter(|r| held.get(&r.tablet) != Some(r))
                    .cloned()
                    .collect();
                req.gone = held
                    .keys()
                    .filter(|t| !all.contains_key(t))
                    .copied()
                    .collect();
            }
            _ => {
                req.report_base = 0;
                req.replicas = all.values().cloned().collect();
                req.gone.clear();
            }
        }
        self.sent = Some((seq, all));
    }

    /// Takes a heartbeat answer.
    pub fn answer(&mut self, r: &pb::HeartbeatResponse) -> Taken {
        let Some(sync) = &r.sync else {
            // Everything listed, nothing acknowledged: a controller from
            // before deltas, or a node that did not ask (the format was
            // off; if it is on now, the next heartbeat asks).
            self.acked = None;
            self.deltas =
                stele_proto::formats::version_of(&r.formats, stele_proto::formats::HEARTBEAT) >= 2;
            self.generation = 0;
            self.unfreeze.clear();
            self.assignments = r
                .assignments
                .iter()
                .map(|a| (a.tablet, a.clone()))
                .collect();
            return Taken::Taken;
        };
        if sync.reports_acked == 0 {
            self.acked = None;
            return Taken::Resync;
        }
        self.deltas =
            stele_proto::formats::version_of(&r.formats, stele_proto::formats::HEARTBEAT) >= 2;
        match self.sent.take() {
            Some((seq, reports)) if seq == sync.reports_acked => {
                self.acked = Some((seq, reports));
            }
            other => {
                // Not the answer to the latest heartbeat: trust no base.
                self.sent = other;
                self.acked = None;
            }
        }
        if !sync.delta {
            self.assignments.clear();
        }
        for t in &sync.removed {
            self.assignments.remove(t);
        }
        for a in &r.assignments {
            self.assignments.insert(a.tablet, a.clone());
        }
        self.generation = sync.generation;
        self.unfreeze = sync.unfreeze.iter().copied().collect();
        Taken::Taken
    }

    /// What the node is to host and do, as the latest answers left it;
    /// the order to unfreeze is folded into its tablet's assignment, as
    /// full answers carry it.
    pub fn assignments(&self) -> Vec<pb::Assignment> {
        self.assignments
            .values()
            .map(|a| {
                let mut a = a.clone();
                if a.merge.is_none() && self.unfreeze.contains(&a.tablet) {
                    a.merge = Some(pb::MergeOrder {
                        action: "unfreeze".into(),
                        ..Default::default()
                    });
                }
                a
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(tablet: u64, applied: u64) -> pb::ReplicaReport {
        pb::ReplicaReport {
            tablet,
            replica_id: tablet * 10,
            applied_index: applied,
            ..Default::default()
        }
    }

    fn delta_cell() -> Vec<pb::FormatVersion> {
        vec![pb::FormatVersion {
            name: stele_proto::formats::HEARTBEAT.into(),
            version: 2,
        }]
    }

    fn ack(seq: u64, generation: u64, delta: bool) -> pb::HeartbeatResponse {
        pb::HeartbeatResponse {
            formats: delta_cell(),
            sync: Some(pb::HeartbeatSync {
                generation,
                delta,
                reports_acked: seq,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reports_go_in_full_until_acknowledged_then_only_changes() {
        let mut st = HeartbeatState::default();
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5), report(2, 5)], &mut req);
        assert_eq!((req.report_base, req.replicas.len()), (0, 2));
        let first = req.report_seq;
        assert_eq!(st.answer(&ack(first, 7, false)), Taken::Taken);
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 6), report(3, 1)], &mut req);
        assert_eq!(req.report_base, first);
        assert_eq!(req.report_seq, first + 1);
        assert_eq!(req.assignments_held, Some(7));
        let mut changed: Vec<u64> = req.replicas.iter().map(|r| r.tablet).collect();
        changed.sort();
        assert_eq!((changed, req.gone.clone()), (vec![1, 3], vec![2]));
        // The answer is lost: the next delta is still against `first`.
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 6), report(3, 1)], &mut req);
        assert_eq!(req.report_base, first);
        assert_eq!(req.replicas.len(), 2);
    }

    #[test]
    fn no_deltas_before_the_format_or_with_an_earlier_controller() {
        let mut st = HeartbeatState::default();
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        let mut a = ack(req.report_seq, 3, false);
        a.formats.clear();
        st.answer(&a);
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        assert_eq!((req.report_base, req.replicas.len()), (0, 1), "format 1");
        // An earlier controller: no sync, everything listed.
        st.answer(&pb::HeartbeatResponse {
            formats: delta_cell(),
            assignments: vec![pb::Assignment {
                tablet: 4,
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        assert_eq!(req.report_base, 0);
        assert_eq!(req.assignments_held, Some(0));
        assert_eq!(st.assignments().len(), 1);
    }

    #[test]
    fn a_refused_delta_asks_for_the_full_reports_at_once() {
        let mut st = HeartbeatState::default();
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        st.answer(&ack(req.report_seq, 3, false));
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        assert_ne!(req.report_base, 0);
        let refused = pb::HeartbeatResponse {
            sync: Some(pb::HeartbeatSync::default()),
            ..Default::default()
        };
        assert_eq!(st.answer(&refused), Taken::Resync);
        let mut req = pb::HeartbeatRequest::default();
        st.request(vec![report(1, 5)], &mut req);
        assert_eq!((req.report_base, req.replicas.len()), (0, 1));
    }

    #[test]
    fn assignment_deltas_apply_and_unfreeze_folds_in() {
        let mut st = HeartbeatState::default();
        let a = |tablet: u64, generation: u64| pb::Assignment {
            tablet,
            range_generation: generation,
            ..Default::default()
        };
        let mut full = ack(1, 10, false);
        full.assignments = vec![a(1, 1), a(2, 1), a(3, 1)];
        st.answer(&full);
        let mut delta = ack(2, 11, true);
        delta.assignments = vec![a(2, 2)];
        delta.sync.as_mut().unwrap().removed = vec![3];
        delta.sync.as_mut().unwrap().unfreeze = vec![1];
        st.answer(&delta);
        let got = st.assignments();
        assert_eq!(
            got.iter()
                .map(|a| (a.tablet, a.range_generation))
                .collect::<Vec<_>>(),
            vec![(1, 1), (2, 2)]
        );
        assert_eq!(got[0].merge.as_ref().unwrap().action, "unfreeze");
        assert!(got[1].merge.is_none());
        assert_eq!(st.generation, 11);
    }
}
