//! A directory process: one member of the directory quorum and its gRPC
//! API. Changes go through the leader; a lookup of a namespace that exists
//! is answered by any member from its applied state, since a namespace
//! never changes cell (its policy may lag the leader by a heartbeat).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stele_proto::pb;
use stele_quorum::{Quorum, QuorumService, QuorumTiming, refuse};
use tonic::{Request, Response, Status};

use crate::state::{
    CellRec, Command, DirectoryState, NamespaceRec, Policy, Reply, from_cbor, to_cbor,
};

#[derive(Debug, Clone)]
pub struct DirectoryOptions {
    pub id: u64,
    pub data_dir: PathBuf,
    /// A lookup with `create_if_missing` creates an unknown namespace on
    /// the least-loaded cell (`stele dev`); off by default.
    pub auto_create: bool,
    pub timing: QuorumTiming,
    /// For `https://` members: the CA and this member's certificate.
    pub tls: Option<stele_tls::ClientTls>,
    /// Back the directory state up to a bucket (`None`: no bucket).
    pub backup: Option<crate::backup::DirectoryBackup>,
}

impl DirectoryOptions {
    pub fn new(id: u64, data_dir: PathBuf) -> DirectoryOptions {
        DirectoryOptions {
            id,
            data_dir,
            auto_create: false,
            timing: QuorumTiming::default(),
            backup: None,
            tls: None,
        }
    }
}

pub struct Directory {
    pub opts: DirectoryOptions,
    pub quorum: Arc<Quorum<DirectoryState>>,
    /// Ends the directory's own tasks (its backups).
    cancel: tokio_util::sync::CancellationToken,
}

fn quorum_status(e: stele_quorum::Error) -> Status {
    e.into()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn policy_of(p: Option<pb::NamespacePolicy>) -> Policy {
    let p = p.unwrap_or_default();
    Policy {
        retention_s: p.retention_s,
        size_limit_bytes: p.size_limit_bytes,
    }
}

fn cell_pb(c: &CellRec, s: &DirectoryState) -> pb::CellRecord {
    pb::CellRecord {
        id: c.id.clone(),
        controllers: c.controllers.clone(),
        labels: c.labels.clone().into_iter().collect(),
        status: c.status.name().into(),
        namespaces: s.namespaces.values().filter(|n| n.cell == c.id).count() as u64,
        generation: c.generation,
    }
}

pub(crate) fn namespace_pb(n: &NamespaceRec, s: &DirectoryState) -> pb::NamespaceRecord {
    pb::NamespaceRecord {
        name: n.name.clone(),
        cell: n.cell.clone(),
        controllers: s
            .cells
            .get(&n.cell)
            .map(|c| c.controllers.clone())
            .unwrap_or_default(),
        state: "active".into(),
        created_us: n.created_us,
        policy: Some(pb::NamespacePolicy {
            retention_s: n.policy.retention_s,
            size_limit_bytes: n.policy.size_limit_bytes,
        }),
        generation: n.generation,
    }
}

impl Directory {
    pub async fn start(opts: DirectoryOptions) -> stele_quorum::Result<Arc<Directory>> {
        let quorum = Quorum::open_with(
            &opts.data_dir.join("directory"),
            opts.id,
            DirectoryState::new(),
            &opts.timing,
            opts.tls.clone(),
            stele_tls::Kind::Directory,
        )
        .await?;
        let d = Arc::new(Directory {
            opts,
            quorum: Arc::new(quorum),
            cancel: Default::default(),
        });
        if let Some(b) = d.opts.backup.clone() {
            crate::backup::spawn(d.quorum.clone(), b, d.cancel.child_token());
        }
        Ok(d)
    }

    /// The gRPC services to mount: the directory API and quorum peering.
    pub fn services(
        self: &Arc<Self>,
    ) -> (
        pb::directory_server::DirectoryServer<Api>,
        pb::quorum_server::QuorumServer<QuorumService<DirectoryState>>,
    ) {
        (
            pb::directory_server::DirectoryServer::new(Api(self.clone())),
            pb::quorum_server::QuorumServer::new(QuorumService(self.quorum.clone()))
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
        )
    }

    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.quorum.shutdown().await;
    }

    async fn propose(&self, cmd: Command) -> Result<Reply, Status> {
        let bytes = self
            .quorum
            .propose(to_cbor(&cmd))
            .await
            .map_err(quorum_status)?;
        from_cbor(&bytes).map_err(|e| Status::internal(format!("directory reply: {e}")))
    }

    /// Waits until this member may answer as of now: it leads and has
    /// applied everything committed before the call.
    async fn read_barrier(&self) -> Result<(), Status> {
        if self.quorum.leader().is_none() {
            return Err(stele_proto::Error::Unavailable {
                reason: "the directory has no leader".into(),
            }
            .into());
        }
        self.quorum.linearizable().await.map_err(quorum_status)
    }

    fn namespace_reply(&self, r: Reply) -> Result<pb::NamespaceRecord, Status> {
        let s = self.quorum.state();
        match r {
            Reply::Namespace(ns) | Reply::Exists(ns) => Ok(namespace_pb(&ns, &s)),
            Reply::Refused(reason) => Err(refuse("namespace", reason)),
            Reply::Cell(_) => Err(Status::internal("unexpected directory reply")),
        }
    }

    fn cell_reply(&self, r: Reply) -> Result<pb::CellRecord, Status> {
        let s = self.quorum.state();
        match r {
            Reply::Cell(c) => Ok(cell_pb(&c, &s)),
            Reply::Refused(reason) => Err(refuse("cell", reason)),
            _ => Err(Status::internal("unexpected directory reply")),
        }
    }

    async fn create(
        &self,
        name: String,
        cell: Option<String>,
        policy: Policy,
    ) -> Result<Reply, Status> {
        stele_proto::limits::validate_namespace(&name)?;
        self.propose(Command::CreateNamespace {
            name,
            cell,
            policy,
            created_us: now_us(),
        })
        .await
    }
}

