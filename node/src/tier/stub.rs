//! Stubs: the structure of an evicted segment, kept on local disk so the
//! segment opens without its object (docs/FORMAT.md, "Segment stub").
//!
//! Opening a segment reads its prologue and header, then its trailer and
//! footer (block index and bloom filter). For a segment whose file went to
//! the cold tier those reads were GETs, so a node restarted while the
//! bucket failed could not open its tablets and stayed down. A stub holds
//! exactly those byte ranges; with it, opening needs no request and only
//! block reads go to the bucket.
//!
//! ```text
//! <id>.stub = magic "STELSTUB" | version u32 | file_len u64
//!           | head_len u32 | tail_offset u64 | tail_len u32
//!           | head bytes | tail bytes | crc32c u32 (of everything before)
//! ```
//!
//! A stub is a cache: the reader checks every byte it takes from it exactly
//! as it checks the object's (header, footer and trailer crc32c), a stub
//! that fails any check is removed and the object is read instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fixed;
use crate::segment::{RangeRead, SegmentReader};

const MAGIC: &[u8; 8] = b"STELSTUB";
const VERSION: u32 = 1;
const OFF_VERSION: usize = 8;
const OFF_FILE_LEN: usize = 12;
const OFF_HEAD_LEN: usize = 20;
const OFF_TAIL_OFFSET: usize = 24;
const OFF_TAIL_LEN: usize = 32;
/// magic, version, file_len, head_len, tail_offset, tail_len.
const FIXED: usize = 8 + 4 + 8 + 4 + 8 + 4;
const CRC_BYTES: usize = 4;
/// Larger stubs are refused unread (a segment's footer is bounded well
/// below this; see `segment::format::FOOTER_BYTES_MAX`).
const STUB_BYTES_MAX: u64 = 256 << 20;

/// Why a stub cannot be used. Each is a reason to remove it and read the
/// object instead: a stub is a cache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {bytes} bytes is too large", .path.display())]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("{}: {damage}", .path.display())]
    Damaged {
        path: PathBuf,
        #[source]
        damage: Damage,
    },
}

/// Why bytes are not the stub of the segment the catalog names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("{bytes} bytes is too short")]
    TooShort { bytes: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("crc32c mismatch")]
    Checksum,
    #[error("unknown version {version}")]
    UnknownVersion { version: u32 },
    #[error("stub of a {stub_len}-byte segment, the catalog's is {file_len} bytes")]
    OtherLength { stub_len: u64, file_len: u64 },
    #[error(
        "ranges [0, {head_len}) and [{tail_offset}, +{tail_len}) do not fit a \
         {file_len}-byte segment in {bytes} bytes"
    )]
    Ranges {
        head_len: usize,
        tail_offset: u64,
        tail_len: usize,
        file_len: u64,
        bytes: usize,
    },
    #[error(transparent)]
    Field(#[from] fixed::Error),
}

/// File name of a segment's stub: `<id>.stub`.
pub fn file_name(id: &str) -> String {
    format!("{id}.stub")
}

pub fn path(dir: &Path, id: &str) -> PathBuf {
    dir.join(file_name(id))
}

/// The structure ranges of one segment of `file_len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stub {
    pub file_len: u64,
    pub head: Vec<u8>,
    pub tail_offset: u64,
    pub tail: Vec<u8>,
}

