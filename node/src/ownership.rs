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
    /// Per directory call.
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    cell: String,
    controllers: Vec<String>,
}

pub struct Ownership {
    link: DirectoryLink,
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
        Ok(Ownership {
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

    /// Asks the directory members in turn, following leader hints.
    async fn lookup(&self, namespace: &str) -> Result<Owner, ApiError> {
        let mut endpoints = self.link.endpoints.clone();
        let mut last = String::from("no directory endpoint");
        let mut i = 0;
        // Each member once, plus a few leader hints.
        while i < endpoints.len() && i < self.link.endpoints.len() + 3 {
            let ep = endpoints[i].clone();
            i += 1;
            let channel = match tonic::transport::Endpoint::from_shared(ep.clone()) {
                Ok(e) => e.connect_timeout(self.link.timeout).connect_lazy(),
                Err(e) => {
                    last = format!("{ep}: {e}");
                    continue;
                }
            };
            let mut client = pb::directory_client::DirectoryClient::new(channel);
            let mut req = tonic::Request::new(pb::GetNamespaceRequest {
                name: namespace.to_string(),
                create_if_missing: false,
            });
            req.set_timeout(self.link.timeout);
            match tokio::time::timeout(self.link.timeout, client.get_namespace(req)).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    return Ok(Owner {
                        cell: r.cell,
                        controllers: r.controllers,
                    });
                }
                Ok(Err(status)) => match ApiError::from_status(&status) {
                    e @ ApiError::NamespaceNotFound { .. } => return Err(e),
                    ApiError::NotLeader {
                        leader_endpoint, ..
                    } if !leader_endpoint.is_empty() => {
                        last = format!("{ep}: not the leader");
                        endpoints.push(leader_endpoint);
                    }
                    e => last = format!("{ep}: {e}"),
                },
                Err(_) => last = format!("{ep}: timed out"),
            }
        }
        Err(ApiError::Unavailable {
            reason: format!(
                "namespace {namespace:?} is not known to this node and the directory did not answer ({last})"
            ),
        })
    }
}