pub struct Api(Arc<Directory>);

impl Api {
    /// Which cell holds a namespace (created on first use when allowed).
    async fn lookup(
        &self,
        request: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceRecord>, Status> {
        let req = request.into_inner();
        let d = &self.0;
        stele_proto::limits::validate_namespace(&req.name)?;
        // A namespace never changes cell: any member that has it answers.
        {
            let s = d.quorum.state();
            if let Some(ns) = s.namespaces.get(&req.name) {
                return Ok(Response::new(namespace_pb(ns, &s)));
            }
        }
        // Its absence is only known by the leader, as of now.
        d.read_barrier().await?;
        {
            let s = d.quorum.state();
            if let Some(ns) = s.namespaces.get(&req.name) {
                return Ok(Response::new(namespace_pb(ns, &s)));
            }
        }
        if req.create_if_missing && d.opts.auto_create {
            let r = d.create(req.name, None, Policy::default()).await?;
            return Ok(Response::new(d.namespace_reply(r)?));
        }
        Err(stele_proto::Error::NamespaceNotFound {
            namespace: req.name,
        }
        .into())
    }
}

#[tonic::async_trait]
impl pb::directory_server::Directory for Api {
    async fn directory_init(
        &self,
        request: Request<pb::DirectoryInitRequest>,
    ) -> Result<Response<pb::DirectoryInitResponse>, Status> {
        let req = request.into_inner();
        let d = &self.0;
        if !req.members.iter().any(|p| p.id == d.opts.id) {
            return Err(refuse(
                "members",
                format!("this member ({}) is not in the list", d.opts.id),
            ));
        }
        let mut ids: Vec<u64> = req.members.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != req.members.len() || ids.contains(&0) {
            return Err(refuse(
                "members",
                "member ids must be distinct and non-zero",
            ));
        }
        // Members dial each other at these: refuse what nobody can dial.
        for p in &req.members {
            if let Err(e) = stele_proto::addr::dialable_url(&p.endpoint) {
                return Err(refuse("members", format!("member {}: {e}", p.id)));
            }
        }
        let members = req
            .members
            .iter()
            .map(|p| (p.id, p.endpoint.clone()))
            .collect();
        let created = d.quorum.initialize(&members).await.map_err(quorum_status)?;
        d.quorum
            .wait_leader(Duration::from_secs(15))
            .await
            .map_err(quorum_status)?;
        Ok(Response::new(pb::DirectoryInitResponse { created }))
    }

