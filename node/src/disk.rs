//! The disk holding the node's data directory, as the services that refuse
//! appends (`StorageFull`) and evict segments see it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::journal::Faults;

#[derive(Clone)]
pub struct Disk {
    data_dir: PathBuf,
    /// The journal's injectable faults: a simulated disk size or free
    /// space stands in for the filesystem's in tests.
    faults: Arc<Faults>,
}

impl Disk {
    pub fn new(data_dir: PathBuf, faults: Arc<Faults>) -> Disk {
        Disk { data_dir, faults }
    }

    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Free bytes on the data directory's filesystem.
    /// The journal's free-space fault override, when set, stands in for the
    /// filesystem (tests drive a filling disk through it), then a simulated
    /// disk (`disk-bytes`).
    pub fn free_bytes(&self) -> u64 {
        match self.faults.free_bytes() {
            Some(free) => free,
            None => self.usage().map_or(u64::MAX, |(_, avail)| avail),
        }
    }

    /// `(total, available)` bytes of the disk holding the data directory:
    /// the filesystem's, or the simulated disk's (`disk-bytes`, whose
    /// contents are the data directory alone).
    pub fn usage(&self) -> std::io::Result<(u64, u64)> {
        match self.faults.disk_bytes() {
            Some(total) => {
                let used = crate::fsutil::tree_bytes(&self.data_dir)?;
                Ok((total, total.saturating_sub(used)))
            }
            None => crate::fsutil::disk_usage(&self.data_dir),
        }
    }
}
