//! Durable-length marks for the jepsen power-loss fault (fail point
//! `journal-sync-marks`): after every real fdatasync, and when a file is
//! created, the committer records each journal file's length known to be
//! on the device in `<journal dir>/SYNCED` (one `seq length` line per
//! file). The harness SIGKILLs every node at once and cuts each file back
//! to its mark: what a power cut leaves of writes that were never synced.
//! Off in production; the marks file itself is not synced (a process kill
//! keeps the page cache, and that is the only crash it is read after).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The marks file in a journal directory.
pub const MARKS_FILE: &str = "SYNCED";

pub(crate) struct Marks {
    path: PathBuf,
    synced: BTreeMap<u64, u64>,
}

impl Marks {
    /// The marks of `dir` as a previous run left them, each cut to the
    /// file's length after recovery; a file without a mark (the first run
    /// with marks) counts as synced whole.
    pub(crate) fn load(dir: &Path, files: &[(u64, u64)]) -> Marks {
        let path = dir.join(MARKS_FILE);
        let old = read(&path);
        let synced = files
            .iter()
            .map(|&(seq, len)| (seq, old.get(&seq).map_or(len, |m| (*m).min(len))))
            .collect();
        let marks = Marks { path, synced };
        marks.write();
        marks
    }

    /// File `seq` is synced up to `len` bytes.
    pub(crate) fn synced(&mut self, seq: u64, len: u64) {
        self.synced.insert(seq, len);
        self.write();
    }

    fn write(&self) {
        let text: String = self
            .synced
            .iter()
            .map(|(seq, len)| format!("{seq} {len}\n"))
            .collect();
        let tmp = self.path.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path))
        {
            tracing::warn!(error = %e, "journal sync marks not written");
        }
    }
}

/// The marks in a marks file: journal file sequence -> synced length.
pub(crate) fn read(path: &Path) -> BTreeMap<u64, u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (seq, len) = l.split_once(' ')?;
            Some((seq.parse().ok()?, len.trim().parse().ok()?))
        })
        .collect()
}
