//! Coalescing a leader's concurrent appends to one tablet into one Raft
//! entry (`TabletCommand::AppendMany`, log format 2).
//!
//! Each entry costs the same fixed work whatever it carries: a proposal
//! through openraft's core, a journal frame, an apply, a replication
//! message to each follower and its acknowledgement. Under many concurrent
//! producers of small batches that fixed cost is most of the CPU, so the
//! leader keeps at most `in_flight` proposals of a tablet out at a time
//! and sends the appends that arrive meanwhile together, as one entry,
//! when a proposal comes back. There is no timer: an append that finds a
//! free slot is proposed at once, alone, as an `Append`; batching happens
//! only when the tablet is already busy, and grows with the load.
//!
//! Every batch keeps its own receipt, condition and response (`apply`
//! applies them one by one), so coalescing changes no client-visible
//! outcome, only how many batches share a log index.
//!
//! Nor may waiting change when an append is refused. openraft refuses a
//! new write at once on a leader whose lease has lapsed (cut off from its
//! followers), but a write it took before stays pending until the leader
//! learns of its successor. Appends queued behind such a proposal would
//! wait with it, for the whole partition, where without coalescing they
//! would have been redirected. So when no proposal of the tablet has come
//! back for [`Limits::stall`] (a leader lease), waiting appends and new
//! ones are proposed alone, outside the in-flight bound, and openraft
//! answers each as it would without coalescing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stele_proto::command::{AppendBatch, TabletCommand, TabletResponse};
use tokio::sync::oneshot;

use super::TabletRaft;
use super::replica::{ProposeError, propose_on};

/// What one batch counts for against [`Limits::bytes`] besides its
/// namespace, keys and values (its ids, condition and encoding; a test
/// checks the encoding never takes more).
pub const BATCH_OVERHEAD: usize = 192;
/// What each record counts for besides its key and value.
pub const RECORD_OVERHEAD: usize = 64;
/// The most batches one entry carries.
pub const BATCHES_MAX: usize = 1024;

/// How far one tablet's appends are coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Proposals of one tablet out at a time; appends beyond wait and go
    /// together. At least 1.
    pub in_flight: usize,
    /// The most one entry carries, by [`cost`]: what a single largest
    /// batch may cost, so a coalesced entry fits a journal frame whenever
    /// a lone batch does. One batch alone is always taken, whatever it
    /// costs.
    pub bytes: usize,
    /// How long appends wait for a proposal to come back before they are
    /// proposed alone (the leader lease: see the module comment).
    pub stall: Duration,
}

/// What `batch` counts for against [`Limits::bytes`].
pub fn cost(batch: &AppendBatch) -> usize {
    BATCH_OVERHEAD
        + batch.namespace.len()
        + batch.expect.as_ref().map_or(0, |e| e.key.len())
        + batch
            .records
            .iter()
            .map(|r| r.key.len() + r.value.len() + RECORD_OVERHEAD)
            .sum::<usize>()
}

/// What a proposal needs, owned, so a coalesced entry can be proposed by
/// a task of its own after the request that opened the slot has gone.
#[derive(Clone)]
pub struct Proposer {
    pub raft: TabletRaft,
    pub tablet: u64,
    pub replica_id: u64,
}

type Reply = oneshot::Sender<Result<TabletResponse, ProposeError>>;

struct Waiting {
    /// Names it in the queue, to withdraw it when proposals stall.
    id: u64,
    batch: AppendBatch,
    cost: usize,
    reply: Reply,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
    /// The last waiting append's id.
    last_id: u64,
    /// When a proposal last came back, or the first one went out after
    /// none was out.
    progress_at: Option<Instant>,
    /// Proposals come back so far.
    progress: u64,
}

impl State {
    /// Whether proposals have been out for `stall` with none back.
    fn stalled(&self, stall: Duration) -> bool {
        self.in_flight > 0 && self.progress_at.is_some_and(|at| at.elapsed() >= stall)
    }
}

/// What became of a waiting append when its wait ran out.
enum Withdrawn {
    /// Out of the queue, to be proposed alone.
    Alone(AppendBatch),
    /// Already taken into a proposal: its response will come.
    Taken,
    /// Still queued: a proposal came back (the progress count now), so
    /// the wait starts again.
    Moving(u64),
}

