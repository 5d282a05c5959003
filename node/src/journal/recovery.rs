//! Opening the journal: scan every file, verify every frame, decide what to
//! do about damage, and hand back where every valid frame lies.
//!
//! The decision is a pure function of a file's bytes (`scan_frames`); the I/O
//! around it reads one file at a time and drops its bytes before the next,
//! so recovery holds at most one file in memory and returns locations, not
//! payloads.
//!
//! Damage rules (DESIGN.md section 7, seeds/002 section 5):
//! - a file before the last was complete and fsynced before the roll, so any
//!   damage there refuses to open;
//! - in the last file, damage followed by any frame that verifies refuses to
//!   open (the operator restores the file); damage with nothing valid after
//!   it is a torn tail, cut off at the first bad byte.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Location;
use super::error::{Error, Result};
use super::format::{
    self, Damage, FrameHeader, FrameKind, HEADER_BYTES, HeaderCheck, encode_file_header,
};
use super::retention::Retention;
use crate::{fixed, fsutil};

/// One valid frame found by recovery: its header fields and where it lies.
/// The payload stays on disk; read it with `Journal::read(location)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveredFrame {
    pub kind: FrameKind,
    pub tablet: u64,
    pub index: u64,
    pub location: Location,
}

/// What recovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Every valid frame in log order. The caller applies Truncate frames itself.
    pub frames: Vec<RecoveredFrame>,
    /// The last file and the offset at which a torn tail was cut off, if any.
    pub truncated: Option<(PathBuf, u64)>,
    /// Number of journal files after recovery.
    pub files: usize,
}

/// How the frames of one file end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanEnd {
    /// The last frame ends exactly at the end of the file.
    Clean,
    /// The bytes at `offset` are not a frame; `valid_after` is the offset of
    /// the first later frame that verifies, if any.
    Damaged {
        offset: u64,
        reason: Damage,
        valid_after: Option<u64>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileScan {
    /// (header, offset, whole frame length) of every valid frame before the end.
    pub(crate) frames: Vec<(FrameHeader, u64, u32)>,
    pub(crate) end: ScanEnd,
}

/// Scans the frames of a whole file (`bytes` includes the file header).
pub(crate) fn scan_frames(bytes: &[u8], payload_bytes_max: usize) -> FileScan {
    debug_assert!(bytes.len() >= HEADER_BYTES);
    let mut frames = Vec::new();
    let mut offset = HEADER_BYTES;
    while offset < bytes.len() {
        match format::verify_frame(&bytes[offset..], payload_bytes_max) {
            Ok(header) => {
                let frame_bytes = format::FRAME_HEADER_BYTES + header.payload_bytes as usize;
                frames.push((header, offset as u64, frame_bytes as u32));
                offset += frame_bytes;
            }
            Err(reason) => {
                let valid_after = find_valid_frame(bytes, offset + 1, payload_bytes_max);
                return FileScan {
                    frames,
                    end: ScanEnd::Damaged {
                        offset: offset as u64,
                        reason,
                        valid_after,
                    },
                };
            }
        }
    }
    FileScan {
        frames,
        end: ScanEnd::Clean,
    }
}

/// Byte-by-byte search for any frame that verifies at or after `from`.
fn find_valid_frame(bytes: &[u8], from: usize, payload_bytes_max: usize) -> Option<u64> {
    (from..bytes.len())
        .find(|&p| {
            format::plausible_frame_start(&bytes[p..], payload_bytes_max)
                && format::verify_frame(&bytes[p..], payload_bytes_max).is_ok()
        })
        .map(|p| p as u64)
}

pub(crate) fn file_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

/// Journal files in `dir`, by sequence. Other names are not ours and are left alone.
fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".wal") else {
            continue;
        };
        if stem.len() != 20 {
            continue;
        }
        if let Ok(seq) = stem.parse::<u64>() {
            files.push((seq, entry.path()));
        }
    }
    files.sort_unstable_by_key(|(seq, _)| *seq);
    Ok(files)
}

/// Everything `Journal::open` needs after recovery.
pub(crate) struct Recovered {
    pub(crate) recovery: Recovery,
    pub(crate) retention: Retention,
    /// Open handles of every file by sequence (the last one writable).
    pub(crate) handles: BTreeMap<u64, Arc<File>>,
    pub(crate) active_seq: u64,
    pub(crate) active_bytes: u64,
}

/// Creates a file holding only a header, durably (file and directory fsynced).
pub(crate) fn create_file(dir: &Path, seq: u64) -> Result<File> {
    let path = file_path(dir, seq);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    file.write_all_at(&encode_file_header(), 0)
        .and_then(|()| file.sync_all())
        .and_then(|()| fsutil::fsync_dir(dir))
        .map_err(|e| Error::io(&path, e))?;
    Ok(file)
}

