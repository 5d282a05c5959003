//! Row layout inside a block (row schema 1), before compression.
//!
//! ```text
//! row = varint len(namespace) | namespace (UTF-8)
//!     | varint len(key)       | key
//!     | varint ts | varint index | varint slot
//!     | varint len(value)     | value
//! ```
//!
//! Rows follow each other with no padding; a block's row count is in the
//! footer's block index, and the decoder requires the bytes to end exactly
//! after the last row.

use super::format::{
    KEY_BYTES_MAX, NAMESPACE_BYTES_MAX, ROW_BYTES_MIN, VALUE_BYTES_HARD_MAX, get_varint,
    put_varint, varint_len,
};
use super::{Damage, Row};

/// Encoded size of `row`.
pub fn row_len(row: &Row) -> usize {
    varint_len(row.namespace.len() as u64)
        + row.namespace.len()
        + varint_len(row.key.len() as u64)
        + row.key.len()
        + varint_len(row.ts)
        + varint_len(row.index)
        + varint_len(u64::from(row.slot))
        + varint_len(u64::from(row.vshard))
        + varint_len(row.value.len() as u64)
        + row.value.len()
}

pub fn put_row(out: &mut Vec<u8>, row: &Row) {
    put_varint(out, row.namespace.len() as u64);
    out.extend_from_slice(row.namespace.as_bytes());
    put_varint(out, row.key.len() as u64);
    out.extend_from_slice(&row.key);
    put_varint(out, row.ts);
    put_varint(out, row.index);
    put_varint(out, u64::from(row.slot));
    put_varint(out, u64::from(row.vshard));
    put_varint(out, row.value.len() as u64);
    out.extend_from_slice(&row.value);
}

fn get_bytes<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    max: usize,
    field: &'static str,
) -> Result<&'a [u8], Damage> {
    let at = *pos;
    let len = get_varint(buf, pos).ok_or(Damage::BadLength { field, at })?;
    if len > max as u64 {
        return Err(Damage::LengthOverMax {
            field,
            len,
            at,
            max,
        });
    }
    let len = len as usize;
    let end = pos
        .checked_add(len)
        .filter(|end| *end <= buf.len())
        .ok_or(Damage::PastBlockEnd { field, len, at })?;
    let bytes = &buf[*pos..end];
    *pos = end;
    Ok(bytes)
}

fn get_u64(buf: &[u8], pos: &mut usize, field: &'static str) -> Result<u64, Damage> {
    let at = *pos;
    get_varint(buf, pos).ok_or(Damage::BadVarint { field, at })
}

fn get_u32(buf: &[u8], pos: &mut usize, field: &'static str) -> Result<u32, Damage> {
    let value = get_u64(buf, pos, field)?;
    u32::try_from(value).map_err(|_| Damage::OverU32 {
        field,
        value,
        at: *pos,
    })
}

