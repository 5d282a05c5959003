//! A segment arriving from a peer in chunks (snapshot catch-up), written
//! straight to a temporary file so that no more than one chunk of it is ever
//! in memory.
//!
//! ```text
//! create     <dir>/<id>.seg.<n>.part   (new file, unique per fetch)
//! append*    chunk at the next offset: the declared length must be the
//!            expected one, the total never passes it, the first bytes must
//!            be the segment magic; xxh3-128 is updated as bytes arrive
//! finish     length complete, xxh3-128 == id -> fsync file
//!            -> rename to <id>.seg -> fsync dir
//! drop       before finish (error, cancel, panic): the part file is removed
//! ```
//!
//! The id is the content hash of the whole file, so the final check is as
//! strict as hashing a buffered copy. A `.part` file left by a crash is
//! removed at start-up with the other orphans (`tablet::seal::remove_orphans`).
//!
//! The calls do blocking file I/O; async callers run them on a blocking
//! thread.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::Xxh3;

use super::error::{Error, Result};
use super::format;

/// Suffix of a segment being fetched.
pub const PART_SUFFIX: &str = ".part";

/// Makes part-file names unique within the process, so two fetches of the
/// same segment (a snapshot retried while the first attempt still runs)
/// never write into one file.
static NEXT_PART: AtomicU64 = AtomicU64::new(0);

/// A segment being received. See the module docs for the protocol.
pub struct Incoming {
    id: String,
    dir: PathBuf,
    part: PathBuf,
    /// `None` once finished (nothing left to clean up).
    file: Option<File>,
    hasher: Box<Xxh3>,
    received: u64,
    expected_len: u64,
}

