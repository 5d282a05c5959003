//! Segment format version 1: named offsets and limits mirroring `docs/FORMAT.md` (section 5),
//! the CBOR header and footer records, and the varint used inside blocks.
//!
//! ```text
//! 0                 prologue  PROLOGUE_LEN bytes
//! PROLOGUE_LEN      header    CBOR HeaderV1, header_len bytes
//! header end        block*    [crc32c u32 LE][zstd frame], contiguous
//! footer_offset     footer    CBOR FooterV1, footer_len bytes
//! file_len - 36     trailer   TRAILER_LEN bytes
//! ```
//!
//! All fixed-width integers are little-endian.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Leading magic, also the first 8 bytes of the header checksum input.
pub const MAGIC: [u8; 8] = *b"STELESEG";
/// Trailing magic, the last 8 bytes of every complete segment file.
pub const TRAILER_MAGIC: [u8; 8] = *b"STELEEND";
/// The oldest format version this build reads and writes.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// The newest format version this build reads and writes. Version 2 is
/// version 1 with blocks compressed at zstd level 6 instead of 1 (smaller
/// segments, locally and in the bucket). Which version a seal writes is
/// decided by the cell (`stele cell formats enable segment 2`) and carried
/// in the seal's Raft entry, so every replica writes the same bytes.
pub const FORMAT_VERSION_MAX: u32 = stele_proto::formats::SEGMENT_MAX;
/// Version of the row layout inside blocks (`HeaderV1::row_schema`) that
/// this build writes. Schema 2 adds each row's vshard; schema 1 files are
/// still read (their rows' vshards are recomputed from the record key).
pub const ROW_SCHEMA: u32 = 2;
/// The oldest row schema this build reads.
pub const ROW_SCHEMA_MIN: u32 = 1;

// Prologue: magic, version, header length, header crc32c.
pub const PROLOGUE_MAGIC_OFFSET: usize = 0;
pub const PROLOGUE_VERSION_OFFSET: usize = 8;
pub const PROLOGUE_HEADER_LEN_OFFSET: usize = 12;
pub const PROLOGUE_HEADER_CRC_OFFSET: usize = 16;
pub const PROLOGUE_LEN: usize = 20;
/// The header crc32c covers prologue bytes `[0, 16)` then the header bytes.
pub const PROLOGUE_CRC_COVERED: usize = PROLOGUE_HEADER_CRC_OFFSET;

// Block: crc32c of the compressed bytes, then the zstd frame.
pub const BLOCK_CRC_LEN: usize = 4;
/// zstd level of a format version: fixed per version, because the bytes
/// (and so the id) must agree across replicas.
pub const fn zstd_level(version: u32) -> i32 {
    if version >= 2 { 6 } else { 1 }
}

// Trailer, at `file_len - TRAILER_LEN`.
pub const TRAILER_FOOTER_OFFSET_OFFSET: usize = 0;
pub const TRAILER_FOOTER_LEN_OFFSET: usize = 8;
pub const TRAILER_FOOTER_CRC_OFFSET: usize = 12;
pub const TRAILER_FILE_XXH3_OFFSET: usize = 16;
pub const TRAILER_CRC_OFFSET: usize = 24;
pub const TRAILER_MAGIC_OFFSET: usize = 28;
pub const TRAILER_LEN: usize = 36;

/// Smallest possible file: prologue, a header, a block, a footer, a trailer.
pub const FILE_LEN_MIN: u64 = (PROLOGUE_LEN + TRAILER_LEN) as u64;

// Limits. Writers refuse input beyond them; readers treat a declared length
// beyond them as corruption, so a hostile file cannot make us allocate more.
pub const NAMESPACE_BYTES_MAX: usize = 1024;
/// The fewest bytes an encoded row takes (one length byte each for the
/// namespace, key and value, and at least one varint byte for ts, index and
/// slot): a block's row count above its bytes / this is a lie.
pub const ROW_BYTES_MIN: u64 = 6;
/// Rows a reader allocates room for before it has decoded them: counts
/// come from the file, so room beyond this grows as rows actually decode.
pub const ROWS_PREALLOC_MAX: u64 = 1 << 16;
pub const KEY_BYTES_MAX: usize = 4096;
/// Hard ceiling for `WriteOptions::value_bytes_max` (default 1 MiB).
pub const VALUE_BYTES_HARD_MAX: usize = 16 << 20;
pub const VALUE_BYTES_DEFAULT_MAX: usize = 1 << 20;
pub const BLOCK_BYTES_TARGET_DEFAULT: usize = 64 << 10;
pub const BLOCK_BYTES_TARGET_MAX: usize = 8 << 20;
/// A block is either rows totalling at most the target or one row, so this
/// bounds every block's uncompressed size.
pub const BLOCK_UNCOMPRESSED_BYTES_MAX: usize = 32 << 20;
// A block is rows within the target or one row (namespace + key + value +
// six varints), so its size stays under the reader's cap.
const _: () = assert!(
    BLOCK_BYTES_TARGET_MAX + VALUE_BYTES_HARD_MAX + NAMESPACE_BYTES_MAX + KEY_BYTES_MAX + 60
        < BLOCK_UNCOMPRESSED_BYTES_MAX
);
pub const HEADER_BYTES_MAX: usize = 64 << 10;
pub const FOOTER_BYTES_MAX: usize = 1 << 30;

