//! Behaviour of the whole journal against a real directory.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;

use super::format::{FRAME_HEADER_BYTES, HEADER_BYTES};
use super::*;

fn test_options(dir: &Path) -> Options {
    let mut opts = Options::new(dir);
    opts.linger = Duration::ZERO;
    opts.reserve_bytes = 0;
    opts.faults = Arc::new(Faults::none());
    opts
}

fn entry(tablet: u64, index: u64, payload: &[u8]) -> Frame {
    Frame {
        kind: FrameKind::Entry,
        tablet,
        index,
        payload: Bytes::copy_from_slice(payload),
    }
}

/// Submits and waits for `done`.
fn append(journal: &Journal, frames: Vec<Frame>) -> Result<Vec<Location>> {
    let (tx, rx) = mpsc::channel();
    journal.submit(
        frames,
        Box::new(move |result| {
            tx.send(result).unwrap();
        }),
    );
    rx.recv().unwrap()
}

fn wal(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

fn summary(recovery: &Recovery) -> Vec<(FrameKind, u64, u64, Location)> {
    recovery
        .frames
        .iter()
        .map(|f| (f.kind, f.tablet, f.index, f.location))
        .collect()
}

#[test]
fn round_trip_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
    assert!(recovery.frames.is_empty());
    assert_eq!(recovery.files, 1);

    let mut written = Vec::new();
    for i in 0..10u64 {
        let frames = vec![
            entry(1, i, format!("t1-{i}").as_bytes()),
            entry(2, i, &vec![i as u8; i as usize * 100]),
            Frame {
                kind: FrameKind::Commit,
                tablet: 3,
                index: i,
                payload: Bytes::new(),
            },
        ];
        let locations = append(&journal, frames.clone()).unwrap();
        // One unit lands contiguously and in order.
        for pair in locations.windows(2) {
            assert_eq!(pair[0].offset + u64::from(pair[0].len), pair[1].offset);
        }
        written.extend(frames.into_iter().zip(locations));
    }
    let truncate = Frame {
        kind: FrameKind::Truncate,
        tablet: 1,
        index: 4,
        payload: Bytes::new(),
    };
    let loc = append(&journal, vec![truncate.clone()]).unwrap()[0];
    written.push((truncate, loc));

    for (frame, loc) in &written {
        assert_eq!(&journal.read(*loc).unwrap(), frame);
    }
    let expected: Vec<_> = written
        .iter()
        .map(|(f, l)| (f.kind, f.tablet, f.index, *l))
        .collect();
    drop(journal);

    let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
    assert_eq!(summary(&recovery), expected);
    assert_eq!(recovery.truncated, None);
    for (frame, loc) in &written {
        assert_eq!(&journal.read(*loc).unwrap(), frame);
    }
    drop(journal);
    let (_journal, again) = Journal::open(test_options(dir.path())).unwrap();
    assert_eq!(again, recovery);
}

#[test]
fn async_append() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(test_options(dir.path())).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let locations = runtime
        .block_on(journal.append(vec![entry(9, 1, b"x")]))
        .unwrap();
    assert_eq!(journal.read(locations[0]).unwrap(), entry(9, 1, b"x"));
}

