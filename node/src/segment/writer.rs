//! Building segment bytes from sorted rows: validate everything first
//! (TigerBeetle style: assert before writing), then lay out prologue, header,
//! blocks, footer and trailer.

use serde_bytes::ByteBuf;
use xxhash_rust::xxh3::xxh3_64;

use super::block::{put_row, row_len};
use super::bloom::Bloom;
use super::format::*;
use super::{Error, Result, Row, SegmentHeader, SegmentStats, WriteOptions};

/// Stats of the rows, validated against the header and the limits.
fn validate(
    header: &SegmentHeader,
    rows: &[Row],
    opts: &WriteOptions,
) -> Result<(SegmentStats, u64, u64)> {
    opts.validate()?;
    if u64::from(header.vshard_lo) >= header.vshard_hi || header.vshard_hi > 1 << 32 {
        return Err(Error::Invalid(format!(
            "vshard range [{}, {}) is empty or beyond 2^32",
            header.vshard_lo, header.vshard_hi
        )));
    }
    if header.log_first > header.log_last {
        return Err(Error::Invalid(format!(
            "log range [{}, {}] is reversed",
            header.log_first, header.log_last
        )));
    }
    if rows.is_empty() {
        return Err(Error::Invalid("a segment needs at least one row".into()));
    }
    let mut stats = SegmentStats {
        rows: rows.len() as u64,
        keys: 0,
        ts_min: u64::MAX,
        ts_max: 0,
    };
    let (mut index_min, mut index_max) = (u64::MAX, 0);
    for (i, row) in rows.iter().enumerate() {
        if row.namespace.len() > NAMESPACE_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "row {i}: namespace of {} bytes exceeds {NAMESPACE_BYTES_MAX}",
                row.namespace.len()
            )));
        }
        if row.key.len() > KEY_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "row {i}: key of {} bytes exceeds {KEY_BYTES_MAX}",
                row.key.len()
            )));
        }
        if row.value.len() > opts.value_bytes_max {
            return Err(Error::Invalid(format!(
                "row {i}: value of {} bytes exceeds {}",
                row.value.len(),
                opts.value_bytes_max
            )));
        }
        if row.index < header.log_first || row.index > header.log_last {
            return Err(Error::Invalid(format!(
                "row {i}: index {} outside the log range [{}, {}]",
                row.index, header.log_first, header.log_last
            )));
        }
        if i > 0 {
            let prev = &rows[i - 1];
            match prev.order_key().cmp(&row.order_key()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return Err(Error::DuplicatePosition {
                        index: row.index,
                        slot: row.slot,
                    });
                }
                std::cmp::Ordering::Greater => {
                    return Err(Error::Unsorted {
                        prev: i - 1,
                        row: i,
                    });
                }
            }
        }
        if i == 0 || rows[i - 1].namespace != row.namespace || rows[i - 1].key != row.key {
            stats.keys += 1;
        }
        stats.ts_min = stats.ts_min.min(row.ts);
        stats.ts_max = stats.ts_max.max(row.ts);
        index_min = index_min.min(row.index);
        index_max = index_max.max(row.index);
    }
    // A position names one record: (index, slot) must be unique across keys too.
    let mut positions: Vec<(u64, u32)> = rows.iter().map(|r| (r.index, r.slot)).collect();
    positions.sort_unstable();
    if let Some(w) = positions.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::DuplicatePosition {
            index: w[0].0,
            slot: w[0].1,
        });
    }
    Ok((stats, index_min, index_max))
}

fn compress(raw: &[u8], version: u32) -> Vec<u8> {
    // bulk::compress on an in-memory buffer only fails on allocation failure
    // or an invalid level; levels 1 and 6 are valid.
    zstd::bulk::compress(raw, zstd_level(version))
        .expect("zstd level 1 or 6 compression of a buffer cannot fail")
}

