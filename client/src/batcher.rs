//! Gateway-style coalescing: single-record appends from many callers that
//! arrive within a short linger and route to the same (namespace, tablet)
//! are sent as one batch.
//!
//! ```text
//! append(ns, rec) ─▶ bounded queue ─▶ run loop ─▶ Coalescer (pure) ─▶ flush
//!                                                      │ full / linger over
//!                                                      ▼
//!                       semaphore(inflight_batches_max) ─▶ Client::append
//!                                                      ─▶ reply to each caller
//! ```
//!
//! Every bound has a `_max`: the queue holds at most `queue_records_max`
//! records, a batch at most `batch_records_max` records and
//! `batch_bytes_max` bytes, and at most `inflight_batches_max` batches are
//! in flight; when they are, the loop stops taking from the queue and
//! callers wait, which is the back-pressure.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{Client, Error, Position, Record, Result, record_bytes, validate};

/// Batcher settings.
#[derive(Debug, Clone)]
pub struct BatcherOptions {
    /// How long the first record of a batch waits for company.
    pub linger: Duration,
    pub batch_records_max: usize,
    pub batch_bytes_max: usize,
    pub inflight_batches_max: usize,
    /// Records accepted but not yet taken by the run loop.
    pub queue_records_max: usize,
}

impl Default for BatcherOptions {
    fn default() -> Self {
        BatcherOptions {
            linger: Duration::from_millis(2),
            batch_records_max: 1000,
            batch_bytes_max: 1024 * 1024,
            inflight_batches_max: 64,
            queue_records_max: 10_000,
        }
    }
}

/// What records are grouped by. `tablet` is `None` when the route cache
/// does not know the record's tablet yet; the client routes such a batch
/// when it sends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    pub namespace: String,
    pub tablet: Option<u64>,
}

/// A batch ready to send.
#[derive(Debug)]
pub struct Flush<T> {
    pub key: GroupKey,
    pub items: Vec<T>,
}

struct Group<T> {
    items: Vec<T>,
    bytes: usize,
    opened: Instant,
}

/// The grouping policy, without I/O: items go in with their size and the
/// current time; full or expired groups come out.
pub struct Coalescer<T> {
    linger: Duration,
    records_max: usize,
    bytes_max: usize,
    groups: HashMap<GroupKey, Group<T>>,
    pending: usize,
}

impl<T> Coalescer<T> {
    pub fn new(linger: Duration, records_max: usize, bytes_max: usize) -> Self {
        Coalescer {
            linger,
            records_max: records_max.max(1),
            bytes_max,
            groups: HashMap::new(),
            pending: 0,
        }
    }

    /// Items held, not yet flushed.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Adds an item. Returns the batches that became ready: the key's open
    /// group if the item would overflow its bytes, and the group holding
    /// the item if it reached a limit.
    pub fn push(&mut self, key: GroupKey, item: T, bytes: usize, now: Instant) -> Vec<Flush<T>> {
        let mut out = Vec::new();
        if let Some(g) = self.groups.get(&key)
            && g.bytes + bytes > self.bytes_max
        {
            out.extend(self.take(&key));
        }
        let g = self.groups.entry(key.clone()).or_insert_with(|| Group {
            items: Vec::new(),
            bytes: 0,
            opened: now,
        });
        g.items.push(item);
        g.bytes += bytes;
        self.pending += 1;
        if g.items.len() >= self.records_max || g.bytes >= self.bytes_max {
            out.extend(self.take(&key));
        }
        out
    }

    /// Groups whose linger has passed.
    pub fn due(&mut self, now: Instant) -> Vec<Flush<T>> {
        let keys: Vec<GroupKey> = self
            .groups
            .iter()
            .filter(|(_, g)| g.opened + self.linger <= now)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter_map(|k| self.take(k)).collect()
    }

    /// When the oldest group's linger ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.groups.values().map(|g| g.opened + self.linger).min()
    }

    /// Every group, ready or not (at shutdown).
    pub fn drain(&mut self) -> Vec<Flush<T>> {
        let keys: Vec<GroupKey> = self.groups.keys().cloned().collect();
        keys.iter().filter_map(|k| self.take(k)).collect()
    }

    fn take(&mut self, key: &GroupKey) -> Option<Flush<T>> {
        let g = self.groups.remove(key)?;
        self.pending -= g.items.len();
        Some(Flush {
            key: key.clone(),
            items: g.items,
        })
    }
}

struct Pending {
    namespace: String,
    record: Record,
    reply: oneshot::Sender<Result<Position>>,
}

/// Coalesces single-record appends into batches. Dropping the batcher (or
/// [`Batcher::close`]) flushes what is queued.
pub struct Batcher {
    tx: mpsc::Sender<Pending>,
    task: JoinHandle<()>,
    client: Client,
}

impl Batcher {
    /// Starts the run loop on the current tokio runtime.
    pub fn new(client: Client, opts: BatcherOptions) -> Batcher {
        let (tx, rx) = mpsc::channel(opts.queue_records_max.max(1));
        let task = tokio::spawn(run(client.clone(), opts, rx));
        Batcher { tx, task, client }
    }