#[test]
fn concurrent_submitters_share_fsyncs() {
    const SUBMITTERS: u64 = 64;
    const FRAMES_EACH: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = test_options(dir.path());
    opts.linger = Duration::from_millis(2);
    let (journal, _) = Journal::open(opts).unwrap();
    let violations = Arc::new(Mutex::new(Vec::new()));

    let threads: Vec<_> = (0..SUBMITTERS)
        .map(|tablet| {
            let journal = journal.clone();
            let violations = Arc::clone(&violations);
            std::thread::spawn(move || {
                let mut locations = Vec::new();
                for index in 0..FRAMES_EACH {
                    let (tx, rx) = mpsc::channel();
                    let observer = journal.clone();
                    let violations = Arc::clone(&violations);
                    journal.submit(
                        vec![entry(tablet, index, &[tablet as u8; 64])],
                        Box::new(move |result| {
                            let loc = result.unwrap()[0];
                            // `bytes` counts only fsynced groups: a done()
                            // before its fsync would see it short of this frame.
                            let synced_end = HEADER_BYTES as u64 + observer.stats().bytes;
                            if synced_end < loc.offset + u64::from(loc.len) {
                                violations.lock().unwrap().push(loc);
                            }
                            tx.send(loc).unwrap();
                        }),
                    );
                    locations.push(rx.recv().unwrap());
                }
                (tablet, locations)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    assert!(violations.lock().unwrap().is_empty());
    let stats = journal.stats();
    eprintln!("group commit: {stats:?}");
    let frames = SUBMITTERS * FRAMES_EACH;
    assert_eq!(stats.frames, frames);
    assert_eq!(stats.groups, stats.fsyncs);
    assert!(
        stats.fsyncs * 4 < frames,
        "{} fsyncs for {frames} frames: submitters did not share fsyncs",
        stats.fsyncs
    );
    for (tablet, locations) in results {
        for (index, loc) in locations.into_iter().enumerate() {
            let frame = journal.read(loc).unwrap();
            assert_eq!((frame.tablet, frame.index), (tablet, index as u64));
        }
    }
}

fn write_five(dir: &Path) -> Vec<Location> {
    let (journal, _) = Journal::open(test_options(dir)).unwrap();
    let mut locations = Vec::new();
    for i in 0..5 {
        locations.extend(append(&journal, vec![entry(1, i, &[i as u8; 40])]).unwrap());
    }
    locations
}

#[test]
fn torn_tail_is_cut_and_appends_continue() {
    for garbage in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let locations = write_five(dir.path());
        let path = wal(dir.path(), 1);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        let cut_at = if garbage {
            // Half a header's worth of junk after the last complete frame.
            use std::io::Write;
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(&[0xAB; 13]).unwrap();
            len
        } else {
            file.set_len(len - 3).unwrap();
            locations[4].offset
        };

        let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
        assert_eq!(recovery.truncated, Some((path.clone(), cut_at)));
        let kept = if garbage { 5 } else { 4 };
        assert_eq!(recovery.frames.len(), kept);
        assert_eq!(fs::metadata(&path).unwrap().len(), cut_at);

        let more = append(&journal, vec![entry(1, 99, b"after")]).unwrap();
        assert_eq!(more[0].offset, cut_at);
        drop(journal);
        let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
        assert_eq!(recovery.truncated, None);
        assert_eq!(recovery.frames.len(), kept + 1);
        assert_eq!(journal.read(more[0]).unwrap(), entry(1, 99, b"after"));
    }
}

#[test]
fn damage_followed_by_valid_frames_refuses_and_names_file_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let locations = write_five(dir.path());
    let path = wal(dir.path(), 1);
    let mut bytes = fs::read(&path).unwrap();
    bytes[locations[1].offset as usize + FRAME_HEADER_BYTES + 5] ^= 0x10;
    fs::write(&path, &bytes).unwrap();

    let err = Journal::open(test_options(dir.path())).err().unwrap();
    match &err {
        Error::Corrupt {
            file,
            offset,
            valid_after,
            ..
        } => {
            assert_eq!(file, &path);
            assert_eq!(*offset, locations[1].offset);
            assert_eq!(*valid_after, Some(locations[2].offset));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("byte offset {}", locations[1].offset)),
        "{message}"
    );
    assert!(message.contains("restore"), "{message}");
    // Refusing must leave the file as it was.
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

fn small_files_options(dir: &Path) -> Options {
    let mut opts = test_options(dir);
    opts.frame_payload_bytes_max = 512;
    opts.file_bytes_max = 1024;
    opts
}

#[test]
fn damage_in_non_last_file_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(small_files_options(dir.path())).unwrap();
    let mut locations = Vec::new();
    for i in 0..10 {
        locations.extend(append(&journal, vec![entry(1, i, &[7; 200])]).unwrap());
    }
    drop(journal);
    let last_of_first = *locations.iter().rfind(|l| l.file_seq == 1).unwrap();
    assert!(locations.iter().any(|l| l.file_seq > 1));

    // Cut the tail of file 1: in the last file this would be a torn tail.
    let path = wal(dir.path(), 1);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(last_of_first.offset + 10).unwrap();
    match Journal::open(small_files_options(dir.path())) {
        Err(Error::Corrupt { file, offset, .. }) => {
            assert_eq!(file, path);
            assert_eq!(offset, last_of_first.offset);
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|(_, r)| r)),
    }
}

#[test]
fn unknown_magic_or_version_is_typed() {
    let dir = tempfile::tempdir().unwrap();
    write_five(dir.path());
    let path = wal(dir.path(), 1);
    let original = fs::read(&path).unwrap();

    let mut bytes = original.clone();
    bytes[format::HEADER_VERSION_OFFSET] = 9;
    fs::write(&path, &bytes).unwrap();
    match Journal::open(test_options(dir.path())) {
        Err(Error::UnsupportedVersion {
            path: p, version, ..
        }) => {
            assert_eq!((p, version), (path.clone(), 9));
        }
        other => panic!(
            "expected UnsupportedVersion, got {:?}",
            other.map(|(_, r)| r)
        ),
    }

    let mut bytes = original;
    bytes[0] = b'X';
    fs::write(&path, &bytes).unwrap();
    match Journal::open(test_options(dir.path())) {
        Err(Error::BadMagic { path: p }) => assert_eq!(p, path),
        other => panic!("expected BadMagic, got {:?}", other.map(|(_, r)| r)),
    }
}

#[test]
fn short_last_file_gets_a_fresh_header() {
    let dir = tempfile::tempdir().unwrap();
    write_five(dir.path());
    // A roll that crashed after creating file 2 but before its header was durable.
    fs::write(wal(dir.path(), 2), b"STELE").unwrap();
    let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
    assert_eq!(recovery.truncated, Some((wal(dir.path(), 2), 0)));
    assert_eq!(recovery.frames.len(), 5);
    let loc = append(&journal, vec![entry(1, 5, b"x")]).unwrap()[0];
    assert_eq!((loc.file_seq, loc.offset), (2, HEADER_BYTES as u64));
}

#[test]
fn roll_trim_and_laggards() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(small_files_options(dir.path())).unwrap();
    // Tablet 1 writes indexes 1..=12, tablet 2 only index 1, early on.
    let mut locations = Vec::new();
    locations.extend(append(&journal, vec![entry(2, 1, &[2; 200])]).unwrap());
    for i in 1..=12 {
        locations.extend(append(&journal, vec![entry(1, i, &[1; 200])]).unwrap());
    }
    let stats = journal.stats();
    assert!(stats.files >= 4, "{stats:?}");
    for loc in &locations {
        assert!(loc.offset + u64::from(loc.len) <= 1024);
    }
    let active = locations.last().unwrap().file_seq;

    // No trim points: nothing goes, and both tablets hold file 1.
    assert!(journal.trim().unwrap().is_empty());
    assert_eq!(journal.laggards(0), vec![1, 2]);
    assert!(journal.laggards(u64::MAX).is_empty());

    // Tablet 1 checkpointed everything, tablet 2 did not: file 1 is held.
    journal.set_trim_point(1, 12);
    assert!(journal.trim().unwrap().is_empty());
    assert_eq!(journal.laggards(0), vec![2]);

    journal.set_trim_point(2, 1);
    let deleted = journal.trim().unwrap();
    let expected: Vec<_> = (1..active).map(|seq| wal(dir.path(), seq)).collect();
    assert_eq!(deleted, expected, "all but the active file, oldest first");
    for path in &deleted {
        assert!(!path.exists());
    }
    assert!(wal(dir.path(), active).exists());
    assert!(matches!(
        journal.read(locations[0]),
        Err(Error::FileGone { file_seq: 1 })
    ));
    journal.read(*locations.last().unwrap()).unwrap();
    drop(journal);

    // The surviving files reopen, and their frames are all there.
    let (_journal, recovery) = Journal::open(small_files_options(dir.path())).unwrap();
    let kept: Vec<_> = locations
        .iter()
        .filter(|l| l.file_seq >= active)
        .copied()
        .collect();
    let recovered: Vec<_> = recovery.frames.iter().map(|f| f.location).collect();
    assert_eq!(recovered, kept);
}