/// Decodes exactly `rows` rows filling all of `buf`. Never panics; the
/// number of rows allocated up front is capped by the buffer size.
pub fn decode_rows(buf: &[u8], rows: u64, schema: u32) -> Result<Vec<Row>, Damage> {
    // Each row takes at least ROW_BYTES_MIN bytes, so a larger count is a lie.
    if rows > buf.len() as u64 / ROW_BYTES_MIN {
        return Err(Damage::TooManyRows {
            rows,
            bytes: buf.len(),
        });
    }
    let mut out = Vec::with_capacity(rows as usize);
    let mut pos = 0;
    for _ in 0..rows {
        let namespace = get_bytes(buf, &mut pos, NAMESPACE_BYTES_MAX, "namespace")?;
        let namespace = std::str::from_utf8(namespace)
            .map_err(|_| Damage::NamespaceNotUtf8 { at: pos })?
            .to_owned();
        let key = get_bytes(buf, &mut pos, KEY_BYTES_MAX, "key")?.to_vec();
        let ts = get_u64(buf, &mut pos, "ts")?;
        let index = get_u64(buf, &mut pos, "index")?;
        let slot = get_u32(buf, &mut pos, "slot")?;
        let vshard = if schema >= 2 {
            get_u32(buf, &mut pos, "vshard")?
        } else {
            // Schema 1 kept no vshard: the record key was the routing key
            // of every record written before schema 2.
            stele_proto::vshard::vshard(&namespace, &key)
        };
        let value = get_bytes(buf, &mut pos, VALUE_BYTES_HARD_MAX, "value")?.to_vec();
        out.push(Row {
            namespace,
            key,
            ts,
            index,
            slot,
            value,
            vshard,
            tablet: 0,
        });
    }
    if pos != buf.len() {
        return Err(Damage::TrailingBytes {
            bytes: buf.len() - pos,
            rows,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(namespace: &str, key: &[u8], value: &[u8]) -> Row {
        Row {
            namespace: namespace.to_owned(),
            key: key.to_vec(),
            ts: 300,
            index: 7,
            slot: 2,
            value: value.to_vec(),
            vshard: 9,
            tablet: 0,
        }
    }

    fn encoded(rows: &[Row]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in rows {
            put_row(&mut out, r);
        }
        out
    }

    /// Each way a block can lie decodes to the `Damage` that names it.
    #[test]
    fn damaged_rows_are_named_by_their_damage() {
        let rows = [row("ns", b"k1", b"v1"), row("ns", b"k2", b"value2")];
        let good = encoded(&rows);
        assert_eq!(decode_rows(&good, 2, 2).unwrap(), rows);

        let check = |buf: &[u8], rows: u64, want: Damage| {
            assert_eq!(decode_rows(buf, rows, 2), Err(want));
        };
        check(
            &good,
            good.len() as u64,
            Damage::TooManyRows {
                rows: good.len() as u64,
                bytes: good.len(),
            },
        );
        check(
            &good,
            1,
            Damage::TrailingBytes {
                bytes: good.len() - row_len(&rows[0]),
                rows: 1,
            },
        );
        // The second row's value cut short by one byte.
        check(
            &good[..good.len() - 1],
            2,
            Damage::PastBlockEnd {
                field: "value",
                len: 6,
                at: good.len() - 7,
            },
        );
        // A namespace that is not UTF-8 (the first row's, after its length byte).
        let mut bad = good.clone();
        bad[1] = 0xff;
        check(&bad, 2, Damage::NamespaceNotUtf8 { at: 3 });
        // A namespace length above the limit.
        let mut long = Vec::new();
        put_varint(&mut long, NAMESPACE_BYTES_MAX as u64 + 1);
        long.resize(64, 0);
        check(
            &long,
            1,
            Damage::LengthOverMax {
                field: "namespace",
                len: NAMESPACE_BYTES_MAX as u64 + 1,
                at: 0,
                max: NAMESPACE_BYTES_MAX,
            },
        );
        // A slot that does not fit u32.
        let mut wide = Vec::new();
        for v in [1u64, b'n' as u64, 1, b'k' as u64] {
            put_varint(&mut wide, v);
        }
        for v in [300, 7, u64::from(u32::MAX) + 1, 9, 0] {
            put_varint(&mut wide, v);
        }
        let slot_end = wide.len() - 2;
        check(
            &wide,
            1,
            Damage::OverU32 {
                field: "slot",
                value: u64::from(u32::MAX) + 1,
                at: slot_end,
            },
        );
        // A varint that never ends.
        check(
            &[1, b'n', 1, b'k', 0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
            1,
            Damage::BadVarint { field: "ts", at: 4 },
        );
        assert_eq!(
            Damage::PastBlockEnd {
                field: "value",
                len: 6,
                at: 20
            }
            .to_string(),
            "value of 6 bytes at block byte 20 runs past the block end"
        );
    }
}
