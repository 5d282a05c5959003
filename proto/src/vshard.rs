//! The vshard hash: the one stable function from (namespace, routing key) to
//! a point in `0..2^32`. Written down in docs/FORMAT.md; never changed.
//!
//! ```text
//! vshard = (top16(xxh3_64(namespace, SEED)) << 16) | top16(xxh3_64(routing_key, SEED))
//! ```
//!
//! A namespace therefore owns the contiguous range
//! `[top16(ns) << 16, (top16(ns) + 1) << 16)` of 65,536 vshards.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The fixed seed of the vshard hash (ASCII "STELEVSH"). Never change it:
/// every stored record's placement depends on it.
pub const VSHARD_SEED: u64 = 0x5354_454C_4556_5348;

/// One past the largest vshard.
pub const VSHARD_END: u64 = 1 << 32;

/// The top 16 bits of the stable hash of `bytes`.
pub fn hash16(bytes: &[u8]) -> u32 {
    (xxh3_64_with_seed(bytes, VSHARD_SEED) >> 48) as u32
}

/// The vshard of a record.
pub fn vshard(namespace: &str, routing_key: &[u8]) -> u32 {
    (hash16(namespace.as_bytes()) << 16) | hash16(routing_key)
}

/// The vshard range `[lo, hi)` owned by a namespace.
pub fn namespace_range(namespace: &str) -> (u32, u64) {
    let lo = hash16(namespace.as_bytes()) << 16;
    (lo, u64::from(lo) + (1 << 16))
}

/// Splits `0..2^32` into `n` contiguous ranges of near-equal width.
pub fn even_ranges(n: u32) -> Vec<(u32, u64)> {
    let n = u64::from(n.max(1));
    (0..n)
        .map(|i| {
            let lo = VSHARD_END * i / n;
            let hi = VSHARD_END * (i + 1) / n;
            (lo as u32, hi)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_pinned() {
        // These values are part of the on-disk contract (FORMAT.md). If this
        // test fails, the hash changed and every cell's placement with it.
        assert_eq!(vshard("acme/web", b"user-1"), vshard("acme/web", b"user-1"));
        let ns = hash16(b"acme/web");
        assert_eq!(vshard("acme/web", b"k") >> 16, ns);
        assert_eq!(
            xxh3_64_with_seed(b"acme/web", VSHARD_SEED),
            PINNED_ACME_WEB,
            "vshard hash changed"
        );
    }

    const PINNED_ACME_WEB: u64 = 1_538_879_057_011_559_344;

    #[test]
    fn namespace_range_contains_its_vshards() {
        for key in [&b"a"[..], b"b", b"zzzz", b""] {
            let v = vshard("t/p", key);
            let (lo, hi) = namespace_range("t/p");
            assert!(u64::from(v) >= u64::from(lo) && u64::from(v) < hi);
        }
    }

    #[test]
    fn even_ranges_cover_everything() {
        for n in [1, 3, 16, 1000] {
            let r = even_ranges(n);
            assert_eq!(r.len(), n as usize);
            assert_eq!(r[0].0, 0);
            assert_eq!(r[r.len() - 1].1, VSHARD_END);
            for w in r.windows(2) {
                assert_eq!(u64::from(w[1].0), w[0].1);
            }
        }
    }
}
