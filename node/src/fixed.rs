//! Fixed-width little-endian integer fields of the node's on-disk and wire
//! formats: journal frames, segment prologues and trailers, segment stubs,
//! transport frame headers.
//!
//! ```text
//! bytes from disk or network ──u32_le / u64_le / array──► value, or Error::Short
//! a fixed-size array, constant offset ──u32_le_in / u64_le_in──► value (checked when compiled)
//! ```
//!
//! Bytes read off a disk or a network are never trusted to be long enough:
//! the slice readers check the bounds and return [`Error::Short`], which each
//! format turns into its own "damaged" or "protocol" error instead of a
//! panic. Where the buffer is a fixed-size array and the offset a constant,
//! the `_in` readers check the bounds when the crate compiles, so they have
//! no failure to handle.

/// `fixed::Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The field lies (partly) past the end of the bytes at hand: the input
    /// is truncated or a length or offset in it is wrong.
    #[error("field of {width} bytes at offset {offset} runs past the end of {len} bytes")]
    Short {
        offset: usize,
        width: usize,
        len: usize,
    },
}

/// `fixed::Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The `N` bytes at `offset` of `buf`.
pub fn array<const N: usize>(buf: &[u8], offset: usize) -> Result<&[u8; N]> {
    offset
        .checked_add(N)
        .and_then(|end| buf.get(offset..end))
        .and_then(|field| field.try_into().ok())
        .ok_or(Error::Short {
            offset,
            width: N,
            len: buf.len(),
        })
}

/// The little-endian `u32` at `offset` of `buf`.
pub fn u32_le(buf: &[u8], offset: usize) -> Result<u32> {
    array(buf, offset).map(|b| u32::from_le_bytes(*b))
}

/// The little-endian `u64` at `offset` of `buf`.
pub fn u64_le(buf: &[u8], offset: usize) -> Result<u64> {
    array(buf, offset).map(|b| u64::from_le_bytes(*b))
}

/// The little-endian `u32` at the constant offset `AT` of an `N`-byte array.
/// A field that does not fit fails the build, not the read.
pub fn u32_le_in<const AT: usize, const N: usize>(buf: &[u8; N]) -> u32 {
    const { assert!(AT + 4 <= N, "u32 field past the end of the array") };
    u32_le(buf, AT).expect("bounds checked at compile time")
}

/// The little-endian `u64` at the constant offset `AT` of an `N`-byte array.
/// A field that does not fit fails the build, not the read.
pub fn u64_le_in<const AT: usize, const N: usize>(buf: &[u8; N]) -> u64 {
    const { assert!(AT + 8 <= N, "u64 field past the end of the array") };
    u64_le(buf, AT).expect("bounds checked at compile time")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_fields_at_their_offsets() {
        let buf = [0xAA, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xBB];
        assert_eq!(u32_le(&buf, 1), Ok(0x0403_0201));
        assert_eq!(u64_le(&buf, 1), Ok(0x0807_0605_0403_0201));
        assert_eq!(u32_le(&buf, 6), Ok(0xBB08_0706));
        assert_eq!(array::<2>(&buf, 8), Ok(&[0x08, 0xBB]));
        assert_eq!(u32_le_in::<1, 10>(&buf), 0x0403_0201);
        assert_eq!(u64_le_in::<2, 10>(&buf), 0xBB08_0706_0504_0302);
        // The same bytes the writers produce with `to_le_bytes`.
        let v = 0x1122_3344_5566_7788u64;
        assert_eq!(u64_le(&v.to_le_bytes(), 0), Ok(v));
        assert_eq!(u32_le(&0xDEAD_BEEFu32.to_le_bytes(), 0), Ok(0xDEAD_BEEF));
    }

    #[test]
    fn a_short_buffer_is_a_typed_error_not_a_panic() {
        let check = |got: Result<u64>, offset: usize, width: usize, len: usize| {
            assert_eq!(got, Err(Error::Short { offset, width, len }));
        };
        let buf = [0u8; 10];
        check(u32_le(&buf, 7).map(u64::from), 7, 4, 10);
        check(u64_le(&buf, 3), 3, 8, 10);
        check(u64_le(&buf, 10), 10, 8, 10);
        check(u64_le(&[], 0), 0, 8, 0);
        check(u32_le(&buf[..3], 0).map(u64::from), 0, 4, 3);
        // An offset so large that offset + width overflows.
        check(u64_le(&buf, usize::MAX - 2), usize::MAX - 2, 8, 10);
        assert!(array::<11>(&buf, 0).is_err());
        // The last field that fits still reads.
        assert_eq!(u32_le(&buf, 6), Ok(0));
        assert_eq!(u64_le(&buf, 2), Ok(0));
        assert_eq!(
            Error::Short {
                offset: 3,
                width: 8,
                len: 10
            }
            .to_string(),
            "field of 8 bytes at offset 3 runs past the end of 10 bytes"
        );
    }
}
