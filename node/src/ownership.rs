//! Which namespaces this node's cell owns, as the global directory says.
//!
//! A node of a directory-managed cell (`--directory`) serves a namespace
//! only if the directory placed it on this cell; a request for another
//! cell's namespace (from a stale or lying client) is refused with
//! `WrongCell` naming the owner, before anything is written. The first
//! request for a namespace asks the directory; the answer is kept in
//! memory and in the catalog for good, since a namespace never changes
//! cell. So the directory is off the data path: a namespace this node has
//! served keeps working, across restarts, while the directory is down.

use std::time::Duration;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use stele_client::admin::DirectoryAdmin;
use stele_proto::Error as ApiError;
use stele_proto::pb;

use crate::catalog::Catalog;

/// Where the directory is and which cell this node belongs to.
#[derive(Debug, Clone)]
pub struct DirectoryLink {
    /// Directory members (`http://host:port`); any one will do.
    pub endpoints: Vec<String>,
    /// This node's cell id, as registered in the directory.
    pub cell: String,
    /// Per directory call (and per connection attempt).
    pub timeout: Duration,
    /// For `https://` members: the CA (and this node's certificate).
    pub tls: Option<stele_tls::ClientTls>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    cell: String,
    controllers: Vec<String>,
}

pub struct Ownership {
    link: DirectoryLink,
    /// The directory members, leader followed; the error when the link's
    /// endpoints are unusable (every lookup then answers `Unavailable`,
    /// saying why).
    directory: Result<DirectoryAdmin, stele_client::Error>,
    owners: DashMap<String, Owner>,
    /// One directory lookup at a time (misses are rare: once per namespace).
    filling: tokio::sync::Mutex<()>,
}

impl Ownership {
    /// Loads the owners cached in the catalog.
    pub fn open(link: DirectoryLink, catalog: &Catalog) -> crate::Result<Ownership> {
        let owners = DashMap::new();
        for (ns, bytes) in catalog.namespace_owners()? {
            let owner: Owner = crate::catalog::from_cbor("namespace owner", &bytes)?;
            owners.insert(ns, owner);
        }
        let directory = directory(&link);
        if let Err(e) = &directory {
            tracing::error!(error = %e, "directory endpoints unusable: namespaces not cached here will be refused as unavailable");
        }
        Ok(Ownership {
            directory,
            link,
            owners,
            filling: tokio::sync::Mutex::new(()),
        })
    }

    pub fn cell(&self) -> &str {
        &self.link.cell
    }

    /// Namespaces whose owner is cached.
    pub fn known(&self) -> usize {
        self.owners.len()
    }

    fn verdict(&self, namespace: &str, owner: &Owner) -> Result<(), ApiError> {
        if owner.cell == self.link.cell {
            Ok(())
        } else {
            Err(ApiError::WrongCell {
                namespace: namespace.to_string(),
                cell: owner.cell.clone(),
                controllers: owner.controllers.clone(),
            })
        }
    }

    /// Ok if this cell owns `namespace`; `WrongCell`, `NamespaceNotFound`,
    /// or `Unavailable` (directory unreachable, namespace never seen).
    pub async fn check(&self, namespace: &str, catalog: &Catalog) -> Result<(), ApiError> {
        if let Some(owner) = self.owners.get(namespace) {
            return self.verdict(namespace, &owner);
        }
        let _one = self.filling.lock().await;
        if let Some(owner) = self.owners.get(namespace) {
            return self.verdict(namespace, &owner);
        }
        let owner = self.lookup(namespace).await?;
        catalog
            .put_namespace_owner(namespace, &crate::catalog::to_cbor(&owner))
            .map_err(|e| ApiError::Unavailable {
                reason: format!("cache namespace owner: {e}"),
            })?;
        let verdict = self.verdict(namespace, &owner);
        self.owners.insert(namespace.to_string(), owner);
        verdict
    }

    /// Asks the directory members in turn, following leader hints: one
    /// pass, each call bounded by the link's timeout.
    async fn lookup(&self, namespace: &str) -> Result<Owner, ApiError> {
        let unavailable = |e: &dyn std::fmt::Display| ApiError::Unavailable {
            reason: format!(
                "namespace {namespace:?} is not known to this node and the directory did not answer ({e})"
            ),
        };
        let directory = self.directory.as_ref().map_err(|e| unavailable(e))?;
        let timeout = self.link.timeout;
        let reply = directory
            .call(|mut c| {
                let mut req = tonic::Request::new(pb::GetNamespaceRequest {
                    name: namespace.to_string(),
                    create_if_missing: false,
                });
                req.set_timeout(timeout);
                async move { c.get_namespace(req).await }
            })
            .await;
        match reply {
            Ok(r) => Ok(Owner {
                cell: r.cell,
                controllers: r.controllers,
            }),
            Err(stele_client::Error::Api(e @ ApiError::NamespaceNotFound { .. })) => Err(e),
            Err(e) => Err(unavailable(&e)),
        }
    }
}

/// The leader-following client of the directory, bounded as a lookup on the
/// request path: one pass over the members, `link.timeout` per call and per
/// connection, no waiting through an election.
fn directory(link: &DirectoryLink) -> Result<DirectoryAdmin, stele_client::Error> {
    let mut d = DirectoryAdmin::with_tls(link.endpoints.clone(), link.tls.clone())?;
    d.request_timeout = link.timeout;
    d.connect_timeout = link.timeout;
    d.rounds_max = 1;
    // Bounded by the one pass, not by time.
    d.deadline = Duration::MAX;
    d.round_pause = Duration::ZERO;
    Ok(d)
}
