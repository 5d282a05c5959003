//! Backups of a quorum group's state to an object store (the cell's bucket),
//! so a controller or directory quorum can be rebuilt from the bucket alone
//! (`stele restore cell`, [`crate::seed`]).
//!
//! ```text
//! leader, every interval:  applied index moved? ──> state bytes ──> Backup
//!   <root>/<index:020>.qbk   create-if-absent PUT (the object first)
//!   <root>/latest            "<index:020>\n"      (then the pointer)
//!   older objects beyond `keep` deleted; never the newest
//! ```
//!
//! The object is self-checking (magic, version, length, CRC-32C; layout in
//! docs/FORMAT.md "Quorum state backup"), so a truncated or damaged one is
//! refused by name, and a reader falls back to the newest good generation
//! when `latest` is missing or names a bad object, saying so.
//!
//! The store is whatever the caller built (the cold tier's
//! `stele_node::tier::open_store`): this module holds no client of its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::{Quorum, QuorumState};

/// First bytes of a backup object.
pub const MAGIC: &[u8; 8] = b"STELEQBK";
/// The backup object format this build writes and reads.
pub const BACKUP_V: u16 = 1;
/// magic (8) + version (2) + body length (4).
const PROLOGUE: usize = 14;
/// Largest body accepted (a state is far smaller; a larger length is damage).
const BODY_MAX: u32 = 1 << 30;
/// Name of the pointer object.
pub const LATEST: &str = "latest";
const SUFFIX: &str = ".qbk";

/// Errors of reading or writing backups.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// Nothing backed up under the root: almost always the wrong cell id or URL.
    #[error("no quorum state backup under {root}")]
    Empty { root: String },
    /// The object exists but is not a whole backup of this build's format.
    #[error("backup object {key} is damaged: {what}")]
    Corrupt { key: String, what: String },
    /// Every generation under the root is damaged.
    #[error("no usable backup under {root}: {reasons}")]
    NoneUsable { root: String, reasons: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One backup: the state's own bytes (its snapshot encoding) and what they
/// are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    /// `controller` or `directory`.
    pub kind: String,
    /// The cell id for a controller; empty for the directory.
    pub scope: String,
    /// The state is as of this applied log index or later.
    pub log_index: u64,
    pub term: u64,
    /// The writer's member id and the group's members (id -> endpoint).
    pub writer: u64,
    pub members: BTreeMap<u64, String>,
    /// Wall clock of the write, ms since the Unix epoch (for operators).
    pub written_at_ms: u64,
    #[serde(with = "serde_bytes")]
    pub state: Vec<u8>,
}

