//! What a node reads back from the cold tier and its own stub files
//! (node/src/tier): segment stubs (the head and tail a node keeps of an
//! evicted segment) and tablet manifests. The first byte picks one.
//! Whatever decodes encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;
use stele_node::tier::stub::Stub;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    if pick & 1 == 0 {
        // The catalog's length of the segment the stub stands for.
        let file_len = u64::from(pick >> 1) * 97;
        if let Ok(stub) = Stub::decode(bytes, file_len) {
            assert_eq!(stub.file_len, file_len);
            assert_eq!(Stub::decode(&stub.encode(), file_len), Ok(stub));
        }
    } else if let Ok(m) = api::manifest(bytes) {
        let back =
            api::manifest(&api::manifest_bytes(&m)).expect("its own encoding does not decode");
        assert_eq!(back, m);
    }
});
