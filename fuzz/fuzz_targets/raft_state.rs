//! The Raft state a tablet replica reads back: log records (journal Entry
//! frames), the vote and the committed log id (catalog and journal), and
//! tablet snapshots (from the leader). The first byte picks the decoder.
//! What decodes must encode to bytes that decode and encode the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;

type Reencode = fn(&[u8]) -> stele_node::Result<Vec<u8>>;

const DECODERS: [Reencode; 4] = [
    api::log_record_reencode,
    api::tablet_snapshot_reencode,
    api::vote_reencode,
    api::committed_reencode,
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let decode = DECODERS[usize::from(pick) % DECODERS.len()];
    if let Ok(encoded) = decode(bytes) {
        let again = decode(&encoded).expect("its own encoding does not decode");
        assert_eq!(again, encoded, "decode and encode are not a round trip");
    }
});
