//! Store-level tests on `object_store::memory::InMemory`: the upload's
//! create-if-absent handling and the manifest race.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::manifest::{self, Manifest, Publish};
use super::upload::{self, Outcome};
use super::{TierOptions, keys};

fn segment_file(dir: &std::path::Path) -> (String, std::path::PathBuf, Vec<u8>) {
    let (id, bytes) = crate::segment::sample_segment(50, |i| vec![i as u8; 100]);
    let path = dir.join(crate::segment::file_name(&id));
    std::fs::write(&path, &bytes).unwrap();
    (id, path, bytes)
}

#[tokio::test]
async fn already_exists_on_retry_is_verified_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (id, path, bytes) = segment_file(dir.path());
    let store = InMemory::new();
    let key = keys::segment(&Path::default(), "c", 1, &id);
    let opts = TierOptions::new("memory:///", "c");
    assert_eq!(
        upload::upload(&store, &key, &path, &id, &opts)
            .await
            .unwrap(),
        Outcome::Created
    );
    // The retry after a lost response: same key, same bytes.
    assert_eq!(
        upload::upload(&store, &key, &path, &id, &opts)
            .await
            .unwrap(),
        Outcome::AlreadyPresent
    );
    // A damaged object under the content address is found and replaced.
    let mut bad = bytes.clone();
    bad[100] ^= 1;
    store.put(&key, PutPayload::from(bad)).await.unwrap();
    assert!(
        upload::verify(&store, &key, &id, bytes.len() as u64)
            .await
            .is_err()
    );
    assert_eq!(
        upload::upload(&store, &key, &path, &id, &opts)
            .await
            .unwrap(),
        Outcome::Repaired
    );
    let body = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(body.as_ref(), bytes.as_slice());
    // A truncated object is refused by size.
    store
        .put(&key, PutPayload::from(bytes[..10].to_vec()))
        .await
        .unwrap();
    assert!(matches!(
        upload::verify(&store, &key, &id, bytes.len() as u64).await,
        Err(super::Error::Mismatch { .. })
    ));
}

#[tokio::test]
async fn multipart_upload_above_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let (id, bytes) = crate::segment::sample_segment(900, |i| {
        // Incompressible (xorshift), so the file passes the 5 MiB part size.
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..8000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    });
    let path = dir.path().join(crate::segment::file_name(&id));
    std::fs::write(&path, &bytes).unwrap();
    assert!(bytes.len() > 5 << 20, "{}", bytes.len());
    let store = InMemory::new();
    let key = keys::segment(&Path::default(), "c", 1, &id);
    let mut opts = TierOptions::new("memory:///", "c");
    opts.multipart_bytes_min = 1 << 20;
    opts.part_bytes = 5 << 20;
    assert_eq!(
        upload::upload(&store, &key, &path, &id, &opts)
            .await
            .unwrap(),
        Outcome::Created
    );
    upload::verify(&store, &key, &id, bytes.len() as u64)
        .await
        .unwrap();
    assert_eq!(
        upload::upload(&store, &key, &path, &id, &opts)
            .await
            .unwrap(),
        Outcome::AlreadyPresent
    );
}

fn manifest(generation: u64, checkpoint: u64) -> Manifest {
    Manifest {
        v: manifest::MANIFEST_V,
        cell: "c".into(),
        tablet: 3,
        generation,
        tablet_generation: 1,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        checkpoint,
        segments: vec![],
        receipt_window_us: 0,
        receipts: vec![],
    }
}

