//! Byte layout of journal files, mirrored in `docs/FORMAT.md` (section 3).
//!
//! ```text
//! file   := header frame*
//! header := magic "STELEJNL" (8) | version u32 LE (4) | reserved u32 (4)
//! frame  := len u32 LE | crc u32 LE | kind u8 | pad [0;3] | tablet u64 LE | index u64 LE | payload[len]
//! crc    := crc32c(frame[0..4] ++ frame[8..28] ++ payload)
//! ```
//!
//! Everything here is pure: encoding into buffers and verifying bytes that a
//! caller already read. The I/O lives in the committer, the reader and the
//! recovery scan.

use std::fmt;

use crate::fixed;

/// The first eight bytes of every journal file.
pub const MAGIC: [u8; 8] = *b"STELEJNL";
/// The only file format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

pub const HEADER_MAGIC_OFFSET: usize = 0;
pub const HEADER_VERSION_OFFSET: usize = 8;
pub const HEADER_RESERVED_OFFSET: usize = 12;
pub const HEADER_BYTES: usize = 16;

pub const FRAME_LEN_OFFSET: usize = 0;
pub const FRAME_CRC_OFFSET: usize = 4;
pub const FRAME_KIND_OFFSET: usize = 8;
pub const FRAME_PAD_OFFSET: usize = 9;
pub const FRAME_PAD_BYTES: usize = 3;
pub const FRAME_TABLET_OFFSET: usize = 12;
pub const FRAME_INDEX_OFFSET: usize = 20;
pub const FRAME_HEADER_BYTES: usize = 28;

/// The default bound on one frame's payload; a length field above the bound
/// is treated as damage rather than as a request to allocate.
pub const FRAME_PAYLOAD_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// What a frame means. The discriminant is the on-disk `kind` byte; zero is
/// never a valid kind so that a zero-filled tail never verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FrameKind {
    /// A Raft log entry; the payload is opaque to the journal.
    Entry = 1,
    /// Every entry of `tablet` with an index above `index` is void. Empty payload.
    Truncate = 2,
    /// Advisory: `index` is the tablet's committed index. Opaque payload.
    Commit = 3,
}

impl FrameKind {
    pub fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            1 => Some(FrameKind::Entry),
            2 => Some(FrameKind::Truncate),
            3 => Some(FrameKind::Commit),
            _ => None,
        }
    }

    pub fn to_byte(self) -> u8 {
        self as u8
    }
}

/// The fixed fields of a frame, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub tablet: u64,
    pub index: u64,
    pub payload_bytes: u32,
}

/// Why bytes at some offset are not a frame (or a file header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Fewer bytes remain than a frame header needs.
    ShortHeader,
    /// The length field exceeds `frame_payload_bytes_max`.
    LengthOverMax { payload_bytes: u32 },
    /// The length field points past the end of the file.
    PastEnd { payload_bytes: u32 },
    /// The checksum does not match.
    Checksum { stored: u32, computed: u32 },
    /// The kind byte names no known kind.
    UnknownKind { kind: u8 },
    /// The pad bytes after the kind are not zero.
    NonZeroPad,
    /// A Truncate frame carries a payload.
    TruncateWithPayload,
    /// The file is shorter than its header.
    ShortFileHeader { file_bytes: u64 },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::ShortHeader => write!(f, "truncated frame header"),
            Damage::LengthOverMax { payload_bytes } => {
                write!(f, "frame length {payload_bytes} exceeds the payload bound")
            }
            Damage::PastEnd { payload_bytes } => {
                write!(
                    f,
                    "frame length {payload_bytes} runs past the end of the file"
                )
            }
            Damage::Checksum { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )
            }
            Damage::UnknownKind { kind } => write!(f, "unknown frame kind {kind}"),
            Damage::NonZeroPad => write!(f, "non-zero pad bytes"),
            Damage::TruncateWithPayload => write!(f, "truncate frame with a payload"),
            Damage::ShortFileHeader { file_bytes } => {
                write!(f, "file of {file_bytes} bytes is shorter than its header")
            }
        }
    }
}