/// The object's bytes: prologue, CBOR body, CRC-32C of everything before it.
pub fn encode(b: &Backup) -> Vec<u8> {
    let body = crate::to_cbor(b);
    let mut out = Vec::with_capacity(PROLOGUE + body.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&BACKUP_V.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks and decodes an object's bytes; `key` names it in errors.
pub fn decode(key: &str, bytes: &[u8]) -> Result<Backup> {
    let bad = |what: String| Error::Corrupt {
        key: key.to_string(),
        what,
    };
    if bytes.len() < PROLOGUE + 4 {
        return Err(bad(format!("{} bytes: truncated", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(bad("no STELEQBK magic: not a quorum backup".into()));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != BACKUP_V {
        return Err(bad(format!(
            "format version {version}; this build reads {BACKUP_V}"
        )));
    }
    let len = u32::from_le_bytes(bytes[10..14].try_into().expect("4 bytes"));
    if len > BODY_MAX || bytes.len() != PROLOGUE + len as usize + 4 {
        return Err(bad(format!(
            "{} bytes where the prologue says {}: truncated or extended",
            bytes.len(),
            PROLOGUE as u64 + u64::from(len) + 4
        )));
    }
    let end = PROLOGUE + len as usize;
    let stored = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..end]) != stored {
        return Err(bad("checksum mismatch".into()));
    }
    ciborium::from_reader(&bytes[PROLOGUE..end]).map_err(|e| bad(format!("body: {e}")))
}

/// What [`Target::read_latest`] found.
#[derive(Debug, Clone)]
pub struct Restored {
    pub generation: u64,
    pub backup: Backup,
    /// Why an older generation than `latest` names was used, if one was.
    pub notes: Vec<String>,
}

/// Where one quorum's backups live: a store and a key prefix in it.
#[derive(Clone)]
pub struct Target {
    pub store: Arc<dyn ObjectStore>,
    pub root: ObjectPath,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backup target {}", self.root)
    }
}

impl Target {
    /// A cell's controller backups: `<prefix>/cells/<cell>/control`.
    pub fn controller(store: Arc<dyn ObjectStore>, prefix: &ObjectPath, cell: &str) -> Target {
        Target {
            store,
            root: prefix.clone().join("cells").join(cell).join("control"),
        }
    }

    /// The directory's backups: `<prefix>/directory`.
    pub fn directory(store: Arc<dyn ObjectStore>, prefix: &ObjectPath) -> Target {
        Target {
            store,
            root: prefix.clone().join("directory"),
        }
    }

    pub fn object(&self, generation: u64) -> ObjectPath {
        self.root.clone().join(format!("{generation:020}{SUFFIX}"))
    }

    pub fn latest(&self) -> ObjectPath {
        self.root.clone().join(LATEST)
    }

    /// Generations present under the root, oldest first.
    pub async fn generations(&self) -> Result<Vec<u64>> {
        let metas: Vec<_> = self.store.list(Some(&self.root)).try_collect().await?;
        let mut out: Vec<u64> = metas
            .iter()
            .filter_map(|m| generation_of(m.location.filename()?))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// Writes `b` as generation `b.log_index`, then points `latest` at it
    /// (unless `latest` already names a newer one: a deposed leader never
    /// moves it back), then deletes all but the newest `keep` generations.
    /// Returns false when that generation existed already.
    pub async fn write(&self, b: &Backup, keep: usize) -> Result<bool> {
        let generation = b.log_index;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let created = match self
            .store
            .put_opts(&self.object(generation), PutPayload::from(encode(b)), opts)
            .await
        {
            Ok(_) => true,
            Err(object_store::Error::AlreadyExists { .. }) => false,
            Err(e) => return Err(e.into()),
        };
        let current = self.pointer().await.ok().flatten();
        if current.is_none_or(|c| c < generation) {
            let line = format!("{generation:020}\n");
            self.store
                .put(&self.latest(), PutPayload::from(line.into_bytes()))
                .await?;
        }
        let generations = self.generations().await?;
        let newest = generations.last().copied();
        let keep = keep.max(1);
        if generations.len() > keep {
            for g in &generations[..generations.len() - keep] {
                if Some(*g) == newest || Some(*g) == current.max(Some(generation)) {
                    continue;
                }
                match self.store.delete(&self.object(*g)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(created)
    }

    /// The generation `latest` names (`None` when there is no pointer).
    async fn pointer(&self) -> Result<Option<u64>> {
        let body = match self.store.get(&self.latest()).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let text = std::str::from_utf8(&body).unwrap_or("").trim();
        match (text.len() == 20)
            .then(|| text.parse::<u64>().ok())
            .flatten()
        {
            Some(g) => Ok(Some(g)),
            None => Err(Error::Corrupt {
                key: self.latest().to_string(),
                what: format!("{} bytes that are not a 20-digit generation", body.len()),
            }),
        }
    }

    /// Reads and checks one generation.
    pub async fn read(&self, generation: u64) -> Result<Backup> {
        let key = self.object(generation);
        let body = match self.store.get(&key).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::Corrupt {
                    key: key.to_string(),
                    what: "missing".into(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let b = decode(key.as_ref(), &body)?;
        if b.log_index != generation {
            return Err(Error::Corrupt {
                key: key.to_string(),
                what: format!("holds log index {}, not its own", b.log_index),
            });
        }
        Ok(b)
    }

    /// The generation `latest` names; if the pointer is missing or bad, or
    /// the object it names is damaged, the newest good generation, with a
    /// note saying why.
    pub async fn read_latest(&self) -> Result<Restored> {
        let mut notes = Vec::new();
        let pointed = match self.pointer().await {
            Ok(p) => p,
            Err(Error::Corrupt { key, what }) => {
                notes.push(format!("{key} is damaged ({what})"));
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(g) = pointed {
            match self.read(g).await {
                Ok(backup) => {
                    return Ok(Restored {
                        generation: g,
                        backup,
                        notes,
                    });
                }
                Err(Error::Corrupt { key, what }) => {
                    notes.push(format!("latest names {key}, which is damaged ({what})"));
                }
                Err(e) => return Err(e),
            }
        }
        let generations = self.generations().await?;
        if generations.is_empty() && pointed.is_none() && notes.is_empty() {
            return Err(Error::Empty {
                root: self.root.to_string(),
            });
        }
        for g in generations.iter().rev() {
            if Some(*g) == pointed {
                continue;
            }
            match self.read(*g).await {
                Ok(backup) => {
                    notes.push(format!("used the previous good generation {g}"));
                    return Ok(Restored {
                        generation: *g,
                        backup,
                        notes,
                    });
                }
                Err(Error::Corrupt { key, what }) => {
                    notes.push(format!("{key} is damaged ({what})"));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoneUsable {
            root: self.root.to_string(),
            reasons: notes.join("; "),
        })
    }
}

/// The generation of a backup object's file name, if it is one.
fn generation_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// How a quorum's leader backs its state up.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// `controller` or `directory`.
    pub kind: String,
    /// The cell id (controller) or empty (directory).
    pub scope: String,
    /// The least time between two writes: a change is in the bucket at most
    /// about this long after it applied.
    pub interval: Duration,
    /// Generations kept (at least 1).
    pub keep: usize,
}

/// Backs the state up while this member leads, until `cancel`: once per
/// `interval`, when the applied log index moved since the last write. An
/// idle group writes nothing new. A failed write is logged and retried at
/// the next tick.
pub async fn run<S: QuorumState>(
    quorum: Arc<Quorum<S>>,
    target: Target,
    o: BackupOptions,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(o.interval.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written: Option<u64> = None;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !quorum.is_leader() {
            // A later leader writes its own; this member starts over if it
            // leads again.
            written = None;
            continue;
        }
        let Some(index) = quorum.applied_index() else {
            continue;
        };
        if written == Some(index) {
            continue;
        }
        // The index is read before the state: the state is as of it or later.
        let b = Backup {
            kind: o.kind.clone(),
            scope: o.scope.clone(),
            log_index: index,
            term: quorum.term(),
            writer: quorum.id(),
            members: quorum.members(),
            written_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            state: quorum.state().snapshot(),
        };
        match target.write(&b, o.keep).await {
            Ok(_) => {
                if failing {
                    tracing::info!(root = %target.root, index, "state backup written again");
                }
                failing = false;
                written = Some(index);
                tracing::debug!(root = %target.root, store = %target.store, index, "state backup written");
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(root = %target.root, error = %e, "state backup failed; retrying every interval");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
#[path = "backup_test.rs"]
mod tests;