/// What `Coalescer::append` does with a batch.
enum Admitted {
    /// Proposed now in a slot of its own.
    Slot(AppendBatch),
    /// Proposed now alone, without a slot: proposals stalled.
    Alone(AppendBatch),
    /// Queued (its id, the progress count then): its response comes on
    /// the receiver.
    Queued(
        u64,
        u64,
        oneshot::Receiver<Result<TabletResponse, ProposeError>>,
    ),
}

/// One tablet's coalescing state (a replica's; used while it leads).
#[derive(Default)]
pub struct Coalescer {
    state: Mutex<State>,
}

impl Coalescer {
    /// Proposes `batch`, alone at once when a slot is free, else with the
    /// other appends waiting when a proposal comes back, and returns its
    /// own response.
    pub async fn append(
        self: &Arc<Self>,
        proposer: &Proposer,
        batch: AppendBatch,
        limits: Limits,
    ) -> Result<TabletResponse, ProposeError> {
        let admitted = {
            let mut st = self.state.lock().expect("lock poisoned");
            if st.in_flight < limits.in_flight.max(1) {
                if st.in_flight == 0 {
                    st.progress_at = Some(Instant::now());
                }
                st.in_flight += 1;
                Admitted::Slot(batch)
            } else if st.stalled(limits.stall) {
                Admitted::Alone(batch)
            } else {
                let (reply, rx) = oneshot::channel();
                st.last_id += 1;
                let id = st.last_id;
                st.waiting.push_back(Waiting {
                    id,
                    cost: cost(&batch),
                    batch,
                    reply,
                });
                Admitted::Queued(id, st.progress, rx)
            }
        };
        match admitted {
            Admitted::Slot(batch) => {
                // Held across the proposal: dropped when it returns or
                // when the request is cancelled, and then passes the slot
                // on.
                let _slot = Slot {
                    coalescer: self.clone(),
                    proposer: proposer.clone(),
                    limits,
                };
                propose_alone(proposer, batch).await
            }
            Admitted::Alone(batch) => propose_alone(proposer, batch).await,
            // Each round waits a whole `stall`: the append is withdrawn
            // only when no proposal came back in all of it.
            Admitted::Queued(id, mut seen, mut rx) => loop {
                if let Ok(reply) = tokio::time::timeout(limits.stall, &mut rx).await {
                    return answered(proposer.tablet, reply);
                }
                match self.withdraw(id, seen) {
                    Withdrawn::Alone(batch) => return propose_alone(proposer, batch).await,
                    Withdrawn::Taken => return answered(proposer.tablet, rx.await),
                    Withdrawn::Moving(progress) => seen = progress,
                }
            },
        }
    }

    /// Takes waiting append `id` out of the queue if no proposal came
    /// back since the progress count was `seen`.
    fn withdraw(&self, id: u64, seen: u64) -> Withdrawn {
        let mut st = self.state.lock().expect("lock poisoned");
        let Some(at) = st.waiting.iter().position(|w| w.id == id) else {
            return Withdrawn::Taken;
        };
        if st.progress != seen {
            return Withdrawn::Moving(st.progress);
        }
        match st.waiting.remove(at) {
            Some(w) => Withdrawn::Alone(w.batch),
            None => Withdrawn::Taken,
        }
    }

    /// The appends the next entry carries, in arrival order, or none (and
    /// the slot given back) when nothing waits. Appends whose caller has
    /// gone are dropped unproposed: nobody would learn the outcome, and a
    /// retry of the batch is idempotent either way.
    fn next(&self, limits: Limits) -> Vec<Waiting> {
        let mut st = self.state.lock().expect("lock poisoned");
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while let Some(w) = st.waiting.front() {
            if w.reply.is_closed() {
                st.waiting.pop_front();
                continue;
            }
            if !out.is_empty() && (out.len() >= BATCHES_MAX || bytes + w.cost > limits.bytes) {
                break;
            }
            bytes += w.cost;
            out.extend(st.waiting.pop_front());
        }
        st.progress_at = Some(Instant::now());
        st.progress += 1;
        if out.is_empty() {
            st.in_flight -= 1;
        }
        out
    }

    /// Appends waiting now (for status and tests).
    pub fn waiting(&self) -> usize {
        self.state.lock().expect("lock poisoned").waiting.len()
    }
}

