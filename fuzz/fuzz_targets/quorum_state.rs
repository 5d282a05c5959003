//! The controller and directory quorums (quorum/, controller/, directory/):
//! commands and states (snapshots) as their replicas decode them, and the
//! backup objects read back from the bucket. The first byte picks one.
//! Whatever decodes encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stele_quorum::{backup, from_cbor, to_cbor};

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(value) = from_cbor::<T>(bytes) {
        let back: T = from_cbor(&to_cbor(&value)).expect("its own encoding does not decode");
        assert_eq!(back, value);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % 5 {
        0 => round_trip::<stele_controller::state::Command>(bytes),
        1 => round_trip::<stele_controller::state::CellState>(bytes),
        2 => round_trip::<stele_directory::state::Command>(bytes),
        3 => round_trip::<stele_directory::state::DirectoryState>(bytes),
        _ => {
            if let Ok(b) = backup::decode("fuzz", bytes) {
                assert_eq!(backup::decode("fuzz", &backup::encode(&b)).ok(), Some(b));
            }
        }
    }
});
