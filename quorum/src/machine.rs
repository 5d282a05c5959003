//! The caller's state as openraft's state machine: committed commands go to
//! [`QuorumState::apply`], snapshots are the state's own bytes stored with
//! the log.

use std::io::{self, Cursor};
use std::sync::{Arc, RwLock};

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoredSnapshot};
use crate::{
    C, Error, LogId, QuorumReply, Result, Snapshot, SnapshotMeta, StoredMembership, from_cbor,
    to_cbor,
};

/// A deterministic state machine replicated by a quorum group.
pub trait QuorumState: Send + Sync + 'static {
    /// Applies one committed command (at log `index`) and returns the reply.
    /// Must depend only on the state and the command: never the clock.
    /// Must not panic: every member applies the same command at the same
    /// index, so a panic stops them all, again on every replay; a command
    /// the state cannot take gets a refusal as its reply.
    fn apply(&mut self, index: u64, cmd: &[u8]) -> Vec<u8>;
    /// The whole state, for a snapshot.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot's. On an error the state is
    /// unchanged.
    fn restore(&mut self, bytes: &[u8]) -> Result<()>;
}

/// A quorum state whose commands, replies and snapshots are CBOR: it only
/// applies typed commands; [`QuorumState`] comes with it.
pub trait CborState: Serialize + for<'de> Deserialize<'de> + Send + Sync + 'static {
    type Command: for<'de> Deserialize<'de>;
    type Reply: Serialize;
    /// The snapshot format version this build reads and writes.
    const VERSION: u16;
    /// The version a decoded snapshot carries.
    fn version(&self) -> u16;
    fn apply_command(&mut self, cmd: Self::Command) -> Self::Reply;
    /// The reply to a command that does not decode.
    fn refused(reason: String) -> Self::Reply;
    /// What the state is called in errors ("controller", "directory").
    fn name() -> &'static str;
}

impl<T: CborState> QuorumState for T {
    fn apply(&mut self, _index: u64, cmd: &[u8]) -> Vec<u8> {
        let reply = match from_cbor::<T::Command>(cmd) {
            Ok(cmd) => self.apply_command(cmd),
            Err(e) => T::refused(format!("undecodable command: {e}")),
        };
        to_cbor(&reply)
    }

    fn snapshot(&self) -> Vec<u8> {
        to_cbor(self)
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let s: T = from_cbor(bytes)?;
        if s.version() != T::VERSION {
            return Err(Error::StateVersion {
                state: T::name(),
                found: s.version(),
                expected: T::VERSION,
            });
        }
        *self = s;
        Ok(())
    }
}

pub(crate) struct Machine<S> {
    store: Store,
    state: Arc<RwLock<S>>,
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl<S: QuorumState> Machine<S> {
    /// The state as of the stored snapshot; openraft re-applies the
    /// committed log after it.
    pub fn recover(store: Store, state: Arc<RwLock<S>>) -> Result<Machine<S>> {
        let (applied, membership) = match store.snapshot()? {
            Some(s) => {
                let restored = state.write().map_err(|_| Error::Poisoned)?.restore(&s.data);
                restored.map_err(|e| Error::Snapshot {
                    path: store.path().to_path_buf(),
                    source: Box::new(e),
                })?;
                (s.meta.last_log_id, s.meta.last_membership)
            }
            None => (None, StoredMembership::default()),
        };
        Ok(Machine {
            store,
            state,
            applied,
            membership,
        })
    }
}

impl<S: QuorumState> RaftStateMachine<C> for Machine<S> {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<C>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id();
            let reply = match &entry.payload {
                EntryPayload::Blank => QuorumReply::default(),
                EntryPayload::Normal(cmd) => {
                    let mut state = self.state.write().map_err(|_| Error::Poisoned.into_io())?;
                    QuorumReply(state.apply(log_id.index(), &cmd.0))
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(log_id), m.clone());
                    QuorumReply::default()
                }
            };
            self.applied = Some(log_id);
            if let Some(r) = responder {
                r.send(reply);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Builder> {
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        // Taken here, between applies, so the bytes match `applied`. A
        // poisoned state is not snapshotted: the build fails instead.
        let data = self.state.read().map(|s| s.snapshot()).ok();
        Builder {
            store: self.store.clone(),
            data,
            applied: self.applied,
            membership: self.membership.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let data = snapshot.into_inner();
        // Restored first, so a snapshot that does not restore is never
        // stored as the one to recover from.
        self.state
            .write()
            .map_err(|_| Error::Poisoned)
            .and_then(|mut s| s.restore(&data))
            .map_err(Error::into_io)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.store
            .put_snapshot(&StoredSnapshot {
                meta: meta.clone(),
                data,
            })
            .map_err(Error::into_io)
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let s = self.store.snapshot().map_err(Error::into_io)?;
        Ok(s.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}

pub(crate) struct Builder {
    store: Store,
    /// The state's bytes; `None` if its lock was poisoned.
    data: Option<Vec<u8>>,
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl RaftSnapshotBuilder<C> for Builder {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let data = self.data.clone().ok_or_else(|| Error::Poisoned.into_io())?;
        let stored = StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: self.applied,
                last_membership: self.membership.clone(),
            },
            data,
        };
        self.store.put_snapshot(&stored).map_err(Error::into_io)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Cursor::new(stored.data),
        })
    }
}

#[cfg(test)]
#[path = "machine_test.rs"]
mod tests;
