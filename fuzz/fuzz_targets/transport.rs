//! The node-to-node transport (node/src/transport): a stream of frames as a
//! peer may send them. Each 24-byte header is decoded with the production
//! size limit and its body taken as the receiver takes it; bodies then go
//! to the decoder of their kind: a Raft call or reply (`router::decode_msg`,
//! an envelope around openraft's messages) or an error body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stele_node::fuzz_api as api;
use stele_node::raft::router::{RaftReply, RaftRpc, decode_msg, encode_msg};
use stele_node::transport::{FrameKind, HEADER_BYTES, Header};

/// The smallest message limit a node accepts is far above what a fuzzer
/// sends; a small one here lets short inputs reach the length check.
const MESSAGE_BYTES_MAX: u64 = 1 << 16;
const LANE_ID_BYTES: usize = 8;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while rest.len() >= HEADER_BYTES {
        let head: &[u8; HEADER_BYTES] = rest[..HEADER_BYTES].try_into().expect("24 bytes");
        let Ok(header) = Header::decode(head, MESSAGE_BYTES_MAX) else {
            return;
        };
        assert!(u64::from(header.length) <= MESSAGE_BYTES_MAX);
        assert_eq!(
            Header::decode(&header.encode(), MESSAGE_BYTES_MAX),
            Ok(header)
        );
        let id = if header.kind.carries_id() {
            LANE_ID_BYTES
        } else {
            0
        };
        let end = HEADER_BYTES + id + header.length as usize;
        let Some(body) = rest.get(HEADER_BYTES + id..end) else {
            return; // Truncated: the receiver waits for more, then gives up.
        };
        match header.kind {
            FrameKind::Err | FrameKind::LaneErr => {
                if let Ok(encoded) = api::remote_error_reencode(body) {
                    assert_eq!(api::remote_error_reencode(&encoded).ok(), Some(encoded));
                }
            }
            FrameKind::Ok | FrameKind::LaneOk => {
                if let Ok(reply) = decode_msg::<RaftReply>("fuzz reply", body) {
                    let encoded = encode_msg(reply);
                    let again = decode_msg::<RaftReply>("fuzz reply", &encoded)
                        .expect("its own encoding does not decode");
                    assert_eq!(encode_msg(again), encoded);
                }
            }
            _ => {
                if let Ok(rpc) = decode_msg::<RaftRpc>("fuzz rpc", body) {
                    let encoded = encode_msg(rpc);
                    let again = decode_msg::<RaftRpc>("fuzz rpc", &encoded)
                        .expect("its own encoding does not decode");
                    assert_eq!(encode_msg(again), encoded);
                }
            }
        }
        rest = &rest[end..];
    }
});