#[test]
fn trim_stops_at_first_needed_file() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(small_files_options(dir.path())).unwrap();
    let mut locations = Vec::new();
    for i in 1..=12 {
        locations.extend(append(&journal, vec![entry(1, i, &[1; 200])]).unwrap());
    }
    // Tablet 1 checkpointed index 5: only files whose frames are all <= 5 go.
    journal.set_trim_point(1, 5);
    let deleted = journal.trim().unwrap();
    let file_of_6 = locations[5].file_seq;
    let file_of_5 = locations[4].file_seq;
    let expected_last = if file_of_5 == file_of_6 {
        file_of_5 - 1
    } else {
        file_of_5
    };
    let expected: Vec<_> = (1..=expected_last).map(|s| wal(dir.path(), s)).collect();
    assert_eq!(deleted, expected);
    journal.read(locations[5]).unwrap();

    journal.forget_tablet(1);
    let rest = journal.trim().unwrap();
    assert_eq!(
        rest.last(),
        Some(&wal(dir.path(), locations[11].file_seq - 1))
    );
}

#[test]
fn refused_sync_stops_the_journal_until_reopen() {
    for fail_write in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let opts = test_options(dir.path());
        let faults = Arc::clone(&opts.faults);
        let (journal, _) = Journal::open(opts).unwrap();
        let acked: Vec<_> = (0..3)
            .map(|i| append(&journal, vec![entry(1, i, b"acked")]).unwrap()[0])
            .collect();

        if fail_write {
            faults.fail_next_write();
        } else {
            faults.fail_next_sync();
        }
        let reason = match append(&journal, vec![entry(1, 3, b"refused")]) {
            Err(Error::Stopped { reason }) => reason,
            other => panic!("expected Stopped, got {other:?}"),
        };
        assert!(
            reason.contains(if fail_write { "write" } else { "fdatasync" }),
            "{reason}"
        );
        match append(&journal, vec![entry(1, 4, b"later")]) {
            Err(Error::Stopped { reason: later }) => assert_eq!(later, reason),
            other => panic!("expected Stopped, got {other:?}"),
        }
        assert_eq!(journal.stats().stopped, Some(reason));
        for loc in &acked {
            assert_eq!(journal.read(*loc).unwrap().payload, &b"acked"[..]);
        }
        drop(journal);

        let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
        let recovered: Vec<_> = recovery.frames.iter().map(|f| f.location).collect();
        assert_eq!(&recovered[..3], &acked[..]);
        // A failed fsync may leave the unacknowledged frame in the page cache.
        assert!(recovered.len() <= 4);
        assert_eq!(journal.stats().stopped, None);
        append(&journal, vec![entry(1, 5, b"again")]).unwrap();
    }
}

