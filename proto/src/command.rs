//! Payloads of tablet Raft entries (CBOR). These are persisted in every
//! replica's journal and replayed on recovery, so they are versioned disk
//! types: fields are only ever added with `#[serde(default)]`, never renamed.

use serde::{Deserialize, Serialize};

use crate::pb;

/// A record position: the tablet that applied it, its Raft log index and its
/// slot within the batch. Positions are immutable; a key's version is the
/// position of its latest record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Pos {
    pub tablet: u64,
    pub index: u64,
    pub slot: u32,
}

impl From<Pos> for pb::Position {
    fn from(p: Pos) -> Self {
        pb::Position {
            tablet: p.tablet,
            index: p.index,
            slot: p.slot,
        }
    }
}

impl From<pb::Position> for Pos {
    fn from(p: pb::Position) -> Self {
        Pos {
            tablet: p.tablet,
            index: p.index,
            slot: p.slot,
        }
    }
}

/// One record of a batch, with its vshard computed by the node that
/// accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordIn {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub ts: u64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub vshard: u32,
}

/// A condition on a key's latest version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expect {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub version: Option<Pos>,
}

/// A batch for one tablet, applied atomically and idempotently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendBatch {
    pub namespace: String,
    /// The client's 128-bit batch id as (high, low) halves.
    pub batch_id: [u64; 2],
    pub records: Vec<RecordIn>,
    pub expect: Option<Expect>,
    /// Leader wall clock at proposal, microseconds. Deterministic on every
    /// replica because it is in the log; ages receipts out of their window.
    pub proposed_at_us: u64,
}

/// Why a seal was proposed (kept in the log for operators).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SealReason {
    Size,
    Age,
    NodeBudget,
    JournalTrim,
    Operator,
}

/// The command carried by a tablet Raft entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TabletCommand {
    Append(AppendBatch),
    /// Concurrent batches to one tablet that its leader coalesced into one
    /// entry (log format 2, `formats::LOG`). Each is applied on its own, in
    /// order, as an `Append` would be: its own receipt, condition and
    /// rejection, and one response each. The slots of a batch's positions
    /// continue from the previous batch's (applied or not), so every
    /// record of the entry has its own position.
    AppendMany(Vec<AppendBatch>),
    /// Seals every memtable row applied before this entry into one segment.
    /// Every replica seals at the same log index, so every replica builds the
    /// same segment bytes. `format` is the segment format version to write
    /// (0, as in entries of builds before formats were gated: version 1):
    /// the leader takes it from the cell's enabled formats, so replicas on
    /// mixed binaries never disagree on a segment's bytes.
    Seal {
        reason: SealReason,
        #[serde(default)]
        format: u32,
    },
    /// The leader uploaded sealed segment `segment` to the cold tier and
    /// verified it: every replica records the cold copy in its catalog.
    /// `file_xxh3` is the whole-file checksum of the segment's trailer, which
    /// a replica compares before it drops its local copy.
    Uploaded {
        segment: String,
        bytes: u64,
        file_xxh3: u64,
    },
    /// Namespace retention: every replica drops published segment `segment`
    /// (all its rows are past their namespace's retention) from its catalog
    /// and deletes the local file. The leader deletes the object once a
    /// manifest without it is published.
    DropSegment {
        segment: String,
    },
    /// Splits the tablet at vshard `at`: it keeps `[lo, at)`, and tablet
    /// `child` takes `[at, hi)` on the same nodes, as its own Raft group
    /// with voters `child_replicas` (one per node, by replica id). Applying
    /// it seals the memtable as `Seal` does; with that seal's publish, each
    /// replica creates its child replica from the sealed segments (shared,
    /// by hard link) and the receipts that touch `[at, hi)`. Both tablets
    /// take range generation `generation`. A `Split` whose `at` is not
    /// strictly inside the range (already applied, or stale) changes
    /// nothing.
    Split {
        at: u32,
        child: u64,
        child_replicas: Vec<u64>,
        generation: u64,
    },
    /// The first step of a merge, on the tablet to be absorbed: it seals
    /// its memtable as `Seal` does and takes no write after this entry (its
    /// range stays, for reads), at range generation `generation`. Once
    /// every replica has published that seal, the tablet is complete in its
    /// segments and receipts.
    Freeze {
        generation: u64,
    },
    /// Undoes a `Freeze` of a merge given up before its `Merge` was
    /// ordered: the tablet takes writes again.
    Unfreeze,
    /// Merges the frozen adjacent tablet `absorbed` (range `[lo, hi)`) into
    /// this one: on every replica, this tablet takes the absorbed tablet's
    /// segments (shared, by hard link) and receipts from the replica of it
    /// on the same node, and its range grows by `[lo, hi)` at range
    /// generation `generation`. It seals the memtable as `Seal` does; with
    /// that seal's publish the absorbed replica is deleted. A `Merge` whose
    /// range is not adjacent to this tablet's (already applied, or stale)
    /// changes nothing.
    Merge {
        absorbed: u64,
        lo: u32,
        hi: u64,
        generation: u64,
    },
    /// Seals the memtable as `Seal` does and, with that seal's publish,
    /// rewrites the published segments `inputs` (a run of the segment
    /// list, oldest first, of one origin, none shared with another tablet)
    /// into one segment of their rows in the tablet's range, in their
    /// place. Every replica resolves the inputs at the same point (after
    /// every earlier seal), so all of them compact, or none (an input
    /// missing, shared or of another origin: the seal alone). `format` as
    /// in `Seal`, for both segments.
    Compact {
        inputs: Vec<String>,
        #[serde(default)]
        format: u32,
    },
}

