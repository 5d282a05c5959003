//! Read pages: limits, the byte budget of one response, and the cursors a
//! page hands back.

use serde::{Deserialize, Serialize};
use stele_proto::Error as ApiError;

use super::invalid;
use crate::segment::Row;

/// Rows returned by one read when the request names no limit.
pub const READ_LIMIT_DEFAULT: usize = 1000;
/// Most rows one read returns, whatever the request asks.
pub const READ_LIMIT_MAX: usize = 10_000;
/// A read response stops adding rows past this many key and value bytes
/// (always returning at least one row) and hands back a cursor, so a page
/// of large values stays well under gRPC message limits.
pub const READ_BYTES_MAX: usize = 4 << 20;

/// How many leading rows fit the byte budget (at least one).
pub(super) fn rows_within_budget<'a>(rows: impl Iterator<Item = &'a Row>) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for row in rows {
        bytes += row.key.len() + row.value.len() + 64;
        if n > 0 && bytes > READ_BYTES_MAX {
            break;
        }
        n += 1;
    }
    n
}

pub(super) fn limit_of(limit: u32) -> usize {
    match limit as usize {
        0 => READ_LIMIT_DEFAULT,
        n => n.min(READ_LIMIT_MAX),
    }
}

pub(super) fn ts_to_of(ts_to: u64) -> u64 {
    if ts_to == 0 { u64::MAX } else { ts_to }
}

/// Cursor of a namespace scan: the last row returned.
#[derive(Serialize, Deserialize)]
pub(crate) struct ScanCursor {
    pub ts: u64,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub tablet: u64,
    pub index: u64,
    pub slot: u32,
}

/// Cursor of a key scan: the last row returned.
#[derive(Serialize, Deserialize)]
pub(crate) struct KeyCursor {
    pub ts: u64,
    pub index: u64,
    pub slot: u32,
    /// The row's position tablet (its parent's, for a row a split child
    /// shares). Absent in cursors from before splits.
    #[serde(default)]
    pub tablet: u64,
}

pub(crate) fn decode_cursor<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
) -> Result<Option<T>, ApiError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    ciborium::from_reader(bytes)
        .map(Some)
        .map_err(|_| invalid("cursor", "not a cursor this server issued"))
}

pub(crate) fn encode_cursor<T: Serialize>(c: &T) -> Vec<u8> {
    crate::catalog::to_cbor(c)
}
