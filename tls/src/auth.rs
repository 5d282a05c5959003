//! Who may call what: one table from gRPC method to the role it needs,
//! enforced by a tower layer in front of every service of a TLS listener.
//!
//! ```text
//! request ─► caller = roles of the verified client certificate (none without one)
//!         ─► need(path) ─► met:  Caller into the request's extensions ─► service
//!                       └► not:  PermissionDenied, counted
//!                                (stele_auth_refused_total{method,need}), nothing runs
//! ```
//!
//! Checks that need the request body are the service's own, with the
//! [`Caller`] the layer left: a heartbeat's node id must be the caller's
//! ([`Caller::may_act_as_node`]).
//!
//! A plaintext listener (dev cells, `--insecure-plaintext`) has no caller
//! identity to check: the layer lets everything through and leaves
//! [`Caller::plaintext`], and services skip their own checks. That is the
//! meaning of plaintext; `stele server` refuses it off loopback unless
//! told.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::roles::{Kind, Role, roles_of};

/// The caller of one request, as the layer established it.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// The request came over TLS (roles are then authoritative).
    pub tls: bool,
    /// The roles of its verified certificate; empty without one.
    pub roles: Vec<Role>,
}

impl Caller {
    pub fn plaintext() -> Caller {
        Caller {
            tls: false,
            roles: Vec::new(),
        }
    }

    /// Whether this caller may act as node `id`: plaintext, or a node
    /// certificate for exactly that id.
    pub fn may_act_as_node(&self, id: u64) -> bool {
        !self.tls || self.roles.contains(&Role::Node(id))
    }

    pub fn has(&self, kind: Kind) -> bool {
        self.roles.iter().any(|r| r.kind() == kind)
    }

    /// The caller's roles for a refusal message.
    pub fn describe(&self) -> String {
        if !self.tls {
            return "a plaintext caller".into();
        }
        if self.roles.is_empty() {
            return "a caller without a certificate".into();
        }
        self.roles
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The caller of a tonic request (plaintext when the layer left none).
    pub fn of<T>(req: &tonic::Request<T>) -> Caller {
        req.extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default()
    }
}

/// What a method needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Any caller that completed TLS (health, reflection, reads of routes
    /// and status, the data API until tokens).
    Anyone,
    /// A certificate with a role of this kind.
    Role(Kind),
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Need::Anyone => f.write_str("anyone"),
            Need::Role(k) => write!(f, "{k}"),
        }
    }
}

/// The method table of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Which quorum's members may send `Quorum/Raft` here: controllers on
    /// a controller, directory members on a directory member, nobody
    /// elsewhere.
    pub quorum: Option<Kind>,
}

/// Operator methods of the controller API.
const CONTROLLER_OPERATOR: &[&str] = &[
    "Init",
    "SetNodeState",
    "MoveTablet",
    "TransferLeader",
    "SplitTablet",
    "MergeTablets",
    "AbortIntent",
    "RestartSafe",
    "EnableFormat",
    "IssueToken",
    "RevokeToken",
    "ListTokens",
];
/// Reads of the controller API, open to any caller.
const CONTROLLER_READ: &[&str] = &[
    "GetRoutes",
    "WatchRoutes",
    "CellStatus",
    "ListNodes",
    "ListCellTablets",
    "GetIntent",
];
const DIRECTORY_OPERATOR: &[&str] = &[
    "DirectoryInit",
    "RegisterCell",
    "RetireCell",
    "CreateNamespace",
    "UpdateNamespace",
];
const DIRECTORY_READ: &[&str] = &[
    "DirectoryStatus",
    "ListCells",
    "GetNamespace",
    "ListNamespaces",
    "WatchNamespaces",
];

