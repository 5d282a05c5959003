//! The node's one registry of tablet replicas, and their life cycle:
//! creating (controller assignment, split child), starting (recovery) and
//! removing (moved away, merged away) replicas.
//!
//! ```text
//! recovery / agent / seal worker ──create, open, remove──► ReplicaSet
//!                                                           │ tablet id → Opening(tablet) | Running(replica)
//! pacer, tier worker, peering, data service, policy ◄─lookup┘
//! a Merge's apply ◄──Neighbours (weak)── the absorbed tablet here
//! ```
//!
//! A tablet is in the set from the moment it is open, before its Raft
//! group starts (`Opening`): at recovery every tablet opens before any
//! group replays, because a replayed `Merge` reads the tablet it absorbs.
//! Lookups for serving ([`ReplicaSet::replica`]) see only running ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use stele_proto::command::{SealReason, TabletCommand};
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, TabletRecord};
use crate::error::{Error, Refusal, Result};
use crate::journal::Journal;
use crate::raft::log_store::LogStore;
use crate::raft::replica::{self, ProposeError};
use crate::raft::router;
use crate::raft::state_machine::{Neighbours, SealQueue, StateMachine};
use crate::raft::{RaftStarter, Replica};
use crate::tablet::{Tablet, TabletOptions};

/// A replica the controller asks this node to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSpec {
    pub tablet: u64,
    pub replica_id: u64,
    pub vshard_lo: u32,
    pub vshard_hi: u64,
    pub range_generation: u64,
}

/// What opening a tablet on this node needs.
#[derive(Clone)]
pub struct HostOptions {
    pub node_id: u64,
    /// `<data>/segments`: one directory per tablet.
    pub segments_dir: PathBuf,
    pub tablet: TabletOptions,
    pub tier: Option<Arc<crate::tier::Tier>>,
    /// The tablet log format in use at start (`formats::LOG`): the
    /// controller's heartbeat answers change it on a controlled node.
    pub log_format: u32,
}

#[derive(Clone)]
enum Slot {
    /// Open, its group not started yet.
    Opening(Arc<Tablet>),
    Running(Arc<Replica>),
}

impl Slot {
    fn tablet(&self) -> &Arc<Tablet> {
        match self {
            Slot::Opening(t) => t,
            Slot::Running(r) => &r.tablet,
        }
    }

    fn running(&self) -> Option<&Arc<Replica>> {
        match self {
            Slot::Opening(_) => None,
            Slot::Running(r) => Some(r),
        }
    }
}

struct Inner {
    opts: HostOptions,
    journal: Journal,
    catalog: Catalog,
    starter: RaftStarter,
    seals: SealQueue,
    /// The node's shutdown.
    cancel: CancellationToken,
    /// One replica of a tablet per node, by tablet id.
    slots: RwLock<BTreeMap<u64, Slot>>,
    /// Serializes replica creation and removal.
    lifecycle: tokio::sync::Mutex<()>,
    /// The segment format version the cell has enabled (the controller's
    /// heartbeat answer sets it): what this node's leaders put in the
    /// seals and compactions they propose.
    segment_format: std::sync::atomic::AtomicU32,
    /// The tablet log format the cell has enabled (`formats::LOG`): from
    /// 2, this node's leaders coalesce concurrent appends into
    /// `AppendMany` entries.
    log_format: std::sync::atomic::AtomicU32,
}

/// The node's replicas (cheap to clone: a handle).
#[derive(Clone)]
pub struct ReplicaSet(Arc<Inner>);

impl ReplicaSet {
    pub fn new(
        opts: HostOptions,
        journal: Journal,
        catalog: Catalog,
        starter: RaftStarter,
        seals: SealQueue,
        cancel: CancellationToken,
    ) -> ReplicaSet {
        ReplicaSet(Arc::new(Inner {
            log_format: opts.log_format.into(),
            opts,
            journal,
            catalog,
            starter,
            seals,
            cancel,
            slots: Default::default(),
            lifecycle: Default::default(),
            segment_format: crate::segment::format::FORMAT_VERSION_MIN.into(),
        }))
    }

    /// The segment format version seals proposed here write.
    pub fn segment_format(&self) -> u32 {
        self.0.segment_format.load(Ordering::Relaxed)
    }