// Bloom filter over (namespace, key); see `bloom.rs`.
pub const BLOOM_SEED_1: u64 = 0x5354_454c_4542_4c31; // "STELEBL1"
pub const BLOOM_SEED_2: u64 = 0x5354_454c_4542_4c32; // "STELEBL2"
pub const BLOOM_BITS_PER_KEY: u64 = 10;
pub const BLOOM_HASHES: u32 = 7;
pub const BLOOM_HASHES_MAX: u32 = 32;

/// The CBOR header (field order is the encoding order: do not reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderV1 {
    pub tablet: u64,
    pub vshard_lo: u32,
    /// Exclusive; up to 2^32, hence u64.
    pub vshard_hi: u64,
    pub log_first: u64,
    pub log_last: u64,
    pub row_schema: u32,
    pub rows: u64,
    pub keys: u64,
    pub ts_min: u64,
    pub ts_max: u64,
}

/// One block's entry in the footer's block index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    /// File offset of the block's crc32c field.
    pub offset: u64,
    /// Length of the zstd frame (excluding the 4-byte crc).
    pub compressed_len: u64,
    pub uncompressed_len: u64,
    pub rows: u64,
    pub first_namespace: String,
    pub first_key: ByteBuf,
    pub last_namespace: String,
    pub last_key: ByteBuf,
    pub ts_min: u64,
    pub ts_max: u64,
}

/// The bloom filter as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BloomV1 {
    pub bits_len: u64,
    pub hashes: u32,
    pub bits: ByteBuf,
}

/// The CBOR footer (field order is the encoding order: do not reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FooterV1 {
    pub blocks: Vec<BlockMeta>,
    pub bloom: BloomV1,
    pub rows: u64,
    pub keys: u64,
    pub ts_min: u64,
    pub ts_max: u64,
    pub index_min: u64,
    pub index_max: u64,
    pub first_namespace: String,
    pub first_key: ByteBuf,
    pub last_namespace: String,
    pub last_key: ByteBuf,
}

/// Appends `v` as unsigned LEB128 (canonical: shortest form).
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes `put_varint` writes for `v`.
pub fn varint_len(v: u64) -> usize {
    let bits = 64 - v.max(1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Reads an unsigned LEB128 at `*pos`, advancing it; `None` if truncated,
/// longer than 10 bytes or overflowing u64.
pub fn get_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        let low = u64::from(b & 0x7f);
        if i == 9 && low > 1 {
            return None;
        }
        v |= low << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Serializes `value` as CBOR. ciborium writes definite lengths, shortest
/// integer forms and struct fields in declaration order, so this is a
/// deterministic function of the value.
pub fn to_cbor<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail, and these types have no fallible
    // Serialize impls (no maps with non-string keys, no custom errors).
    ciborium::into_writer(value, &mut out).expect("CBOR encoding into a Vec cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trips_and_rejects_overflow() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "len of {v}");
            let mut pos = 0;
            assert_eq!(get_varint(&buf, &mut pos), Some(v));
            assert_eq!(pos, buf.len());
            let mut pos = 0;
            assert_eq!(get_varint(&buf[..buf.len() - 1], &mut pos), None);
        }
        let mut pos = 0;
        assert_eq!(get_varint(&[0xff; 10], &mut pos), None);
        let mut pos = 0;
        assert_eq!(
            get_varint(
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                &mut pos
            ),
            None
        );
    }

    #[test]
    fn layout_constants_agree() {
        assert_eq!(PROLOGUE_MAGIC_OFFSET + MAGIC.len(), PROLOGUE_VERSION_OFFSET);
        assert_eq!(PROLOGUE_HEADER_CRC_OFFSET + 4, PROLOGUE_LEN);
        assert_eq!(TRAILER_MAGIC_OFFSET + TRAILER_MAGIC.len(), TRAILER_LEN);
    }
}
