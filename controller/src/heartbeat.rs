//! The controller's answer to a node heartbeat: the lease renewed, the
//! reports kept (in full, or a delta against what this leader holds), the
//! registration updated, and what the node must do, in full or only what
//! changed since the generation it holds ([`crate::book`]).

use std::time::Instant;

use stele_proto::pb;
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
        // Leaders reported (in full, or changed since the base): for the
        // route watches, once the reports are taken.
        let leading: Vec<(u64, u64)> = req
            .replicas
            .iter()
            .filter(|r| r.leader)
            .map(|r| (r.tablet, r.term))
            .collect();
        let update = ReportUpdate {
            seq: req.report_seq,
            base: req.report_base,
            replicas: req.replicas,
            gone: req.gone,
        };
        // A delta before the cell's heartbeat format is 2 is not taken
        // (answered like a delta without its base: the node sends its
        // full reports at once). An error instead would fail every later
        // heartbeat of a node that holds a base, until its lease ran out.
        let deltas_on = c.quorum.state().format(stele_proto::formats::HEARTBEAT) >= 2;
        let taken = (update.base == 0 || deltas_on)
            && Controller::blocking(|| {
                let mut h = c.health();
                let taken = h.heartbeat(reg.id, update, now, c.opts.split.window);
                if taken && let Some(load) = &load {
                    h.record_load(reg.id, load, now);
                }
                taken
            });
        if taken {
            c.routes.note_leaders(reg.id, leading);
        } else {
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
        Controller::blocking(|| {
            self.answer(
                rec.id,
                req.assignments_held,
                req.report_seq,
                token_epoch,
                now,
            )
        })
        .map(Response::new)
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
    ) -> Result<pb::HeartbeatResponse, Status> {
        let c = &self.0;
        // The term and the leadership from one view: a member that has
        // just lost the lead must not start a book numbered by the new
        // leader's term (its generations would clash with that leader's).
        let term = c.quorum.leading_term().ok_or_else(|| c.not_leader())?;
        // Read before the state: the book's index is never newer than the
        // state it was built from.
        let applied = c.quorum.applied_index().unwrap_or(0);
        let s = c.quorum.state();
        let retired = |keep: &dyn Fn(&crate::state::ReplicaRec) -> bool| -> Vec<pb::ReplicaRef> {
            s.retired
                .get(&node)
                .into_iter()
                .flatten()
                .filter(|r| keep(r))
                .map(|r| pb::ReplicaRef {
                    replica_id: r.replica_id,
                    node: r.node,
                })
                .collect()
        };
        let (assignments, peers, sync, retire) = match held {
            Some(held) => {
                let (answer, retire) = {
                    let mut book = c.book(term);
                    let book = book.get_or_insert_with(|| crate::book::Book::new(term));
                    book.refresh(&s, applied, now);
                    // The book may be behind the state (refreshes are
                    // spaced): a replica it still assigns here is not
                    // retired in the same answer, or the node would delete
                    // it and then create it again from the assignment it
                    // holds. It is retired once the book files its removal.
                    let retire = retired(&|r| !book.assigns(node, r.replica_id));
                    (book.answer(node, held), retire)
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
                    retire,
                )
            }
            None => (
                crate::orders::assignments(&s, &c.health(), node),
                crate::book::peers_of(&s),
                None,
                retired(&|_| true),
            ),
        };
        let node_state = s
            .nodes
            .get(&node)
            .map_or("up", |n| n.placement_state().name());
        Ok(pb::HeartbeatResponse {
            node_state: node_state.into(),
            assignments,
            retire,
            peers,
            lease_ms: c.opts.lease.as_millis() as u64,
            formats: stele_proto::formats::to_pb(&s.formats),
            tokens: s.tokens.keys_pb(token_epoch),
            sync,
        })
    }
}
