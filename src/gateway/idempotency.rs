//! Idempotency keys: a producer names a request, and every gateway turns
//! the same name and records into the same batches with the same batch
//! ids, so the cell's receipts apply a retried request once whichever
//! gateway (or how many crashed ones) it went through.
//!
//! ```text
//! records ─▶ grouped by vshard (input order kept) ─▶ runs within the batch limits
//!         ─▶ batch id = SHA-256("stele-idempotency-v2", namespace, key, vshard, run,
//!                               the run's records as the producer sent them)[..16]
//! ```
//!
//! The records are in the id so that a key reused for other records (a
//! producer's bug) is applied as the new request it is, never answered as
//! a duplicate of the first with its records dropped. They enter as sent:
//! a `ts` the gateway filled in (its clock, different on every try) is not
//! part of them.
//!
//! A vshard belongs to exactly one tablet whatever splits, merges and
//! moves happen between two tries, so a group never straddles tablets and
//! its batch id never depends on the routes the gateway held.

use std::collections::BTreeMap;

use axum::http::HeaderValue;
use stele_client::{Client, Position, Record, chunk, record_vshard};

use super::json::ApiError;

/// Longest idempotency key.
pub const KEY_BYTES_MAX: usize = 128;

/// The key of an `Idempotency-Key` header: 1 to 128 printable ASCII bytes.
pub fn key_of(v: &HeaderValue) -> Result<String, ApiError> {
    let bytes = v.as_bytes();
    if bytes.is_empty()
        || bytes.len() > KEY_BYTES_MAX
        || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "1 to 128 printable ASCII characters, no spaces",
        ));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// The batches of an idempotent append: record indices and batch id.
/// `ts_given[i]`: record `i`'s `ts` is the producer's (else the gateway's
/// clock, hashed as 0).
pub fn batches(
    namespace: &str,
    key: &str,
    records: &[Record],
    ts_given: &[bool],
    records_max: usize,
    bytes_max: usize,
) -> Vec<(Vec<usize>, [u8; 16])> {
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        groups
            .entry(record_vshard(namespace, r))
            .or_default()
            .push(i);
    }
    let mut out = Vec::new();
    for (vshard, idxs) in groups {
        for (run, idxs) in chunk(records, idxs, records_max, bytes_max)
            .into_iter()
            .enumerate()
        {
            let id = batch_id(
                namespace,
                key,
                vshard,
                run as u32,
                idxs.iter().map(|&i| (&records[i], ts_given[i])),
            );
            out.push((idxs, id));
        }
    }
    out
}

fn batch_id<'a>(
    namespace: &str,
    key: &str,
    vshard: u32,
    run: u32,
    records: impl Iterator<Item = (&'a Record, bool)>,
) -> [u8; 16] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    let mut part = |b: &[u8]| {
        ctx.update(&(b.len() as u32).to_be_bytes());
        ctx.update(b);
    };
    part(b"stele-idempotency-v2");
    part(namespace.as_bytes());
    part(key.as_bytes());
    part(&vshard.to_be_bytes());
    part(&run.to_be_bytes());
    for (r, ts_given) in records {
        part(&r.key);
        part(&(if ts_given { r.ts } else { 0 }).to_be_bytes());
        part(&r.value);
        match &r.routing_key {
            None => part(b""),
            Some(k) => {
                part(b"r");
                part(k);
            }
        }
    }
    let digest = ctx.finish();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest.as_ref()[..16]);
    id
}

/// Appends under the key's batch ids, the groups concurrently. Returns
/// positions in input order and whether every group had been applied
/// before.
pub async fn append(
    client: &Client,
    namespace: &str,
    key: &str,
    records: Vec<Record>,
    ts_given: &[bool],
) -> stele_client::Result<(Vec<Position>, bool)> {
    let opts = client.options();
    let plan = batches(
        namespace,
        key,
        &records,
        ts_given,
        opts.batch_records_max,
        opts.batch_bytes_max,
    );
    let sends = plan.iter().map(|(idxs, id)| {
        let group: Vec<Record> = idxs.iter().map(|&i| records[i].clone()).collect();
        client.append_batch(namespace, group, None, Some(*id))
    });
    let outcomes = futures::future::try_join_all(sends).await?;
    let mut positions = vec![Position::default(); records.len()];
    let mut duplicate = true;
    for ((idxs, _), outcome) in plan.iter().zip(outcomes) {
        duplicate &= outcome.duplicate;
        if outcome.positions.len() != idxs.len() {
            return Err(stele_client::Error::Protocol(
                "a batch got a position count unlike its records".into(),
            ));
        }
        for (&i, p) in idxs.iter().zip(outcome.positions) {
            positions[i] = p;
        }
    }
    Ok((positions, duplicate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stele_client::record;

    #[test]
    fn same_key_same_batches_whatever_the_gateway() {
        let recs: Vec<Record> = (0..50)
            .map(|i| record(format!("k{}", i % 7), i, "v"))
            .collect();
        let given = vec![true; recs.len()];
        let a = batches("a/b", "req-1", &recs, &given, 10_000, 1 << 20);
        assert_eq!(
            a,
            batches("a/b", "req-1", &recs, &given, 10_000, 1 << 20),
            "deterministic"
        );
        assert_eq!(a.len(), 7, "one batch per vshard: {a:?}");
        let covered: usize = a.iter().map(|(i, _)| i.len()).sum();
        assert_eq!(covered, 50);
        let ids = |b: &[(Vec<usize>, [u8; 16])]| b.iter().map(|x| x.1).collect::<Vec<_>>();
        let other_key = batches("a/b", "req-2", &recs, &given, 10_000, 1 << 20);
        let other_ns = batches("a/c", "req-1", &recs, &given, 10_000, 1 << 20);
        for other in [&other_key, &other_ns] {
            assert!(ids(&a).iter().all(|id| !ids(other).contains(id)));
        }
        // Runs within a vshard get ids of their own.
        let small = batches("a/b", "req-1", &recs, &given, 3, 1 << 20);
        let mut seen = ids(&small);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), small.len());
        assert!(small.iter().all(|(i, _)| i.len() <= 3));
        // The key reused for other records: other ids where the records
        // differ, the same where they do not.
        let mut changed = recs.clone();
        changed[0].value = b"other".to_vec();
        let reused = batches("a/b", "req-1", &changed, &given, 10_000, 1 << 20);
        let differ = ids(&a)
            .iter()
            .zip(ids(&reused))
            .filter(|(x, y)| **x != *y)
            .count();
        assert_eq!(differ, 1, "only the changed record's batch gets a new id");
        // A ts the gateway filled in differs per try and is not hashed;
        // one the producer gave is.
        let mut later = recs.clone();
        for r in &mut later {
            r.ts += 1_000_000;
        }
        let filled = vec![false; recs.len()];
        assert_eq!(
            batches("a/b", "req-1", &later, &filled, 10_000, 1 << 20),
            batches("a/b", "req-1", &recs, &filled, 10_000, 1 << 20),
        );
        assert_ne!(batches("a/b", "req-1", &later, &given, 10_000, 1 << 20), a);
    }

    #[test]
    fn header_values() {
        for ok in [
            "a",
            "550e8400-e29b-41d4-a716-446655440000",
            &"x".repeat(128),
        ] {
            assert!(key_of(&HeaderValue::from_str(ok).unwrap()).is_ok(), "{ok}");
        }
        for bad in ["", "a b", &"x".repeat(129)] {
            assert!(
                key_of(&HeaderValue::from_str(bad).unwrap()).is_err(),
                "{bad:?}"
            );
        }
    }
}
