//! A client for many cells: resolves `namespace -> cell` through the
//! directory once, caches the answer, then routes inside the cell as
//! [`Client`] does.
//!
//! The directory is never on the data path: a namespace resolved once
//! keeps working while the directory is down. Only a namespace never seen
//! before needs the directory. The cached answers are kept current from
//! the directory's pushed namespace map (`WatchNamespaces`, opened at the
//! first resolve): a namespace whose cell's controllers changed is routed
//! by the new ones from the next request. A cell that refuses a namespace
//! as not its own (`WrongCell`, from a cache filled by hand or a directory
//! restored from an old backup) makes the client resolve it again, once.
//!
//! ```text
//! resolve ─▶ cache hit, else GetNamespace ─▶ cache
//! WatchNamespaces(since = generation held) at the directory leader
//!   ├─ each message ─▶ replace the cached placements it names; a cell
//!   │                  whose controllers changed: its client dropped
//!   └─ ends or fails ─▶ wait (250 ms doubling to 5 s) ─▶ open again
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

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

impl Placement {
    fn of(ns: pb::NamespaceRecord) -> Placement {
        Placement {
            namespace: ns.name,
            cell: ns.cell,
            controllers: ns.controllers,
            generation: ns.generation,
        }
    }
}

#[derive(Clone)]
pub struct GlobalClient {
    inner: Arc<Inner>,
}

struct Inner {
    directory: DirectoryAdmin,
    opts: ClientOptions,
    create_if_missing: bool,
    watch_namespaces: bool,
    namespaces: RwLock<HashMap<String, Placement>>,
    cells: tokio::sync::Mutex<HashMap<String, Client>>,
    /// The directory generation of the last pushed map applied.
    generation: AtomicU64,
    /// Pushed namespace maps applied.
    pushed: AtomicU64,
    /// The namespace watch, started at the first resolve.
    watch: OnceLock<tokio::task::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.watch.get() {
            task.abort();
        }
    }
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
                watch_namespaces: true,
                namespaces: RwLock::new(HashMap::new()),
                cells: tokio::sync::Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
                pushed: AtomicU64::new(0),
                watch: OnceLock::new(),
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

    /// Keep cached placements current from the directory's pushed map (on
    /// by default); off, a placement changes only when a cell refuses it.
    pub fn watch_namespaces(mut self, on: bool) -> GlobalClient {
        Arc::get_mut(&mut self.inner)
            .expect("set before the client is cloned")
            .watch_namespaces = on;
        self
    }

    /// Pushed namespace maps applied so far, and the directory generation
    /// they brought the cache to.
    pub fn namespace_pushes(&self) -> (u64, u64) {
        (
            self.inner.pushed.load(Ordering::Relaxed),
            self.inner.generation.load(Ordering::Relaxed),
        )
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
        if self.inner.watch_namespaces {
            self.inner
                .watch
                .get_or_init(|| tokio::spawn(watch(Arc::downgrade(&self.inner))));
        }
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
        let p = Placement::of(ns);
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

const PAUSE_MIN: Duration = Duration::from_millis(250);
const PAUSE_MAX: Duration = Duration::from_secs(5);

/// Keeps the cache current from `WatchNamespaces` until the client is
/// dropped.
async fn watch(inner: Weak<Inner>) {
    let mut pause = PAUSE_MIN;
    loop {
        let opened = {
            let Some(i) = inner.upgrade() else { return };
            let since = i.generation.load(Ordering::Relaxed);
            i.directory
                .call(|mut c| async move {
                    c.watch_namespaces(pb::WatchNamespacesRequest {
                        since_generation: since,
                    })
                    .await
                })
                .await
        };
        match opened {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(map)) => {
                        let Some(i) = inner.upgrade() else { return };
                        i.apply(map).await;
                        pause = PAUSE_MIN;
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(error = %status, "namespace watch ended");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "namespace watch not opened"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PAUSE_MAX);
    }
}

impl Inner {
    /// Replaces the cached placements `map` names (namespaces never
    /// resolved here are not taken: the cache holds what this client
    /// uses); drops the clients of cells whose controllers changed.
    async fn apply(&self, map: pb::NamespaceMap) {
        let mut stale_cells = Vec::new();
        {
            let mut cache = self.namespaces.write().expect("namespace cache lock");
            for ns in map.namespaces {
                let Some(held) = cache.get_mut(&ns.name) else {
                    continue;
                };
                if ns.generation < held.generation && ns.cell == held.cell {
                    continue;
                }
                let new = Placement::of(ns);
                if new.cell != held.cell || new.controllers != held.controllers {
                    stale_cells.push(held.cell.clone());
                }
                *held = new;
            }
        }
        if !stale_cells.is_empty() {
            let mut cells = self.cells.lock().await;
            for c in stale_cells {
                cells.remove(&c);
            }
        }
        self.generation.fetch_max(map.generation, Ordering::Relaxed);
        self.pushed.fetch_add(1, Ordering::Relaxed);
    }
}