impl Stub {
    /// The stub of an open segment (local or remote: a remote reader's
    /// structure ranges are in the cold cache right after it opened).
    pub fn of(reader: &SegmentReader) -> crate::segment::Result<Stub> {
        let [(h_off, h_len), (t_off, t_len)] = reader.structure_ranges();
        Ok(Stub {
            file_len: reader.file_len(),
            head: reader.raw_range(h_off, h_len)?,
            tail_offset: t_off,
            tail: reader.raw_range(t_off, t_len)?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED + self.head.len() + self.tail.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.file_len.to_le_bytes());
        out.extend_from_slice(&(self.head.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.tail_offset.to_le_bytes());
        out.extend_from_slice(&(self.tail.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&self.tail);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a stub of a segment of `file_len` bytes (the catalog's
    /// length), checking its framing: the reader checks the contents.
    pub fn decode(bytes: &[u8], file_len: u64) -> Result<Stub, Damage> {
        if bytes.len() < FIXED + CRC_BYTES {
            return Err(Damage::TooShort { bytes: bytes.len() });
        }
        if &bytes[..8] != MAGIC {
            return Err(Damage::BadMagic);
        }
        let (body, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
        if crc32c::crc32c(body) != fixed::u32_le(crc, 0)? {
            return Err(Damage::Checksum);
        }
        let fields = fixed::array::<FIXED>(body, 0)?;
        let version = fixed::u32_le_in::<OFF_VERSION, FIXED>(fields);
        if version != VERSION {
            return Err(Damage::UnknownVersion { version });
        }
        let stub_len = fixed::u64_le_in::<OFF_FILE_LEN, FIXED>(fields);
        let head_len = fixed::u32_le_in::<OFF_HEAD_LEN, FIXED>(fields) as usize;
        let tail_offset = fixed::u64_le_in::<OFF_TAIL_OFFSET, FIXED>(fields);
        let tail_len = fixed::u32_le_in::<OFF_TAIL_LEN, FIXED>(fields) as usize;
        if stub_len != file_len {
            return Err(Damage::OtherLength { stub_len, file_len });
        }
        if FIXED + head_len + tail_len != body.len()
            || head_len as u64 > tail_offset
            || tail_offset.checked_add(tail_len as u64) != Some(file_len)
        {
            return Err(Damage::Ranges {
                head_len,
                tail_offset,
                tail_len,
                file_len,
                bytes: bytes.len(),
            });
        }
        Ok(Stub {
            file_len,
            head: body[FIXED..FIXED + head_len].to_vec(),
            tail_offset,
            tail: body[FIXED + head_len..].to_vec(),
        })
    }

    /// The bytes `[offset, offset + len)` when the stub holds all of them.
    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len as u64)?;
        if end <= self.head.len() as u64 {
            return Some(&self.head[offset as usize..end as usize]);
        }
        if offset >= self.tail_offset && end <= self.file_len {
            let at = (offset - self.tail_offset) as usize;
            return Some(&self.tail[at..at + len]);
        }
        None
    }
}

/// Reads `dir/<id>.stub`: `Ok(None)` when there is none, `Err` when it
/// exists and is unusable.
pub fn read(dir: &Path, id: &str, file_len: u64) -> Result<Option<Stub>, Error> {
    let path = path(dir, id);
    let len = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path, source }),
    };
    if len > STUB_BYTES_MAX {
        return Err(Error::TooLarge { path, bytes: len });
    }
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(source) => return Err(Error::Io { path, source }),
    };
    match Stub::decode(&bytes, file_len) {
        Ok(stub) => Ok(Some(stub)),
        Err(damage) => Err(Error::Damaged { path, damage }),
    }
}

/// Publishes `dir/<id>.stub` durably (write, fsync, rename, fsync dir).
pub fn write(dir: &Path, id: &str, stub: &Stub) -> std::io::Result<()> {
    crate::fsutil::durable_write(&path(dir, id), &stub.encode())
}

/// Removes a stub if there is one.
pub fn remove(dir: &Path, id: &str) {
    match std::fs::remove_file(path(dir, id)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), segment = id, error = %e, "stub not removed")
        }
    }
}

/// A remote segment whose structure ranges come from its stub and whose
/// blocks come from `inner` (the object).
#[derive(Debug)]
pub struct Stubbed {
    pub stub: Stub,
    pub inner: Arc<dyn RangeRead>,
}

