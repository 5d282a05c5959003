//! The decoders this crate runs on bytes from disk and the network, for the
//! fuzz targets in `fuzz/` (cargo feature `fuzz`; docs/FUZZING.md).
//!
//! Each function calls the decoder production calls, with the same limits,
//! and hands back what it decoded in a form a target can compare. Where a
//! decoder has an encoder, the `*_reencode` functions return the encoding
//! of what was decoded, so a target can check the round trip
//! `decode(encode(decode(x))) == decode(x)` on types without `PartialEq`:
//! encoding them again must give the same bytes. Nothing here is used by the
//! node itself.
//!
//! Public decoders (`segment::SegmentReader::open_remote`,
//! `transport::Header::decode`, `tier::stub::Stub::decode`,
//! `raft::router::decode_msg`, `segment::encode`) need no entry here; the
//! targets call them directly.

use crate::journal::format::{self, HEADER_BYTES};
use crate::journal::{FrameKind, recovery};

pub use crate::journal::Damage as JournalDamage;
pub use crate::journal::format::{
    FRAME_HEADER_BYTES as JOURNAL_FRAME_HEADER_BYTES, FrameHeader,
    HEADER_BYTES as JOURNAL_HEADER_BYTES, HeaderCheck,
};

/// The largest frame payload the fuzz targets allow (the journal's default
/// limit is far larger; a smaller one lets short inputs reach the check).
pub const JOURNAL_PAYLOAD_BYTES_MAX: usize = 1 << 16;

/// What journal recovery makes of one file's bytes (`recovery::recover`
/// runs the same two steps on every file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalScan {
    /// Shorter than the 16-byte file header.
    Short,
    /// The header is not this build's (bad magic, other version).
    Header(HeaderCheck),
    /// The frames that verify, in order: header, offset, whole length; then
    /// the damage that ended the scan, if any: offset, reason, and the
    /// offset of a valid frame after it (which makes recovery refuse).
    Frames {
        frames: Vec<(FrameHeader, u64, u32)>,
        damage: Option<(u64, JournalDamage, Option<u64>)>,
    },
}

/// Scans a whole journal file as recovery does.
pub fn journal_scan(bytes: &[u8], payload_bytes_max: usize) -> JournalScan {
    let Ok(header) = crate::fixed::array::<HEADER_BYTES>(bytes, 0) else {
        return JournalScan::Short;
    };
    match format::check_file_header(header) {
        HeaderCheck::Ok => {}
        other => return JournalScan::Header(other),
    }
    let scan = recovery::scan_frames(bytes, payload_bytes_max);
    let damage = match scan.end {
        recovery::ScanEnd::Clean => None,
        recovery::ScanEnd::Damaged {
            offset,
            reason,
            valid_after,
        } => Some((offset, reason, valid_after)),
    };
    JournalScan::Frames {
        frames: scan.frames,
        damage,
    }
}

