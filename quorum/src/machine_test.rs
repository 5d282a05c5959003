//! The state-machine adapter: a restart rebuilds the state from the stored
//! snapshot, and a snapshot that does not restore is a typed error that
//! changes nothing.

use std::collections::BTreeSet;
use std::io::Cursor;
use std::sync::{Arc, RwLock};

use openraft::entry::RaftEntry;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::log_id;
use openraft::{EntryPayload, Membership};

use super::Machine;
use crate::store::{Store, StoredSnapshot};
use crate::test_state::Tally;
use crate::{C, Entry, Error, QuorumCmd, QuorumState, StoredMembership, to_cbor};

fn machine(store: &Store) -> Result<(Machine<Tally>, Arc<RwLock<Tally>>), Error> {
    let state = Arc::new(RwLock::new(Tally::new()));
    Ok((Machine::recover(store.clone(), state.clone())?, state))
}

fn add(index: u64, n: u64) -> Entry {
    Entry::new(
        log_id::<C>(1, 1, index),
        EntryPayload::Normal(QuorumCmd(to_cbor(&n))),
    )
}

async fn apply(m: &mut Machine<Tally>, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    m.apply(stream).await.unwrap();
}

#[tokio::test]
async fn a_restart_rebuilds_the_state_from_the_stored_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (mut m, state) = machine(&store).unwrap();
    let membership = Membership::new_with_defaults(vec![BTreeSet::from([1])], []);
    let mut entries = vec![Entry::new(
        log_id::<C>(1, 1, 1),
        EntryPayload::Membership(membership.clone()),
    )];
    entries.extend((2..=4).map(|i| add(i, i * 10)));
    apply(&mut m, entries).await;
    assert_eq!(state.read().unwrap().sum, 90);
    let built = m
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id::<C>(1, 1, 4)));
    // Applied after the snapshot: not in it, so not rebuilt from it.
    apply(&mut m, vec![add(5, 1)]).await;
    drop(m);
    drop(store);

    let store = Store::open(dir.path()).unwrap();
    let (mut m, state) = machine(&store).unwrap();
    assert_eq!(
        *state.read().unwrap(),
        Tally {
            v: 1,
            sum: 90,
            count: 3
        }
    );
    let (applied, stored) = m.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id::<C>(1, 1, 4)));
    assert_eq!(
        stored,
        StoredMembership::new(Some(log_id::<C>(1, 1, 1)), membership)
    );
    let current = m.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, built.meta);
}

#[tokio::test]
async fn a_stored_snapshot_that_does_not_restore_is_a_typed_error() {
    let newer = Tally {
        v: 9,
        sum: 1,
        count: 1,
    };
    for (data, want_version) in [(to_cbor(&newer), true), (b"\xff\x00".to_vec(), false)] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .put_snapshot(&StoredSnapshot {
                meta: Default::default(),
                data,
            })
            .unwrap();
        let e = machine(&store)
            .err()
            .expect("recovered from a bad snapshot");
        let Error::Snapshot { path, source } = &e else {
            panic!("wrong error: {e}");
        };
        assert_eq!(path, &dir.path().join(crate::store::FILE));
        match **source {
            Error::StateVersion {
                state: "tally",
                found: 9,
                expected: 1,
            } => assert!(want_version, "{e}"),
            Error::Decode { .. } => assert!(!want_version, "{e}"),
            _ => panic!("wrong cause: {e}"),
        }
    }
}

#[tokio::test]
async fn an_installed_snapshot_that_does_not_restore_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (mut m, state) = machine(&store).unwrap();
    apply(&mut m, vec![add(1, 5)]).await;
    let before = state.read().unwrap().clone();
    let meta = crate::SnapshotMeta {
        last_log_id: Some(log_id::<C>(2, 1, 9)),
        last_membership: Default::default(),
    };
    let e = m
        .install_snapshot(&meta, Cursor::new(b"\xff\x00".to_vec()))
        .await
        .expect_err("installed garbage");
    let typed = e.get_ref().and_then(|e| e.downcast_ref::<Error>());
    assert!(matches!(typed, Some(Error::Decode { .. })), "{e}");
    assert_eq!(*state.read().unwrap(), before);
    assert_eq!(
        m.applied_state().await.unwrap().0,
        Some(log_id::<C>(1, 1, 1))
    );
    assert!(m.get_current_snapshot().await.unwrap().is_none());
}

#[test]
fn an_undecodable_command_is_refused_not_applied() {
    let mut t = Tally::new();
    let reply: Result<u64, String> =
        crate::from_cbor(&QuorumState::apply(&mut t, 1, b"\xff\x00")).unwrap();
    assert!(reply.is_err());
    assert_eq!(t, Tally::new());
}
