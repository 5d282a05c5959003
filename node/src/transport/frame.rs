//! The frames transport streams carry.
//!
//! ```text
//! offset size field
//!      0    2 magic  "SN" (0x53 0x4E)
//!      2    1 version (1)
//!      3    1 kind   1 hello, 2 hello-ok, 3 control, 4 bulk, 5 ok, 6 err,
//!                    7 lane-open, 8 lane-call, 9 lane-ok, 10 lane-err
//!      4    8 group  u64 LE (hello: the node id the dialer claims)
//!     12    8 target u64 LE (target replica; echoed in responses)
//!     20    4 length u32 LE, body bytes that follow (after the id, if any)
//!     24    8 id     u64 LE, only in lane-call, lane-ok and lane-err
//!  24/32    . body   request/response bytes, CBOR RemoteError for err and
//!                    lane-err, the lane version (1 byte) for lane-open
//! ```
//!
//! A request stream carries one frame each way (kinds 1-6) and the sender
//! finishes its side after it; trailing bytes are a protocol violation. A
//! control lane (`lane.rs`) opens with one lane-open frame and then carries
//! any number of lane frames, matched by `id`. `length` is checked against
//! `message_bytes_max` before any body buffer is allocated. This module is
//! pure: it encodes and decodes headers, and the stream code in `conn.rs`
//! and `lane.rs` moves the bytes.

use crate::fixed;

pub const MAGIC: [u8; 2] = *b"SN";
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 24;
/// The request id that follows the header in lane-call, lane-ok, lane-err.
pub const LANE_ID_BYTES: usize = 8;
/// Version of the control lane, the one body byte of its lane-open frame.
pub const LANE_VERSION: u8 = 1;

const OFF_VERSION: usize = 2;
const OFF_KIND: usize = 3;
const OFF_GROUP: usize = 4;
const OFF_TARGET: usize = 12;
const OFF_LENGTH: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Hello = 1,
    HelloOk = 2,
    Control = 3,
    Bulk = 4,
    Ok = 5,
    Err = 6,
    LaneOpen = 7,
    LaneCall = 8,
    LaneOk = 9,
    LaneErr = 10,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Hello,
            2 => FrameKind::HelloOk,
            3 => FrameKind::Control,
            4 => FrameKind::Bulk,
            5 => FrameKind::Ok,
            6 => FrameKind::Err,
            7 => FrameKind::LaneOpen,
            8 => FrameKind::LaneCall,
            9 => FrameKind::LaneOk,
            10 => FrameKind::LaneErr,
            _ => return None,
        })
    }

    /// Whether a request id follows the header (the lane's messages).
    pub fn carries_id(self) -> bool {
        matches!(
            self,
            FrameKind::LaneCall | FrameKind::LaneOk | FrameKind::LaneErr
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub group: u64,
    pub target: u64,
    pub length: u32,
}

/// Why a header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    #[error("frame version {0}; this build speaks {VERSION}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("body of {length} bytes exceeds message_bytes_max {max_bytes}")]
    TooLarge { length: u32, max_bytes: u64 },
    #[error("frame kind {got:?} where {expected} was expected")]
    UnexpectedKind {
        got: FrameKind,
        expected: &'static str,
    },
    #[error("stream ended inside a frame")]
    Truncated,
    #[error("bytes after the frame's end")]
    TrailingBytes,
    #[error("frame not complete within request_read_timeout")]
    Stalled,
    #[error("control lane version {0}; this build speaks {LANE_VERSION}")]
    BadLaneVersion(u8),
    #[error("lane-open frame with a {0}-byte body instead of 1")]
    BadLaneOpen(u32),
    #[error("undecodable error body: {reason}")]
    ErrorBody { reason: String },
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..OFF_VERSION].copy_from_slice(&MAGIC);
        b[OFF_VERSION] = VERSION;
        b[OFF_KIND] = self.kind as u8;
        b[OFF_GROUP..OFF_TARGET].copy_from_slice(&self.group.to_le_bytes());
        b[OFF_TARGET..OFF_LENGTH].copy_from_slice(&self.target.to_le_bytes());
        b[OFF_LENGTH..].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// Decodes and bounds a header; `max_bytes` is `message_bytes_max`.
    pub fn decode(b: &[u8; HEADER_BYTES], max_bytes: u64) -> Result<Header, FrameError> {
        let magic = [b[0], b[1]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[OFF_VERSION] != VERSION {
            return Err(FrameError::BadVersion(b[OFF_VERSION]));
        }
        let kind = FrameKind::from_u8(b[OFF_KIND]).ok_or(FrameError::BadKind(b[OFF_KIND]))?;
        let length = fixed::u32_le_in::<OFF_LENGTH, HEADER_BYTES>(b);
        if u64::from(length) > max_bytes {
            return Err(FrameError::TooLarge { length, max_bytes });
        }
        Ok(Header {
            kind,
            group: fixed::u64_le_in::<OFF_GROUP, HEADER_BYTES>(b),
            target: fixed::u64_le_in::<OFF_TARGET, HEADER_BYTES>(b),
            length,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn kinds() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Hello),
            Just(FrameKind::HelloOk),
            Just(FrameKind::Control),
            Just(FrameKind::Bulk),
            Just(FrameKind::Ok),
            Just(FrameKind::Err),
            Just(FrameKind::LaneOpen),
            Just(FrameKind::LaneCall),
            Just(FrameKind::LaneOk),
            Just(FrameKind::LaneErr),
        ]
    }

    proptest! {
        #[test]
        fn header_round_trips(kind in kinds(), group: u64, target: u64, length: u32) {
            let h = Header { kind, group, target, length };
            prop_assert_eq!(Header::decode(&h.encode(), u64::from(u32::MAX)), Ok(h));
        }

        #[test]
        fn any_bytes_decode_or_reject_without_panic(bytes in proptest::array::uniform24(any::<u8>()), max: u32) {
            if let Ok(h) = Header::decode(&bytes, u64::from(max)) {
                prop_assert!(h.length <= max);
                prop_assert_eq!(h.encode(), bytes);
            }
        }
    }

    #[test]
    fn rejections_are_specific() {
        let good = Header {
            kind: FrameKind::Control,
            group: 1,
            target: 2,
            length: 10,
        }
        .encode();
        let check = |mutate: &dyn Fn(&mut [u8; HEADER_BYTES]), max: u64, want: FrameError| {
            let mut b = good;
            mutate(&mut b);
            assert_eq!(Header::decode(&b, max), Err(want));
        };
        check(&|b| b[0] = b'X', 100, FrameError::BadMagic([b'X', b'N']));
        check(&|b| b[2] = 9, 100, FrameError::BadVersion(9));
        check(&|b| b[3] = 0, 100, FrameError::BadKind(0));
        check(&|b| b[3] = 11, 100, FrameError::BadKind(11));
        check(
            &|_| {},
            9,
            FrameError::TooLarge {
                length: 10,
                max_bytes: 9,
            },
        );
        assert!(Header::decode(&good, 10).is_ok());
    }
}