#[test]
fn storage_full_refuses_without_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = test_options(dir.path());
    opts.reserve_bytes = 1 << 20;
    let faults = Arc::clone(&opts.faults);
    let (journal, _) = Journal::open(opts).unwrap();
    let first = append(&journal, vec![entry(1, 1, b"one")]).unwrap()[0];
    let file_len = fs::metadata(wal(dir.path(), 1)).unwrap().len();

    faults.set_free_bytes(Some((1 << 20) + 10));
    match append(&journal, vec![entry(1, 2, b"two")]) {
        Err(Error::StorageFull { reserve_bytes, .. }) => assert_eq!(reserve_bytes, 1 << 20),
        other => panic!("expected StorageFull, got {other:?}"),
    }
    assert_eq!(fs::metadata(wal(dir.path(), 1)).unwrap().len(), file_len);
    assert_eq!(journal.stats().stopped, None);

    faults.set_free_bytes(None);
    let second = append(&journal, vec![entry(1, 2, b"two")]).unwrap()[0];
    assert_eq!(second.offset, first.offset + u64::from(first.len));
}

#[test]
fn oversize_payload_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = test_options(dir.path());
    opts.frame_payload_bytes_max = 100;
    opts.file_bytes_max = 4096;
    let (journal, _) = Journal::open(opts).unwrap();
    match append(&journal, vec![entry(1, 1, b"ok"), entry(1, 2, &[0; 101])]) {
        Err(Error::TooLarge {
            payload_bytes,
            max_bytes,
        }) => assert_eq!((payload_bytes, max_bytes), (101, 100)),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // A unit that cannot fit in one file is refused too.
    let big: Vec<_> = (0..40).map(|i| entry(1, i, &[0; 100])).collect();
    assert!(matches!(
        append(&journal, big),
        Err(Error::UnitTooLarge { .. })
    ));
    assert_eq!(
        fs::metadata(wal(dir.path(), 1)).unwrap().len(),
        HEADER_BYTES as u64
    );
    assert_eq!(journal.stats().frames, 0);
}

