//! Golden log records: the bytes of an `Append` (log format 1) and an
//! `AppendMany` (log format 2) entry as a journal frame carries them
//! (FORMAT.md section 4). A change that alters them breaks every data
//! directory and every mixed cell, so it fails here first. Rewrite the
//! files (only for a deliberate, versioned change) with
//! `STELE_WRITE_GOLDEN=1 cargo test -p stele-node --lib golden`.

use std::path::PathBuf;

use stele_proto::command::{AppendBatch, Expect, Pos, RecordIn, TabletCommand};

use super::log_store::LogRecord;
use super::{decode, encode};

fn batch(id: u64, records: u64, expect: bool) -> AppendBatch {
    AppendBatch {
        namespace: "acme/web".into(),
        batch_id: [0x0123_4567_89ab_cdef, id],
        records: (0..records)
            .map(|n| RecordIn {
                key: format!("user-{n}").into_bytes(),
                ts: 1_700_000_000_000 + n,
                value: format!("value {id}.{n}").into_bytes(),
                vshard: 40_000 + n as u32,
            })
            .collect(),
        expect: expect.then(|| Expect {
            key: b"user-0".to_vec(),
            version: Some(Pos {
                tablet: 7,
                index: 41,
                slot: 2,
            }),
        }),
        proposed_at_us: 1_700_000_000_123_456,
    }
}

fn golden(name: &str, cmd: TabletCommand) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/raft/testdata")
        .join(name);
    let bytes = encode(&LogRecord::seed(42, cmd.clone()));
    if std::env::var_os("STELE_WRITE_GOLDEN").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes, want, "{name}: the encoding changed");
    let back: LogRecord = decode("golden record", &want).unwrap();
    assert_eq!(back.v, 1);
    match back.entry.payload {
        openraft::EntryPayload::Normal(got) => assert_eq!(got, cmd, "{name}"),
        _ => panic!("{name}: not a normal entry"),
    }
}

#[test]
fn an_append_record_reads_and_writes_as_in_log_format_1() {
    golden(
        "log_append_v1.cbor",
        TabletCommand::Append(batch(1, 2, true)),
    );
}

#[test]
fn an_append_many_record_reads_and_writes_as_in_log_format_2() {
    golden(
        "log_append_many_v2.cbor",
        TabletCommand::AppendMany(vec![
            batch(2, 1, false),
            batch(3, 3, true),
            batch(4, 2, false),
        ]),
    );
}
