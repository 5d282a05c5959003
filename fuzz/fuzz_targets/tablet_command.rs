//! Tablet commands (proto/src/command.rs), the CBOR payload of every
//! tablet Raft entry: decoded as the node decodes them, and
//! `decode(encode(c)) == c` for every command that decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;

fuzz_target!(|data: &[u8]| {
    if let Ok(cmd) = api::tablet_command(data) {
        let encoded = api::tablet_command_bytes(&cmd);
        let back = api::tablet_command(&encoded).expect("its own encoding does not decode");
        assert_eq!(back, cmd);
    }
});