#[test]
fn shutdown_flushes_then_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(test_options(dir.path())).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..20 {
        let tx = tx.clone();
        journal.submit(
            vec![entry(1, i, b"q")],
            Box::new(move |r| tx.send(r.is_ok()).unwrap()),
        );
    }
    journal.shutdown();
    drop(tx);
    assert_eq!(rx.iter().filter(|ok| *ok).count(), 20);
    assert!(matches!(
        append(&journal, vec![entry(1, 20, b"late")]),
        Err(Error::ShutDown)
    ));
}

#[derive(Debug, Clone)]
enum Op {
    /// A unit of frames with these payload sizes.
    Append(Vec<usize>),
    /// Crash, then cut this many bytes off the end of the last file.
    Tear(usize),
    /// Crash, then append these junk bytes to the last file.
    Junk(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0usize..300, 1..4).prop_map(Op::Append),
        1 => (1usize..200).prop_map(Op::Tear),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Op::Junk),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// After any crash that only touches the tail of the last file, recovery
    /// yields exactly the acknowledged frames that lie wholly before the
    /// damage, in order, and nothing else.
    #[test]
    fn recovery_yields_the_acked_prefix(ops in prop::collection::vec(op(), 1..16)) {
        let dir = tempfile::tempdir().unwrap();
        let opts = || {
            let mut o = test_options(dir.path());
            o.frame_payload_bytes_max = 512;
            o.file_bytes_max = 2048;
            o
        };
        let mut model: Vec<(Frame, Location)> = Vec::new();
        let (mut journal, _) = Journal::open(opts()).unwrap();
        let mut next_index = 0u64;
        for op in ops {
            match op {
                Op::Append(sizes) => {
                    let frames: Vec<_> = sizes
                        .iter()
                        .map(|&size| {
                            next_index += 1;
                            entry(next_index % 3, next_index, &vec![next_index as u8; size])
                        })
                        .collect();
                    let locations = append(&journal, frames.clone()).unwrap();
                    model.extend(frames.into_iter().zip(locations));
                }
                Op::Tear(_) | Op::Junk(_) => {
                    drop(journal);
                    let last = fs::read_dir(dir.path()).unwrap().count() as u64;
                    let path = wal(dir.path(), last);
                    let len = fs::metadata(&path).unwrap().len();
                    let new_len = match &op {
                        Op::Tear(cut) => {
                            let new_len = len.saturating_sub(*cut as u64);
                            OpenOptions::new().write(true).open(&path).unwrap().set_len(new_len).unwrap();
                            new_len
                        }
                        Op::Junk(junk) => {
                            use std::io::Write;
                            OpenOptions::new().append(true).open(&path).unwrap().write_all(junk).unwrap();
                            len
                        }
                        Op::Append(_) => unreachable!(),
                    };
                    // Frames in the last file past the cut are lost; nothing else.
                    model.retain(|(_, l)| l.file_seq < last || l.offset + u64::from(l.len) <= new_len);
                    let (reopened, recovery) = Journal::open(opts()).unwrap();
                    let got: Vec<_> = recovery.frames.iter().map(|f| f.location).collect();
                    let want: Vec<_> = model.iter().map(|(_, l)| *l).collect();
                    prop_assert_eq!(got, want);
                    journal = reopened;
                }
            }
        }
        for (frame, loc) in &model {
            prop_assert_eq!(&journal.read(*loc).unwrap(), frame);
        }
    }
}

