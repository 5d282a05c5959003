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
        let sm = StateMachine::new(tablet, tx, Arc::new(NoNeighbours(Default::default())));
        Ok((Guard { _dir: dir, journal }, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_log_suite_passes_on_the_journal_store() -> Result<(), StorageError<TabletConfig>>
{
    Suite::test_all(Builder).await
}