/// The result of applying a [`TabletCommand`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TabletResponse {
    /// Positions of the batch's records; `duplicate` when a receipt already
    /// covered the batch (the positions are the original ones).
    Appended {
        positions: Vec<Pos>,
        duplicate: bool,
    },
    ConditionFailed {
        actual: Option<Pos>,
    },
    /// The batch was refused at apply time (a record outside the tablet's
    /// range after a topology change); nothing was applied.
    Rejected {
        reason: String,
    },
    Sealed,
    /// Membership and blank entries.
    None,
    /// The responses of an `AppendMany`'s batches, in order.
    Many(Vec<TabletResponse>),
}

impl std::fmt::Display for TabletCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TabletCommand::Append(b) => write!(
                f,
                "Append({} records, ns {}, batch {:016x}{:016x})",
                b.records.len(),
                b.namespace,
                b.batch_id[0],
                b.batch_id[1]
            ),
            TabletCommand::AppendMany(batches) => write!(
                f,
                "AppendMany({} batches, {} records)",
                batches.len(),
                batches.iter().map(|b| b.records.len()).sum::<usize>()
            ),
            TabletCommand::Seal { reason, format } => {
                write!(f, "Seal({reason:?}, segment format {format})")
            }
            TabletCommand::Uploaded { segment, .. } => write!(f, "Uploaded({segment})"),
            TabletCommand::DropSegment { segment } => write!(f, "DropSegment({segment})"),
            TabletCommand::Split { at, child, .. } => write!(f, "Split(at {at}, child {child})"),
            TabletCommand::Freeze { generation } => write!(f, "Freeze(generation {generation})"),
            TabletCommand::Unfreeze => write!(f, "Unfreeze"),
            TabletCommand::Compact { inputs, format } => write!(
                f,
                "Compact({} segments, segment format {format})",
                inputs.len()
            ),
            TabletCommand::Merge {
                absorbed, lo, hi, ..
            } => write!(f, "Merge(absorbed {absorbed} [{lo}, {hi}))"),
        }
    }
}

impl std::fmt::Display for TabletResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Splits a 128-bit batch id into the halves stored in the log.
pub fn batch_id_halves(id: u128) -> [u64; 2] {
    [(id >> 64) as u64, id as u64]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_cbor_round_trip() {
        let cmd = TabletCommand::Append(AppendBatch {
            namespace: "a/b".into(),
            batch_id: batch_id_halves(u128::MAX - 7),
            records: vec![RecordIn {
                key: b"k".to_vec(),
                ts: 5,
                value: vec![0; 100],
                vshard: 77,
            }],
            expect: Some(Expect {
                key: b"k".to_vec(),
                version: Some(Pos {
                    tablet: 1,
                    index: 2,
                    slot: 0,
                }),
            }),
            proposed_at_us: 9,
        });
        let mut buf = Vec::new();
        ciborium::into_writer(&cmd, &mut buf).unwrap();
        let back: TabletCommand = ciborium::from_reader(&buf[..]).unwrap();
        assert_eq!(back, cmd);
    }

    #[test]
    fn garbage_does_not_decode_or_panic() {
        for bytes in [&b""[..], b"\xff\xff", b"\xa1\x00", &[0x9f; 64]] {
            assert!(ciborium::from_reader::<TabletCommand, _>(bytes).is_err());
        }
    }
}