impl RangeRead for Stubbed {
    fn byte_len(&self) -> u64 {
        self.inner.byte_len()
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        match self.stub.slice(offset, len) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => self.inner.read_at(offset, len),
        }
    }

    fn invalidate(&self) {
        self.inner.invalidate();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stub() -> Stub {
        Stub {
            file_len: 100,
            head: vec![1; 10],
            tail_offset: 80,
            tail: vec![2; 20],
        }
    }

    #[test]
    fn a_stub_round_trips_and_serves_only_its_ranges() {
        let s = stub();
        assert_eq!(Stub::decode(&s.encode(), 100).unwrap(), s);
        assert_eq!(s.slice(0, 10), Some(&[1u8; 10][..]));
        assert_eq!(s.slice(85, 15), Some(&[2u8; 15][..]));
        assert_eq!(s.slice(5, 10), None, "crosses the head's end");
        assert_eq!(s.slice(40, 4), None, "a block");
        assert_eq!(s.slice(90, 20), None, "past the end");
        assert_eq!(s.slice(u64::MAX, 2), None);
    }

    #[test]
    fn a_damaged_or_foreign_stub_is_refused() {
        let bytes = stub().encode();
        assert_eq!(
            Stub::decode(&bytes, 101),
            Err(Damage::OtherLength {
                stub_len: 100,
                file_len: 101
            })
        );
        assert_eq!(
            Stub::decode(&bytes[..20], 100),
            Err(Damage::TooShort { bytes: 20 })
        );
        assert_eq!(Stub::decode(&[], 100), Err(Damage::TooShort { bytes: 0 }));
        for at in [0, 9, 14, 22, 30, 40, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(Stub::decode(&bad, 100).is_err(), "flip at {at}");
        }
        // Framing that lies about its ranges, with a crc to match.
        let mut lying = stub();
        lying.tail_offset = 70;
        let err = Stub::decode(&lying.encode(), 100).unwrap_err();
        assert!(matches!(err, Damage::Ranges { .. }), "{err}");
        assert!(err.to_string().contains("do not fit"), "{err}");
    }

    #[test]
    fn read_finds_none_a_stub_or_refuses_an_oversized_file_unread() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "s1", 100).unwrap(), None);
        write(dir.path(), "s1", &stub()).unwrap();
        assert_eq!(read(dir.path(), "s1", 100).unwrap(), Some(stub()));
        // Sparse: the size alone refuses it, before any byte is read.
        let big = std::fs::File::create(path(dir.path(), "s2")).unwrap();
        big.set_len(STUB_BYTES_MAX + 1).unwrap();
        let err = read(dir.path(), "s2", 100).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("too large"), "{err}");
        // A stub of another length of segment is refused, naming its file.
        let err = read(dir.path(), "s1", 101).unwrap_err();
        match &err {
            Error::Damaged { path: p, damage } => {
                assert_eq!(p, &path(dir.path(), "s1"));
                assert!(matches!(damage, Damage::OtherLength { .. }), "{damage}");
            }
            other => panic!("{other}"),
        }
        assert!(
            err.to_string()
                .starts_with(&*path(dir.path(), "s1").to_string_lossy())
        );
        remove(dir.path(), "s1");
        remove(dir.path(), "s1");
        assert_eq!(read(dir.path(), "s1", 100).unwrap(), None);
    }

    /// An object that counts the reads that reach it.
    #[derive(Debug)]
    struct Object {
        bytes: Vec<u8>,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl RangeRead for Object {
        fn byte_len(&self) -> u64 {
            self.bytes.len() as u64
        }

        fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let at = offset as usize;
            Ok(self.bytes[at..at + len].to_vec())
        }
    }

    /// A range the stub does not wholly hold (a header longer than the
    /// stub's head, a block) is read from the object, whole; ranges the
    /// stub holds never reach it.
    #[test]
    fn ranges_beyond_the_stub_are_read_from_the_object() {
        let object = Arc::new(Object {
            bytes: (0..100u8).collect(),
            reads: Default::default(),
        });
        let stubbed = Stubbed {
            stub: stub(),
            inner: object.clone(),
        };
        let reads = || object.reads.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(stubbed.read_at(0, 10).unwrap(), vec![1; 10]);
        assert_eq!(stubbed.read_at(80, 20).unwrap(), vec![2; 20]);
        assert_eq!(reads(), 0);
        assert_eq!(
            stubbed.read_at(0, 16).unwrap(),
            (0..16u8).collect::<Vec<_>>()
        );
        assert_eq!(stubbed.read_at(40, 4).unwrap(), vec![40, 41, 42, 43]);
        assert_eq!(stubbed.read_at(78, 4).unwrap(), vec![78, 79, 80, 81]);
        assert_eq!(reads(), 3);
        assert_eq!(stubbed.byte_len(), 100);
    }
}
