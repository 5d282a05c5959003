//! The data service's settings, the handles it serves from, and its fail
//! points.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use stele_proto::Error as ApiError;

use crate::catalog::Catalog;
use crate::disk::Disk;
use crate::endpoints::Endpoints;
use crate::journal::Journal;
use crate::ownership::Ownership;
use crate::peering::PeerFilter;
use crate::raft::NodeStats;
use crate::raft::pacer::PacerStats;
use crate::replicas::ReplicaSet;

/// Named fail points of one node's data service, for in-process tests: each
/// node has its own, so arming one never reaches a test running beside it.
#[derive(Debug, Default)]
pub struct FailPoints {
    /// Milliseconds every key read sleeps between its read barrier and its
    /// read; 0: none.
    key_read_delay_ms: std::sync::atomic::AtomicU64,
    /// Key reads that have entered that sleep (a test waits for one).
    key_reads_delayed: std::sync::atomic::AtomicU64,
}

impl FailPoints {
    /// Every `ScanKey` then waits `ms` after its read barrier, as a read
    /// does that waits behind a slow apply, so a split can cut its range
    /// under it. 0 disarms.
    pub fn delay_key_reads(&self, ms: u64) {
        self.key_read_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// How many key reads have entered the delay so far.
    pub fn key_reads_delayed(&self) -> u64 {
        self.key_reads_delayed.load(Ordering::SeqCst)
    }

    pub(super) fn key_read_delay(&self) -> Option<Duration> {
        match self.key_read_delay_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => {
                self.key_reads_delayed.fetch_add(1, Ordering::SeqCst);
                Some(Duration::from_millis(ms))
            }
        }
    }
}

/// The data service's own settings (from `NodeOptions`).
#[derive(Clone)]
pub struct DataOptions {
    pub node_id: u64,
    /// The cell controller assigns the replicas (route generations then
    /// may run ahead of a range's).
    pub controlled: bool,
    /// Jepsen's negative control (`NodeOptions::unsafe_local_reads`).
    pub unsafe_local_reads: bool,
    /// Jepsen's negative control (`NodeOptions::unsafe_wake_reads`).
    pub unsafe_wake_reads: bool,
    pub value_bytes_max: usize,
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Proposals of one tablet out at a time before appends share an
    /// entry (`NodeOptions::append_in_flight`).
    pub append_in_flight: usize,
    /// How long appends wait on a tablet's proposals before they are
    /// proposed alone (`raft::coalesce::Limits::stall`).
    pub append_stall: Duration,
    /// Refuse appends with `StorageFull` when free space falls below this.
    pub disk_reserve_bytes: u64,
    pub peer_filter: Arc<PeerFilter>,
    pub tier: Option<Arc<crate::tier::Tier>>,
    pub fail_points: Arc<FailPoints>,
    /// The certificate `Status` reports (serial, expiry), read at each call
    /// so a rotation shows.
    pub tls: Option<Arc<stele_tls::Credentials>>,
}

/// Everything the data service reads or proposes to.
pub struct DataParts {
    pub options: DataOptions,
    pub replicas: ReplicaSet,
    pub endpoints: Arc<Endpoints>,
    pub journal: Journal,
    pub catalog: Catalog,
    pub disk: Disk,
    /// Namespace owners, when the cell is directory-managed.
    pub ownership: Option<Arc<Ownership>>,
    /// The cell's token keys, for callers without a certificate.
    pub tokens: Arc<stele_tls::token::Keyring>,
    pub stats: Arc<NodeStats>,
    pub pacer_stats: Arc<PacerStats>,
    /// What the agent reports as the node's load (the console's charts).
    pub load: Arc<crate::load::LoadMeter>,
}

impl DataParts {
    /// Ok if this node may serve `namespace`: always, unless the cell is
    /// directory-managed and the directory placed it on another cell
    /// (`WrongCell`) or nowhere (`NamespaceNotFound`).
    pub(super) async fn check_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        match &self.ownership {
            None => Ok(()),
            Some(o) => o.check(namespace, &self.catalog).await,
        }
    }
}