/// The 16-byte file header.
pub fn encode_file_header() -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[HEADER_MAGIC_OFFSET..HEADER_VERSION_OFFSET].copy_from_slice(&MAGIC);
    header[HEADER_VERSION_OFFSET..HEADER_RESERVED_OFFSET]
        .copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header
}

/// What the first 16 bytes of a file say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCheck {
    Ok,
    BadMagic,
    UnsupportedVersion(u32),
}

pub fn check_file_header(header: &[u8; HEADER_BYTES]) -> HeaderCheck {
    if header[HEADER_MAGIC_OFFSET..HEADER_VERSION_OFFSET] != MAGIC {
        return HeaderCheck::BadMagic;
    }
    let version = fixed::u32_le_in::<HEADER_VERSION_OFFSET, HEADER_BYTES>(header);
    if version != FORMAT_VERSION {
        return HeaderCheck::UnsupportedVersion(version);
    }
    HeaderCheck::Ok
}

/// Appends one encoded frame to `out` and returns its whole length in bytes.
/// The caller has already bounded `payload` by `frame_payload_bytes_max`.
pub fn encode_frame(
    out: &mut Vec<u8>,
    kind: FrameKind,
    tablet: u64,
    index: u64,
    payload: &[u8],
) -> u32 {
    let payload_bytes = u32::try_from(payload.len()).expect("payload bounded by caller");
    let start = out.len();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[FRAME_LEN_OFFSET..FRAME_CRC_OFFSET].copy_from_slice(&payload_bytes.to_le_bytes());
    header[FRAME_KIND_OFFSET] = kind.to_byte();
    header[FRAME_TABLET_OFFSET..FRAME_INDEX_OFFSET].copy_from_slice(&tablet.to_le_bytes());
    header[FRAME_INDEX_OFFSET..FRAME_HEADER_BYTES].copy_from_slice(&index.to_le_bytes());
    let crc = frame_crc(&header, payload);
    header[FRAME_CRC_OFFSET..FRAME_KIND_OFFSET].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    debug_assert_eq!(
        verify_frame(&out[start..], payload_bytes as usize).map(|h| h.index),
        Ok(index)
    );
    (out.len() - start) as u32
}

/// crc32c over everything in the frame except the crc field itself.
fn frame_crc(header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[FRAME_LEN_OFFSET..FRAME_CRC_OFFSET]);
    let crc = crc32c::crc32c_append(crc, &header[FRAME_KIND_OFFSET..FRAME_HEADER_BYTES]);
    crc32c::crc32c_append(crc, payload)
}

/// Verifies the frame that starts at `bytes[0]`; `bytes` may extend past it
/// (to the end of the file). Returns the header when the whole frame checks out.
pub fn verify_frame(bytes: &[u8], payload_bytes_max: usize) -> Result<FrameHeader, Damage> {
    let Ok(header) = fixed::array::<FRAME_HEADER_BYTES>(bytes, 0) else {
        return Err(Damage::ShortHeader);
    };
    let payload_bytes = fixed::u32_le_in::<FRAME_LEN_OFFSET, FRAME_HEADER_BYTES>(header);
    if payload_bytes as usize > payload_bytes_max {
        return Err(Damage::LengthOverMax { payload_bytes });
    }
    let frame_bytes = FRAME_HEADER_BYTES + payload_bytes as usize;
    if bytes.len() < frame_bytes {
        return Err(Damage::PastEnd { payload_bytes });
    }
    let stored = fixed::u32_le_in::<FRAME_CRC_OFFSET, FRAME_HEADER_BYTES>(header);
    let computed = frame_crc(header, &bytes[FRAME_HEADER_BYTES..frame_bytes]);
    if stored != computed {
        return Err(Damage::Checksum { stored, computed });
    }
    // A frame whose CRC verifies but whose kind is unknown was written by a
    // newer build (or by a bug): either way this build cannot interpret it.
    let kind_byte = header[FRAME_KIND_OFFSET];
    let pad = &header[FRAME_PAD_OFFSET..FRAME_PAD_OFFSET + FRAME_PAD_BYTES];
    let Some(kind) = FrameKind::from_byte(kind_byte) else {
        return Err(Damage::UnknownKind { kind: kind_byte });
    };
    if pad.iter().any(|&b| b != 0) {
        return Err(Damage::NonZeroPad);
    }
    if kind == FrameKind::Truncate && payload_bytes != 0 {
        return Err(Damage::TruncateWithPayload);
    }
    Ok(FrameHeader {
        kind,
        tablet: fixed::u64_le_in::<FRAME_TABLET_OFFSET, FRAME_HEADER_BYTES>(header),
        index: fixed::u64_le_in::<FRAME_INDEX_OFFSET, FRAME_HEADER_BYTES>(header),
        payload_bytes,
    })
}

