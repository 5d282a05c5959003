//! The node's journal: one segmented, group-committed write-ahead log that
//! carries the Raft log entries of every tablet hosted on the node.
//!
//! ```text
//!  callers (any thread) --submit--> bounded queue --> committer thread
//!                                                      | one write + one fdatasync per group
//!                                                      v
//!                                   <dir>/00000000000000000001.wal, ...02.wal, ...
//!  read(Location) --pread--> any retained file        trim() deletes old files
//! ```
//!
//! Thousands of tablets share one file set so that one fsync covers the
//! frames of many tablets (DESIGN.md section 5, step 3). Only this module
//! calls fsync on journal files. The byte layout is in `docs/FORMAT.md`
//! (section 3) and mirrored in `format.rs`.
//!
//! After `open`, the journal keeps no trim points: the owner sets them from
//! its catalog (`set_trim_point`) and forgets tablets the node no longer
//! hosts (`forget_tablet`) before calling `trim`.

mod committer;
mod error;
pub(crate) mod format;
mod marks;
mod options;
mod queue;
pub(crate) mod recovery;
mod retention;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;

pub use error::{Error, Result};
pub use format::{Damage, FrameKind};
pub use options::{Faults, Options};
pub use recovery::{RecoveredFrame, Recovery};

use committer::Committer;
use format::{FRAME_HEADER_BYTES, HEADER_BYTES};
use queue::{Queue, Unit};
use recovery::file_path;
use retention::Retention;

/// One frame as the caller submits it and as `read` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub tablet: u64,
    pub index: u64,
    pub payload: Bytes,
}

/// Where a frame lies: file sequence, byte offset of the frame, whole frame length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub file_seq: u64,
    pub offset: u64,
    pub len: u32,
}

/// Counters since `open`, plus the current file set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub fsyncs: u64,
    pub groups: u64,
    pub frames: u64,
    pub bytes: u64,
    pub files: usize,
    pub retained_bytes: u64,
    /// Why the journal stopped, if it did.
    pub stopped: Option<String>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) fsyncs: AtomicU64,
    pub(crate) groups: AtomicU64,
    pub(crate) frames: AtomicU64,
    pub(crate) bytes: AtomicU64,
}

/// State shared by callers and the committer. Every lock here is held only
/// for memory operations, never across I/O.
pub(crate) struct Shared {
    pub(crate) opts: Options,
    pub(crate) queue: Queue,
    pub(crate) stopped: Mutex<Option<String>>,
    pub(crate) handles: Mutex<BTreeMap<u64, Arc<File>>>,
    pub(crate) retention: Mutex<Retention>,
    pub(crate) counters: Counters,
    /// Serialises `trim` calls with each other (not with appends).
    trim_lock: Mutex<()>,
}

impl Shared {
    pub(crate) fn stopped_reason(&self) -> Option<String> {
        self.stopped.lock().expect("stopped lock").clone()
    }
}

struct Inner {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        shutdown(&self.shared, &self.committer);
    }
}

fn shutdown(shared: &Shared, committer: &Mutex<Option<JoinHandle<()>>>) {
    shared.queue.close();
    let handle = committer.lock().expect("committer lock").take();
    if let Some(handle) = handle {
        // A done callback may drop the last handle on the committer thread
        // itself; joining there would wait forever.
        if handle.thread().id() != std::thread::current().id() {
            let _ = handle.join();
        }
    }
}