/// A file written by format version 1, committed once and read forever: if
/// this fails, the format changed and needs a new version and an upgrade path.
const GOLDEN_V1: &[u8] = include_bytes!("testdata/v1.wal");

#[test]
fn golden_v1_file_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(wal(dir.path(), 1), GOLDEN_V1).unwrap();
    let (journal, recovery) = Journal::open(test_options(dir.path())).unwrap();
    assert_eq!(recovery.truncated, None);
    let expected = vec![
        entry(7, 1, b"first entry"),
        Frame {
            kind: FrameKind::Commit,
            tablet: 7,
            index: 1,
            payload: Bytes::from_static(b"c"),
        },
        Frame {
            kind: FrameKind::Truncate,
            tablet: 8,
            index: 41,
            payload: Bytes::new(),
        },
    ];
    let offsets: Vec<_> = recovery.frames.iter().map(|f| f.location.offset).collect();
    assert_eq!(offsets, vec![16, 55, 84]);
    let frames: Vec<_> = recovery
        .frames
        .iter()
        .map(|f| journal.read(f.location).unwrap())
        .collect();
    assert_eq!(frames, expected);
    // And this build still writes the same bytes for the same frames.
    let fresh = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(test_options(fresh.path())).unwrap();
    append(&journal, expected).unwrap();
    drop(journal);
    assert_eq!(fs::read(wal(fresh.path(), 1)).unwrap(), GOLDEN_V1);
}

#[test]
fn journal_is_send_sync_and_clone() {
    fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
    assert_shareable::<Journal>();
}

/// What a power cut leaves: every journal file cut back to its synced
/// length as the marks record it (the harness does the same to a killed
/// node).
fn power_cut(dir: &Path) {
    for (seq, len) in super::marks::read(&dir.join(super::marks::MARKS_FILE)) {
        let f = OpenOptions::new().write(true).open(wal(dir, seq)).unwrap();
        if f.metadata().unwrap().len() > len {
            f.set_len(len).unwrap();
        }
    }
}

#[test]
fn sync_marks_cover_every_acknowledged_frame_and_skipped_syncs_lose_them() {
    let dir = tempfile::tempdir().unwrap();
    let opts = |spec: &str| {
        let mut o = small_files_options(dir.path());
        o.faults = Arc::new(Faults::parse(spec));
        o
    };
    // Synced groups: a power cut keeps every acknowledged frame, across
    // file rolls and a reopen.
    let (journal, _) = Journal::open(opts("journal-sync-marks")).unwrap();
    for i in 1..=6 {
        append(&journal, vec![entry(1, i, &[1; 300])]).unwrap();
    }
    assert!(journal.stats().files >= 2);
    drop(journal);
    power_cut(dir.path());
    let (journal, recovery) = Journal::open(opts("journal-sync-marks")).unwrap();
    assert_eq!(recovery.frames.len(), 6);
    for i in 7..=8 {
        append(&journal, vec![entry(1, i, &[1; 300])]).unwrap();
    }
    drop(journal);
    power_cut(dir.path());
    let (journal, recovery) = Journal::open(opts("journal-sync-marks")).unwrap();
    assert_eq!(
        recovery.frames.len(),
        8,
        "every acknowledged frame survives"
    );
    drop(journal);

    // Skipped syncs (the negative control): acknowledged all the same,
    // and gone after the cut.
    let (journal, _) = Journal::open(opts("journal-sync-marks,journal-skip-sync")).unwrap();
    for i in 9..=14 {
        append(&journal, vec![entry(1, i, &[1; 300])]).unwrap();
    }
    drop(journal);
    let (journal, recovery) = Journal::open(opts("journal-sync-marks")).unwrap();
    assert_eq!(recovery.frames.len(), 14, "a process kill keeps them");
    drop(journal);
    power_cut(dir.path());
    let (_journal, recovery) = Journal::open(opts("journal-sync-marks")).unwrap();
    let left: Vec<u64> = recovery.frames.iter().map(|f| f.index).collect();
    assert_eq!(
        left,
        (1..=8).collect::<Vec<u64>>(),
        "the unsynced frames are lost"
    );
}
