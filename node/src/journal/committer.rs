//! The committer thread: the only writer of journal files.
//!
//! ```text
//! pop first unit -> linger (collect units until bytes/frames/file bound) ->
//! free-space check -> one write -> one fdatasync -> record retention -> done()s
//! ```
//!
//! A std thread, not a tokio task, because every step after the linger is
//! blocking I/O. A refused write or fsync stops the journal: the file may now
//! hold a gap, and a frame written after a gap would be acknowledged yet
//! unreadable after recovery (seeds/002 section 5).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::error::{Error, Result};
use super::format::HEADER_BYTES;
use super::queue::Unit;
use super::recovery::{create_file, file_path};
use super::{Location, Shared};

pub(crate) struct Committer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) file: Arc<File>,
    pub(crate) seq: u64,
    /// Bytes durably in the active file; the next group is written here.
    pub(crate) len_bytes: u64,
    /// Synced lengths for the power-loss fault (`journal-sync-marks`).
    pub(crate) marks: Option<super::marks::Marks>,
    /// Groups begun since `open`: the `group` field of `journal_group`
    /// spans (`crate::trace`), failed groups included.
    pub(crate) groups_started: u64,
}

impl Committer {
    pub(crate) fn run(mut self) {
        while let Some(first) = self.shared.queue.pop() {
            if let Some(reason) = self.shared.stopped_reason() {
                fail(first, || Error::Stopped {
                    reason: reason.clone(),
                });
                continue;
            }
            let shared = Arc::clone(&self.shared);
            let opts = &shared.opts;
            let first_bytes = first.bytes.len() as u64;
            let must_roll = self.len_bytes > HEADER_BYTES as u64
                && self.len_bytes + first_bytes > opts.file_bytes_max;
            if must_roll && let Err(e) = self.roll() {
                let reason = format!("rolling to journal file {}: {e}", self.seq + 1);
                self.stop(&reason);
                fail(first, || Error::Stopped {
                    reason: reason.clone(),
                });
                continue;
            }

            let mut group_bytes = first.bytes.len();
            let mut group_frames = first.frames.len();
            let mut group = vec![first];
            let deadline = Instant::now() + opts.linger;
            let file_room_bytes = opts.file_bytes_max.saturating_sub(self.len_bytes);
            while group_bytes < opts.group_bytes_max && group_frames < opts.group_frames_max {
                let room = (
                    opts.group_bytes_max
                        .saturating_sub(group_bytes)
                        .min(file_room_bytes.saturating_sub(group_bytes as u64) as usize),
                    opts.group_frames_max.saturating_sub(group_frames),
                );
                let next = shared.queue.pop_until(deadline, room, |unit| {
                    group_bytes + unit.bytes.len() <= opts.group_bytes_max
                        && group_frames + unit.frames.len() <= opts.group_frames_max
                        && (group_bytes + unit.bytes.len()) as u64 <= file_room_bytes
                });
                let Some(unit) = next else { break };
                group_bytes += unit.bytes.len();
                group_frames += unit.frames.len();
                group.push(unit);
            }
            self.groups_started += 1;
            let span = tracing::debug_span!(
                "journal_group",
                group = self.groups_started,
                units = group.len(),
                frames = group_frames,
                bytes = group_bytes,
                file = self.seq,
            );
            span.in_scope(|| self.commit(group, group_bytes));
        }
    }

