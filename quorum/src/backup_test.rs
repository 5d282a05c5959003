//! Backup objects, the `latest` pointer and the fall back to an older
//! generation, over an in-memory store; and a group seeded from a backup.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

use super::*;
use crate::test_state::Tally;
use crate::{CborState, QuorumTiming, from_cbor, seed, to_cbor};

fn backup(index: u64, sum: u64) -> Backup {
    let mut t = Tally::new();
    t.sum = sum;
    Backup {
        kind: "controller".into(),
        scope: "c1".into(),
        log_index: index,
        term: 2,
        writer: 1,
        members: BTreeMap::from([(1, "http://a:1".to_string())]),
        written_at_ms: 7,
        state: to_cbor(&t),
    }
}

fn target() -> Target {
    Target::controller(Arc::new(InMemory::new()), &ObjectPath::from("pre"), "c1")
}

#[test]
fn an_object_round_trips_and_damage_is_named() {
    let b = backup(5, 9);
    let bytes = encode(&b);
    assert_eq!(decode("k", &bytes).unwrap(), b);
    for (what, bad) in [
        ("truncated", bytes[..bytes.len() - 1].to_vec()),
        ("truncated", bytes[..5].to_vec()),
        ("magic", [b"XXXXXXXX".as_slice(), &bytes[8..]].concat()),
        ("checksum", {
            let mut x = bytes.clone();
            x[20] ^= 1;
            x
        }),
        ("version", {
            let mut x = bytes.clone();
            x[8] = 9;
            x
        }),
    ] {
        let e = decode("k", &bad).unwrap_err().to_string();
        assert!(e.contains("backup object k is damaged"), "{what}: {e}");
        assert!(e.contains(what), "{what}: {e}");
    }
}

#[tokio::test]
async fn latest_names_the_newest_and_old_generations_are_pruned() {
    let t = target();
    assert!(matches!(t.read_latest().await, Err(Error::Empty { .. })));
    for i in 1..=6 {
        assert!(t.write(&backup(i * 10, i), 3).await.unwrap());
    }
    // The same generation again is not a new object.
    assert!(!t.write(&backup(60, 6), 3).await.unwrap());
    assert_eq!(t.generations().await.unwrap(), vec![40, 50, 60]);
    let r = t.read_latest().await.unwrap();
    assert_eq!((r.generation, r.notes.len()), (60, 0));
    assert_eq!(from_cbor::<Tally>(&r.backup.state).unwrap().sum, 6);
    // A deposed leader's older write does not move the pointer back.
    t.write(&backup(55, 99), 3).await.unwrap();
    assert_eq!(t.read_latest().await.unwrap().generation, 60);
    assert_eq!(
        t.root.as_ref(),
        "pre/cells/c1/control",
        "keys are functions of the cell id"
    );
}

#[tokio::test]
async fn a_damaged_latest_falls_back_to_the_previous_generation_and_says_so() {
    let t = target();
    for i in 1..=3 {
        t.write(&backup(i, i), 5).await.unwrap();
    }
    // The newest object truncated.
    let bytes = encode(&backup(3, 3));
    t.store
        .put(
            &t.object(3),
            PutPayload::from(bytes[..bytes.len() / 2].to_vec()),
        )
        .await
        .unwrap();
    let r = t.read_latest().await.unwrap();
    assert_eq!(r.generation, 2);
    assert!(
        r.notes.iter().any(|n| n.contains("damaged")),
        "{:?}",
        r.notes
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("previous good generation 2"))
    );
    // A pointer that is not a generation.
    t.store
        .put(&t.latest(), PutPayload::from(b"garbage".to_vec()))
        .await
        .unwrap();
    let r = t.read_latest().await.unwrap();
    assert_eq!(r.generation, 2);
    assert!(r.notes[0].contains("latest is damaged"), "{:?}", r.notes);
    // Every object damaged: refused, naming each.
    for g in [1, 2] {
        t.store
            .put(&t.object(g), PutPayload::from(b"x".to_vec()))
            .await
            .unwrap();
    }
    let e = t.read_latest().await.unwrap_err();
    assert!(matches!(e, Error::NoneUsable { .. }), "{e}");
    assert!(e.to_string().contains("00000000000000000001.qbk"), "{e}");
}

fn timing() -> QuorumTiming {
    QuorumTiming {
        heartbeat_ms: 50,
        election_min_ms: 150,
        election_max_ms: 300,
        snapshot_every: 1000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_member_starts_from_the_backed_up_state() {
    let dir = tempfile::tempdir().unwrap();
    let members = BTreeMap::from([(1, "http://127.0.0.1:9".to_string())]);
    let mut t = Tally::new();
    t.sum = 41;
    t.count = 3;
    // Bytes this build cannot read are refused before anything is written.
    let mut newer = t.clone();
    newer.v = Tally::VERSION + 1;
    let e = seed(dir.path(), &members, &to_cbor(&newer), 40, Tally::new()).unwrap_err();
    assert!(matches!(e, crate::Error::StateVersion { .. }), "{e}");
    assert!(!dir.path().join("quorum.redb").exists());
    seed(dir.path(), &members, &to_cbor(&t), 40, Tally::new()).unwrap();
    let e = seed(dir.path(), &members, &to_cbor(&t), 40, Tally::new()).unwrap_err();
    assert!(e.to_string().contains("seed only a new member"), "{e}");

    let q = crate::Quorum::open(dir.path(), 1, Tally::new(), &timing())
        .await
        .unwrap();
    assert_eq!(q.state().sum, 41);
    assert!(!q.initialize(&members).await.unwrap(), "seeded: exists");
    q.wait_leader(Duration::from_secs(10)).await.unwrap();
    let reply: Result<u64, String> = from_cbor(&q.propose(to_cbor(&1u64)).await.unwrap()).unwrap();
    assert_eq!(reply.unwrap(), 42);
    assert_eq!(q.members(), members);
    // The log goes on past the backed-up index: backups sort after it.
    // (The applied index is read from metrics, which follow the apply.)
    let started = std::time::Instant::now();
    while q.applied_index().is_none_or(|i| i <= 40) && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(q.applied_index().unwrap() > 40, "{:?}", q.applied_index());
    // The leader backs the state up within an interval.
    let target = target();
    let cancel = CancellationToken::new();
    let q = Arc::new(q);
    let task = tokio::spawn(run(
        q.clone(),
        target.clone(),
        BackupOptions {
            kind: "controller".into(),
            scope: "c1".into(),
            interval: Duration::from_millis(50),
            keep: 3,
        },
        cancel.clone(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        if let Ok(r) = target.read_latest().await {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "no backup written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(from_cbor::<Tally>(&r.backup.state).unwrap().sum, 42);
    assert_eq!(r.backup.members, members);
    cancel.cancel();
    task.await.unwrap();
    q.shutdown().await;
    drop(q);
    // A restart keeps the seeded state and what was applied after it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let q = loop {
        match crate::Quorum::open(dir.path(), 1, Tally::new(), &timing()).await {
            Ok(q) => break q,
            Err(crate::Error::Storage {
                source: redb::Error::DatabaseAlreadyOpen,
                ..
            }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    q.wait_leader(Duration::from_secs(10)).await.unwrap();
    let reply: Result<u64, String> = from_cbor(&q.propose(to_cbor(&2u64)).await.unwrap()).unwrap();
    assert_eq!(reply.unwrap(), 44);
    q.shutdown().await;
}