/// A proposal slot, held while its proposal is out; dropping it proposes
/// what waits (in a task of its own) or frees the slot.
struct Slot {
    coalescer: Arc<Coalescer>,
    proposer: Proposer,
    limits: Limits,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let next = self.coalescer.next(self.limits);
        if next.is_empty() {
            return;
        }
        let slot = Slot {
            coalescer: self.coalescer.clone(),
            proposer: self.proposer.clone(),
            limits: self.limits,
        };
        match tokio::runtime::Handle::try_current() {
            // Outside a runtime (never in a serving node) the waiting
            // appends fail as the replica stopping: `slot` drops with them
            // and so goes on until nothing waits.
            Err(_) => drop((slot, next)),
            Ok(rt) => drop(rt.spawn(propose_waiting(slot, next))),
        }
    }
}

/// Proposes `batch` as an entry of its own.
async fn propose_alone(
    proposer: &Proposer,
    batch: AppendBatch,
) -> Result<TabletResponse, ProposeError> {
    crate::metrics::record_append_entry(1);
    propose_on(proposer, TabletCommand::Append(batch)).await
}

/// A queued append's response, or the replica stopping if it never came.
fn answered(
    tablet: u64,
    reply: Result<Result<TabletResponse, ProposeError>, oneshot::error::RecvError>,
) -> Result<TabletResponse, ProposeError> {
    reply.unwrap_or_else(|_| {
        Err(ProposeError::Unavailable {
            tablet,
            reason: "the replica stopped before proposing the append".into(),
        })
    })
}

/// Proposes `next` as one entry and answers each append from its own
/// response; `slot` passes on when done.
async fn propose_waiting(slot: Slot, next: Vec<Waiting>) {
    let (batches, replies): (Vec<AppendBatch>, Vec<Reply>) =
        next.into_iter().map(|w| (w.batch, w.reply)).unzip();
    let tablet = slot.proposer.tablet;
    crate::metrics::record_append_entry(batches.len());
    let cmd = if batches.len() == 1 {
        TabletCommand::Append(batches.into_iter().next().expect("one batch"))
    } else {
        TabletCommand::AppendMany(batches)
    };
    let result = propose_on(&slot.proposer, cmd).await;
    drop(slot);
    match result {
        Ok(TabletResponse::Many(responses)) if responses.len() == replies.len() => {
            for (reply, response) in replies.into_iter().zip(responses) {
                let _ = reply.send(Ok(response));
            }
        }
        Ok(response) if replies.len() == 1 => {
            let _ = replies
                .into_iter()
                .next()
                .expect("one reply")
                .send(Ok(response));
        }
        Ok(other) => {
            let e = ProposeError::Unavailable {
                tablet,
                reason: format!("unexpected apply result for coalesced appends: {other:?}"),
            };
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use stele_proto::command::{Expect, Pos, RecordIn};

    use super::*;

    /// The largest encoding each field can take: longest namespace, ids,
    /// clocks and positions at their maximum, a condition on a long key.
    fn widest(records: usize, key: usize, value: usize) -> AppendBatch {
        AppendBatch {
            namespace: ["n".repeat(64), "m".repeat(64), "o".repeat(64)].join("/"),
            batch_id: [u64::MAX, u64::MAX],
            records: (0..records)
                .map(|_| RecordIn {
                    key: vec![1; key],
                    ts: u64::MAX,
                    value: vec![2; value],
                    vshard: u32::MAX,
                })
                .collect(),
            expect: Some(Expect {
                key: vec![3; 4096],
                version: Some(Pos {
                    tablet: u64::MAX,
                    index: u64::MAX,
                    slot: u32::MAX,
                }),
            }),
            proposed_at_us: u64::MAX,
        }
    }

    #[test]
    fn an_entry_never_encodes_larger_than_its_cost() {
        for (records, key, value) in [(1, 1, 0), (3, 1, 0), (1, 4096, 70_000), (50, 300, 5)] {
            let batches: Vec<AppendBatch> = (0..BATCHES_MAX)
                .map(|_| widest(records, key, value))
                .take(if value > 1000 { 4 } else { BATCHES_MAX })
                .collect();
            let cost: usize = batches.iter().map(cost).sum();
            let bytes = crate::raft::encode(&TabletCommand::AppendMany(batches)).len();
            assert!(
                bytes <= cost,
                "{records} records of {key}+{value} bytes: {bytes} encoded > {cost}"
            );
        }
    }
}
