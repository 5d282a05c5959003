//! Group commit of Raft values (votes) in the catalog.
//!
//! A vote must be durable before it is granted or asked for, and the
//! catalog makes it so with a redb commit and its fsyncs. One commit per
//! vote, run on the calling task, is fine for one election at a time; when
//! a node that led thousands of groups dies, its survivors hold thousands
//! of elections in one election timeout, and one commit each (blocking a
//! runtime worker for every fsync) made the elections, not the network,
//! the bottleneck: rounds outlasted the campaign timer and groups
//! campaigned three or four times over. Here one thread writes every vote
//! that waits in one transaction, so a storm of elections costs a few
//! commits, and the tasks that wait for it do not block a worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use redb::Database;
use tokio::sync::oneshot;

/// One value to store durably, and where to say it is.
struct Put {
    tablet: u64,
    name: &'static str,
    value: Vec<u8>,
    done: oneshot::Sender<Result<(), String>>,
}

/// The sending side; the writer thread ends when the last clone drops.
#[derive(Clone)]
pub(crate) struct GroupWriter {
    tx: mpsc::Sender<Put>,
    /// Transactions committed so far.
    commits: Arc<AtomicU64>,
}

impl GroupWriter {
    /// Starts the writer thread of `db`. The thread holds the database only
    /// while it writes, so dropping the catalog closes it.
    pub(crate) fn start(db: &Arc<Database>) -> std::io::Result<GroupWriter> {
        let (tx, rx) = mpsc::channel::<Put>();
        let db = Arc::downgrade(db);
        let commits = Arc::new(AtomicU64::new(0));
        let counted = commits.clone();
        std::thread::Builder::new()
            .name("catalog-votes".into())
            .spawn(move || run(&db, &rx, &counted))?;
        Ok(GroupWriter { tx, commits })
    }

    /// Transactions committed so far (each for one or more values).
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Stores `value` under (`tablet`, `name`) in the `table`, durable when
    /// this returns `Ok`.
    pub(crate) async fn put(
        &self,
        tablet: u64,
        name: &'static str,
        value: Vec<u8>,
    ) -> Result<(), String> {
        let (done, wait) = oneshot::channel();
        let put = Put {
            tablet,
            name,
            value,
            done,
        };
        self.tx
            .send(put)
            .map_err(|_| "the catalog's vote writer stopped".to_string())?;
        wait.await
            .map_err(|_| "the catalog's vote writer stopped".to_string())?
    }
}

fn run(db: &Weak<Database>, rx: &mpsc::Receiver<Put>, commits: &AtomicU64) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let result = match db.upgrade() {
            Some(db) => write(&db, &batch)
                .map(|()| {
                    commits.fetch_add(1, Ordering::Relaxed);
                })
                .map_err(|e| e.to_string()),
            None => Err("the catalog is closed".to_string()),
        };
        for put in batch {
            let _ = put.done.send(result.clone());
        }
    }
}

/// Every put of `batch` in one transaction, in order (a later value of the
/// same key wins, as it would one commit at a time).
fn write(db: &Database, batch: &[Put]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(crate::catalog::RAFT)?;
        for p in batch {
            table.insert((p.tablet, p.name), p.value.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::catalog::Catalog;

    /// Votes written at once by many groups are durable (read back after
    /// the catalog is closed and reopened), the latest value of a key wins,
    /// and they take fewer commits than values: the point of the writer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_votes_are_durable_and_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let catalog = Catalog::open(&path).unwrap();
        let mut puts = tokio::task::JoinSet::new();
        for tablet in 0..400u64 {
            let c = catalog.clone();
            puts.spawn(async move {
                c.put_raft_grouped(tablet, "vote", vec![1, tablet as u8])
                    .await
                    .unwrap();
                c.put_raft_grouped(tablet, "vote", vec![2, tablet as u8])
                    .await
                    .unwrap();
            });
        }
        while let Some(r) = puts.join_next().await {
            r.unwrap();
        }
        let commits = catalog.vote_commits();
        assert!(
            (1..800).contains(&commits),
            "{commits} commits for 800 votes"
        );
        drop(catalog);
        let reopened = Catalog::open(&path).unwrap();
        for tablet in 0..400u64 {
            assert_eq!(
                reopened.get_raft(tablet, "vote").unwrap(),
                Some(vec![2, tablet as u8]),
                "tablet {tablet}"
            );
        }
    }
}
