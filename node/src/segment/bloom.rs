//! Per-key bloom filter over `(namespace, key)`, written by hand so its bits
//! are a documented, deterministic function of the keys.
//!
//! ```text
//! input  = u32 LE len(namespace) || namespace || key
//! h1     = xxh3_64_with_seed(input, BLOOM_SEED_1)
//! h2     = xxh3_64_with_seed(input, BLOOM_SEED_2) | 1
//! bit_i  = (h1 + i * h2) mod bits_len   (wrapping u64 arithmetic), i in 0..hashes
//! bit b  = byte b / 8, bit (b % 8) counted from the least significant bit
//! ```
//!
//! `bits_len` is `max(64, keys * 10)` rounded up to a multiple of 64 and
//! `hashes` is 7, which gives a false-positive rate near 0.8%.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::Damage;
use super::format::{
    BLOOM_BITS_PER_KEY, BLOOM_HASHES, BLOOM_HASHES_MAX, BLOOM_SEED_1, BLOOM_SEED_2, BloomV1,
};

/// A bloom filter being built or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    bits_len: u64,
    hashes: u32,
    bits: Vec<u8>,
}

fn hashes_of(namespace: &str, key: &[u8]) -> (u64, u64) {
    let mut input = Vec::with_capacity(4 + namespace.len() + key.len());
    // Lengths fit u32: the writer limits namespaces to NAMESPACE_BYTES_MAX.
    input.extend_from_slice(&(namespace.len() as u32).to_le_bytes());
    input.extend_from_slice(namespace.as_bytes());
    input.extend_from_slice(key);
    (
        xxh3_64_with_seed(&input, BLOOM_SEED_1),
        xxh3_64_with_seed(&input, BLOOM_SEED_2) | 1,
    )
}

impl Bloom {
    /// An empty filter sized for `keys` distinct keys.
    pub fn with_keys(keys: u64) -> Self {
        let bits_len = keys
            .saturating_mul(BLOOM_BITS_PER_KEY)
            .max(64)
            .div_ceil(64)
            .saturating_mul(64);
        Self {
            bits_len,
            hashes: BLOOM_HASHES,
            bits: vec![0; (bits_len / 8) as usize],
        }
    }

    pub fn insert(&mut self, namespace: &str, key: &[u8]) {
        let (h1, h2) = hashes_of(namespace, key);
        for i in 0..u64::from(self.hashes) {
            let b = h1.wrapping_add(i.wrapping_mul(h2)) % self.bits_len;
            self.bits[(b / 8) as usize] |= 1 << (b % 8);
        }
    }

    pub fn may_contain(&self, namespace: &str, key: &[u8]) -> bool {
        let (h1, h2) = hashes_of(namespace, key);
        (0..u64::from(self.hashes)).all(|i| {
            let b = h1.wrapping_add(i.wrapping_mul(h2)) % self.bits_len;
            self.bits[(b / 8) as usize] & (1 << (b % 8)) != 0
        })
    }

    pub fn to_stored(&self) -> BloomV1 {
        BloomV1 {
            bits_len: self.bits_len,
            hashes: self.hashes,
            bits: serde_bytes::ByteBuf::from(self.bits.clone()),
        }
    }

    /// Validates a stored filter; `Err` names what is wrong.
    pub fn from_stored(stored: BloomV1) -> Result<Self, Damage> {
        if stored.bits_len == 0 || !stored.bits_len.is_multiple_of(8) {
            return Err(Damage::BloomBitsLen {
                bits_len: stored.bits_len,
            });
        }
        if stored.bits.len() as u64 != stored.bits_len / 8 {
            return Err(Damage::BloomBytes {
                bytes: stored.bits.len(),
                bits_len: stored.bits_len,
            });
        }
        if stored.hashes == 0 || stored.hashes > BLOOM_HASHES_MAX {
            return Err(Damage::BloomHashes {
                hashes: stored.hashes,
            });
        }
        Ok(Self {
            bits_len: stored.bits_len,
            hashes: stored.hashes,
            bits: stored.bits.into_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_false_negatives(keys in proptest::collection::vec(("[a-c]{0,3}", proptest::collection::vec(any::<u8>(), 0..20)), 0..200)) {
            let mut bloom = Bloom::with_keys(keys.len() as u64);
            for (ns, key) in &keys {
                bloom.insert(ns, key);
            }
            let bloom = Bloom::from_stored(bloom.to_stored()).unwrap();
            for (ns, key) in &keys {
                prop_assert!(bloom.may_contain(ns, key));
            }
        }
    }

    #[test]
    fn false_positive_rate_is_near_design() {
        let n = 10_000u64;
        let mut bloom = Bloom::with_keys(n);
        for i in 0..n {
            bloom.insert("ws/proj", format!("key-{i}").as_bytes());
        }
        let probes = 100_000u64;
        let hits = (0..probes)
            .filter(|i| bloom.may_contain("ws/proj", format!("other-{i}").as_bytes()))
            .count() as f64;
        let rate = hits / probes as f64;
        // Theory for 10 bits/key, k=7: ~0.82%.
        assert!(rate < 0.015, "false-positive rate {rate}");
        assert!(
            rate > 0.002,
            "suspiciously low rate {rate}: are bits being set?"
        );
    }

    #[test]
    fn namespace_and_key_boundary_is_unambiguous() {
        let mut bloom = Bloom::with_keys(1);
        bloom.insert("ab", b"c");
        assert!(bloom.may_contain("ab", b"c"));
        // Same concatenation, different split: must hash differently.
        assert_ne!(hashes_of("ab", b"c"), hashes_of("a", b"bc"));
    }

    #[test]
    fn rejects_bad_stored_filters() {
        let good = Bloom::with_keys(3).to_stored();
        assert_eq!(good.bits_len, 64);
        let check = |mutate: &dyn Fn(&mut BloomV1), want: Damage| {
            let mut b = good.clone();
            mutate(&mut b);
            assert_eq!(Bloom::from_stored(b), Err(want));
        };
        check(&|b| b.bits_len = 0, Damage::BloomBitsLen { bits_len: 0 });
        check(&|b| b.bits_len = 63, Damage::BloomBitsLen { bits_len: 63 });
        check(
            &|b| b.bits_len += 8,
            Damage::BloomBytes {
                bytes: 8,
                bits_len: 72,
            },
        );
        check(&|b| b.hashes = 0, Damage::BloomHashes { hashes: 0 });
        check(
            &|b| b.hashes = BLOOM_HASHES_MAX + 1,
            Damage::BloomHashes {
                hashes: BLOOM_HASHES_MAX + 1,
            },
        );
        assert_eq!(
            Damage::BloomBytes {
                bytes: 8,
                bits_len: 72
            }
            .to_string(),
            "bloom has 8 bytes, bits_len 72 needs 9"
        );
    }
}