impl Policy {
    /// What a gRPC path (`/package.Service/Method`) needs; `None` for a
    /// method this table does not know, which nobody may call.
    pub fn need(&self, path: &str) -> Option<Need> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        match service {
            "grpc.health.v1.Health"
            | "grpc.reflection.v1.ServerReflection"
            | "grpc.reflection.v1alpha.ServerReflection"
            | "stele.v1.Data" => Some(Need::Anyone),
            "stele.v1.Quorum" if method == "Raft" => self.quorum.map(Need::Role),
            "stele.v1.Controller" => {
                if method == "Heartbeat" {
                    Some(Need::Role(Kind::Node))
                } else if CONTROLLER_OPERATOR.contains(&method) {
                    Some(Need::Role(Kind::Operator))
                } else if CONTROLLER_READ.contains(&method) {
                    Some(Need::Anyone)
                } else {
                    None
                }
            }
            "stele.v1.Directory" => {
                if DIRECTORY_OPERATOR.contains(&method) {
                    Some(Need::Role(Kind::Operator))
                } else if DIRECTORY_READ.contains(&method) {
                    Some(Need::Anyone)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// Whether `caller` may call `path`, and if not, why.
    pub fn check(&self, path: &str, caller: &Caller) -> Result<(), String> {
        if !caller.tls {
            return Ok(());
        }
        match self.need(path) {
            Some(Need::Anyone) => Ok(()),
            Some(Need::Role(kind)) if caller.has(kind) => Ok(()),
            Some(need) => Err(format!(
                "{path} needs a {need} certificate; the caller is {}",
                caller.describe()
            )),
            None => Err(format!(
                "{path}: not a method this listener serves to anyone"
            )),
        }
    }
}

/// The layer that enforces a [`Policy`].
#[derive(Clone, Debug)]
pub struct AuthLayer {
    policy: Arc<Policy>,
}

impl AuthLayer {
    pub fn new(policy: Policy) -> AuthLayer {
        AuthLayer {
            policy: Arc::new(policy),
        }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            policy: self.policy.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Auth<S> {
    inner: S,
    policy: Arc<Policy>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for Auth<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let caller = match req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() {
            None => Caller::plaintext(),
            Some(info) => Caller {
                tls: true,
                roles: info
                    .peer_certs()
                    .and_then(|certs| certs.first().map(|c| cached_roles(c)))
                    .unwrap_or_default(),
            },
        };
        let path = req.uri().path().to_string();
        if let Err(why) = self.policy.check(&path, &caller) {
            refused(&path, &why);
            let status = tonic::Status::permission_denied(why);
            return Box::pin(async move { Ok(status.into_http()) });
        }
        req.extensions_mut().insert(caller);
        Box::pin(self.inner.call(req))
    }
}

/// Certificates whose roles were read, by their DER bytes: a client sends
/// many requests on one connection, and parsing its certificate each time
/// costs more than the lookup.
const ROLES_CACHED_MAX: usize = 1024;

/// The roles of a verified client certificate (none if it names none).
fn cached_roles(cert: &rustls_pki_types::CertificateDer<'_>) -> Vec<Role> {
    use std::collections::HashMap;
    use std::sync::{OnceLock, RwLock};
    static CACHE: OnceLock<RwLock<HashMap<Vec<u8>, Vec<Role>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(roles) = cache.read().expect("lock poisoned").get(cert.as_ref()) {
        return roles.clone();
    }
    let roles = roles_of(cert).unwrap_or_default();
    let mut c = cache.write().expect("lock poisoned");
    if c.len() >= ROLES_CACHED_MAX {
        c.clear();
    }
    c.insert(cert.to_vec(), roles.clone());
    roles
}

/// Logs and counts one refusal (`stele_auth_refused_total{method}`).
pub fn refused(method: &str, why: &str) {
    metrics::counter!("stele_auth_refused_total", "method" => method.to_string()).increment(1);
    tracing::warn!(method, reason = why, "request refused");
}

/// The `PermissionDenied` a service answers when its own check (one that
/// needs the request body) fails; counted like the layer's refusals.
pub fn deny(method: &str, why: String) -> tonic::Status {
    refused(method, &why);
    tonic::Status::permission_denied(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(roles: Vec<Role>) -> Caller {
        Caller { tls: true, roles }
    }

    #[test]
    fn the_table_refuses_what_it_should() {
        let controller = Policy {
            quorum: Some(Kind::Controller),
        };
        let op = tls(vec![Role::Operator("ann".into())]);
        let node = tls(vec![Role::Node(3)]);
        let nobody = tls(vec![]);
        let ctl = tls(vec![Role::Controller(2)]);
        let p = |m: &str| format!("/stele.v1.Controller/{m}");
        assert!(controller.check(&p("MoveTablet"), &op).is_ok());
        assert!(controller.check(&p("MoveTablet"), &node).is_err());
        assert!(controller.check(&p("MoveTablet"), &nobody).is_err());
        assert!(controller.check(&p("Heartbeat"), &node).is_ok());
        assert!(controller.check(&p("Heartbeat"), &op).is_err());
        assert!(controller.check(&p("GetRoutes"), &nobody).is_ok());
        assert!(controller.check(&p("NoSuchMethod"), &op).is_err());
        assert!(controller.check("/stele.v1.Quorum/Raft", &ctl).is_ok());
        assert!(controller.check("/stele.v1.Quorum/Raft", &node).is_err());
        assert!(controller.check("/stele.v1.Quorum/Raft", &op).is_err());
        let dir = Policy {
            quorum: Some(Kind::Directory),
        };
        assert!(dir.check("/stele.v1.Quorum/Raft", &ctl).is_err());
        assert!(dir.check("/stele.v1.Directory/RegisterCell", &ctl).is_err());
        assert!(dir.check("/stele.v1.Directory/RegisterCell", &op).is_ok());
        assert!(
            dir.check("/stele.v1.Directory/WatchNamespaces", &nobody)
                .is_ok()
        );
        assert!(
            dir.check("/stele.v1.Directory/GetNamespace", &nobody)
                .is_ok()
        );
        let node_port = Policy { quorum: None };
        assert!(node_port.check("/stele.v1.Quorum/Raft", &ctl).is_err());
        assert!(node_port.check("/stele.v1.Data/Append", &nobody).is_ok());
        assert!(node_port.check("/other.Service/X", &op).is_err());
        // Plaintext listeners check nothing.
        assert!(
            node_port
                .check("/stele.v1.Quorum/Raft", &Caller::plaintext())
                .is_ok()
        );
        assert!(tls(vec![Role::Node(3)]).may_act_as_node(3));
        assert!(!tls(vec![Role::Node(3)]).may_act_as_node(4));
        assert!(!tls(vec![Role::Operator("x".into())]).may_act_as_node(4));
        assert!(Caller::plaintext().may_act_as_node(4));
    }
}
