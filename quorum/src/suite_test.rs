//! openraft's own storage conformance suite, run against the real redb log
//! store and the real state-machine adapter (over a small test state).

use std::sync::{Arc, RwLock};

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

use crate::QuorumConfig;
use crate::machine::Machine;
use crate::store::Store;
use crate::test_state::Tally;

struct Builder;

impl StoreBuilder<QuorumConfig, Store, Machine<Tally>, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, Store, Machine<Tally>), StorageError<QuorumConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open store");
        let machine = Machine::recover(store.clone(), Arc::new(RwLock::new(Tally::new())))
            .expect("recover machine");
        Ok((dir, store, machine))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_log_suite_passes_on_the_redb_store() -> Result<(), StorageError<QuorumConfig>> {
    Suite::test_all(Builder).await
}