/// Many uploaders race on one generation: exactly one PUT wins, and every
/// loser re-reads the winner and moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manifest_race_has_exactly_one_winner() {
    for round in 0..20u64 {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("p");
        let racers: Vec<_> = (0..8u64)
            .map(|i| {
                let store = store.clone();
                let prefix = prefix.clone();
                tokio::spawn(async move {
                    // Each racer's state differs (checkpoint), all at generation 1.
                    let m = manifest(1, 100 * round + i);
                    let won = manifest::publish(store.as_ref(), &prefix, &m)
                        .await
                        .unwrap();
                    (i, won)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for r in racers {
            let (i, outcome) = r.await.unwrap();
            if outcome == Publish::Won {
                winners.push(i);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let stored = manifest::read(store.as_ref(), &prefix, "c", 3, 1)
            .await
            .unwrap();
        assert_eq!(stored.checkpoint, 100 * round + winners[0]);
        // A loser re-reads and publishes its own state at the next
        // generation; one that equals the winner's does nothing.
        let (o, g) = manifest::publish_next(store.as_ref(), &prefix, "c", 3, 3, |g| {
            manifest(g, 100 * round + 99)
        })
        .await
        .unwrap();
        assert_eq!((o, g), (Publish::Won, 2));
        assert_eq!(
            manifest::latest_generation(store.as_ref(), &prefix, "c", 3)
                .await
                .unwrap(),
            Some(2)
        );
    }
}

#[tokio::test]
async fn loser_with_the_winners_state_moves_on() {
    let store = InMemory::new();
    let prefix = Path::default();
    // Simulates a loser that read generation 0 while the winner published 1:
    // publish_next sees 1, tries 2, and a concurrent identical writer...
    assert_eq!(
        manifest::publish(&store, &prefix, &manifest(1, 5))
            .await
            .unwrap(),
        Publish::Won
    );
    assert_eq!(
        manifest::publish(&store, &prefix, &manifest(1, 5))
            .await
            .unwrap(),
        Publish::Lost
    );
    let m = manifest::read(&store, &prefix, "c", 3, 1).await.unwrap();
    assert_eq!(m, manifest(1, 5));
}

/// A damaged cached chunk is dropped and fetched again (the read succeeds
/// with the right rows); damage in the bucket itself is reported as
/// `Corrupt`, never returned as rows.
#[test]
fn damaged_cold_bytes_are_refetched_once_then_reported() {
    let (id, bytes) = crate::segment::sample_segment(300, |i| vec![i as u8; 500]);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let tier = super::Tier::with_store(
        TierOptions::new("memory:///", "c"),
        store.clone(),
        Path::default(),
    )
    .unwrap();
    let key = tier.segment_key(1, &id);
    let (s, k, b) = (store.clone(), key.clone(), bytes.clone());
    tier.block_on(async move { Ok(s.put(&k, PutPayload::from(b)).await?) })
        .unwrap();
    let seg = crate::catalog::SegmentRef {
        id: id.clone(),
        bytes: bytes.len() as u64,
        rows: 300,
        log_first: 1,
        log_last: 300,
        ts_min: 0,
        ts_max: 299,
        cold: None,
        origin: 0,
        shared: false,
        keep: None,
    };
    let stubs = tempfile::tempdir().unwrap();
    let reader = super::cold::open_reader(&tier, 1, &seg, stubs.path()).unwrap();
    let expected = reader.scan("a/b", b"", 0, u64::MAX).unwrap();
    assert_eq!(expected.len(), 300);

    // Damage the cached chunk holding the first block.
    let at = reader.block_offsets()[0] + 20;
    let chunk = at / super::cold::CHUNK_BYTES;
    let mut damaged = tier
        .cache
        .get(&(id.clone(), chunk))
        .unwrap()
        .as_ref()
        .clone();
    damaged[(at % super::cold::CHUNK_BYTES) as usize] ^= 0xff;
    tier.cache.insert((id.clone(), chunk), Arc::new(damaged));
    assert_eq!(reader.scan("a/b", b"", 0, u64::MAX).unwrap(), expected);

    // Damage in the bucket: reported, twice in a row.
    let mut bad = bytes.clone();
    bad[at as usize] ^= 0xff;
    let (s, k) = (store.clone(), key.clone());
    tier.block_on(async move { Ok(s.put(&k, PutPayload::from(bad)).await?) })
        .unwrap();
    tier.cache.clear();
    for _ in 0..2 {
        match reader.scan("a/b", b"", 0, u64::MAX) {
            Err(crate::segment::Error::Corrupt { .. }) => {}
            other => panic!("damaged bucket object read as {other:?}"),
        }
    }
}
