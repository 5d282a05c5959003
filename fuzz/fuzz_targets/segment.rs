//! Segment files (node/src/segment), the bytes a node reads from its disk,
//! from a peer (snapshot catch-up) and from the cold tier: the reader's
//! open, block reads and scrub on any bytes; a block's row decoder; and
//! rows the writer encodes read back exactly, while damage to them, even
//! with every checksum recomputed, is refused or at least never panics.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;
use stele_node::segment::format::{self, FORMAT_VERSION_MAX, FORMAT_VERSION_MIN};
use stele_node::segment::{self, RangeRead, Row, SegmentHeader, SegmentReader, WriteOptions};

/// Segment bytes in memory, as the cold tier's range reads serve them.
#[derive(Debug)]
struct Mem(Vec<u8>);

impl RangeRead for Mem {
    fn byte_len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        usize::try_from(offset)
            .ok()
            .and_then(|at| self.0.get(at..at.checked_add(len)?))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| std::io::Error::other("range past the end"))
    }
}

/// Everything a node does with a segment it did not write; errors are fine.
fn read_everything(bytes: Vec<u8>, id: &str) -> Option<(SegmentReader, Vec<Row>)> {
    let reader = SegmentReader::open_remote("fuzz.seg", id, Arc::new(Mem(bytes))).ok()?;
    let _ = reader.latest("ns", b"k");
    let _ = reader.scan("ns", b"", 0, u64::MAX);
    let _ = reader.scan_key("ns", b"k", 0, u64::MAX, None, 10);
    let _ = reader.sole_namespace();
    let rows = reader.rows().ok()?;
    Some((reader, rows))
}

const ANY_ID: &str = "00000000000000000000000000000000";

fuzz_target!(|data: &[u8]| {
    // Any bytes as a whole segment.
    let _ = read_everything(data.to_vec(), ANY_ID);

    // Any bytes as a decompressed block of either row schema; what decodes
    // encodes to rows that decode the same.
    if let Some((&head, buf)) = data.split_first() {
        let schema = if head & 1 == 0 {
            1
        } else {
            api::SEGMENT_ROW_SCHEMA
        };
        let rows = u64::from(head >> 1);
        if let Ok(decoded) = api::segment_block_rows(buf, rows, schema) {
            let again = api::segment_block_bytes(&decoded);
            let back = api::segment_block_rows(&again, rows, api::SEGMENT_ROW_SCHEMA);
            assert_eq!(back.as_ref(), Ok(&decoded));
        }
    }

    let mut u = Unstructured::new(data);
    let Ok((header, rows, opts)) = segment_input(&mut u) else {
        return;
    };
    let Ok(bytes) = segment::encode(&header, &rows, &opts) else {
        return;
    };
    let id = segment::segment_id(&bytes);
    let (reader, back) =
        read_everything(bytes.clone(), &id).expect("an encoded segment does not read back");
    assert_eq!(back, rows, "rows changed on the way through a segment");
    assert_eq!(reader.header(), &header);
    reader
        .verify_all()
        .expect("an encoded segment fails its scrub");
    let blocks = reader.block_offsets();
    let footer = reader.footer_offset() as usize;

    // Damage: up to four bytes changed. The scrub must refuse it, with the
    // checksums as they are and with all of them recomputed (a tampered
    // object in the bucket); reading it must never panic.
    let mut damaged = bytes.clone();
    for _ in 0..u.int_in_range(1..=4).unwrap_or(1) {
        let at = u.choose_index(damaged.len()).unwrap_or(0);
        damaged[at] ^= u.int_in_range(1..=255u8).unwrap_or(1);
    }
    for damaged in [damaged.clone(), resealed(damaged, &blocks, footer)] {
        // (Recomputing can undo damage to a checksum field.)
        if damaged == bytes {
            continue;
        }
        if let Some((reader, _)) = read_everything(damaged, &id) {
            assert!(reader.verify_all().is_err(), "damage passed the scrub");
        }
    }
});

fn segment_input(
    u: &mut Unstructured,
) -> libfuzzer_sys::arbitrary::Result<(SegmentHeader, Vec<Row>, WriteOptions)> {
    let log_first = u.int_in_range(0..=1000u64)?;
    let log_last = log_first + u.int_in_range(0..=1000u64)?;
    let vshard_lo = u.int_in_range(0..=u32::MAX - 1)?;
    let vshard_hi = u.int_in_range(u64::from(vshard_lo) + 1..=1u64 << 32)?;
    let header = SegmentHeader {
        tablet: u.arbitrary()?,
        vshard_lo,
        vshard_hi,
        log_first,
        log_last,
    };
    let mut rows = Vec::new();
    for _ in 0..u.int_in_range(1..=24)? {
        let key_len = u.int_in_range(0..=6)?;
        let value_len = u.int_in_range(0..=64)?;
        rows.push(Row {
            namespace: ["ns", "", "a", "log"][u.choose_index(4)?].to_owned(),
            key: u.bytes(key_len)?.to_vec(),
            ts: u.int_in_range(0..=1 << 20)?,
            index: u.int_in_range(log_first..=log_last)?,
            slot: u.int_in_range(0..=8)?,
            value: u.bytes(value_len)?.to_vec(),
            vshard: u.int_in_range(vshard_lo..=u32::try_from(vshard_hi - 1).unwrap_or(u32::MAX))?,
            tablet: 0,
        });
    }
    rows.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    rows.dedup_by(|a, b| a.order_key() == b.order_key());
    let opts = WriteOptions {
        block_bytes_target: u.int_in_range(1..=4096)?,
        format: u.int_in_range(FORMAT_VERSION_MIN..=FORMAT_VERSION_MAX)?,
        ..WriteOptions::default()
    };
    Ok((header, rows, opts))
}

/// Every checksum and the whole-file hash recomputed over damaged bytes,
/// at the offsets of the intact file (node/src/segment/tests.rs does the
/// same): only the content hash (the id) still tells.
fn resealed(mut bytes: Vec<u8>, blocks: &[u64], footer: usize) -> Vec<u8> {
    use format::*;
    let header_len = u32::from_le_bytes(
        bytes[PROLOGUE_HEADER_LEN_OFFSET..][..4]
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let header_end = (PROLOGUE_LEN + header_len).clamp(PROLOGUE_LEN, footer);
    let crc = crc32c(
        &bytes[..PROLOGUE_CRC_COVERED],
        &bytes[PROLOGUE_LEN..header_end],
    );
    bytes[PROLOGUE_HEADER_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
    let ends = blocks.iter().skip(1).map(|o| *o as usize).chain([footer]);
    for (start, end) in blocks.iter().map(|o| *o as usize).zip(ends) {
        let crc = crc32c(&[], &bytes[start + BLOCK_CRC_LEN..end]);
        bytes[start..][..4].copy_from_slice(&crc.to_le_bytes());
    }
    let trailer = bytes.len() - TRAILER_LEN;
    let crc = crc32c(&[], &bytes[footer..trailer]);
    bytes[trailer + TRAILER_FOOTER_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
    let hash = stele_node::fuzz_api::xxh3_64(&bytes[..trailer]);
    bytes[trailer + TRAILER_FILE_XXH3_OFFSET..][..8].copy_from_slice(&hash.to_le_bytes());
    let crc = crc32c(&[], &bytes[trailer..trailer + TRAILER_CRC_OFFSET]);
    bytes[trailer + TRAILER_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn crc32c(a: &[u8], b: &[u8]) -> u32 {
    stele_node::fuzz_api::crc32c(a, b)
}
