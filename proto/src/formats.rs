//! Gated formats: on-disk or on-the-wire formats whose newer version a
//! cell turns on only once every member reads and writes it (a rolling
//! upgrade runs mixed binaries; a replica on an old binary must never be
//! handed bytes it cannot read, and replicas must write the same bytes).
//!
//! Each binary reports, per format, the newest version it knows; the
//! controller keeps, per format, the version in use (1 until enabled) and
//! refuses to raise it while a member reports less. A binary from before
//! the gate reports nothing, which counts as version 1 of every format.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::pb::FormatVersion;

/// Segment files (FORMAT.md section 5): version 2 compresses blocks at
/// zstd level 6.
pub const SEGMENT: &str = "segment";
/// The newest segment format this build reads and writes.
pub const SEGMENT_MAX: u32 = 2;

/// Namespace tokens (docs/SECURITY.md): version 2 is a controller state
/// that holds token keys and issued tokens, and nodes that verify tokens.
/// The first `IssueToken` turns it on once every member supports it.
pub const TOKEN: &str = "token";
/// The newest token format this build knows.
pub const TOKEN_MAX: u32 = 2;

/// Tablet log entries (FORMAT.md section 4): version 2 adds
/// `AppendMany`, one entry for the concurrent batches a leader coalesced.
/// A binary that knows only version 1 cannot decode such an entry.
pub const LOG: &str = "log";
/// The newest log format this build writes.
pub const LOG_MAX: u32 = 2;
/// The log format from which leaders write `AppendMany`.
pub const LOG_APPEND_MANY: u32 = 2;

/// Node heartbeats (docs/ARCHITECTURE.md, "Heartbeat deltas"): version
/// 2 lets nodes report only the replicas whose report changed. A
/// controller of an earlier build would take such a report for the
/// node's whole set, so nodes send deltas only once every controller
/// reads them. (Assignment deltas in the answers need no gate: a node
/// asks for them, and an earlier controller answers in full.)
pub const HEARTBEAT: &str = "heartbeat";
/// The newest heartbeat format this build knows.
pub const HEARTBEAT_MAX: u32 = 2;

/// Every gated format this build knows, with the newest version of each.
pub const SUPPORTED: &[(&str, u32)] = &[
    (HEARTBEAT, HEARTBEAT_MAX),
    (LOG, LOG_MAX),
    (SEGMENT, SEGMENT_MAX),
    (TOKEN, TOKEN_MAX),
];

/// The version of every format before anything is enabled, and of every
/// format a member does not report.
pub const BASELINE: u32 = 1;

/// The newest version of `name` this build knows, if it knows the format.
pub fn supported(name: &str) -> Option<u32> {
    SUPPORTED.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// This build's formats, as reported in registrations and status.
pub fn supported_pb() -> Vec<FormatVersion> {
    SUPPORTED
        .iter()
        .map(|(name, version)| FormatVersion {
            name: (*name).into(),
            version: *version,
        })
        .collect()
}

/// The version of `name` in `formats` (a member's report or the cell's
/// formats in use), [`BASELINE`] when absent.
pub fn version_of(formats: &[FormatVersion], name: &str) -> u32 {
    formats
        .iter()
        .find(|f| f.name == name)
        .map_or(BASELINE, |f| f.version)
}

/// As protobuf, sorted by name.
pub fn to_pb(formats: &BTreeMap<String, u32>) -> Vec<FormatVersion> {
    formats
        .iter()
        .map(|(name, version)| FormatVersion {
            name: name.clone(),
            version: *version,
        })
        .collect()
}

/// `name version, ...` for messages and tables.
pub fn describe(formats: &[FormatVersion]) -> String {
    if formats.is_empty() {
        return "none reported (version 1 of each)".into();
    }
    formats
        .iter()
        .map(|f| format!("{} {}", f.name, f.version))
        .collect::<Vec<_>>()
        .join(", ")
}

static BINARY_VERSION: OnceLock<String> = OnceLock::new();

/// Sets the binary version this process reports (the `stele` binary does,
/// at start, with its build label); once.
pub fn set_binary_version(version: String) {
    let _ = BINARY_VERSION.set(version);
}

/// The binary version this process reports: what [`set_binary_version`]
/// set, else the crate version.
pub fn binary_version() -> &'static str {
    BINARY_VERSION
        .get()
        .map(String::as_str)
        .unwrap_or(env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_format_is_the_baseline() {
        let reported = vec![FormatVersion {
            name: SEGMENT.into(),
            version: 2,
        }];
        assert_eq!(version_of(&reported, SEGMENT), 2);
        assert_eq!(version_of(&[], SEGMENT), BASELINE);
        assert_eq!(version_of(&reported, "journal"), BASELINE);
        assert_eq!(supported(SEGMENT), Some(SEGMENT_MAX));
        assert_eq!(supported("journal"), None);
    }
}
