//! The controller leader backs the cell state up to the cell's bucket, next
//! to the tablets' manifests (`<prefix>/cells/<cell>/control/`), through
//! [`stele_quorum::backup`]: within `interval` of every change, an idle
//! cell writing nothing new. `stele restore cell` reads it back
//! ([`read_latest`]) and seeds new controllers with it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stele_quorum::backup::{self, BackupOptions};
pub use stele_quorum::backup::{Restored, Target};

use crate::server::Controller;
use crate::state::CellState;

/// What `kind` a controller backup carries.
pub const KIND: &str = "controller";

/// Where and how often the leader writes the cell state.
#[derive(Debug, Clone)]
pub struct ControlBackup {
    pub target: Target,
    /// The bucket's cell id (the nodes' `--cell-id`), kept in each backup.
    pub cell: String,
    /// The least time between two writes (default 10 s).
    pub interval: Duration,
    /// Generations kept (default 5).
    pub keep: usize,
}

impl ControlBackup {
    pub fn new(target: Target, cell: impl Into<String>) -> ControlBackup {
        ControlBackup {
            target,
            cell: cell.into(),
            interval: Duration::from_secs(10),
            keep: 5,
        }
    }
}

/// Starts the backup task of `c`, which ends with the controller.
pub(crate) fn spawn(c: &Arc<Controller>, b: ControlBackup) {
    let o = BackupOptions {
        kind: KIND.into(),
        scope: b.cell,
        interval: b.interval,
        keep: b.keep,
    };
    tokio::spawn(backup::run(
        c.quorum.clone(),
        b.target,
        o,
        c.cancel.child_token(),
    ));
}

/// A controller backup that does not fit the cell asked for.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Backup(#[from] backup::Error),
    #[error("{key} is a {kind} backup of {scope:?}, not the controller state of cell {cell:?}")]
    WrongCell {
        key: String,
        kind: String,
        scope: String,
        cell: String,
    },
    #[error("{key}: the controller state does not decode: {reason}")]
    State { key: String, reason: String },
}

/// The newest usable controller backup of `cell` and its state.
pub async fn read_latest(target: &Target, cell: &str) -> Result<(Restored, CellState), Error> {
    let r = target.read_latest().await?;
    let key = target.object(r.generation).to_string();
    if r.backup.kind != KIND || r.backup.scope != cell {
        return Err(Error::WrongCell {
            key,
            kind: r.backup.kind,
            scope: r.backup.scope,
            cell: cell.into(),
        });
    }
    let mut state = CellState::new();
    stele_quorum::QuorumState::restore(&mut state, &r.backup.state).map_err(|e| Error::State {
        key,
        reason: e.to_string(),
    })?;
    Ok((r, state))
}

/// Writes the quorum state of a new controller (its `--data-dir`) of a
/// group of `members` (controller id -> gRPC endpoint) that starts from
/// `state`, backed up at log `index`: started, the members elect a leader
/// and serve the restored cell with no `stele cell init`, their log going
/// on past `index`.
pub fn seed(
    data_dir: &Path,
    members: &BTreeMap<u64, String>,
    state: &CellState,
    index: u64,
) -> stele_quorum::Result<()> {
    stele_quorum::seed(
        &data_dir.join("controller"),
        members,
        &stele_quorum::QuorumState::snapshot(state),
        index,
        CellState::new(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use stele_quorum::backup::Backup;

    use super::*;

    fn target() -> Target {
        let store = Arc::new(object_store::memory::InMemory::new());
        Target::controller(store, &Default::default(), "c1")
    }

    fn backup(scope: &str, state: Vec<u8>) -> Backup {
        Backup {
            kind: KIND.into(),
            scope: scope.into(),
            log_index: 3,
            term: 1,
            writer: 1,
            members: BTreeMap::new(),
            written_at_ms: 0,
            state,
        }
    }

    #[tokio::test]
    async fn a_backup_of_another_cell_or_an_unreadable_state_is_refused() {
        let t = target();
        let e = read_latest(&t, "c1").await.unwrap_err();
        assert!(
            e.to_string()
                .contains("no quorum state backup under cells/c1/control"),
            "{e}"
        );
        t.write(&backup("c2", stele_quorum::to_cbor(&CellState::new())), 5)
            .await
            .unwrap();
        let e = read_latest(&t, "c1").await.unwrap_err();
        assert!(matches!(e, Error::WrongCell { .. }), "{e}");
        let t = target();
        t.write(&backup("c1", b"not a state".to_vec()), 5)
            .await
            .unwrap();
        let e = read_latest(&t, "c1").await.unwrap_err();
        assert!(matches!(e, Error::State { .. }), "{e}");
        let t = target();
        let mut s = CellState::new();
        s.route_generation = 7;
        t.write(&backup("c1", stele_quorum::to_cbor(&s)), 5)
            .await
            .unwrap();
        let (r, got) = read_latest(&t, "c1").await.unwrap();
        assert_eq!((r.generation, got), (3, s));
    }
}