    fn commit(&mut self, group: Vec<Unit>, group_bytes: usize) {
        let shared = Arc::clone(&self.shared);
        let opts = &shared.opts;
        if opts.reserve_bytes > 0 {
            match self.free_bytes() {
                Ok(free_bytes)
                    if free_bytes.saturating_sub(group_bytes as u64) < opts.reserve_bytes =>
                {
                    // Nothing was written, so the file has no gap: refuse this
                    // group and keep running; callers retry when space returns.
                    for unit in group {
                        fail(unit, || Error::StorageFull {
                            free_bytes,
                            group_bytes: group_bytes as u64,
                            reserve_bytes: opts.reserve_bytes,
                        });
                    }
                    return;
                }
                Ok(_) => {}
                // The probe is a courtesy ahead of ENOSPC; a write that then
                // fails still stops the journal safely.
                Err(e) => tracing::warn!(error = %e, "journal free-space probe failed"),
            }
        }

        let mut buf = Vec::with_capacity(group_bytes);
        for unit in &group {
            buf.extend_from_slice(&unit.bytes);
        }
        debug_assert_eq!(buf.len(), group_bytes);
        let path = file_path(&opts.dir, self.seq);
        let written = self.write(&buf).map_err(|e| {
            format!(
                "write of {group_bytes} bytes at offset {} of {} failed: {e}",
                self.len_bytes,
                path.display()
            )
        });
        let sync_started = Instant::now();
        let synced = written.and_then(|()| {
            self.sync()
                .map_err(|e| format!("fdatasync of {} failed: {e}", path.display()))
        });
        if let Err(reason) = synced {
            self.stop(&reason);
            for unit in group {
                fail(unit, || Error::Stopped {
                    reason: reason.clone(),
                });
            }
            return;
        }

        let base = self.len_bytes;
        self.len_bytes += group_bytes as u64;
        if !shared.opts.faults.skip_sync()
            && let Some(marks) = &mut self.marks
        {
            marks.synced(self.seq, self.len_bytes);
        }
        let frames = group.iter().map(|u| u.frames.len()).sum();
        crate::metrics::record_journal_group(sync_started.elapsed(), frames, group_bytes);
        let counters = &shared.counters;
        counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        counters.groups.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes
            .fetch_add(group_bytes as u64, Ordering::Relaxed);

        let mut locations = Vec::with_capacity(group.len());
        {
            let mut retention = shared.retention.lock().expect("retention lock");
            let mut offset = base;
            for unit in &group {
                let mut unit_locations = Vec::with_capacity(unit.frames.len());
                for &(tablet, index, len) in &unit.frames {
                    retention.record(self.seq, tablet, index, u64::from(len));
                    unit_locations.push(Location {
                        file_seq: self.seq,
                        offset,
                        len,
                    });
                    offset += u64::from(len);
                }
                locations.push(unit_locations);
            }
            debug_assert_eq!(offset, self.len_bytes);
        }
        for (unit, unit_locations) in group.into_iter().zip(locations) {
            if tracing::enabled!(tracing::Level::TRACE) {
                for &(tablet, index, _) in &unit.frames {
                    tracing::trace!(tablet, index, "journal frame durable");
                }
            }
            counters
                .frames
                .fetch_add(unit_locations.len() as u64, Ordering::Relaxed);
            call_done(unit, Ok(unit_locations));
        }
    }

    fn write(&self, buf: &[u8]) -> io::Result<()> {
        if self.shared.opts.faults.write_fires() {
            // Like a device that accepted part of the write before refusing.
            self.file
                .write_all_at(&buf[..buf.len() / 2], self.len_bytes)?;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.write_all_at(buf, self.len_bytes)
    }

    fn sync(&self) -> io::Result<()> {
        if self.shared.opts.faults.sync_fires() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if self.shared.opts.faults.skip_sync() {
            // The negative control: acknowledged, never synced.
            return Ok(());
        }
        if let Some(delay) = self.shared.opts.faults.sync_delay() {
            // A slow device: the group is written, not yet durable.
            std::thread::sleep(delay);
        }
        self.file.sync_data()
    }

    fn free_bytes(&self) -> io::Result<u64> {
        match self.shared.opts.faults.free_bytes() {
            Some(free) => Ok(free),
            None => crate::fsutil::free_bytes(&self.shared.opts.dir),
        }
    }

    /// Starts the next file. The old one needs no extra fsync: every group
    /// in it was fdatasynced before its callers heard back.
    fn roll(&mut self) -> Result<()> {
        let seq = self.seq + 1;
        let file = Arc::new(create_file(&self.shared.opts.dir, seq)?);
        self.shared
            .handles
            .lock()
            .expect("handles lock")
            .insert(seq, Arc::clone(&file));
        {
            let mut retention = self.shared.retention.lock().expect("retention lock");
            retention.add_file(seq, HEADER_BYTES as u64);
            retention.set_active(seq);
        }
        self.file = file;
        self.seq = seq;
        self.len_bytes = HEADER_BYTES as u64;
        if let Some(marks) = &mut self.marks {
            // create_file synced the header and the directory entry.
            marks.synced(seq, self.len_bytes);
        }
        Ok(())
    }

    fn stop(&self, reason: &str) {
        tracing::error!(reason, "journal stopped; restart the node to recover");
        let mut stopped = self.shared.stopped.lock().expect("stopped lock");
        stopped.get_or_insert_with(|| reason.to_string());
    }
}

fn fail(unit: Unit, error: impl Fn() -> Error) {
    call_done(unit, Err(error()));
}

/// A panicking callback must not take the committer (and every other
/// caller's durability) down with it.
fn call_done(unit: Unit, result: Result<Vec<Location>>) {
    let done = unit.done;
    if catch_unwind(AssertUnwindSafe(move || done(result))).is_err() {
        tracing::error!("journal done callback panicked");
    }
}
