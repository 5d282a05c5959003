//! Page cursors (node/src/service/page.rs): opaque bytes a client sends
//! back with its next Read or Scan, so anything at all. The first byte
//! picks the key or the namespace cursor; what decodes must encode to
//! bytes that decode and encode the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;

type Reencode = fn(&[u8]) -> Result<Option<Vec<u8>>, stele_proto::Error>;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let decode: Reencode = if pick & 1 == 0 {
        api::key_cursor_reencode
    } else {
        api::scan_cursor_reencode
    };
    match decode(bytes) {
        Ok(None) => assert!(bytes.is_empty(), "only the empty cursor is no cursor"),
        Ok(Some(encoded)) => {
            let again = decode(&encoded).expect("its own cursor does not decode");
            assert_eq!(again, Some(encoded));
        }
        Err(e) => assert!(
            matches!(e, stele_proto::Error::InvalidArgument { .. }),
            "a bad cursor is the caller's error: {e}"
        ),
    }
});