impl Incoming {
    /// Starts receiving segment `id` of `expected_len` bytes (the length the
    /// catalog entry of the sender recorded) into `dir`, creating `dir` if
    /// needed.
    pub fn create(dir: &Path, id: &str, expected_len: u64) -> Result<Incoming> {
        if id.len() != 32
            || !id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::Invalid(format!(
                "segment id {id:?} is not 32 lowercase hex digits"
            )));
        }
        if expected_len < format::FILE_LEN_MIN {
            return Err(Error::Invalid(format!(
                "segment {id}: expected length {expected_len} is below the smallest segment ({})",
                format::FILE_LEN_MIN
            )));
        }
        let io = |op, source| Error::Io {
            file: dir.to_path_buf(),
            op,
            source,
        };
        crate::fsutil::create_dir_durable(dir).map_err(|e| io("creating the directory", e))?;
        let n = NEXT_PART.fetch_add(1, Ordering::Relaxed);
        let part = dir.join(format!("{}.{n}{PART_SUFFIX}", super::file_name(id)));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
            .map_err(|source| Error::Io {
                file: part.clone(),
                op: "creating the part file",
                source,
            })?;
        Ok(Incoming {
            id: id.to_string(),
            dir: dir.to_path_buf(),
            part,
            file: Some(file),
            hasher: Box::new(Xxh3::new()),
            received: 0,
            expected_len,
        })
    }

    /// Bytes received so far: the offset of the next chunk.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// True once every expected byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.received == self.expected_len
    }

    /// Where the part file is (for tests and logs).
    pub fn part_path(&self) -> &Path {
        &self.part
    }

    fn corrupt(&self, offset: u64, what: String) -> Error {
        Error::Corrupt {
            file: self.part.clone(),
            offset,
            what,
        }
    }

    /// Appends the chunk at offset [`received`](Self::received); `file_len`
    /// is the whole length the sender declares with it. On error the caller
    /// drops `self`, which removes the part file.
    pub fn append(&mut self, chunk: &[u8], file_len: u64) -> Result<()> {
        let at = self.received;
        if file_len != self.expected_len {
            return Err(self.corrupt(
                at,
                format!(
                    "sender declares {file_len} bytes, the snapshot names {}",
                    self.expected_len
                ),
            ));
        }
        if chunk.is_empty() && at < file_len {
            return Err(self.corrupt(at, "empty chunk before the end".into()));
        }
        if at + chunk.len() as u64 > file_len {
            return Err(self.corrupt(at, format!("sender sent more than {file_len} bytes")));
        }
        // The prologue magic arrives first: refuse a wrong file at once
        // rather than after transferring all of it.
        if at < format::MAGIC.len() as u64 {
            let want = &format::MAGIC[at as usize..];
            let n = want.len().min(chunk.len());
            if chunk[..n] != want[..n] {
                return Err(self.corrupt(at, "does not start with the segment magic".into()));
            }
        }
        let Some(file) = self.file.as_mut() else {
            return Err(Error::Invalid(format!(
                "segment {}: append after finish",
                self.id
            )));
        };
        file.write_all(chunk).map_err(|source| Error::Io {
            file: self.part.clone(),
            op: "writing a fetched chunk",
            source,
        })?;
        self.hasher.update(chunk);
        self.received += chunk.len() as u64;
        Ok(())
    }

    /// Checks the length and the content hash, then publishes the file as
    /// `<dir>/<id>.seg` durably (fsync, rename, fsync directory). Returns
    /// the final path. On error the part file is removed.
    pub fn finish(mut self) -> Result<PathBuf> {
        if !self.is_complete() {
            return Err(self.corrupt(
                self.received,
                format!(
                    "truncated: {} of {} bytes",
                    self.received, self.expected_len
                ),
            ));
        }
        let got = format!("{:032x}", self.hasher.digest128());
        if got != self.id {
            return Err(self.corrupt(0, format!("content hashes to {got}, not to its id")));
        }
        let file = self.file.take().expect("finish runs once");
        let io = |file: &Path, op, source| Error::Io {
            file: file.to_path_buf(),
            op,
            source,
        };
        let result = file
            .sync_all()
            .map_err(|e| io(&self.part, "fsync of the part file", e))
            .and_then(|()| {
                drop(file);
                let path = self.dir.join(super::file_name(&self.id));
                std::fs::rename(&self.part, &path)
                    .map_err(|e| io(&path, "renaming the part file", e))?;
                crate::fsutil::fsync_dir(&self.dir)
                    .map_err(|e| io(&self.dir, "fsync of the directory", e))?;
                Ok(path)
            });
        if result.is_err() {
            // The rename may or may not have happened; the part name is
            // the only one this fetch owns.
            let _ = std::fs::remove_file(&self.part);
        }
        result
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Best effort: a leftover is removed at the next start-up.
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (String, Vec<u8>) {
        crate::segment::sample_segment(40, |i| vec![i as u8; 300])
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Feeds `bytes` in chunks of `chunk` bytes, declaring `declared` as the
    /// length, then finishes.
    fn receive(dir: &Path, id: &str, bytes: &[u8], declared: u64, chunk: usize) -> Result<PathBuf> {
        let mut inc = Incoming::create(dir, id, bytes.len() as u64)?;
        for c in bytes.chunks(chunk) {
            inc.append(c, declared)?;
        }
        inc.finish()
    }

    #[test]
    fn chunks_publish_the_exact_file_and_leave_no_part() {
        let dir = tempfile::tempdir().unwrap();
        let (id, bytes) = sample();
        let path = receive(dir.path(), &id, &bytes, bytes.len() as u64, 1000).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        assert_eq!(names(dir.path()), vec![crate::segment::file_name(&id)]);
        crate::segment::SegmentReader::open_with_id(&path, &id).unwrap();
    }

    #[test]
    fn every_failure_leaves_no_file() {
        let (id, bytes) = sample();
        let len = bytes.len() as u64;
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 1;
        let mut bad_magic = bytes.clone();
        bad_magic[0] = b'X';
        type Case<'a> = (&'a str, Box<dyn Fn(&Path) -> Result<PathBuf> + 'a>);
        let cases: Vec<Case> = vec![
            (
                "a flipped byte (hash mismatch)",
                Box::new(|d| receive(d, &id, &flipped, len, 777)),
            ),
            (
                "wrong declared length",
                Box::new(|d| receive(d, &id, &bytes, len + 1, 777)),
            ),
            (
                "bad magic in the first chunk",
                Box::new(|d| receive(d, &id, &bad_magic, len, 777)),
            ),
            (
                "truncated",
                Box::new(|d| receive(d, &id, &bytes[..bytes.len() - 1], len, 777)),
            ),
            (
                "more bytes than declared",
                Box::new(|d| {
                    let mut inc = Incoming::create(d, &id, len)?;
                    inc.append(&bytes, len)?;
                    inc.append(b"x", len)?;
                    inc.finish()
                }),
            ),
            (
                "empty chunk before the end",
                Box::new(|d| {
                    let mut inc = Incoming::create(d, &id, len)?;
                    inc.append(&bytes[..100], len)?;
                    inc.append(&[], len)?;
                    inc.finish()
                }),
            ),
            (
                "dropped midway (cancelled fetch)",
                Box::new(|d| {
                    let mut inc = Incoming::create(d, &id, len)?;
                    inc.append(&bytes[..100], len)?;
                    assert!(inc.part_path().exists());
                    drop(inc);
                    Err(Error::Invalid("cancelled".into()))
                }),
            ),
        ];
        for (what, run) in cases {
            let dir = tempfile::tempdir().unwrap();
            assert!(run(dir.path()).is_err(), "{what}: accepted");
            assert!(
                names(dir.path()).is_empty(),
                "{what}: left {:?}",
                names(dir.path())
            );
        }
    }

    #[test]
    fn bad_ids_and_lengths_are_refused_before_any_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Incoming::create(dir.path(), "../../etc/passwd", 1000).is_err());
        assert!(Incoming::create(dir.path(), &"A".repeat(32), 1000).is_err());
        assert!(Incoming::create(dir.path(), &"a".repeat(32), 3).is_err());
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn concurrent_fetches_of_one_segment_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let (id, bytes) = sample();
        let len = bytes.len() as u64;
        let mut a = Incoming::create(dir.path(), &id, len).unwrap();
        let mut b = Incoming::create(dir.path(), &id, len).unwrap();
        assert_ne!(a.part_path(), b.part_path());
        a.append(&bytes, len).unwrap();
        b.append(&bytes, len).unwrap();
        a.finish().unwrap();
        b.finish().unwrap();
        assert_eq!(names(dir.path()), vec![crate::segment::file_name(&id)]);
    }
}
