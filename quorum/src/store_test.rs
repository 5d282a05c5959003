//! The redb store across a reopen, and a stored value that does not decode.

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::{blank_ent, log_id};

use super::{FILE, META, Store, VOTE};
use crate::{C, Error, Vote};

#[tokio::test]
async fn a_reopened_store_keeps_vote_log_committed_and_purged() {
    let dir = tempfile::tempdir().unwrap();
    let vote = Vote::new_committed(3, 2);
    {
        let mut s = Store::open(dir.path()).unwrap();
        s.save_vote(&vote).await.unwrap();
        let entries = (1..=6).map(|i| blank_ent::<C>(3, 2, i));
        s.append(entries, IOFlushed::noop()).await.unwrap();
        s.save_committed(Some(log_id::<C>(3, 2, 5))).await.unwrap();
        s.purge(log_id::<C>(3, 2, 2)).await.unwrap();
        s.truncate_after(Some(log_id::<C>(3, 2, 5))).await.unwrap();
    }
    let mut s = Store::open(dir.path()).unwrap();
    assert_eq!(s.read_vote().await.unwrap(), Some(vote));
    assert_eq!(
        s.read_committed().await.unwrap(),
        Some(log_id::<C>(3, 2, 5))
    );
    let state = s.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id::<C>(3, 2, 2)));
    assert_eq!(state.last_log_id, Some(log_id::<C>(3, 2, 5)));
    let ids: Vec<u64> = s
        .try_get_log_entries(0..100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.index())
        .collect();
    assert_eq!(ids, [3, 4, 5]);
}

#[tokio::test]
async fn a_vote_that_does_not_decode_is_an_error_not_forgotten() {
    // A member that forgot its vote could vote again in the same term.
    let dir = tempfile::tempdir().unwrap();
    {
        let mut s = Store::open(dir.path()).unwrap();
        s.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
    }
    {
        let db = redb::Database::create(dir.path().join(FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(VOTE, b"\xff\x00".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    match Store::open(dir.path()) {
        Err(Error::Decode { what, .. }) => assert_eq!(what, VOTE),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a store with an undecodable vote opened"),
    }
}

#[test]
fn a_store_in_an_unwritable_place_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    match Store::open(&file.join("quorum")) {
        Err(Error::CreateDir { path, .. }) => assert_eq!(path, file.join("quorum")),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened a store under a file"),
    }
}
