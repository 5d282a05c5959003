//! Settings of the journal and its injectable faults.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::error::{Error, Result};
use super::format::{FRAME_HEADER_BYTES, FRAME_PAYLOAD_BYTES_MAX_DEFAULT, HEADER_BYTES};

#[derive(Debug, Clone)]
pub struct Options {
    /// Directory holding `<seq:020>.wal` files; created if absent.
    pub dir: PathBuf,
    /// How long the committer waits for more units before it writes a group.
    /// Short on purpose: seeds/002 measured a 10 ms linger halving throughput.
    pub linger: Duration,
    /// A group stops collecting units at this many bytes (a single larger unit still goes alone).
    pub group_bytes_max: usize,
    /// A group stops collecting units at this many frames.
    pub group_frames_max: usize,
    /// Roll to a new file when the active one would pass this size.
    pub file_bytes_max: u64,
    /// Frames waiting for the committer; `submit` blocks above this.
    pub queue_frames_max: usize,
    /// Largest payload of one frame, enforced on write and on read.
    pub frame_payload_bytes_max: usize,
    /// Free space the filesystem must keep after a group; 0 disables the check.
    pub reserve_bytes: u64,
    /// Fault injection, shared so a test can arm it after `open`.
    pub faults: Arc<Faults>,
}

impl Options {
    pub fn new(dir: impl Into<PathBuf>) -> Options {
        Options {
            dir: dir.into(),
            linger: Duration::from_millis(2),
            group_bytes_max: 4 * 1024 * 1024,
            group_frames_max: 4096,
            file_bytes_max: 64 * 1024 * 1024,
            queue_frames_max: 65_536,
            frame_payload_bytes_max: FRAME_PAYLOAD_BYTES_MAX_DEFAULT,
            reserve_bytes: 64 * 1024 * 1024,
            faults: Arc::new(Faults::none()),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::InvalidOptions(msg));
        if self.linger > Duration::from_secs(1) {
            return fail(format!("linger {:?} is above 1 s", self.linger));
        }
        if self.group_bytes_max == 0 || self.group_frames_max == 0 || self.queue_frames_max == 0 {
            return fail(
                "group_bytes_max, group_frames_max and queue_frames_max must be positive".into(),
            );
        }
        if self.frame_payload_bytes_max == 0
            || self.frame_payload_bytes_max > (u32::MAX as usize - FRAME_HEADER_BYTES)
        {
            return fail(format!(
                "frame_payload_bytes_max {} must be in 1..{}",
                self.frame_payload_bytes_max,
                u32::MAX as usize - FRAME_HEADER_BYTES
            ));
        }
        // Any single frame must fit in a fresh file, or a valid submit could never be written.
        let frame_file_bytes_min =
            (HEADER_BYTES + FRAME_HEADER_BYTES + self.frame_payload_bytes_max) as u64;
        if self.file_bytes_max < frame_file_bytes_min {
            return fail(format!(
                "file_bytes_max {} is below one header plus one largest frame ({frame_file_bytes_min})",
                self.file_bytes_max
            ));
        }
        Ok(())
    }
}

/// Named fail points for the journal's I/O. A real code path, not `cfg(test)`,
/// so a process-level test can arm them through the environment of a
/// `stele` binary built with the `fault-injection` feature (src/switches.rs;
/// this library never reads the environment itself):
///
/// `STELE_FAILPOINTS=journal-sync-eio` makes the first group fsync fail with
/// EIO; `journal-sync-eio=N` makes the N-th one fail; `journal-write-eio[=N]`
/// does the same for the group write (which then writes half its bytes first,
/// like a torn write). `disk-bytes=N` makes the node see a disk of N bytes
/// holding just its data directory (free = N - the directory's size), for
/// its disk reserve and the cold tier's watermarks. `journal-skip-sync`
/// acknowledges groups without fdatasync (the harness's negative control:
/// it must lose acknowledged writes in a power cut); `journal-sync-delay-ms=N`
/// holds every group N ms before its fdatasync, like a slow device (the
/// harness gives one node this under power cuts, so a cut often finds a
/// leader's tail unsynced while its followers synced theirs); `journal-sync-marks`
/// records synced lengths for the harness's power cut (`SYNCED` in the
/// journal directory, FORMAT.md). Several points are separated by commas.
#[derive(Debug)]
pub struct Faults {
    /// Countdown: 0 = disarmed, N = the N-th group fsync from now fails.
    pub fail_sync_in: AtomicU64,
    /// Countdown: 0 = disarmed, N = the N-th group write from now fails.
    pub fail_write_in: AtomicU64,
    /// Free bytes the free-space probe reports instead of asking the filesystem;
    /// `FREE_BYTES_REAL` means ask the filesystem.
    pub free_bytes_override: AtomicU64,
    /// A simulated disk of this many bytes holding only the data directory
    /// (0: the real filesystem).
    pub disk_bytes: AtomicU64,
    /// Groups are acknowledged without fdatasync (unsafe; jepsen only).
    pub skip_sync: AtomicBool,
    /// Each fdatasync waits this many ms first (0: none).
    pub sync_delay_ms: AtomicU64,
    /// Synced lengths are recorded for a simulated power cut.
    pub sync_marks: AtomicBool,
}

