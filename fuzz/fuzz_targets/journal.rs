//! Journal files (node/src/journal): what recovery makes of any bytes, and
//! that frames the writer encodes are found again, whole or torn.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api::{self as api, JournalScan};

use api::{JOURNAL_FRAME_HEADER_BYTES as FRAME_HEADER_BYTES, JOURNAL_HEADER_BYTES as HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    // Any bytes: a scan that classifies them, never a panic, and a result
    // that describes the file consistently.
    check_consistent(
        data,
        &api::journal_scan(data, api::JOURNAL_PAYLOAD_BYTES_MAX),
    );

    // Frames the writer encodes, from the same input: found again exactly.
    let mut u = Unstructured::new(data);
    let mut frames = Vec::new();
    while frames.len() < 16 && !u.is_empty() {
        let kind = api::JOURNAL_FRAME_KINDS[u.choose_index(3).unwrap_or(0)];
        let tablet = u.arbitrary::<u64>().unwrap_or(0);
        let index = u.arbitrary::<u64>().unwrap_or(0);
        let len = u.int_in_range(0..=512usize).unwrap_or(0);
        let payload = u.bytes(len).unwrap_or(&[]).to_vec();
        frames.push((kind, tablet, index, payload));
    }
    let file = api::journal_file(&frames);
    let scan = api::journal_scan(&file, api::JOURNAL_PAYLOAD_BYTES_MAX);
    let JournalScan::Frames {
        frames: found,
        damage: None,
    } = &scan
    else {
        panic!("an intact file does not scan clean: {scan:?}");
    };
    assert_eq!(found.len(), frames.len());
    for ((h, offset, len), (kind, tablet, index, payload)) in found.iter().zip(&frames) {
        assert_eq!((h.kind, h.tablet, h.index), (*kind, *tablet, *index));
        let body = &file[*offset as usize + FRAME_HEADER_BYTES..*offset as usize + *len as usize];
        if *kind != stele_node::journal::FrameKind::Truncate {
            assert_eq!(body, payload.as_slice());
        }
    }

    // A torn tail (the file cut anywhere after its header) keeps exactly
    // the frames wholly before the cut, and is damage unless the cut falls
    // between frames. (A frame after the damage can verify: a payload may
    // hold a whole encoded frame, and recovery then refuses to guess.)
    let cut = u
        .int_in_range(HEADER_BYTES..=file.len())
        .unwrap_or(file.len());
    let torn = api::journal_scan(&file[..cut], api::JOURNAL_PAYLOAD_BYTES_MAX);
    let JournalScan::Frames {
        frames: kept,
        damage,
    } = &torn
    else {
        panic!("a torn file lost its header: {torn:?}");
    };
    let whole = found
        .iter()
        .take_while(|(_, o, l)| (*o + u64::from(*l)) as usize <= cut)
        .count();
    assert_eq!(kept.as_slice(), &found[..whole]);
    let boundary = match whole {
        0 => HEADER_BYTES,
        n => (found[n - 1].1 + u64::from(found[n - 1].2)) as usize,
    };
    assert_eq!(
        damage.is_none(),
        cut == boundary,
        "cut at {cut}: {damage:?}"
    );
});

fn check_consistent(data: &[u8], scan: &JournalScan) {
    match scan {
        JournalScan::Short => assert!(data.len() < HEADER_BYTES),
        JournalScan::Header(check) => {
            assert!(data.len() >= HEADER_BYTES);
            assert_ne!(*check, api::HeaderCheck::Ok);
        }
        JournalScan::Frames { frames, damage } => {
            let mut at = HEADER_BYTES as u64;
            for (h, offset, len) in frames {
                assert_eq!(*offset, at, "frames tile the file");
                assert_eq!(*len as usize, FRAME_HEADER_BYTES + h.payload_bytes as usize);
                assert!(h.payload_bytes as usize <= api::JOURNAL_PAYLOAD_BYTES_MAX);
                at += u64::from(*len);
            }
            assert!(at as usize <= data.len());
            match damage {
                None => assert_eq!(at as usize, data.len(), "a clean scan ends at the end"),
                Some((offset, _, valid_after)) => {
                    assert_eq!(*offset, at, "damage starts where the frames stop");
                    if let Some(after) = valid_after {
                        assert!(after > offset && (*after as usize) < data.len());
                    }
                }
            }
        }
    }
}
