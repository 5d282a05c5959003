//! The directory leader backs its state (namespaces by cell, the cell
//! registry) up to a bucket (`<prefix>/directory/`), through
//! [`stele_quorum::backup`], when the directory has one configured
//! (`stele server --roles directory --object-store URL`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stele_quorum::backup::{self, BackupOptions};
pub use stele_quorum::backup::{Restored, Target};
use tokio_util::sync::CancellationToken;

use crate::state::DirectoryState;

/// What `kind` a directory backup carries.
pub const KIND: &str = "directory";

/// Where and how often the leader writes the directory state.
#[derive(Debug, Clone)]
pub struct DirectoryBackup {
    pub target: Target,
    /// The least time between two writes (default 10 s).
    pub interval: Duration,
    /// Generations kept (default 5).
    pub keep: usize,
}

impl DirectoryBackup {
    pub fn new(target: Target) -> DirectoryBackup {
        DirectoryBackup {
            target,
            interval: Duration::from_secs(10),
            keep: 5,
        }
    }
}

pub(crate) fn spawn(
    quorum: Arc<stele_quorum::Quorum<DirectoryState>>,
    b: DirectoryBackup,
    cancel: CancellationToken,
) {
    let o = BackupOptions {
        kind: KIND.into(),
        scope: String::new(),
        interval: b.interval,
        keep: b.keep,
    };
    tokio::spawn(backup::run(quorum, b.target, o, cancel));
}

/// A directory backup that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Backup(#[from] backup::Error),
    #[error("{key} is a {kind} backup, not the directory's")]
    WrongKind { key: String, kind: String },
    #[error("{key}: the directory state does not decode: {reason}")]
    State { key: String, reason: String },
}

/// The newest usable directory backup under `target`, its state checked
/// to restore.
pub async fn read_latest(target: &Target) -> Result<Restored, Error> {
    let r = target.read_latest().await?;
    let key = target.object(r.generation).to_string();
    if r.backup.kind != KIND {
        return Err(Error::WrongKind {
            key,
            kind: r.backup.kind,
        });
    }
    let mut state = DirectoryState::new();
    stele_quorum::QuorumState::restore(&mut state, &r.backup.state).map_err(|e| Error::State {
        key,
        reason: e.to_string(),
    })?;
    Ok(r)
}

/// Writes the quorum state of a new directory member (its `--data-dir`)
/// of a group of `members` (id -> gRPC endpoint) that starts from the
/// backed-up state bytes, backed up at log `index` (the new log goes on
/// past it).
pub fn seed(
    data_dir: &Path,
    members: &BTreeMap<u64, String>,
    state: &[u8],
    index: u64,
) -> stele_quorum::Result<()> {
    stele_quorum::seed(
        &data_dir.join("directory"),
        members,
        state,
        index,
        DirectoryState::new(),
    )
}