    /// Queues one record; resolves with its position once its batch is
    /// acknowledged. Waits for queue space when the batcher is saturated.
    /// The record is validated at once, so a bad record fails alone.
    pub fn append(
        &self,
        namespace: &str,
        record: Record,
    ) -> impl Future<Output = Result<Position>> + Send + 'static {
        let checked = validate(
            namespace,
            std::slice::from_ref(&record),
            self.client.options(),
        );
        let tx = self.tx.clone();
        let namespace = namespace.to_string();
        async move {
            checked?;
            let (reply, rx) = oneshot::channel();
            tx.send(Pending {
                namespace,
                record,
                reply,
            })
            .await
            .map_err(|_| Error::Closed)?;
            // Release the sender while waiting, so `close` can end the queue.
            drop(tx);
            rx.await.map_err(|_| Error::Closed)?
        }
    }

    /// Stops accepting records, sends what is queued and waits for every
    /// batch in flight.
    pub async fn close(self) {
        drop(self.tx);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "batcher task failed");
        }
    }
}

async fn run(client: Client, opts: BatcherOptions, mut rx: mpsc::Receiver<Pending>) {
    let inflight_max = opts.inflight_batches_max.max(1);
    let inflight = Arc::new(Semaphore::new(inflight_max));
    let mut coalescer = Coalescer::new(opts.linger, opts.batch_records_max, opts.batch_bytes_max);
    loop {
        let deadline = coalescer.next_deadline();
        tokio::select! {
            msg = rx.recv() => {
                let Some(p) = msg else { break };
                let key = GroupKey {
                    tablet: client.tablet_of(&p.namespace, &p.record),
                    namespace: p.namespace.clone(),
                };
                let bytes = record_bytes(&p.record);
                for flush in coalescer.push(key, p, bytes, Instant::now()) {
                    dispatch(&client, &inflight, flush).await;
                }
            }
            () = sleep_until(deadline), if deadline.is_some() => {
                for flush in coalescer.due(Instant::now()) {
                    dispatch(&client, &inflight, flush).await;
                }
            }
        }
    }
    for flush in coalescer.drain() {
        dispatch(&client, &inflight, flush).await;
    }
    // Every in-flight batch holds a permit until it has replied.
    let _all = inflight.acquire_many(inflight_max as u32).await;
}

async fn sleep_until(deadline: Option<Instant>) {
    if let Some(d) = deadline {
        tokio::time::sleep_until(d).await;
    }
}

async fn dispatch(client: &Client, inflight: &Arc<Semaphore>, flush: Flush<Pending>) {
    let permit = inflight
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    let client = client.clone();
    tokio::spawn(async move {
        let (records, replies): (Vec<Record>, Vec<_>) =
            flush.items.into_iter().map(|p| (p.record, p.reply)).unzip();
        let result = client.append(&flush.key.namespace, records).await;
        match result {
            Ok(positions) => {
                for (reply, pos) in replies.into_iter().zip(positions) {
                    let _ = reply.send(Ok(pos));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        drop(permit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, tablet: u64) -> GroupKey {
        GroupKey {
            namespace: ns.into(),
            tablet: Some(tablet),
        }
    }

    fn sizes<T>(flushes: &[Flush<T>]) -> Vec<usize> {
        flushes.iter().map(|f| f.items.len()).collect()
    }

    #[test]
    fn groups_by_namespace_and_tablet_until_linger() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(2), 100, 1 << 20);
        for i in 0..10 {
            assert!(c.push(key("a/b", i % 2), i, 10, t0).is_empty());
        }
        assert!(c.push(key("a/c", 0), 99, 10, t0).is_empty());
        assert_eq!(c.pending(), 11);
        assert_eq!(c.next_deadline(), Some(t0 + Duration::from_millis(2)));
        assert!(c.due(t0 + Duration::from_millis(1)).is_empty());
        let mut due = c.due(t0 + Duration::from_millis(2));
        due.sort_by_key(|f| (f.key.namespace.clone(), f.key.tablet));
        assert_eq!(sizes(&due), [5, 5, 1]);
        assert_eq!(due[0].items, [0, 2, 4, 6, 8]);
        assert_eq!(c.pending(), 0);
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn flushes_at_records_max() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(1), 3, 1 << 20);
        assert!(c.push(key("a/b", 1), 1, 1, t0).is_empty());
        assert!(c.push(key("a/b", 1), 2, 1, t0).is_empty());
        let f = c.push(key("a/b", 1), 3, 1, t0);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].items, [1, 2, 3]);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn flushes_before_bytes_overflow() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(1), 100, 100);
        assert!(c.push(key("a/b", 1), 1, 60, t0).is_empty());
        // 60 + 60 > 100: the open group goes first, the new item starts another.
        let f = c.push(key("a/b", 1), 2, 60, t0);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].items, [1]);
        assert_eq!(c.pending(), 1);
        // An item as large as the limit is sent alone, at once.
        let f = c.push(key("a/b", 2), 3, 100, t0);
        assert_eq!(sizes(&f), [1]);
        assert_eq!(c.drain().len(), 1);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn linger_runs_from_the_first_item() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalescer::new(ms(2), 100, 1 << 20);
        c.push(key("a/b", 1), 1, 1, t0);
        c.push(key("a/b", 1), 2, 1, t0 + ms(1));
        c.push(key("a/b", 2), 3, 1, t0 + ms(1));
        assert_eq!(c.next_deadline(), Some(t0 + ms(2)));
        let due = c.due(t0 + ms(2));
        assert_eq!(sizes(&due), [2]);
        assert_eq!(c.next_deadline(), Some(t0 + ms(3)));
    }
}
