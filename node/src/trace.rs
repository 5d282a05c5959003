//! The write path's tracing spans: what each is called, what it carries,
//! and the field values they share, so a log line or an exported trace can
//! follow one batch from the client's call to the fsync that made it
//! durable and the seal that moved it into a segment.
//!
//! ```text
//! append {tablet, replica, batch, records}            service        DEBUG
//!  └─ propose {tablet, replica, index}                raft::replica  DEBUG
//! apply {tablet, replica, index, command, batch}      raft::state_machine, every replica  DEBUG
//! journal_group {group, units, frames, bytes, file}   journal::committer  DEBUG
//!  └─ "journal frame durable" {tablet, index}         one TRACE event per frame
//! seal {tablet, replica, index}                       sealer         INFO
//! ```
//!
//! `batch` is the client's idempotency id (32 hex digits): it stays the
//! same across the client's retries and is in the log entry, so the
//! leader's `append` and every replica's `apply` carry it. The journal runs
//! below Raft and knows only `(tablet, index)`: `propose` records the
//! index the batch got, and the frame events of a group name it.
//!
//! Spans are created only when their level is enabled (a disabled callsite
//! costs one cached check), never per record, and their field values are
//! numbers or formatted lazily ([`Batch`]). ERROR and WARN lines inside a
//! span carry its fields: in `--log-format json` as `span` and `spans`.

use std::fmt;

use stele_proto::command::TabletCommand;

/// A batch id as the spans show it: 32 hex digits (`-` when absent or
/// malformed), formatted only when a span is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch(pub Option<u128>);

impl Batch {
    /// From the request's bytes (16, big-endian), before validation.
    pub fn of_bytes(bytes: &[u8]) -> Batch {
        Batch(<[u8; 16]>::try_from(bytes).ok().map(u128::from_be_bytes))
    }

    /// From the halves stored in the log entry.
    pub fn of_halves(halves: [u64; 2]) -> Batch {
        Batch(Some(u128::from(halves[0]) << 64 | u128::from(halves[1])))
    }
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, "{id:032x}"),
            None => f.write_str("-"),
        }
    }
}

/// The `command` field of an `apply` span.
pub fn command_name(cmd: &TabletCommand) -> &'static str {
    match cmd {
        TabletCommand::Append(_) => "append",
        TabletCommand::AppendMany(_) => "append_many",
        TabletCommand::Seal { .. } => "seal",
        TabletCommand::Uploaded { .. } => "uploaded",
        TabletCommand::DropSegment { .. } => "drop_segment",
        TabletCommand::Split { .. } => "split",
        TabletCommand::Freeze { .. } => "freeze",
        TabletCommand::Unfreeze => "unfreeze",
        TabletCommand::Compact { .. } => "compact",
        TabletCommand::Merge { .. } => "merge",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_read_the_same_from_the_request_and_the_log() {
        let id: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        let from_request = Batch::of_bytes(&id.to_be_bytes());
        let from_log = Batch::of_halves(stele_proto::command::batch_id_halves(id));
        assert_eq!(from_request, from_log);
        assert_eq!(from_log.to_string(), "0123456789abcdeffedcba9876543210");
        assert_eq!(Batch::of_bytes(&[1; 15]).to_string(), "-");
    }
}
