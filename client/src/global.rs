//! A client for many cells: resolves `namespace -> cell` through the
//! directory once, caches the answer, then routes inside the cell as
//! [`Client`] does.
//!
//! The directory is never on the data path: a namespace never changes cell,
//! so a cached answer never goes stale, and a namespace resolved once keeps
//! working while the directory is down. Only a namespace never seen before
//! needs the directory. A cell that refuses a namespace as not its own
//! (`WrongCell`, from a cache filled by hand or a directory restored from
//! an old backup) makes the client resolve it again, once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};

use stele_proto::pb;

use crate::admin::DirectoryAdmin;
use crate::{AppendOutcome, Client, ClientOptions, Condition, ReadOptions, Record, Result, Row};

/// Where a namespace lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub namespace: String,
    pub cell: String,
    /// The owning cell's controllers.
    pub controllers: Vec<String>,
    /// The directory generation of the answer.
    pub generation: u64,
}

#[derive(Clone)]
pub struct GlobalClient {
    inner: Arc<Inner>,
}

struct Inner {
    directory: DirectoryAdmin,
    opts: ClientOptions,
    create_if_missing: bool,
    namespaces: RwLock<HashMap<String, Placement>>,
    cells: tokio::sync::Mutex<HashMap<String, Client>>,
}

impl std::fmt::Debug for GlobalClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalClient")
            .field("directory", &self.inner.directory.endpoints())
            .finish_non_exhaustive()
    }
}

impl GlobalClient {
    /// A client of the cells the directory at `directory` (any members)
    /// knows. Nothing is called until the first request.
    pub fn new(directory: &[String], opts: ClientOptions) -> Result<GlobalClient> {
        Ok(GlobalClient {
            inner: Arc::new(Inner {
                directory: DirectoryAdmin::with_tls(directory.to_vec(), opts.tls.clone())?,
                opts,
                create_if_missing: false,
                namespaces: RwLock::new(HashMap::new()),
                cells: tokio::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Asks the directory to create a namespace it does not know on first
    /// use (it does so only when it runs with auto-creation on, as in
    /// `stele dev`; elsewhere the answer stays `NamespaceNotFound`).
    pub fn create_if_missing(mut self, on: bool) -> GlobalClient {
        Arc::get_mut(&mut self.inner)
            .expect("set before the client is cloned")
            .create_if_missing = on;
        self
    }

    /// The directory's leader-following client (operator calls).
    pub fn directory(&self) -> &DirectoryAdmin {
        &self.inner.directory
    }

    /// The cached placement of a namespace, if resolved before.
    pub fn cached(&self, namespace: &str) -> Option<Placement> {
        self.inner
            .namespaces
            .read()
            .expect("namespace cache lock")
            .get(namespace)
            .cloned()
    }

    /// Drops a cached placement (the next request resolves it again).
    pub fn forget(&self, namespace: &str) {
        self.inner
            .namespaces
            .write()
            .expect("namespace cache lock")
            .remove(namespace);
    }

    /// The namespace's cell: from the cache, else from the directory.
    pub async fn resolve(&self, namespace: &str) -> Result<Placement> {
        stele_proto::limits::validate_namespace(namespace)?;
        if let Some(p) = self.cached(namespace) {
            return Ok(p);
        }
        let create = self.inner.create_if_missing;
        let ns = self
            .inner
            .directory
            .call(|mut c| {
                let name = namespace.to_string();
                async move {
                    c.get_namespace(pb::GetNamespaceRequest {
                        name,
                        create_if_missing: create,
                    })
                    .await
                }
            })
            .await?;
        let p = Placement {
            namespace: ns.name,
            cell: ns.cell,
            controllers: ns.controllers,
            generation: ns.generation,
        };
        self.inner
            .namespaces
            .write()
            .expect("namespace cache lock")
            .insert(namespace.to_string(), p.clone());
        Ok(p)
    }

    /// A client of the cell that holds `namespace`.
    pub async fn cell(&self, namespace: &str) -> Result<Client> {
        let p = self.resolve(namespace).await?;
        let mut cells = self.inner.cells.lock().await;
        if let Some(c) = cells.get(&p.cell) {
            return Ok(c.clone());
        }
        let c = Client::connect_cell(&p.controllers, self.inner.opts.clone()).await?;
        cells.insert(p.cell.clone(), c.clone());
        Ok(c)
    }

    /// Runs `f` against the namespace's cell; if that cell refuses the
    /// namespace as another cell's, resolves it again and retries once.
    pub async fn with_cell<T, F, Fut>(&self, namespace: &str, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let client = self.cell(namespace).await?;
        match f(client).await {
            Err(e) if matches!(e.api(), Some(stele_proto::Error::WrongCell { .. })) => {
                tracing::info!(namespace, error = %e, "namespace is on another cell: resolving again");
                self.forget(namespace);
                f(self.cell(namespace).await?).await
            }
            other => other,
        }
    }

    pub async fn append(&self, namespace: &str, records: Vec<Record>) -> Result<Vec<pb::Position>> {
        self.with_cell(namespace, |c| {
            let records = records.clone();
            async move { c.append(namespace, records).await }
        })
        .await
    }

    /// As [`Client::append_batch`]; pass `batch_id` to retry a batch whose
    /// outcome is unknown.
    pub async fn append_batch(
        &self,
        namespace: &str,
        records: Vec<Record>,
        expect: Option<Condition>,
        batch_id: Option<[u8; 16]>,
    ) -> Result<AppendOutcome> {
        // One id across a re-resolve, so a retry is applied at most once.
        let batch_id = batch_id.unwrap_or_else(crate::new_batch_id);
        self.with_cell(namespace, |c| {
            let records = records.clone();
            let expect = expect.clone();
            async move {
                c.append_batch(namespace, records, expect, Some(batch_id))
                    .await
            }
        })
        .await
    }

    pub async fn get(&self, namespace: &str, key: &[u8], read: ReadOptions) -> Result<Option<Row>> {
        self.with_cell(
            namespace,
            |c| async move { c.get(namespace, key, read).await },
        )
        .await
    }

    pub async fn scan_all(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        self.with_cell(namespace, |c| async move {
            c.scan_all(namespace, ts_from, ts_to, key_prefix, read)
                .await
        })
        .await
    }

    pub async fn scan_key_all(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        self.with_cell(namespace, |c| async move {
            c.scan_key_all(namespace, key, ts_from, ts_to, read).await
        })
        .await
    }
}
