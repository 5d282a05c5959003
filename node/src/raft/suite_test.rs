//! openraft's own storage conformance suite, run against the real
//! journal-backed log store and the real tablet state machine.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tokio::sync::mpsc;

use super::TabletConfig;
use super::log_store::LogStore;
use super::state_machine::{NoNeighbours, StateMachine};
use crate::catalog::{Catalog, TabletRecord};
use crate::journal::{self, Journal};
use crate::tablet::{Tablet, TabletOptions};

struct Builder;

/// Keeps the temp dir and the journal alive for one test.
struct Guard {
    _dir: tempfile::TempDir,
    journal: Journal,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.journal.shutdown();
    }
}

impl StoreBuilder<TabletConfig, LogStore, StateMachine, Guard> for Builder {
    async fn build(&self) -> Result<(Guard, LogStore, StateMachine), StorageError<TabletConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let catalog = Catalog::open(&dir.path().join("catalog.redb")).expect("catalog");
        let mut opts = journal::Options::new(dir.path().join("journal"));
        opts.reserve_bytes = 0;
        let (journal, _) = Journal::open(opts).expect("journal");
        let record = TabletRecord {
            v: 1,
            id: 7,
            vshard_lo: 0,
            vshard_hi: 1 << 32,
            generation: 1,
            checkpoint: 0,
            applied_state: vec![],
            segments: vec![],
            replica_id: 7,
            init_voters: Vec::new(),
            frozen: false,
        };
        catalog.put_tablet(&record).expect("put tablet");
        let tablet: Arc<Tablet> = Tablet::open(
            &record,
            dir.path().join("segments"),
            catalog.clone(),
            TabletOptions::default(),
        )
        .expect("tablet");
        let log = LogStore::new(7, journal.clone(), catalog);
        let (tx, _rx) = mpsc::unbounded_channel();
        let sm = StateMachine::new(tablet, tx, Arc::new(NoNeighbours(Default::default())))
            .marking(log.applied_mark());
        Ok((Guard { _dir: dir, journal }, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_log_suite_passes_on_the_journal_store() -> Result<(), StorageError<TabletConfig>>
{
    Suite::test_all(Builder).await
}

/// The log holds each written entry in memory until the state machine's
/// mark passes it (apply and replication then skip a journal read and a
/// decode), then only its location; both paths return the same entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_entries_are_held_until_applied() {
    use openraft::entry::RaftEntry;
    use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
    use openraft::vote::RaftLeaderIdExt;
    use stele_proto::command::TabletCommand;

    let (_guard, mut log, _sm) = Builder.build().await.expect("build");
    let leader = <TabletConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(2, 1);
    let entries: Vec<super::Entry> = (1..=3)
        .map(|i| {
            super::Entry::new_normal(
                super::LogId::new(leader, i),
                TabletCommand::DropSegment {
                    segment: format!("segment-{i}"),
                },
            )
        })
        .collect();
    let (tx, rx) = <TabletConfig as openraft::type_config::TypeConfigExt>::oneshot();
    log.append(entries.clone(), IOFlushed::signal(tx))
        .await
        .expect("append");
    rx.await.expect("flushed").expect("written");
    assert_eq!(log.held_entries(), 3);

    log.applied_mark().set(2);
    let read = log.try_get_log_entries(1..4).await.expect("read");
    assert_eq!(
        read, entries,
        "held and journal reads return the entries written"
    );
    assert_eq!(
        log.held_entries(),
        1,
        "entries at or below the mark are released"
    );

    log.applied_mark().set(3);
    assert_eq!(log.try_get_log_entries(1..4).await.expect("read"), entries);
    assert_eq!(log.held_entries(), 0);
}