impl Faults {
    /// Sentinel for `free_bytes_override`: no override.
    pub const FREE_BYTES_REAL: u64 = u64::MAX;

    pub fn none() -> Faults {
        Faults {
            fail_sync_in: AtomicU64::new(0),
            fail_write_in: AtomicU64::new(0),
            free_bytes_override: AtomicU64::new(Self::FREE_BYTES_REAL),
            disk_bytes: AtomicU64::new(0),
            skip_sync: AtomicBool::new(false),
            sync_delay_ms: AtomicU64::new(0),
            sync_marks: AtomicBool::new(false),
        }
    }

    /// Parses the `STELE_FAILPOINTS` syntax; unknown names are ignored because
    /// the variable is shared with fail points of other modules.
    pub fn parse(spec: &str) -> Faults {
        let faults = Faults::none();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, nth) = match item.split_once('=') {
                Some((name, n)) => (name, n.trim().parse::<u64>().unwrap_or(1).max(1)),
                None => (item, 1),
            };
            match name {
                "journal-sync-eio" => faults.fail_sync_in.store(nth, Ordering::SeqCst),
                "journal-write-eio" => faults.fail_write_in.store(nth, Ordering::SeqCst),
                "disk-bytes" => faults.disk_bytes.store(nth, Ordering::SeqCst),
                "journal-skip-sync" => faults.skip_sync.store(true, Ordering::SeqCst),
                "journal-sync-delay-ms" => faults.sync_delay_ms.store(nth, Ordering::SeqCst),
                "journal-sync-marks" => faults.sync_marks.store(true, Ordering::SeqCst),
                _ => {}
            }
        }
        faults
    }

    pub fn fail_next_sync(&self) {
        self.fail_sync_in.store(1, Ordering::SeqCst);
    }

    pub fn fail_next_write(&self) {
        self.fail_write_in.store(1, Ordering::SeqCst);
    }

    pub fn set_free_bytes(&self, free_bytes: Option<u64>) {
        self.free_bytes_override.store(
            free_bytes.unwrap_or(Self::FREE_BYTES_REAL),
            Ordering::SeqCst,
        );
    }

    /// Simulates a disk of `bytes` holding only the data directory (`None`:
    /// the real filesystem).
    pub fn set_disk_bytes(&self, bytes: Option<u64>) {
        self.disk_bytes.store(bytes.unwrap_or(0), Ordering::SeqCst);
    }

    /// The simulated disk size, if one is set.
    pub fn disk_bytes(&self) -> Option<u64> {
        match self.disk_bytes.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n),
        }
    }

    /// How long each fdatasync waits first (`journal-sync-delay-ms`).
    pub fn sync_delay(&self) -> Option<std::time::Duration> {
        match self.sync_delay_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    /// Whether groups skip their fdatasync (`journal-skip-sync`).
    pub fn skip_sync(&self) -> bool {
        self.skip_sync.load(Ordering::SeqCst)
    }

    /// Whether synced lengths are recorded (`journal-sync-marks`).
    pub fn sync_marks(&self) -> bool {
        self.sync_marks.load(Ordering::SeqCst)
    }

    /// Counts one sync down; true when this one must fail.
    pub(crate) fn sync_fires(&self) -> bool {
        countdown(&self.fail_sync_in)
    }

    pub(crate) fn write_fires(&self) -> bool {
        countdown(&self.fail_write_in)
    }

    /// The overridden free space, if a test set one.
    pub fn free_bytes(&self) -> Option<u64> {
        match self.free_bytes_override.load(Ordering::SeqCst) {
            Self::FREE_BYTES_REAL => None,
            free => Some(free),
        }
    }
}

impl Default for Faults {
    fn default() -> Faults {
        Faults::none()
    }
}

fn countdown(counter: &AtomicU64) -> bool {
    let previous = counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .unwrap_or(0);
    previous == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        Options::new("/tmp/x").validate().unwrap();
    }

    #[test]
    fn file_must_hold_largest_frame() {
        let mut opts = Options::new("/tmp/x");
        opts.file_bytes_max = 1024;
        assert!(matches!(opts.validate(), Err(Error::InvalidOptions(_))));
    }

    #[test]
    fn failpoint_spec() {
        let faults = Faults::parse("other-point, journal-sync-eio=2");
        assert!(!faults.sync_fires());
        assert!(faults.sync_fires());
        assert!(!faults.sync_fires());
        assert!(!faults.write_fires());
        assert_eq!(faults.sync_delay(), None);
        let slow = Faults::parse("journal-sync-marks,journal-sync-delay-ms=25");
        assert_eq!(
            slow.sync_delay(),
            Some(std::time::Duration::from_millis(25))
        );
        assert!(slow.sync_marks() && !slow.skip_sync());
    }
}