/// The journal handle: cheap to clone, shareable across threads.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl Journal {
    /// Opens the journal in `opts.dir` (creating it if absent), runs recovery
    /// and starts the committer thread.
    pub fn open(opts: Options) -> Result<(Journal, Recovery)> {
        opts.validate()?;
        let recovered = recovery::recover(&opts.dir, opts.frame_payload_bytes_max)?;
        let file = Arc::clone(&recovered.handles[&recovered.active_seq]);
        let shared = Arc::new(Shared {
            queue: Queue::new(opts.queue_frames_max),
            opts,
            stopped: Mutex::new(None),
            handles: Mutex::new(recovered.handles),
            retention: Mutex::new(recovered.retention),
            counters: Counters::default(),
            trim_lock: Mutex::new(()),
        });
        if shared.opts.faults.skip_sync() {
            tracing::warn!(
                "STELE_FAILPOINTS journal-skip-sync: writes are acknowledged without fdatasync; a power cut loses them (jepsen negative control only)"
            );
        }
        let marks = if shared.opts.faults.sync_marks() {
            let files: Vec<(u64, u64)> = shared
                .handles
                .lock()
                .expect("handles lock")
                .iter()
                .map(|(seq, f)| (*seq, f.metadata().map_or(0, |m| m.len())))
                .collect();
            Some(marks::Marks::load(&shared.opts.dir, &files))
        } else {
            None
        };
        let committer = Committer {
            shared: Arc::clone(&shared),
            file,
            seq: recovered.active_seq,
            len_bytes: recovered.active_bytes,
            marks,
            groups_started: 0,
        };
        let thread = std::thread::Builder::new()
            .name("journal-committer".into())
            .spawn(move || committer.run())
            .map_err(|e| Error::io(&shared.opts.dir, e))?;
        let journal = Journal {
            inner: Arc::new(Inner {
                shared,
                committer: Mutex::new(Some(thread)),
            }),
        };
        Ok((journal, recovered.recovery))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Queues `frames` as one unit: they land contiguously and in order in
    /// one file. `done` runs after the fsync that covers them, with each
    /// frame's location, or with the error. Never waits for I/O; blocks only
    /// while the bounded queue is full. Refusals known up front (stopped,
    /// too large, shut down) call `done` on the caller's thread before
    /// returning; otherwise `done` runs on the committer thread and must be quick.
    pub fn submit(&self, frames: Vec<Frame>, done: Box<dyn FnOnce(Result<Vec<Location>>) + Send>) {
        let shared = self.shared();
        if frames.is_empty() {
            return done(Ok(Vec::new()));
        }
        if let Some(reason) = shared.stopped_reason() {
            return done(Err(Error::Stopped { reason }));
        }
        let payload_bytes_max = shared.opts.frame_payload_bytes_max;
        let mut unit_bytes = 0;
        for frame in &frames {
            if frame.payload.len() > payload_bytes_max {
                return done(Err(Error::TooLarge {
                    payload_bytes: frame.payload.len(),
                    max_bytes: payload_bytes_max,
                }));
            }
            if frame.kind == FrameKind::Truncate && !frame.payload.is_empty() {
                return done(Err(Error::TruncatePayload));
            }
            unit_bytes += (FRAME_HEADER_BYTES + frame.payload.len()) as u64;
        }
        // A unit never spans files, so it must fit in a fresh one.
        if HEADER_BYTES as u64 + unit_bytes > shared.opts.file_bytes_max {
            return done(Err(Error::UnitTooLarge {
                unit_bytes,
                file_bytes_max: shared.opts.file_bytes_max,
            }));
        }
        let mut bytes = Vec::with_capacity(unit_bytes as usize);
        let mut metas = Vec::with_capacity(frames.len());
        for frame in &frames {
            let len = format::encode_frame(
                &mut bytes,
                frame.kind,
                frame.tablet,
                frame.index,
                &frame.payload,
            );
            metas.push((frame.tablet, frame.index, len));
        }
        let unit = Unit {
            bytes,
            frames: metas,
            done,
        };
        if let Err(unit) = shared.queue.push(unit) {
            (unit.done)(Err(Error::ShutDown));
        }
    }

    /// Submits `frames` and waits for the fsync that covers them.
    ///
    /// Blocks the calling thread while the submission queue is full (a
    /// bounded wait: the committer does not depend on the runtime).
    /// Dropping the future does not withdraw the frames: they may still
    /// become durable.
    pub async fn append(&self, frames: Vec<Frame>) -> Result<Vec<Location>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            frames,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        );
        rx.await.unwrap_or(Err(Error::ShutDown))
    }

    /// Reads the frame at `loc` and verifies its checksum. Uses pread, so
    /// it runs concurrently with appends and works after the journal stopped.
    pub fn read(&self, loc: Location) -> Result<Frame> {
        let shared = self.shared();
        let file = shared
            .handles
            .lock()
            .expect("handles lock")
            .get(&loc.file_seq)
            .cloned()
            .ok_or(Error::FileGone {
                file_seq: loc.file_seq,
            })?;
        let path = file_path(&shared.opts.dir, loc.file_seq);
        let corrupt = |reason| Error::Corrupt {
            file: path.clone(),
            offset: loc.offset,
            reason,
            valid_after: None,
        };
        let payload_bytes_max = shared.opts.frame_payload_bytes_max;
        let len = loc.len as usize;
        if len < FRAME_HEADER_BYTES {
            return Err(corrupt(Damage::ShortHeader));
        }
        if len - FRAME_HEADER_BYTES > payload_bytes_max {
            return Err(corrupt(Damage::LengthOverMax {
                payload_bytes: loc.len - FRAME_HEADER_BYTES as u32,
            }));
        }
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, loc.offset)
            .map_err(|e| Error::io(&path, e))?;
        let header = format::verify_frame(&buf, payload_bytes_max).map_err(corrupt)?;
        if FRAME_HEADER_BYTES + header.payload_bytes as usize != len {
            return Err(corrupt(Damage::PastEnd {
                payload_bytes: header.payload_bytes,
            }));
        }
        Ok(Frame {
            kind: header.kind,
            tablet: header.tablet,
            index: header.index,
            payload: Bytes::from(buf).slice(FRAME_HEADER_BYTES..),
        })
    }

    /// The tablet no longer needs its frames with index <= `index` (its
    /// checkpoint). Trim points only move forward.
    pub fn set_trim_point(&self, tablet: u64, index: u64) {
        self.retention().set_trim_point(tablet, index);
    }

    /// The tablet is gone from this node: none of its frames are needed.
    pub fn forget_tablet(&self, tablet: u64) {
        self.retention().forget_tablet(tablet);
    }

    /// Deletes whole files, oldest first, that are not the active file and
    /// whose frames are all at or below their tablet's trim point. Stops at
    /// the first file still needed. Returns the deleted paths.
    pub fn trim(&self) -> Result<Vec<PathBuf>> {
        let shared = self.shared();
        let _trim = shared.trim_lock.lock().expect("trim lock");
        let seqs = self.retention().trimmable();
        let dir = &shared.opts.dir;
        let mut deleted = Vec::with_capacity(seqs.len());
        for seq in seqs {
            // Forget the file first so no new read starts on it.
            self.retention().remove(seq);
            shared.handles.lock().expect("handles lock").remove(&seq);
            let path = file_path(dir, seq);
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            // One directory fsync per file keeps deletions in order on disk:
            // recovery treats a gap in the sequence as a lost file.
            crate::fsutil::fsync_dir(dir).map_err(|e| Error::io(dir, e))?;
            deleted.push(path);
        }
        Ok(deleted)
    }

    /// When the journal retains more than `bytes_max`, the tablets holding
    /// back its oldest files, those holding the oldest file first: the node
    /// force-seals them.
    pub fn laggards(&self, bytes_max: u64) -> Vec<u64> {
        self.retention().laggards(bytes_max)
    }

    /// Why the journal stopped taking writes, if it did (what
    /// [`Journal::stats`] reports, without counting files: the append path
    /// asks on every request).
    pub fn stopped(&self) -> Option<String> {
        self.shared().stopped_reason()
    }

    pub fn stats(&self) -> Stats {
        let shared = self.shared();
        let counters = &shared.counters;
        let (files, retained_bytes) = {
            let retention = self.retention();
            (retention.files.len(), retention.retained_bytes())
        };
        Stats {
            fsyncs: counters.fsyncs.load(Ordering::Relaxed),
            groups: counters.groups.load(Ordering::Relaxed),
            frames: counters.frames.load(Ordering::Relaxed),
            bytes: counters.bytes.load(Ordering::Relaxed),
            files,
            retained_bytes,
            stopped: shared.stopped_reason(),
        }
    }

    /// Stops the committer after it has written what is queued. Later
    /// submits fail with `Error::ShutDown`; reads keep working.
    pub fn shutdown(&self) {
        shutdown(&self.inner.shared, &self.inner.committer);
    }

    fn retention(&self) -> std::sync::MutexGuard<'_, Retention> {
        self.shared().retention.lock().expect("retention lock")
    }
}