pub(crate) fn recover(dir: &Path, payload_bytes_max: usize) -> Result<Recovered> {
    fsutil::create_dir_durable(dir).map_err(|e| Error::io(dir, e))?;
    let files = list_files(dir)?;
    for pair in files.windows(2) {
        if pair[1].0 != pair[0].0 + 1 {
            return Err(Error::MissingFile {
                dir: dir.to_path_buf(),
                missing_seq: pair[0].0 + 1,
            });
        }
    }

    let mut retention = Retention::default();
    let mut handles = BTreeMap::new();
    let mut frames = Vec::new();
    let mut truncated = None;

    if files.is_empty() {
        let seq = 1;
        handles.insert(seq, Arc::new(create_file(dir, seq)?));
        retention.add_file(seq, HEADER_BYTES as u64);
        retention.set_active(seq);
        return Ok(Recovered {
            recovery: Recovery {
                frames,
                truncated,
                files: 1,
            },
            retention,
            handles,
            active_seq: seq,
            active_bytes: HEADER_BYTES as u64,
        });
    }

    let last_seq = files.last().expect("not empty").0;
    let mut active_bytes = 0;
    for (seq, path) in &files {
        let is_last = *seq == last_seq;
        let file = OpenOptions::new()
            .read(true)
            .write(is_last)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;

        let Ok(header) = fixed::array::<HEADER_BYTES>(&bytes, 0) else {
            if !is_last {
                return Err(Error::Corrupt {
                    file: path.clone(),
                    offset: 0,
                    reason: Damage::ShortFileHeader {
                        file_bytes: bytes.len() as u64,
                    },
                    valid_after: None,
                });
            }
            // A roll that crashed between creating the file and syncing its
            // header: nothing in it was ever acknowledged.
            file.set_len(0)
                .and_then(|()| file.write_all_at(&encode_file_header(), 0))
                .and_then(|()| file.sync_all())
                .map_err(|e| Error::io(path, e))?;
            truncated = Some((path.clone(), 0));
            retention.add_file(*seq, HEADER_BYTES as u64);
            handles.insert(*seq, Arc::new(file));
            active_bytes = HEADER_BYTES as u64;
            continue;
        };

        match format::check_file_header(header) {
            HeaderCheck::Ok => {}
            HeaderCheck::BadMagic => return Err(Error::BadMagic { path: path.clone() }),
            HeaderCheck::UnsupportedVersion(version) => {
                return Err(Error::UnsupportedVersion {
                    path: path.clone(),
                    version,
                    supported: format::FORMAT_VERSION,
                });
            }
        }

        let scan = scan_frames(&bytes, payload_bytes_max);
        let mut file_bytes = bytes.len() as u64;
        drop(bytes);
        if let ScanEnd::Damaged {
            offset,
            reason,
            valid_after,
        } = scan.end
        {
            if !is_last || valid_after.is_some() {
                return Err(Error::Corrupt {
                    file: path.clone(),
                    offset,
                    reason,
                    valid_after,
                });
            }
            tracing::warn!(file = %path.display(), offset, %reason, "cutting torn journal tail");
            file.set_len(offset)
                .and_then(|()| file.sync_all())
                .map_err(|e| Error::io(path, e))?;
            truncated = Some((path.clone(), offset));
            file_bytes = offset;
        }

        retention.add_file(*seq, HEADER_BYTES as u64);
        for (header, offset, len) in scan.frames {
            retention.record(*seq, header.tablet, header.index, u64::from(len));
            frames.push(RecoveredFrame {
                kind: header.kind,
                tablet: header.tablet,
                index: header.index,
                location: Location {
                    file_seq: *seq,
                    offset,
                    len,
                },
            });
        }
        handles.insert(*seq, Arc::new(file));
        active_bytes = file_bytes;
    }
    retention.set_active(last_seq);

    Ok(Recovered {
        recovery: Recovery {
            frames,
            truncated,
            files: files.len(),
        },
        retention,
        handles,
        active_seq: last_seq,
        active_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::format::encode_frame;

    fn file_with(n: usize) -> Vec<u8> {
        let mut bytes = encode_file_header().to_vec();
        for i in 0..n {
            encode_frame(&mut bytes, FrameKind::Entry, 1, i as u64, &[i as u8; 10]);
        }
        bytes
    }

    const FRAME: u64 = (format::FRAME_HEADER_BYTES + 10) as u64;
    const H: u64 = HEADER_BYTES as u64;

    #[test]
    fn clean_file() {
        let scan = scan_frames(&file_with(3), 1024);
        assert_eq!(scan.frames.len(), 3);
        assert_eq!(scan.end, ScanEnd::Clean);
        assert_eq!(scan.frames[2].1, H + 2 * FRAME);
    }

    #[test]
    fn torn_tail_has_nothing_valid_after() {
        let mut bytes = file_with(3);
        bytes.truncate(bytes.len() - 3);
        let scan = scan_frames(&bytes, 1024);
        assert_eq!(scan.frames.len(), 2);
        assert!(matches!(
            scan.end,
            ScanEnd::Damaged { offset, valid_after: None, .. } if offset == H + 2 * FRAME
        ));
    }

    #[test]
    fn damage_before_valid_frames_names_both_offsets() {
        let mut bytes = file_with(3);
        bytes[(H + FRAME + 30) as usize] ^= 0xff;
        let scan = scan_frames(&bytes, 1024);
        assert_eq!(scan.frames.len(), 1);
        assert_eq!(
            scan.end,
            ScanEnd::Damaged {
                offset: H + FRAME,
                reason: scan_reason(&scan.end),
                valid_after: Some(H + 2 * FRAME),
            }
        );
    }

    fn scan_reason(end: &ScanEnd) -> Damage {
        match end {
            ScanEnd::Damaged { reason, .. } => *reason,
            ScanEnd::Clean => panic!("clean"),
        }
    }
}