    async fn directory_status(
        &self,
        request: Request<pb::DirectoryStatusRequest>,
    ) -> Result<Response<pb::DirectoryStatusResponse>, Status> {
        let d = &self.0;
        if !request.into_inner().local && !d.quorum.is_leader() {
            d.read_barrier().await?;
        }
        let (leader_id, leader_endpoint) = d.quorum.leader().unwrap_or_default();
        let members = d.quorum.members();
        let s = d.quorum.state();
        Ok(Response::new(pb::DirectoryStatusResponse {
            member_id: d.opts.id,
            leader_id,
            leader_endpoint,
            initialized: !members.is_empty(),
            generation: s.generation,
            cells: s.cells.len() as u64,
            namespaces: s.namespaces.len() as u64,
            members: members
                .into_iter()
                .map(|(id, endpoint)| pb::DirectoryPeer { id, endpoint })
                .collect(),
        }))
    }

    async fn register_cell(
        &self,
        request: Request<pb::RegisterCellRequest>,
    ) -> Result<Response<pb::CellRecord>, Status> {
        let req = request.into_inner();
        let r = self
            .0
            .propose(Command::RegisterCell {
                id: req.id,
                controllers: req.controllers,
                labels: req.labels.into_iter().collect(),
            })
            .await?;
        Ok(Response::new(self.0.cell_reply(r)?))
    }

    async fn list_cells(
        &self,
        _request: Request<pb::ListCellsRequest>,
    ) -> Result<Response<pb::ListCellsResponse>, Status> {
        self.0.read_barrier().await?;
        let s = self.0.quorum.state();
        Ok(Response::new(pb::ListCellsResponse {
            cells: s.cells.values().map(|c| cell_pb(c, &s)).collect(),
            generation: s.generation,
        }))
    }

    async fn retire_cell(
        &self,
        request: Request<pb::RetireCellRequest>,
    ) -> Result<Response<pb::CellRecord>, Status> {
        let id = request.into_inner().id;
        let r = self.0.propose(Command::RetireCell { id }).await?;
        Ok(Response::new(self.0.cell_reply(r)?))
    }

    async fn create_namespace(
        &self,
        request: Request<pb::CreateNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceRecord>, Status> {
        let req = request.into_inner();
        let cell = (!req.cell.is_empty()).then_some(req.cell);
        let r = self
            .0
            .create(req.name.clone(), cell, policy_of(req.policy))
            .await?;
        if let Reply::Exists(ns) = r {
            return Err(refuse(
                "name",
                format!(
                    "namespace {:?} exists already (on cell {:?})",
                    ns.name, ns.cell
                ),
            ));
        }
        Ok(Response::new(self.0.namespace_reply(r)?))
    }

    async fn get_namespace(
        &self,
        request: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceRecord>, Status> {
        let r = self.lookup(request).await;
        crate::metrics::record_lookup(&r);
        r
    }

    async fn list_namespaces(
        &self,
        request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let cell = request.into_inner().cell;
        self.0.read_barrier().await?;
        let s = self.0.quorum.state();
        if !cell.is_empty() && !s.cells.contains_key(&cell) {
            return Err(refuse("cell", format!("no cell {cell:?}")));
        }
        Ok(Response::new(pb::ListNamespacesResponse {
            namespaces: s
                .namespaces
                .values()
                .filter(|n| cell.is_empty() || n.cell == cell)
                .map(|n| namespace_pb(n, &s))
                .collect(),
            generation: s.generation,
        }))
    }

    async fn update_namespace(
        &self,
        request: Request<pb::UpdateNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceRecord>, Status> {
        let req = request.into_inner();
        stele_proto::limits::validate_namespace(&req.name)?;
        let r = self
            .0
            .propose(Command::UpdateNamespace {
                name: req.name,
                policy: policy_of(req.policy),
            })
            .await?;
        Ok(Response::new(self.0.namespace_reply(r)?))
    }

    type WatchNamespacesStream = crate::watch::NamespaceWatch;

    async fn watch_namespaces(
        &self,
        request: Request<pb::WatchNamespacesRequest>,
    ) -> Result<Response<crate::watch::NamespaceWatch>, Status> {
        let since = request.into_inner().since_generation;
        Ok(Response::new(crate::watch::watch(self.0.clone(), since)?))
    }
}