/// Cheap pre-filter for the forward search after damage: can a frame start here at all?
pub fn plausible_frame_start(bytes: &[u8], payload_bytes_max: usize) -> bool {
    let Ok(header) = fixed::array::<FRAME_HEADER_BYTES>(bytes, 0) else {
        return false;
    };
    let payload_bytes = fixed::u32_le_in::<FRAME_LEN_OFFSET, FRAME_HEADER_BYTES>(header) as usize;
    payload_bytes <= payload_bytes_max
        && FRAME_HEADER_BYTES + payload_bytes <= bytes.len()
        && FrameKind::from_byte(header[FRAME_KIND_OFFSET]).is_some()
        && header[FRAME_PAD_OFFSET..FRAME_PAD_OFFSET + FRAME_PAD_BYTES] == [0; FRAME_PAD_BYTES]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_and_every_byte_is_covered() {
        let mut buf = Vec::new();
        let len = encode_frame(&mut buf, FrameKind::Entry, 7, 42, b"hello");
        assert_eq!(len as usize, FRAME_HEADER_BYTES + 5);
        let header = verify_frame(&buf, 1024).unwrap();
        assert_eq!(
            header,
            FrameHeader {
                kind: FrameKind::Entry,
                tablet: 7,
                index: 42,
                payload_bytes: 5
            }
        );
        // Flipping any single byte must make the frame fail to verify.
        for i in 0..buf.len() {
            let mut damaged = buf.clone();
            damaged[i] ^= 0x01;
            assert!(
                verify_frame(&damaged, 1024).is_err(),
                "byte {i} not covered"
            );
        }
    }

    #[test]
    fn length_over_max_is_damage() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, FrameKind::Entry, 1, 1, &[0u8; 100]);
        assert_eq!(
            verify_frame(&buf, 99),
            Err(Damage::LengthOverMax { payload_bytes: 100 })
        );
    }

    #[test]
    fn a_frame_cut_inside_its_header_is_short_not_a_panic() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, FrameKind::Entry, 1, 1, b"x");
        for len in 0..FRAME_HEADER_BYTES {
            assert_eq!(verify_frame(&buf[..len], 1024), Err(Damage::ShortHeader));
            assert!(!plausible_frame_start(&buf[..len], 1024));
        }
        assert_eq!(
            verify_frame(&buf[..FRAME_HEADER_BYTES], 1024),
            Err(Damage::PastEnd { payload_bytes: 1 })
        );
        assert!(plausible_frame_start(&buf, 1024));
    }

    #[test]
    fn zeroes_never_verify() {
        assert!(verify_frame(&[0u8; 64], 1024).is_err());
    }

    #[test]
    fn header_checks() {
        let mut header = encode_file_header();
        assert_eq!(check_file_header(&header), HeaderCheck::Ok);
        header[HEADER_VERSION_OFFSET] = 2;
        assert_eq!(
            check_file_header(&header),
            HeaderCheck::UnsupportedVersion(2)
        );
        header[0] = b'X';
        assert_eq!(check_file_header(&header), HeaderCheck::BadMagic);
    }
}
