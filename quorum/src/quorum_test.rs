//! A one-member group end to end: openraft over the real store, machine
//! and timing, through a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::test_state::Tally;
use crate::{Error, Quorum, QuorumTiming, from_cbor, to_cbor};

fn timing() -> QuorumTiming {
    QuorumTiming {
        heartbeat_ms: 50,
        election_min_ms: 150,
        election_max_ms: 300,
        // Small, so the run below builds snapshots and purges the log.
        snapshot_every: 4,
    }
}

async fn add(q: &Quorum<Tally>, n: u64) -> u64 {
    let reply: Result<u64, String> = from_cbor(&q.propose(to_cbor(&n)).await.unwrap()).unwrap();
    reply.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_keeps_its_state_through_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let members = BTreeMap::from([(1, "http://127.0.0.1:9".to_string())]);
    {
        let q = Quorum::open(dir.path(), 1, Tally::new(), &timing())
            .await
            .unwrap();
        // Before the group exists nobody leads: a redirect with no leader,
        // or unavailable, never a reply.
        match q.propose(to_cbor(&1u64)).await {
            Err(Error::NotLeader { leader: None, .. } | Error::Unavailable(_)) => {}
            other => panic!("an uninitialized member answered {other:?}"),
        }
        // A batch stops at its first failure, which is its last item.
        let failed = q.propose_many(vec![to_cbor(&1u64), to_cbor(&2u64)]).await;
        match failed.as_deref() {
            Ok([Err(Error::NotLeader { leader: None, .. } | Error::Unavailable(_))])
            | Err(Error::Unavailable(_)) => {}
            other => panic!("an uninitialized member answered a batch {other:?}"),
        }
        assert!(q.initialize(&members).await.unwrap());
        assert!(!q.initialize(&members).await.unwrap(), "created twice");
        assert_eq!(q.wait_leader(Duration::from_secs(10)).await.unwrap(), 1);
        let mut sum = 0;
        for n in 1..=10 {
            sum += n;
            assert_eq!(add(&q, n).await, sum);
        }
        // A batch applies in its order: each reply is the sum after it.
        let sums: Vec<u64> = q
            .propose_many((11..=14u64).map(|n| to_cbor(&n)).collect())
            .await
            .unwrap()
            .into_iter()
            .map(|r| {
                from_cbor::<Result<u64, String>>(&r.unwrap())
                    .unwrap()
                    .unwrap()
            })
            .collect();
        assert_eq!(sums, [66, 78, 91, 105]);
        assert!(q.propose_many(Vec::new()).await.unwrap().is_empty());
        q.linearizable().await.unwrap();
        assert_eq!(q.state().sum, 105);
        q.shutdown().await;
    }
    // openraft's tasks let go of the database shortly after shutdown.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let q = loop {
        match Quorum::open(dir.path(), 1, Tally::new(), &timing()).await {
            Ok(q) => break q,
            Err(Error::Storage {
                source: redb::Error::DatabaseAlreadyOpen,
                ..
            }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    assert!(!q.initialize(&members).await.unwrap(), "the group is new");
    q.wait_leader(Duration::from_secs(10)).await.unwrap();
    // The next write commits after everything before it is re-applied.
    assert_eq!(add(&q, 100).await, 205);
    assert_eq!(q.state().count, 15);
    assert_eq!(q.members(), members);
    q.shutdown().await;
}