/// Encodes a segment. Pure and deterministic: the same header, rows and
/// options always give the same bytes. Rows must be strictly sorted by
/// `(namespace, key, ts, index, slot)` with unique `(index, slot)`.
pub fn encode(header: &SegmentHeader, rows: &[Row], opts: &WriteOptions) -> Result<Vec<u8>> {
    let (stats, index_min, index_max) = validate(header, rows, opts)?;

    let header_cbor = to_cbor(&HeaderV1 {
        tablet: header.tablet,
        vshard_lo: header.vshard_lo,
        vshard_hi: header.vshard_hi,
        log_first: header.log_first,
        log_last: header.log_last,
        row_schema: ROW_SCHEMA,
        rows: stats.rows,
        keys: stats.keys,
        ts_min: stats.ts_min,
        ts_max: stats.ts_max,
    });
    assert!(header_cbor.len() <= HEADER_BYTES_MAX);

    let mut out = Vec::with_capacity(PROLOGUE_LEN + header_cbor.len() + rows.len() * 32);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&opts.format.to_le_bytes());
    out.extend_from_slice(&(header_cbor.len() as u32).to_le_bytes());
    let header_crc =
        crc32c::crc32c_append(crc32c::crc32c(&out[..PROLOGUE_CRC_COVERED]), &header_cbor);
    out.extend_from_slice(&header_crc.to_le_bytes());
    debug_assert_eq!(out.len(), PROLOGUE_LEN);
    out.extend_from_slice(&header_cbor);

    let mut bloom = Bloom::with_keys(stats.keys);
    let mut blocks: Vec<BlockMeta> = Vec::new();
    let mut raw: Vec<u8> =
        Vec::with_capacity(opts.block_bytes_target.min(BLOCK_BYTES_TARGET_DEFAULT) * 2);
    let mut block_start = 0;
    let mut flush = |out: &mut Vec<u8>, raw: &mut Vec<u8>, block_rows: &[Row]| {
        assert!(!block_rows.is_empty() && raw.len() <= BLOCK_UNCOMPRESSED_BYTES_MAX);
        let frame = compress(raw, opts.format);
        let first = &block_rows[0];
        let last = &block_rows[block_rows.len() - 1];
        blocks.push(BlockMeta {
            offset: out.len() as u64,
            compressed_len: frame.len() as u64,
            uncompressed_len: raw.len() as u64,
            rows: block_rows.len() as u64,
            first_namespace: first.namespace.clone(),
            first_key: ByteBuf::from(first.key.clone()),
            last_namespace: last.namespace.clone(),
            last_key: ByteBuf::from(last.key.clone()),
            ts_min: block_rows.iter().map(|r| r.ts).min().unwrap_or(0),
            ts_max: block_rows.iter().map(|r| r.ts).max().unwrap_or(0),
        });
        out.extend_from_slice(&crc32c::crc32c(&frame).to_le_bytes());
        out.extend_from_slice(&frame);
        raw.clear();
    };
    for (i, row) in rows.iter().enumerate() {
        if i == 0 || rows[i - 1].namespace != row.namespace || rows[i - 1].key != row.key {
            bloom.insert(&row.namespace, &row.key);
        }
        // A block holds rows totalling at most the target, or a single row.
        if !raw.is_empty() && raw.len() + row_len(row) > opts.block_bytes_target {
            flush(&mut out, &mut raw, &rows[block_start..i]);
            block_start = i;
        }
        put_row(&mut raw, row);
        if raw.len() >= opts.block_bytes_target {
            flush(&mut out, &mut raw, &rows[block_start..=i]);
            block_start = i + 1;
        }
    }
    if !raw.is_empty() {
        flush(&mut out, &mut raw, &rows[block_start..]);
    }

    let first = &rows[0];
    let last = &rows[rows.len() - 1];
    let footer_cbor = to_cbor(&FooterV1 {
        blocks,
        bloom: bloom.to_stored(),
        rows: stats.rows,
        keys: stats.keys,
        ts_min: stats.ts_min,
        ts_max: stats.ts_max,
        index_min,
        index_max,
        first_namespace: first.namespace.clone(),
        first_key: ByteBuf::from(first.key.clone()),
        last_namespace: last.namespace.clone(),
        last_key: ByteBuf::from(last.key.clone()),
    });
    if footer_cbor.len() > FOOTER_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "footer of {} bytes exceeds {FOOTER_BYTES_MAX}; seal fewer rows",
            footer_cbor.len()
        )));
    }
    let footer_offset = out.len() as u64;
    out.extend_from_slice(&footer_cbor);

    let mut trailer = [0u8; TRAILER_LEN];
    trailer[TRAILER_FOOTER_OFFSET_OFFSET..][..8].copy_from_slice(&footer_offset.to_le_bytes());
    trailer[TRAILER_FOOTER_LEN_OFFSET..][..4]
        .copy_from_slice(&(footer_cbor.len() as u32).to_le_bytes());
    trailer[TRAILER_FOOTER_CRC_OFFSET..][..4]
        .copy_from_slice(&crc32c::crc32c(&footer_cbor).to_le_bytes());
    trailer[TRAILER_FILE_XXH3_OFFSET..][..8].copy_from_slice(&xxh3_64(&out).to_le_bytes());
    let trailer_crc = crc32c::crc32c(&trailer[..TRAILER_CRC_OFFSET]);
    trailer[TRAILER_CRC_OFFSET..][..4].copy_from_slice(&trailer_crc.to_le_bytes());
    trailer[TRAILER_MAGIC_OFFSET..].copy_from_slice(&TRAILER_MAGIC);
    out.extend_from_slice(&trailer);
    Ok(out)
}
