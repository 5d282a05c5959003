//! Batch receipts: the memory of which batches a tablet applied, so a retry
//! is applied once (DESIGN.md section 5.6).
//!
//! A receipt is `(namespace, batch_id) -> [(vshard range at apply time,
//! positions)]`. A retried record is a duplicate iff a receipt part of its
//! batch covers its vshard; that rule stays true when a tablet's range is
//! later split or merged, because the range recorded is the one the batch
//! was applied under, not the tablet's current one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use stele_proto::command::Pos;

/// `(namespace, batch id halves)`.
pub type ReceiptKey = (String, [u64; 2]);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptPart {
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    /// `(record number within the batch, position)` of each applied record.
    pub positions: Vec<(u32, Pos)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub v: u16,
    pub parts: Vec<ReceiptPart>,
    /// Proposal time of the batch, for the retention window.
    pub at_us: u64,
    /// Log index the batch was applied at.
    pub index: u64,
}

impl Receipt {
    /// The original position of record `n` (vshard `vshard`) of the batch,
    /// if a part of this receipt covers it.
    pub fn covers(&self, n: u32, vshard: u32) -> Option<Pos> {
        self.parts
            .iter()
            .filter(|p| vshard >= p.vshard_lo && u64::from(vshard) < p.vshard_hi)
            .find_map(|p| {
                p.positions
                    .iter()
                    .find(|(i, _)| *i == n)
                    .map(|(_, pos)| *pos)
            })
    }
}

/// Encodes a receipt key for the catalog: batch id (16 bytes, big endian)
/// then the namespace bytes.
pub fn encode_key(key: &ReceiptKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + key.0.len());
    out.extend_from_slice(&key.1[0].to_be_bytes());
    out.extend_from_slice(&key.1[1].to_be_bytes());
    out.extend_from_slice(key.0.as_bytes());
    out
}

pub fn decode_key(bytes: &[u8]) -> Option<ReceiptKey> {
    if bytes.len() < 16 {
        return None;
    }
    let hi = u64::from_be_bytes(bytes[0..8].try_into().ok()?);
    let lo = u64::from_be_bytes(bytes[8..16].try_into().ok()?);
    let ns = std::str::from_utf8(&bytes[16..]).ok()?.to_string();
    Some((ns, [hi, lo]))
}

/// A tablet's receipts, in memory; the catalog holds those at or below the
/// checkpoint, the journal replay rebuilds the rest.
#[derive(Debug, Default)]
pub struct Receipts {
    map: HashMap<ReceiptKey, Receipt>,
}

impl Receipts {
    pub fn get(&self, key: &ReceiptKey) -> Option<&Receipt> {
        self.map.get(key)
    }

    pub fn insert(&mut self, key: ReceiptKey, receipt: Receipt) {
        self.map.insert(key, receipt);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Receipts applied in `(after, upto]`, to publish with a seal.
    pub fn applied_between(&self, after: u64, upto: u64) -> Vec<(ReceiptKey, Receipt)> {
        let mut out: Vec<_> = self
            .map
            .iter()
            .filter(|(_, r)| r.index > after && r.index <= upto)
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Keys of receipts older than `cutoff_us` applied at or below `upto`:
    /// what a seal at `upto` drops, from the catalog and then from memory.
    pub fn expired(&self, cutoff_us: u64, upto: u64) -> Vec<ReceiptKey> {
        let mut gone: Vec<ReceiptKey> = self
            .map
            .iter()
            .filter(|(_, r)| r.at_us < cutoff_us && r.index <= upto)
            .map(|(k, _)| k.clone())
            .collect();
        gone.sort();
        gone
    }

    /// Forgets one receipt (it aged out and its drop was published).
    pub fn expire_key(&mut self, key: &ReceiptKey) {
        self.map.remove(key);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ReceiptKey, &Receipt)> {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(index: u64, slot: u32) -> Pos {
        Pos {
            tablet: 1,
            index,
            slot,
        }
    }

    #[test]
    fn coverage_follows_the_range_at_apply_time() {
        let r = Receipt {
            v: 1,
            parts: vec![ReceiptPart {
                vshard_lo: 100,
                vshard_hi: 200,
                positions: vec![(0, pos(5, 0)), (1, pos(5, 1))],
            }],
            at_us: 0,
            index: 5,
        };
        assert_eq!(r.covers(0, 150), Some(pos(5, 0)));
        assert_eq!(r.covers(1, 199), Some(pos(5, 1)));
        assert_eq!(r.covers(1, 200), None, "outside the range at apply time");
        assert_eq!(r.covers(2, 150), None, "record not in the batch");
    }

    #[test]
    fn key_codec_round_trips() {
        let k = ("ws/proj".to_string(), [u64::MAX, 7]);
        assert_eq!(decode_key(&encode_key(&k)), Some(k));
        assert_eq!(decode_key(b"short"), None);
    }

    #[test]
    fn expire_keeps_young_and_unpublished() {
        let mut rs = Receipts::default();
        for (i, at) in [(1u64, 10u64), (2, 20), (3, 30)] {
            rs.insert(
                ("a/b".into(), [0, i]),
                Receipt {
                    v: 1,
                    parts: vec![],
                    at_us: at,
                    index: i,
                },
            );
        }
        let gone = rs.expired(25, 1);
        assert_eq!(gone, vec![("a/b".to_string(), [0, 1])]);
        for k in &gone {
            rs.expire_key(k);
        }
        assert_eq!(rs.len(), 2);
        assert_eq!(rs.applied_between(1, 3).len(), 2);
    }
}