    /// Sets the cell's enabled segment format version; a version this
    /// build cannot write is refused (the controller refuses this node's
    /// heartbeats in that case, so it does not happen in a working cell).
    pub fn set_segment_format(&self, version: u32) -> Result<()> {
        use crate::segment::format::{FORMAT_VERSION_MAX, FORMAT_VERSION_MIN};
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION_MAX).contains(&version) {
            return Err(stele_proto::Error::InvalidArgument {
                field: "segment format".into(),
                reason: format!(
                    "{version} is not one this build writes ({FORMAT_VERSION_MIN}..={FORMAT_VERSION_MAX})"
                ),
            }
            .into());
        }
        let old = self.0.segment_format.swap(version, Ordering::Relaxed);
        if old != version {
            tracing::info!(
                from = old,
                to = version,
                "segment format of new seals changed"
            );
        }
        Ok(())
    }

    /// The tablet log format entries proposed here may use.
    pub fn log_format(&self) -> u32 {
        self.0.log_format.load(Ordering::Relaxed)
    }

    /// Sets the cell's enabled log format; a version this build does not
    /// know is refused, as [`ReplicaSet::set_segment_format`] does.
    pub fn set_log_format(&self, version: u32) -> Result<()> {
        use stele_proto::formats::{BASELINE, LOG_MAX};
        if !(BASELINE..=LOG_MAX).contains(&version) {
            return Err(stele_proto::Error::InvalidArgument {
                field: "log format".into(),
                reason: format!("{version} is not one this build writes ({BASELINE}..={LOG_MAX})"),
            }
            .into());
        }
        let old = self.0.log_format.swap(version, Ordering::Relaxed);
        if old != version {
            tracing::info!(from = old, to = version, "tablet log format changed");
        }
        Ok(())
    }

    pub fn node_id(&self) -> u64 {
        self.0.opts.node_id
    }

    /// Cancelled when the node shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.0.cancel.clone()
    }

    /// Resolves when the node starts shutting down.
    pub async fn cancelled(&self) {
        self.0.cancel.cancelled().await
    }

    /// A handle that does not keep the set alive (for the state machines
    /// the set itself holds).
    fn neighbours(&self) -> Arc<dyn Neighbours> {
        Arc::new(WeakSet(Arc::downgrade(&self.0)))
    }

    /// The running replica of `tablet`.
    pub fn replica(&self, tablet: u64) -> Option<Arc<Replica>> {
        self.0
            .slots
            .read()
            .expect("lock poisoned")
            .get(&tablet)
            .and_then(Slot::running)
            .cloned()
    }

    /// Every running replica, by tablet id (a snapshot of the set).
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.0
            .slots
            .read()
            .expect("lock poisoned")
            .values()
            .filter_map(Slot::running)
            .cloned()
            .collect()
    }

    pub fn replica_count(&self) -> usize {
        self.0
            .slots
            .read()
            .expect("lock poisoned")
            .values()
            .filter(|s| s.running().is_some())
            .count()
    }

    /// The replica whose range holds `vshard`, not counting one frozen for
    /// a merge: the tablet absorbing it may take writes for its range
    /// before it is gone, so it serves no reads.
    pub fn replica_for(&self, vshard: u32) -> Option<Arc<Replica>> {
        self.0
            .slots
            .read()
            .expect("lock poisoned")
            .values()
            .filter_map(Slot::running)
            .find(|r| r.tablet.contains(vshard) && !r.tablet.is_frozen())
            .cloned()
    }

    fn segment_dir(&self, tablet: u64) -> PathBuf {
        self.0.opts.segments_dir.join(tablet.to_string())
    }

    /// Opens the tablet of `record` from its files (no group yet).
    pub(crate) fn open_tablet(&self, record: &TabletRecord) -> Result<Arc<Tablet>> {
        Tablet::open_tiered(
            record,
            self.segment_dir(record.id),
            self.0.catalog.clone(),
            self.0.opts.tablet.clone(),
            self.0.opts.tier.clone(),
        )
    }

    /// Puts an open tablet in the set before its group starts.
    pub(crate) fn insert_opening(&self, tablet: Arc<Tablet>) {
        self.0
            .slots
            .write()
            .expect("lock poisoned")
            .insert(tablet.id, Slot::Opening(tablet));
    }

    fn insert_running(&self, replica: Arc<Replica>) {
        self.0
            .slots
            .write()
            .expect("lock poisoned")
            .insert(replica.tablet.id, Slot::Running(replica));
    }

    /// Starts the Raft group of an open tablet over `log`.
    pub(crate) async fn start_group(
        &self,
        tablet: &Arc<Tablet>,
        log: &LogStore,
    ) -> Result<crate::raft::TabletRaft> {
        let sm = StateMachine::new(tablet.clone(), self.0.seals.clone(), self.neighbours())
            .marking(log.applied_mark());
        self.0
            .starter
            .start(tablet.id, tablet.replica_id, log.clone(), sm)
            .await
    }

    /// Starts the group of a tablet opened at recovery, and campaigns at
    /// once when it cannot lose: `initialize` (the voters of a new group,
    /// on the one replica that creates it), or this replica is the group's
    /// only voter, so a restarted single-node cell serves at once instead
    /// of after an election timeout.
    pub(crate) async fn start_recovered(
        &self,
        tablet: Arc<Tablet>,
        log: LogStore,
        initialize: Option<Vec<u64>>,
    ) -> Result<()> {
        let raft = self.start_group(&tablet, &log).await?;
        let replica_id = tablet.replica_id;
        if let Some(voters) = initialize {
            replica::initialize(&raft, tablet.id, &voters).await?;
            // Campaign at once rather than after a timeout; if the other
            // voters are not up yet the pacer tries again.
            replica::campaign(&raft, true).await;
        } else if tablet
            .read()
            .membership
            .membership()
            .voter_ids()
            .eq([replica_id])
            || replica::sole_voter_in_log(&raft, replica_id)
        {
            replica::campaign(&raft, false).await;
        }
        self.insert_running(Arc::new(Replica::new(tablet, raft, replica_id, log)));
        Ok(())
    }

    /// Creates (or finds) the replica the controller assigned to this node.
    /// With `initialize`, a new, empty replica creates its Raft group with
    /// these voter replica ids; every other replica waits to hear from a
    /// leader. A tombstoned replica id is refused: ids are never reused.
    pub async fn create_replica(
        &self,
        spec: &ReplicaSpec,
        initialize: Option<&[u64]>,
    ) -> Result<Arc<Replica>> {
        let _guard = self.0.lifecycle.lock().await;
        let refused = |refusal| Error::ReplicaRefused {
            tablet: spec.tablet,
            replica: spec.replica_id,
            refusal,
        };
        if let Some(r) = self.replica(spec.tablet) {
            if r.replica_id != spec.replica_id {
                return Err(refused(Refusal::OtherReplicaHere { here: r.replica_id }));
            }
            return Ok(r);
        }
        if self.0.catalog.is_tombstoned(spec.replica_id)? {
            return Err(refused(Refusal::Tombstoned));
        }
        let owner = router::node_of(spec.replica_id);
        if owner != self.node_id() {
            return Err(refused(Refusal::OtherNode {
                owner,
                here: self.node_id(),
            }));
        }
        // A split on this node made the replica already (its record names
        // the parent's segments): open that one, never an empty one over it.
        if let Some(record) = self.0.catalog.tablet(spec.tablet)?
            && record.replica_id == spec.replica_id
        {
            return self.open_created(record).await;
        }
        let record = TabletRecord {
            v: 1,
            id: spec.tablet,
            vshard_lo: spec.vshard_lo,
            vshard_hi: spec.vshard_hi,
            generation: spec.range_generation,
            checkpoint: 0,
            applied_state: Vec::new(),
            segments: Vec::new(),
            replica_id: spec.replica_id,
            init_voters: Vec::new(),
            frozen: false,
        };
        let dir = self.segment_dir(spec.tablet);
        // Files of an earlier replica of the tablet here are not ours.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
        }
        let log =
            LogStore::create(spec.tablet, self.0.journal.clone(), self.0.catalog.clone()).await?;
        self.0.catalog.put_tablet(&record)?;
        let tablet = self.open_tablet(&record)?;
        self.insert_opening(tablet.clone());
        let raft = self.start_group(&tablet, &log).await?;
        if let Some(voters) = initialize {
            replica::initialize(&raft, spec.tablet, voters).await?;
            replica::campaign(&raft, true).await;
        }
        let replica = Arc::new(Replica::new(tablet, raft, spec.replica_id, log));
        self.insert_running(replica.clone());
        tracing::info!(
            tablet = spec.tablet,
            replica = spec.replica_id,
            initialize = initialize.is_some(),
            "replica created"
        );
        Ok(replica)
    }

    /// Opens the child replica a split created in the catalog on this node
    /// (nothing if it is open already).
    pub async fn open_split_child(&self, record: TabletRecord) -> Result<()> {
        let _guard = self.0.lifecycle.lock().await;
        if self.replica(record.id).is_some() {
            return Ok(());
        }
        self.open_created(record).await.map(|_| ())
    }

    /// Opens a replica whose catalog record exists but that has no journal
    /// frames yet (a split child). Called with the lifecycle lock held.
    async fn open_created(&self, record: TabletRecord) -> Result<Arc<Replica>> {
        let tablet = self.open_tablet(&record)?;
        let log =
            LogStore::create(record.id, self.0.journal.clone(), self.0.catalog.clone()).await?;
        self.insert_opening(tablet.clone());
        let raft = self.start_group(&tablet, &log).await?;
        // The child's group exists from its first state on (a membership
        // applied at index 0): the replica on the node that proposed the
        // split campaigns at once, the others wait for it, or time out.
        if record.init_voters.first() == Some(&record.replica_id) {
            replica::campaign(&raft, true).await;
        }
        let replica = Arc::new(Replica::new(tablet, raft, record.replica_id, log));
        self.insert_running(replica.clone());
        Ok(replica)
    }

    /// Removes a replica that was moved away: stops its Raft group, deletes
    /// its catalog rows and segment files, and tombstones its id. Nothing
    /// when this node does not hold that replica.
    pub async fn remove_replica(&self, tablet: u64, replica_id: u64) -> Result<bool> {
        let _guard = self.0.lifecycle.lock().await;
        let Some(r) = self.replica(tablet) else {
            return Ok(false);
        };
        if r.replica_id != replica_id {
            return Ok(false);
        }
        self.0.slots.write().expect("lock poisoned").remove(&tablet);
        let _ = r.raft.shutdown().await;
        self.0.catalog.remove_tablet(tablet, replica_id)?;
        self.0.journal.forget_tablet(tablet);
        let dir = &r.tablet.segment_dir;
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
        }
        tracing::info!(tablet, replica = replica_id, "replica removed");
        Ok(true)
    }

    /// Waits until every tablet has a leader and has applied its log. A
    /// replica removed while this waits (the absorbed side of a merge that
    /// publishes during start, a replica moved away) is not waited for: its
    /// group shuts down, and that is not a failure to become ready.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        for r in self.replicas() {
            self.wait_hosted(&r, r.wait_ready(timeout)).await?;
        }
        Ok(())
    }

    /// Waits until each of `replicas` (those hosted at start) has caught
    /// up ([`Replica::wait_caught_up`]); one removed meanwhile is not
    /// waited for. `timeout` bounds the wait of each.
    pub async fn wait_caught_up(&self, replicas: &[Arc<Replica>], timeout: Duration) -> Result<()> {
        for r in replicas {
            if self
                .replica(r.tablet.id)
                .is_some_and(|now| Arc::ptr_eq(&now, r))
            {
                self.wait_hosted(r, r.wait_caught_up(timeout)).await?;
            }
        }
        Ok(())
    }

    /// `wait`'s error, unless `r` is no longer hosted when it fails.
    async fn wait_hosted(
        &self,
        r: &Arc<Replica>,
        wait: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        if let Err(e) = wait.await {
            let still_hosted = self
                .replica(r.tablet.id)
                .is_some_and(|now| Arc::ptr_eq(&now, r));
            if still_hosted {
                return Err(e);
            }
            tracing::debug!(
                tablet = r.tablet.id,
                "replica removed while waiting for it to be ready"
            );
        }
        Ok(())
    }

    /// Proposes `cmd` to the replica of `tablet` here.
    async fn propose(&self, tablet: u64, cmd: TabletCommand) -> Result<()> {
        let r = self
            .replica(tablet)
            .ok_or(stele_proto::Error::TabletNotFound { tablet })?;
        r.propose(cmd)
            .await
            .map_err(|e: ProposeError| stele_proto::Error::Unavailable {
                reason: e.to_string(),
            })?;
        Ok(())
    }

    /// Proposes a seal of one tablet (operator or policy).
    pub async fn seal(&self, tablet: u64, reason: SealReason) -> Result<()> {
        let format = self.segment_format();
        self.propose(tablet, TabletCommand::Seal { reason, format })
            .await
    }

    /// Proposes a compaction of `inputs` (segment ids of `tablet`).
    pub async fn compact(&self, tablet: u64, inputs: Vec<String>) -> Result<()> {
        let format = self.segment_format();
        self.propose(tablet, TabletCommand::Compact { inputs, format })
            .await
    }

    /// Stops every Raft group.
    pub(crate) async fn shutdown_groups(&self) {
        for r in self.replicas() {
            let _ = r.raft.shutdown().await;
        }
    }
}

/// The set as a `Merge`'s apply sees it, without keeping it alive: the set
/// holds the replicas, whose state machines hold this.
struct WeakSet(Weak<Inner>);

impl Neighbours for WeakSet {
    fn tablet(&self, id: u64) -> Option<Arc<Tablet>> {
        let set = self.0.upgrade()?;
        let slots = set.slots.read().expect("lock poisoned");
        slots.get(&id).map(|s| s.tablet().clone())
    }

    fn shutdown(&self) -> CancellationToken {
        match self.0.upgrade() {
            Some(set) => set.cancel.clone(),
            None => {
                // The node is gone: nothing to wait for.
                let gone = CancellationToken::new();
                gone.cancel();
                gone
            }
        }
    }
}
