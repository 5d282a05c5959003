//! The controller's answer to a node heartbeat: the lease renewed, the
//! reports kept (in full, or a delta against what this leader holds), the
//! registration updated, and what the node must do, in full or only what
//! changed since the generation it holds ([`crate::book`]).

use std::time::Instant;

use stele_proto::pb;
use stele_quorum::refuse;
use tonic::{Request, Response, Status};

use crate::api::Api;
use crate::health::ReportUpdate;
use crate::server::Controller;
use crate::state::{Admin, Command, NodeRec};

impl Api {
    /// A node's heartbeat: its lease renewed, its reports kept, its
    /// registration updated; answered with what it must do (in full, or
    /// only what changed when the node asks for that: [`crate::book`]).
    pub(crate) async fn handle_heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let c = &self.0;
        let caller = stele_tls::Caller::of(&request);
        let req = request.into_inner();
        let token_epoch = req.token_epoch;
        let load = req.load;
        let reg = crate::error::checked_registration(&caller, req.node)?;
        c.require_leader()?;
        crate::formats::admit(c, &reg)?;
        let now = Instant::now();
        let update = ReportUpdate {
            seq: req.report_seq,
            base: req.report_base,
            replicas: req.replicas,
            gone: req.gone,
        };
        if update.base != 0 && c.quorum.state().format(stele_proto::formats::HEARTBEAT) < 2 {
            return Err(refuse(
                "report_base",
                "delta reports before the cell's heartbeat format is 2",
            ));
        }
        let taken = Controller::blocking(|| {
            let mut h = c.health();
            let taken = h.heartbeat(reg.id, update, now, c.opts.split.window);
            if taken && let Some(load) = &load {
                h.record_load(reg.id, load, now);
            }
            taken
        });
        if !taken {
            crate::metrics::record_heartbeat_resync();
            return Ok(Response::new(pb::HeartbeatResponse {
                node_state: String::new(),
                sync: Some(pb::HeartbeatSync::default()),
                ..Default::default()
            }));
        }
        let rec = NodeRec {
            id: reg.id,
            client_endpoint: reg.client_endpoint,
            peer_endpoint: reg.peer_endpoint,
            zone: reg.zone,
            rack: reg.rack,
            capacity: reg.capacity.max(1),
            admin: Admin::Active,
            dead: false,
        };
        let known = c.quorum.state().nodes.get(&rec.id).cloned();
        let changed = match &known {
            None => true,
            Some(k) => {
                k.dead
                    || k.client_endpoint != rec.client_endpoint
                    || k.peer_endpoint != rec.peer_endpoint
                    || k.zone != rec.zone
                    || k.rack != rec.rack
                    || k.capacity != rec.capacity
            }
        };
        if changed {
            if known.as_ref().is_some_and(|k| k.dead) {
                tracing::info!(node = rec.id, "node is back");
            }
            c.propose(Command::Register(rec.clone())).await?;
        }
        Ok(Response::new(Controller::blocking(|| {
            self.answer(
                rec.id,
                req.assignments_held,
                req.report_seq,
                token_epoch,
                now,
            )
        })))
    }

    /// The answer to node `node`'s heartbeat (already taken): in full, or
    /// against generation `held` (its reports acknowledged as `seq`).
    fn answer(
        &self,
        node: u64,
        held: Option<u64>,
        seq: u64,
        token_epoch: Option<u64>,
        now: Instant,
    ) -> pb::HeartbeatResponse {
        let c = &self.0;
        // Read before the state: the book's index is never newer than the
        // state it was built from.
        let (term, applied) = (c.quorum.term(), c.quorum.applied_index().unwrap_or(0));
        let s = c.quorum.state();
        let (assignments, peers, sync) = match held {
            Some(held) => {
                let answer = {
                    let mut book = c.book(term);
                    let book = book.get_or_insert_with(|| crate::book::Book::new(term));
                    book.refresh(&s, applied, now);
                    book.answer(node, held)
                };
                let unfreeze = {
                    let h = c.health();
                    h.reports
                        .get(&node)
                        .into_iter()
                        .flat_map(|r| r.values())
                        .filter(|r| r.leader && r.frozen)
                        .filter(|r| {
                            s.tablets
                                .get(&r.tablet)
                                .is_some_and(|t| crate::orders::unfreezes(&s, t, r))
                        })
                        .map(|r| r.tablet)
                        .collect()
                };
                crate::metrics::record_heartbeat_answer(answer.delta);
                let sync = pb::HeartbeatSync {
                    generation: answer.generation,
                    delta: answer.delta,
                    removed: answer.removed,
                    unfreeze,
                    reports_acked: seq,
                };
                (
                    answer.assignments,
                    answer.peers.unwrap_or_default(),
                    Some(sync),
                )
            }
            None => (
                crate::orders::assignments(&s, &c.health(), node),
                crate::book::peers_of(&s),
                None,
            ),
        };
        let retire = s
            .retired
            .get(&node)
            .map(|set| {
                set.iter()
                    .map(|r| pb::ReplicaRef {
                        replica_id: r.replica_id,
                        node: r.node,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let node_state = s
            .nodes
            .get(&node)
            .map_or("up", |n| n.placement_state().name());
        pb::HeartbeatResponse {
            node_state: node_state.into(),
            assignments,
            retire,
            peers,
            lease_ms: c.opts.lease.as_millis() as u64,
            formats: stele_proto::formats::to_pb(&s.formats),
            tokens: s.tokens.keys_pb(token_epoch),
            sync,
        }
    }
}
