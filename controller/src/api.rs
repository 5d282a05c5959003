//! The controller's gRPC API: cell setup, node heartbeats (`heartbeat.rs`: they feed the
//! leader's health view and return each node's assignments), routes,
//! status and the operator's requests (moves, transfers, splits, merges,
//! drains, aborts). Requests are checked here and become commands the
//! quorum applies; nothing here decides on its own.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stele_proto::pb;
use stele_quorum::refuse;
use tonic::{Request, Response, Status};

use crate::placement::{Cluster, NodeState, PlacementError};
use crate::server::Controller;
use crate::state::{
    Admin, CellConfig, CellState, Command, IntentKind, IntentRec, IntentState, MergePhase, Reply,
    node_of,
};

pub struct Api(pub(crate) Arc<Controller>);

#[tonic::async_trait]
impl pb::controller_server::Controller for Api {
    async fn init(
        &self,
        request: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        let req = request.into_inner();
        let c = &self.0;
        if req.controllers.is_empty() {
            return Err(refuse("controllers", "name at least this controller"));
        }
        if !req.controllers.iter().any(|p| p.id == c.opts.id) {
            return Err(refuse(
                "controllers",
                format!("this controller ({}) is not in the list", c.opts.id),
            ));
        }
        // Members dial each other at these: refuse what nobody can dial.
        for p in &req.controllers {
            if let Err(e) = stele_proto::addr::dialable_url(&p.endpoint) {
                return Err(refuse("controllers", format!("controller {}: {e}", p.id)));
            }
        }
        let members = req
            .controllers
            .iter()
            .map(|p| (p.id, p.endpoint.clone()))
            .collect();
        c.quorum.initialize(&members).await.map_err(Status::from)?;
        c.quorum
            .wait_leader(Duration::from_secs(15))
            .await
            .map_err(Status::from)?;
        let existed = c.snapshot().cell.is_some();
        let cfg = CellConfig {
            cell_id: if req.cell_id.is_empty() {
                "cell".into()
            } else {
                req.cell_id
            },
            replication: req.replication,
            tablets: req.tablets,
        };
        match c.propose(Command::Init(cfg)).await? {
            Reply::Refused(reason) => Err(refuse("init", reason)),
            _ => Ok(Response::new(pb::InitResponse { created: !existed })),
        }
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let started = Instant::now();
        let r = self.handle_heartbeat(request).await;
        crate::metrics::record_heartbeat(started.elapsed(), r.is_ok());
        r
    }