/// The bytes of a journal file holding these frames (the writer's own
/// encoders). A `Truncate` frame's payload is dropped: it has none.
pub fn journal_file(frames: &[(FrameKind, u64, u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = format::encode_file_header().to_vec();
    for (kind, tablet, index, payload) in frames {
        let payload: &[u8] = if *kind == FrameKind::Truncate {
            &[]
        } else {
            payload
        };
        format::encode_frame(&mut out, *kind, *tablet, *index, payload);
    }
    out
}

/// Every journal frame kind, for targets that pick one from a byte.
pub const JOURNAL_FRAME_KINDS: [FrameKind; 3] =
    [FrameKind::Entry, FrameKind::Truncate, FrameKind::Commit];

/// A segment block's rows (after its crc and zstd), as the reader decodes them.
pub fn segment_block_rows(
    buf: &[u8],
    rows: u64,
    schema: u32,
) -> Result<Vec<crate::segment::Row>, crate::segment::Damage> {
    crate::segment::block::decode_rows(buf, rows, schema)
}

/// A block's bytes for these rows (the writer's encoder, current schema).
pub fn segment_block_bytes(rows: &[crate::segment::Row]) -> Vec<u8> {
    let mut out = Vec::new();
    for row in rows {
        crate::segment::block::put_row(&mut out, row);
    }
    out
}

/// crc32c of `a` then `b`, and xxh3-64: the checksums the segment format
/// uses, for a target that recomputes them over damaged bytes.
pub fn crc32c(a: &[u8], b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(a), b)
}

pub fn xxh3_64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The row schema the writer uses now.
pub const SEGMENT_ROW_SCHEMA: u32 = crate::segment::format::ROW_SCHEMA;

/// A Raft log entry record from a journal Entry frame's payload
/// (`log_store` decodes it on recovery and on every log read).
pub fn log_record_reencode(bytes: &[u8]) -> crate::Result<Vec<u8>> {
    let rec: crate::raft::log_store::LogRecord = crate::raft::decode("log entry", bytes)?;
    Ok(crate::raft::encode(&rec))
}

/// A tablet command, the payload of every tablet Raft entry (inside a
/// `LogRecord` on disk, inside `AppendEntries` on the wire), decoded as the
/// node decodes its CBOR.
pub fn tablet_command(bytes: &[u8]) -> crate::Result<stele_proto::command::TabletCommand> {
    crate::raft::decode("tablet command", bytes)
}

/// Its encoding as the node writes it.
pub fn tablet_command_bytes(cmd: &stele_proto::command::TabletCommand) -> Vec<u8> {
    crate::raft::encode(cmd)
}

/// A tablet snapshot as installed from the leader (`install_snapshot`).
pub fn tablet_snapshot_reencode(bytes: &[u8]) -> crate::Result<Vec<u8>> {
    let snap: crate::raft::state_machine::TabletSnapshot =
        crate::raft::decode("tablet snapshot", bytes)?;
    // The other reader of snapshot bytes (which segments to fetch first).
    crate::raft::state_machine::snapshot_segments(bytes)?;
    Ok(crate::raft::encode(&snap))
}

/// The Raft vote and the committed log id as the catalog and journal hold them.
pub fn vote_reencode(bytes: &[u8]) -> crate::Result<Vec<u8>> {
    let vote: crate::raft::Vote = crate::raft::decode("vote", bytes)?;
    Ok(crate::raft::encode(&vote))
}

pub fn committed_reencode(bytes: &[u8]) -> crate::Result<Vec<u8>> {
    let id: Option<crate::raft::LogId> = crate::raft::decode("committed log id", bytes)?;
    Ok(crate::raft::encode(&id))
}

/// A page cursor a client sent back (`Read` by key, `Scan` of a namespace).
/// `Ok(None)` is the empty cursor of a first page.
pub fn key_cursor_reencode(bytes: &[u8]) -> Result<Option<Vec<u8>>, stele_proto::Error> {
    let c: Option<crate::service::page::KeyCursor> = crate::service::page::decode_cursor(bytes)?;
    Ok(c.map(|c| crate::service::page::encode_cursor(&c)))
}

pub fn scan_cursor_reencode(bytes: &[u8]) -> Result<Option<Vec<u8>>, stele_proto::Error> {
    let c: Option<crate::service::page::ScanCursor> = crate::service::page::decode_cursor(bytes)?;
    Ok(c.map(|c| crate::service::page::encode_cursor(&c)))
}

/// The body of a transport `Err` frame.
pub fn remote_error_reencode(bytes: &[u8]) -> Result<Vec<u8>, crate::transport::FrameError> {
    let e = crate::transport::conn::decode_remote_error(bytes)?;
    Ok(crate::transport::conn::encode_remote_error(&e).to_vec())
}

/// A tablet manifest read back from the bucket (`tier::manifest::read`).
pub fn manifest(bytes: &[u8]) -> crate::Result<crate::tier::manifest::Manifest> {
    crate::catalog::from_cbor("manifest", bytes)
}

/// Its encoding as `tier::manifest` writes it.
pub fn manifest_bytes(m: &crate::tier::manifest::Manifest) -> Vec<u8> {
    crate::catalog::to_cbor(m)
}

/// Small valid inputs for each fuzz target, in the form the target takes
/// them (with its leading selector byte where it has one). fuzz/seeds/
/// holds them, with the golden segment files; regenerate with
/// `cargo test -p stele-node --features fuzz -- --ignored write_fuzz_seeds`.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use stele_proto::command::{AppendBatch, Expect, Pos, RecordIn, SealReason, TabletCommand};

    let with = |pick: u8, bytes: Vec<u8>| [vec![pick], bytes].concat();
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        out.push((target, name.to_owned(), bytes));
    };

    add(
        "journal",
        "three-frames",
        journal_file(&[
            (FrameKind::Entry, 7, 1, b"payload".to_vec()),
            (FrameKind::Commit, 7, 1, Vec::new()),
            (FrameKind::Truncate, 7, 0, Vec::new()),
        ]),
    );
    add("journal", "empty", journal_file(&[]));

    let batch = AppendBatch {
        namespace: "ns".into(),
        batch_id: [1, 2],
        records: vec![RecordIn {
            key: b"k".to_vec(),
            ts: 5,
            value: b"v".to_vec(),
            vshard: 9,
        }],
        expect: Some(Expect {
            key: b"k".to_vec(),
            version: Some(Pos {
                tablet: 1,
                index: 2,
                slot: 0,
            }),
        }),
        proposed_at_us: 1_000,
    };
    let commands = [
        TabletCommand::Append(batch.clone()),
        TabletCommand::AppendMany(vec![
            batch.clone(),
            AppendBatch {
                batch_id: [1, 3],
                expect: None,
                ..batch
            },
        ]),
        TabletCommand::Seal {
            reason: SealReason::Size,
            format: 2,
        },
    ];
    for (i, cmd) in commands.iter().enumerate() {
        add(
            "tablet_command",
            &format!("command-{i}"),
            tablet_command_bytes(cmd),
        );
        let rec = crate::raft::log_store::LogRecord::seed(10 + i as u64, cmd.clone());
        add(
            "raft_state",
            &format!("log-record-{i}"),
            with(0, crate::raft::encode(&rec)),
        );
    }
    let (applied, purged) = crate::raft::restored_state(1, 10);
    add("raft_state", "applied", with(3, applied));
    add("raft_state", "purged", with(3, purged));
    add(
        "raft_state",
        "vote",
        with(2, crate::raft::encode(&crate::raft::Vote::new(3, 1))),
    );
    let snapshot = crate::raft::state_machine::TabletSnapshot::seed();
    add(
        "raft_state",
        "snapshot",
        with(1, crate::raft::encode(&snapshot)),
    );

    let key = crate::service::page::KeyCursor {
        ts: 1,
        index: 2,
        slot: 3,
        tablet: 4,
    };
    let scan = crate::service::page::ScanCursor {
        ts: 1,
        key: b"k".to_vec(),
        tablet: 4,
        index: 2,
        slot: 3,
    };
    add(
        "cursor",
        "key",
        with(0, crate::service::page::encode_cursor(&key)),
    );
    add(
        "cursor",
        "scan",
        with(1, crate::service::page::encode_cursor(&scan)),
    );

    // Transport streams: a call, its reply and an error, each in its frame.
    use crate::raft::router::{RaftRpc, encode_msg};
    use crate::transport::{FrameKind as Kind, Header, RemoteError};
    let frame = |kind: Kind, body: &[u8]| {
        let header = Header {
            kind,
            group: 7,
            target: 2,
            length: body.len() as u32,
        };
        let id: &[u8] = if kind.carries_id() { &[0; 8] } else { &[] };
        [&header.encode()[..], id, body].concat()
    };
    let fetch = encode_msg(RaftRpc::FetchSegment {
        id: "0".repeat(32),
        offset: 0,
        len: 64,
    });
    let error =
        crate::transport::conn::encode_remote_error(&RemoteError::UnknownGroup { group: 7 });
    add(
        "transport",
        "call-and-error",
        [frame(Kind::Control, &fetch), frame(Kind::Err, &error)].concat(),
    );
    add("transport", "lane-call", frame(Kind::LaneCall, &fetch));

    // Tier: a stub (the selector byte 2 is a segment of 97 bytes) and a manifest.
    let stub = crate::tier::stub::Stub {
        file_len: 97,
        head: vec![1; 20],
        tail_offset: 61,
        tail: vec![2; 36],
    };
    add("tier", "stub", with(2, stub.encode()));
    let manifest = crate::tier::manifest::Manifest {
        v: 1,
        cell: "c1".into(),
        tablet: 3,
        generation: 1,
        tablet_generation: 1,
        vshard_lo: 0,
        vshard_hi: 1 << 32,
        checkpoint: 10,
        segments: Vec::new(),
        receipt_window_us: 60_000_000,
        receipts: Vec::new(),
    };
    add("tier", "manifest", with(1, manifest_bytes(&manifest)));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    #[ignore = "writes fuzz/seeds; run by hand after a format change"]
    fn write_fuzz_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        for (target, name, bytes) in super::seeds() {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}