    async fn get_routes(
        &self,
        request: Request<pb::GetRoutesRequest>,
    ) -> Result<Response<pb::GetRoutesResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let since = request.into_inner().since_generation;
        let leaders = c.leaders();
        let s = c.quorum.state();
        let full = since == 0 || since > s.route_generation;
        let tablets = s
            .tablets
            .values()
            .filter(|t| !t.voters.is_empty() && (full || t.generation > since))
            .map(|t| Controller::descriptor(&s, t, &leaders))
            .collect();
        Ok(Response::new(pb::GetRoutesResponse {
            generation: s.route_generation,
            tablets,
            removed: Vec::new(),
            full,
            filed_at_unix_us: 0,
        }))
    }

    type WatchRoutesStream = crate::routes_feed::Watch;

    async fn watch_routes(
        &self,
        request: Request<pb::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        let since = request.into_inner().since_generation;
        crate::routes_feed::watch(self.0.clone(), since).map(Response::new)
    }

    async fn cell_status(
        &self,
        request: Request<pb::CellStatusRequest>,
    ) -> Result<Response<pb::CellStatusResponse>, Status> {
        let c = &self.0;
        if !request.into_inner().local && c.quorum.leader().is_some() {
            c.require_leader()?;
        }
        let now = Instant::now();
        let s = c.snapshot();
        let nodes = c.placement_nodes(&s, now);
        let up: BTreeSet<u64> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Up)
            .map(|n| n.id)
            .collect();
        let replication = s.cell.as_ref().map_or(0, |c| c.replication);
        let under = s
            .tablets
            .values()
            .filter(|t| {
                !t.voters.is_empty()
                    && t.voters.iter().filter(|r| up.contains(&r.node)).count()
                        < replication as usize
            })
            .count();
        let (leader_id, leader_endpoint) = c.quorum.leader().unwrap_or_default();
        Ok(Response::new(pb::CellStatusResponse {
            controller_id: c.opts.id,
            leader_id,
            leader_endpoint,
            initialized: s.cell.is_some(),
            cell_id: s
                .cell
                .as_ref()
                .map(|c| c.cell_id.clone())
                .unwrap_or_default(),
            replication,
            nodes_up: up.len() as u64,
            nodes_total: s
                .nodes
                .values()
                .filter(|n| n.admin != Admin::Decommissioned)
                .count() as u64,
            tablets: s.tablets.len() as u64,
            route_generation: s.route_generation,
            under_replicated: under as u64,
            intents_open: s
                .intents
                .values()
                .filter(|i| i.state == IntentState::Pending)
                .count() as u64,
            controllers: c
                .quorum
                .members()
                .into_iter()
                .map(|(id, endpoint)| pb::ControllerPeer { id, endpoint })
                .collect(),
            tablets_unplaced: s.tablets.values().filter(|t| t.voters.is_empty()).count() as u64,
            controller_version: stele_proto::formats::binary_version().into(),
            controller_formats: stele_proto::formats::supported_pb(),
            formats: stele_proto::formats::to_pb(&s.formats),
        }))
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let now = Instant::now();
        let s = c.snapshot();
        let leaders = c.leaders();
        let states = c.placement_nodes(&s, now);
        let seen = c.health().seen.clone();
        let builds = c.health().builds.clone();
        let nodes = s
            .nodes
            .values()
            .zip(states)
            .map(|(n, p)| {
                let mut state = p.state;
                // Placement keeps a dead node Suspect during its grace;
                // operators see the verdict.
                if n.dead && n.admin != Admin::Decommissioned {
                    state = NodeState::Dead;
                }
                pb::NodeInfo {
                    id: n.id,
                    client_endpoint: n.client_endpoint.clone(),
                    peer_endpoint: n.peer_endpoint.clone(),
                    zone: n.zone.clone(),
                    rack: n.rack.clone(),
                    capacity: n.capacity,
                    state: state.name().into(),
                    replicas: s
                        .tablets
                        .values()
                        .filter(|t| s.replica_on(t, n.id).is_some())
                        .count() as u64,
                    leaders: leaders
                        .values()
                        .filter(|r| node_of(r.replica_id) == n.id)
                        .count() as u64,
                    heartbeat_age_ms: seen
                        .get(&n.id)
                        .map_or(0, |t| now.duration_since(*t).as_millis() as u64),
                    version: builds
                        .get(&n.id)
                        .map(|b| b.version.clone())
                        .unwrap_or_default(),
                    formats: builds
                        .get(&n.id)
                        .map(|b| b.formats.clone())
                        .unwrap_or_default(),
                }
            })
            .collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn set_node_state(
        &self,
        request: Request<pb::SetNodeStateRequest>,
    ) -> Result<Response<pb::IntentList>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let admin = match req.state.as_str() {
            "draining" | "drain" => Admin::Draining,
            "decommissioned" | "decommission" => Admin::Decommissioned,
            "active" | "up" => Admin::Active,
            other => {
                return Err(refuse(
                    "state",
                    format!("{other:?} is not one of draining, decommissioned, active"),
                ));
            }
        };
        let s = c.snapshot();
        if !s.nodes.contains_key(&req.node) {
            return Err(refuse(
                "node",
                PlacementError::UnknownNode { node: req.node },
            ));
        }
        if admin != Admin::Active {
            let (nodes, tablets, replication) = c.cluster_view(&s);
            let cluster = Cluster {
                nodes: &nodes,
                tablets: &tablets,
                replication,
            };
            cluster
                .check_drain(req.node)
                .map_err(|e| refuse("node", e))?;
        }
        match c
            .propose(Command::SetAdmin {
                node: req.node,
                admin,
            })
            .await?
        {
            Reply::Refused(r) => Err(refuse("node", r)),
            _ => Ok(Response::new(pb::IntentList {
                intents: Vec::new(),
            })),
        }
    }

    async fn list_cell_tablets(
        &self,
        request: Request<pb::ListCellTabletsRequest>,
    ) -> Result<Response<pb::ListCellTabletsResponse>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let only = request.into_inner().tablet;
        let leaders = c.leaders();
        let s = c.quorum.state();
        if let Some(id) = only
            && !s.tablets.contains_key(&id)
        {
            return Err(stele_proto::Error::TabletNotFound { tablet: id }.into());
        }
        let tablets = s
            .tablets
            .values()
            .filter(|t| only.is_none_or(|id| id == t.id))
            .map(|t| {
                let mut replicas: Vec<pb::ReplicaInfo> = t
                    .voters
                    .iter()
                    .map(|r| pb::ReplicaInfo {
                        replica_id: r.replica_id,
                        node: r.node,
                        role: "voter".into(),
                    })
                    .collect();
                if let Some(l) = t.leaving {
                    replicas.push(pb::ReplicaInfo {
                        replica_id: l.replica_id,
                        node: l.node,
                        role: "leaving".into(),
                    });
                }
                pb::CellTablet {
                    id: t.id,
                    vshard_lo: t.lo,
                    vshard_hi: t.hi,
                    generation: t.generation,
                    replicas,
                    leader_node: leaders.get(&t.id).map_or(0, |r| node_of(r.replica_id)),
                    intent: t.intent,
                    last_change: last_change(&s, t.id).map(intent_pb),
                }
            })
            .collect();
        Ok(Response::new(pb::ListCellTabletsResponse { tablets }))
    }

    async fn move_tablet(
        &self,
        request: Request<pb::MoveTabletRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        let (nodes, tablets, replication) = c.cluster_view(&s);
        let cluster = Cluster {
            nodes: &nodes,
            tablets: &tablets,
            replication,
        };
        cluster
            .check_move(req.tablet, req.from, req.to)
            .map_err(|e| refuse("move", e))?;
        let reply = c
            .propose(Command::StartMove {
                tablet: req.tablet,
                from: req.from,
                to: req.to,
                reason: "operator".into(),
                expect_generation: req.expect_generation,
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        if c.quorum
            .state()
            .nodes
            .get(&req.to)
            .is_none_or(|n| n.placement_state() != NodeState::Up)
        {
            return Err(refuse("to", format!("node {} is not an up node", req.to)));
        }
        let reply = c
            .propose(Command::TransferLeader {
                tablet: req.tablet,
                to: req.to,
                reason: "operator".into(),
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn enable_format(
        &self,
        request: Request<pb::EnableFormatRequest>,
    ) -> Result<Response<pb::EnableFormatResponse>, Status> {
        crate::formats::enable(&self.0, request).await
    }

    async fn issue_token(
        &self,
        request: Request<pb::IssueTokenRequest>,
    ) -> Result<Response<pb::IssueTokenResponse>, Status> {
        crate::tokens::issue(&self.0, request.into_inner()).await
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        crate::tokens::revoke(&self.0, request.into_inner()).await
    }

    async fn list_tokens(
        &self,
        _: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        Ok(crate::tokens::list(&self.0))
    }

    async fn restart_safe(
        &self,
        request: Request<pb::RestartSafeRequest>,
    ) -> Result<Response<pb::RestartSafeResponse>, Status> {
        crate::restart::restart_safe(&self.0, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn split_tablet(
        &self,
        request: Request<pb::SplitTabletRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        if let Some(why) = s.split_refusal(req.tablet, req.expect_generation) {
            return Err(refuse("tablet", why));
        }
        let t = &s.tablets[&req.tablet];
        let at = CellState::split_point(t, req.at).map_err(|e| refuse("at", e))?;
        if req.dry_run {
            // The plan as StartSplit would record it, recorded nowhere.
            let mut plan = s.clone();
            let reply = plan.apply(Command::StartSplit {
                tablet: req.tablet,
                at,
                reason: "operator (dry run)".into(),
                expect_generation: req.expect_generation,
            });
            return match reply {
                Reply::Intent(id) => {
                    let mut i = intent_pb(&plan.intents[&id]);
                    i.id = 0;
                    i.state = "plan".into();
                    Ok(Response::new(i))
                }
                Reply::Refused(r) => Err(refuse("tablet", r)),
                Reply::Ok => Err(Status::internal("no plan")),
            };
        }
        let reply = c
            .propose(Command::StartSplit {
                tablet: req.tablet,
                at,
                reason: "operator".into(),
                expect_generation: req.expect_generation,
            })
            .await?;
        intent_reply(c, reply)
    }

    async fn merge_tablets(
        &self,
        request: Request<pb::MergeTabletsRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let req = request.into_inner();
        let s = c.snapshot();
        s.merge_refusal(
            req.a,
            req.b,
            req.expect_generation_a,
            req.expect_generation_b,
        )
        .map_err(|why| refuse("tablet", why))?;
        let cmd = Command::StartMerge {
            a: req.a,
            b: req.b,
            reason: if req.dry_run {
                "operator (dry run)".into()
            } else {
                "operator".into()
            },
            expect_generation_a: req.expect_generation_a,
            expect_generation_b: req.expect_generation_b,
        };
        if req.dry_run {
            let mut plan = s.clone();
            return match plan.apply(cmd) {
                Reply::Intent(id) => {
                    let mut i = intent_pb(&plan.intents[&id]);
                    i.id = 0;
                    // The phase it would start in: colocating or freezing.
                    i.detail = std::mem::replace(&mut i.state, "plan".into());
                    Ok(Response::new(i))
                }
                Reply::Refused(r) => Err(refuse("tablet", r)),
                Reply::Ok => Err(Status::internal("no plan")),
            };
        }
        let reply = c.propose(cmd).await?;
        intent_reply(c, reply)
    }

    async fn abort_intent(
        &self,
        request: Request<pb::AbortIntentRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let c = &self.0;
        c.require_leader()?;
        let id = request.into_inner().id;
        let s = c.snapshot();
        let Some(i) = s.intents.get(&id) else {
            return Err(refuse("id", format!("no intent {id}")));
        };
        if i.state != IntentState::Pending {
            return Err(refuse("id", format!("intent {id} has finished")));
        }
        let past = match &i.kind {
            IntentKind::Split {
                child, generation, ..
            } => c.health().split_progress(i.tablet, *child, *generation).1,
            IntentKind::Move { new_replica, .. } => c
                .leaders()
                .get(&i.tablet)
                .is_some_and(|r| r.voters.contains(new_replica) || r.joint),
            IntentKind::TransferLeader { .. } => false,
            IntentKind::Merge { phase, moving, .. } => {
                *phase == MergePhase::Merge
                    || (*moving != 0
                        && c.leaders()
                            .get(&i.tablet)
                            .is_some_and(|r| r.voters.contains(moving) || r.joint))
            }
        };
        if past {
            return Err(refuse(
                "id",
                format!("intent {id} is past its point of no return; it completes"),
            ));
        }
        c.propose(Command::FailIntent {
            intent: id,
            reason: "aborted by the operator".into(),
        })
        .await?;
        match c.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(Status::internal("intent vanished")),
        }
    }

    async fn get_intent(
        &self,
        request: Request<pb::GetIntentRequest>,
    ) -> Result<Response<pb::Intent>, Status> {
        let id = request.into_inner().id;
        match self.0.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(refuse("id", format!("no intent {id}"))),
        }
    }
}

/// The latest split or merge that made or changed `tablet`: one it split
/// (or was split from), or one it survived.
fn last_change(s: &CellState, tablet: u64) -> Option<&IntentRec> {
    s.intents.values().rev().find(|i| match &i.kind {
        IntentKind::Split { child, .. } => i.tablet == tablet || *child == tablet,
        IntentKind::Merge { .. } => i.tablet == tablet,
        _ => false,
    })
}

fn intent_reply(c: &Controller, reply: Reply) -> Result<Response<pb::Intent>, Status> {
    match reply {
        Reply::Intent(id) => match c.quorum.state().intents.get(&id) {
            Some(i) => Ok(Response::new(intent_pb(i))),
            None => Err(Status::internal("intent vanished")),
        },
        Reply::Refused(r) => Err(refuse("request", r)),
        Reply::Ok => Err(Status::internal("no intent recorded")),
    }
}

pub(crate) fn intent_pb(i: &IntentRec) -> pb::Intent {
    let (kind, from, to) = match &i.kind {
        IntentKind::Move { from, to, .. } => ("move", *from, *to),
        IntentKind::TransferLeader { to } => ("transfer-leader", 0, *to),
        IntentKind::Split { .. } => ("split", 0, 0),
        IntentKind::Merge { .. } => ("merge", 0, 0),
    };
    let (at, child, vshard_lo, vshard_hi, absorbed) = match &i.kind {
        IntentKind::Split {
            at, child, lo, hi, ..
        } => (*at, *child, *lo, *hi, 0),
        IntentKind::Merge {
            absorbed, lo, hi, ..
        } => (0, 0, *lo, *hi, *absorbed),
        _ => (0, 0, 0, 0, 0),
    };
    let pending = match &i.kind {
        IntentKind::Merge { phase, .. } => match phase {
            MergePhase::Colocate => "colocating",
            MergePhase::Freeze => "freezing",
            MergePhase::Merge => "merging",
        },
        _ => "pending",
    };
    let (state, detail, done, generation) = match &i.state {
        IntentState::Pending => (pending, String::new(), false, 0),
        IntentState::Done { generation } => ("done", String::new(), true, *generation),
        IntentState::Failed { reason } => ("failed", reason.clone(), true, 0),
    };
    pb::Intent {
        id: i.id,
        kind: format!("{kind} ({})", i.reason),
        tablet: i.tablet,
        from,
        to,
        state: state.into(),
        detail,
        done,
        generation,
        at,
        child,
        vshard_lo,
        vshard_hi,
        reason: i.reason.clone(),
        absorbed,
    }
}
