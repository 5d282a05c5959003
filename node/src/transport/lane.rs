//! The control lane: one long-lived bidirectional stream per connection and
//! calling side that carries the small `MsgKind::Control` requests of every
//! Raft group, and their answers, as a stream of frames matched by id.
//!
//! ```text
//!  caller node                                   answering node
//!  call() -> register id -> queue ---+
//!                                    v
//!  writer task: everything queued    lane-open, lane-call(id), lane-call(id)...
//!  so far, one write  ============================================> reader task
//!                                                 each call -> Handler (concurrent,
//!                                                 at most control_inflight_max)
//!                                                                   |
//!  reader task: id -> waiting call   lane-ok(id) / lane-err(id) ... v
//!  <============================================================= writer task:
//!                                                 answers done so far, one write
//! ```
//!
//! Each node opens its own lane on a connection the first time it calls
//! the peer over it, so a connection carries at most one lane per
//! direction of calling. The lane-open frame carries the lane version and
//! goes out in the first write. Bulk requests and control requests larger
//! than `control_lane_body_bytes_max` keep a stream of their own
//! (`conn.rs`), so a big message never holds up the lane.
//!
//! A frame the answering side cannot accept (bad header, oversized,
//! wrong kind, stalled body, unknown lane version) is counted in
//! `rejected_frames`, answered with one plain `err` frame that says why,
//! and ends the lane: the caller fails every call waiting on it and opens a
//! new lane for the next call. The connection and its other streams go on.
//! The same holds the other way round for a bad answer frame.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use quinn::{RecvStream, SendStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::{ReadFail, STREAM_PROTOCOL, answer_frame, decode_remote_error, priority};
use super::error::{Error, RemoteError, Result, StreamError};
use super::frame::{FrameError, FrameKind, HEADER_BYTES, Header, LANE_ID_BYTES, LANE_VERSION};
use super::{Inner, MsgKind, Request};
use crate::fixed;

/// A writer stops gathering queued frames into its batch once the batch
/// has this many bytes (a single frame may be larger).
const BATCH_BYTES_MAX: usize = 1 << 20;
/// Largest piece a reader takes from its stream at once.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// The lanes of one connection; lives as long as the connection's `Link`.
#[derive(Default)]
pub(super) struct Lanes {
    /// The lane this node opened for its own calls, once opened.
    caller: Mutex<Option<Arc<CallerLane>>>,
    /// Held while opening the caller lane, so that only one is opened.
    opening: tokio::sync::Mutex<()>,
}

impl Lanes {
    fn open_caller(&self) -> Option<Arc<CallerLane>> {
        self.caller
            .lock()
            .unwrap()
            .as_ref()
            .filter(|lane| lane.is_open())
            .cloned()
    }

    /// This node's lane on `conn`, opened now if there is none (or the
    /// last one ended).
    async fn caller(
        &self,
        inner: &Arc<Inner>,
        peer: u64,
        conn: &quinn::Connection,
    ) -> Result<Arc<CallerLane>> {
        if let Some(lane) = self.open_caller() {
            return Ok(lane);
        }
        let _opening = self.opening.lock().await;
        if let Some(lane) = self.open_caller() {
            return Ok(lane);
        }
        let lane = open(inner, peer, conn).await?;
        *self.caller.lock().unwrap() = Some(lane.clone());
        Ok(lane)
    }

    /// Calls waiting for an answer on this node's lane (tests).
    #[cfg(test)]
    pub(super) fn waiting_calls(&self) -> usize {
        self.caller
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |lane| lane.calls.lock().unwrap().waiting.len())
    }
}

/// Sends `req`, a control request, on this node's lane of `conn` and waits
/// for its answer. Cancel-safe: dropping the future forgets the call, and
/// an answer that arrives later is dropped.
pub(super) async fn call(
    inner: &Arc<Inner>,
    peer: u64,
    conn: &quinn::Connection,
    lanes: &Lanes,
    req: Request,
) -> Result<Bytes> {
    let lane = lanes.caller(inner, peer, conn).await?;
    let (id, answer) = lane.register()?;
    let _forget = Forget { lane: &lane, id };
    let frame = Outgoing::call(id, req);
    lane.queue.send(frame).await.map_err(|_| lane.lost())?;
    answer.await.unwrap_or_else(|_| Err(lane.lost()))
}

/// This node's side of a lane it opened: the calls waiting for answers.
struct CallerLane {
    peer: u64,
    queue: mpsc::Sender<Outgoing>,
    calls: Mutex<Calls>,
    /// Fires when the lane ends, for whatever reason; stops both tasks.
    end: CancellationToken,
}

struct Calls {
    next_id: u64,
    waiting: HashMap<u64, oneshot::Sender<Result<Bytes>>>,
    /// Why the lane ended, once it has; no call registers after that.
    ended: Option<String>,
}

impl CallerLane {
    fn is_open(&self) -> bool {
        !self.end.is_cancelled()
    }

    fn register(&self) -> Result<(u64, oneshot::Receiver<Result<Bytes>>)> {
        let mut calls = self.calls.lock().unwrap();
        if let Some(reason) = &calls.ended {
            return Err(Error::ConnectionLost {
                peer: self.peer,
                reason: reason.clone(),
            });
        }
        let id = calls.next_id;
        calls.next_id = calls.next_id.wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        calls.waiting.insert(id, tx);
        Ok((id, rx))
    }

    /// Hands an answer to the call waiting for `id`; a call that was
    /// dropped meanwhile is not waiting any more, and its answer goes.
    fn answer(&self, id: u64, answer: Result<Bytes>) {
        let waiting = self.calls.lock().unwrap().waiting.remove(&id);
        if let Some(tx) = waiting {
            let _ = tx.send(answer);
        }
    }

    /// Ends the lane: fails every waiting call with `reason` and stops the
    /// lane's tasks. The first reason given is the one kept.
    fn end(&self, reason: String) {
        let waiting = {
            let mut calls = self.calls.lock().unwrap();
            calls.ended.get_or_insert(reason);
            std::mem::take(&mut calls.waiting)
        };
        self.end.cancel();
        for (_, tx) in waiting {
            let _ = tx.send(Err(self.lost()));
        }
    }

    fn lost(&self) -> Error {
        let reason = self.calls.lock().unwrap().ended.clone();
        Error::ConnectionLost {
            peer: self.peer,
            reason: reason.unwrap_or_else(|| "control lane ended".into()),
        }
    }
}

/// Removes a call's entry when the call ends, answered or dropped.
struct Forget<'a> {
    lane: &'a CallerLane,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.lane.calls.lock().unwrap().waiting.remove(&self.id);
    }
}

/// Opens a lane on `conn` and starts its writer and reader tasks. The
/// lane-open frame is the first thing queued, so it leads the first write.
async fn open(inner: &Arc<Inner>, peer: u64, conn: &quinn::Connection) -> Result<Arc<CallerLane>> {
    let (mut send, recv) = conn.open_bi().await.map_err(|e| Error::ConnectionLost {
        peer,
        reason: e.to_string(),
    })?;
    inner.stats.streams.fetch_add(1, Ordering::Relaxed);
    let _ = send.set_priority(priority(MsgKind::Control));
    let (queue, mut queued) = mpsc::channel(inner.limits.control_queue_max);
    queue
        .try_send(Outgoing::opening())
        .expect("a new queue has room for the opening frame");
    let lane = Arc::new(CallerLane {
        peer,
        queue,
        calls: Mutex::new(Calls {
            next_id: 1,
            waiting: HashMap::new(),
            ended: None,
        }),
        end: inner.cancel.child_token(),
    });
    let writer = {
        let (inner, lane) = (inner.clone(), lane.clone());
        async move {
            if let Err(e) = write_batches(&inner, &mut send, &mut queued, &lane.end).await {
                lane.end(e.to_string());
            }
            // Whatever is still queued has no one to answer it.
            let _ = send.reset(STREAM_PROTOCOL);
        }
    };
    inner.tasks.spawn(writer);
    inner
        .tasks
        .spawn(read_answers(inner.clone(), lane.clone(), recv));
    Ok(lane)
}

/// Reads the peer's answers off a lane this node opened and hands each to
/// its waiting call, until the lane ends.
async fn read_answers(inner: Arc<Inner>, lane: Arc<CallerLane>, recv: RecvStream) {
    let peer = lane.peer;
    let rejected = || inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
    let mut reader = FrameReader::new(recv, &inner);
    let reason = loop {
        let frame = tokio::select! {
            frame = reader.next(&inner) => frame,
            _ = lane.end.cancelled() => break if inner.cancel.is_cancelled() {
                "transport shut down".to_string()
            } else {
                "control lane closed".to_string()
            },
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break format!("node {peer} ended the control lane"),
            Err(ReadFail::Stream(e)) => break e.to_string(),
            Err(ReadFail::Frame(e)) => {
                rejected();
                break format!("bad frame on the control lane: {e}");
            }
        };
        match frame.header.kind {
            FrameKind::LaneOk => lane.answer(frame.id, Ok(frame.body)),
            FrameKind::LaneErr => {
                let answer = match decode_remote_error(&frame.body) {
                    Ok(error) => Error::Remote { peer, error },
                    Err(e) => {
                        rejected();
                        Error::Protocol {
                            peer,
                            reason: e.to_string(),
                        }
                    }
                };
                lane.answer(frame.id, Err(answer));
            }
            FrameKind::Err => {
                let why = match decode_remote_error(&frame.body) {
                    Ok(error) => error.to_string(),
                    Err(e) => e.to_string(),
                };
                break format!("node {peer} closed the control lane: {why}");
            }
            other => {
                rejected();
                break format!("{other:?} frame on the control lane");
            }
        }
    };
    reader.stop();
    tracing::debug!(peer, reason, "control lane ended");
    lane.end(reason);
}

/// Serves a lane `peer` opened, once its lane-open frame is read: reads
/// its calls, runs each through the handler concurrently (at most
/// `control_inflight_max` at once, counting answers not yet written) and
/// queues each answer for the writer as soon as it is ready, so a slow
/// handler holds up no other call. The handler futures are polled by this
/// task rather than spawned one per call (a spawn per heartbeat is what
/// the lane saves); like any async code they must not block the thread.
pub(super) async fn serve(inner: Arc<Inner>, peer: u64, send: SendStream, recv: RecvStream) {
    let _ = send.set_priority(priority(MsgKind::Control));
    let inflight_max = inner.limits.control_inflight_max;
    // Every queued answer holds a slot, so the queue never holds more than
    // `inflight_max` answers plus the closing refusal.
    let (queue, mut queued) = mpsc::channel(inflight_max + 1);
    let end = inner.cancel.child_token();
    let writer = {
        let (inner, end) = (inner.clone(), end.clone());
        let mut send = send;
        async move {
            if let Err(e) = write_batches(&inner, &mut send, &mut queued, &end).await {
                tracing::debug!(peer, error = %e, "control lane answers failed");
                end.cancel();
            }
        }
    };
    inner.tasks.spawn(writer);

    enum Step {
        End,
        Answered(Outgoing),
        Read(OwnedSemaphorePermit, Result<Option<Frame>, ReadFail>),
    }
    let slots = Arc::new(Semaphore::new(inflight_max));
    let mut reader = FrameReader::new(recv, &inner);
    let mut handlers = FuturesUnordered::new();
    // False once the caller has finished its side: the calls read so far
    // are still answered.
    let mut reading = true;
    let refusal = loop {
        if !reading && handlers.is_empty() {
            break None;
        }
        let step = tokio::select! {
            biased;
            _ = end.cancelled() => Step::End,
            Some(answer) = handlers.next() => Step::Answered(answer),
            read = async {
                let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
                (slot, reader.next(&inner).await)
            }, if reading => Step::Read(read.0, read.1),
        };
        match step {
            Step::End => break None,
            Step::Answered(answer) => {
                if queue.try_send(answer).is_err() {
                    // The writer is gone: the stream failed.
                    break None;
                }
            }
            Step::Read(slot, Ok(Some(frame))) if frame.header.kind == FrameKind::LaneCall => {
                handlers.push(handle(&inner, peer, frame, slot));
            }
            Step::Read(_, Ok(Some(frame))) => {
                let reason = format!(
                    "frame kind {:?} where a lane-call was expected",
                    frame.header.kind
                );
                break Some(RemoteError::Protocol { reason });
            }
            Step::Read(_, Ok(None)) => reading = false,
            // The caller reset its side, or the connection went.
            Step::Read(_, Err(ReadFail::Stream(_))) => break None,
            Step::Read(_, Err(ReadFail::Frame(FrameError::TooLarge { length, max_bytes }))) => {
                break Some(RemoteError::TooLarge {
                    bytes: u64::from(length),
                    max_bytes,
                });
            }
            Step::Read(_, Err(ReadFail::Frame(e))) => {
                break Some(RemoteError::Protocol {
                    reason: e.to_string(),
                });
            }
        }
    };
    if let Some(error) = refusal {
        inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer, %error, "rejected a frame on a control lane; closing the lane");
        reader.stop();
        // The calls still running are dropped with the lane; the caller
        // fails them when it reads this refusal.
        let _ = queue.try_send(Outgoing::refusal(&error));
    }
    // Dropping the queue lets the writer write what is queued and finish.
}

/// Runs one call through the handler; the answer keeps `slot` until it is
/// written. A handler that panics is answered `Internal`.
fn handle(
    inner: &Arc<Inner>,
    peer: u64,
    frame: Frame,
    slot: OwnedSemaphorePermit,
) -> impl Future<Output = Outgoing> + use<> {
    let Frame { header, id, body } = frame;
    let req = Request {
        group: header.group,
        target_replica: header.target,
        kind: MsgKind::Control,
        body,
    };
    let handling = AssertUnwindSafe(inner.handler.handle(peer, req)).catch_unwind();
    let inner = inner.clone();
    async move {
        let answer = handling.await.unwrap_or_else(|_| {
            Err(RemoteError::Internal {
                reason: "handler panicked".into(),
            })
        });
        let (kind, body) = answer_frame(&inner, answer);
        let kind = match kind {
            FrameKind::Ok => FrameKind::LaneOk,
            _ => FrameKind::LaneErr,
        };
        Outgoing {
            header: Header {
                kind,
                group: header.group,
                target: header.target,
                length: body.len() as u32,
            },
            id: Some(id),
            body,
            slot: Some(slot),
        }
    }
}

/// One frame queued for a lane's writer.
struct Outgoing {
    header: Header,
    /// The request id, for lane-call, lane-ok and lane-err.
    id: Option<u64>,
    body: Bytes,
    /// An answer's in-flight slot, given back once it is written.
    slot: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    fn opening() -> Outgoing {
        let body = Bytes::from_static(&[LANE_VERSION]);
        Outgoing {
            header: Header {
                kind: FrameKind::LaneOpen,
                group: 0,
                target: 0,
                length: body.len() as u32,
            },
            id: None,
            body,
            slot: None,
        }
    }

    fn call(id: u64, req: Request) -> Outgoing {
        Outgoing {
            header: Header {
                kind: FrameKind::LaneCall,
                group: req.group,
                target: req.target_replica,
                length: req.body.len() as u32,
            },
            id: Some(id),
            body: req.body,
            slot: None,
        }
    }

    /// The last frame of a lane its answering side ends.
    fn refusal(error: &RemoteError) -> Outgoing {
        let body = super::conn::encode_remote_error(error);
        Outgoing {
            header: Header {
                kind: FrameKind::Err,
                group: 0,
                target: 0,
                length: body.len() as u32,
            },
            id: None,
            body,
            slot: None,
        }
    }

    /// Appends the frame to `out`; returns the answer's slot, to be held
    /// until `out` is written.
    fn encode_into(self, out: &mut BytesMut) -> Option<OwnedSemaphorePermit> {
        out.put_slice(&self.header.encode());
        if let Some(id) = self.id {
            out.put_u64_le(id);
        }
        out.put_slice(&self.body);
        self.slot
    }
}

/// Writes queued frames until the queue closes or `end` fires. Each round
/// yields once after its first frame, then takes everything queued by then (up to `BATCH_BYTES_MAX`) and writes it
/// in one call, so many groups' messages queued together leave together.
/// Returns why the stream failed, if it did.
async fn write_batches(
    inner: &Inner,
    send: &mut SendStream,
    queued: &mut mpsc::Receiver<Outgoing>,
    end: &CancellationToken,
) -> Result<(), StreamError> {
    let mut slots = Vec::new();
    loop {
        let first = tokio::select! {
            first = queued.recv() => first,
            _ = end.cancelled() => return Ok(()),
        };
        let Some(mut next) = first else {
            return Ok(());
        };
        // Let the tasks that are ready now (other groups' Raft cores, other
        // handlers) queue their messages before this batch closes: a yield,
        // not a timer, so a lone message waits only one scheduling round.
        tokio::task::yield_now().await;
        let mut batch = BytesMut::new();
        let mut messages = 0;
        loop {
            messages += u64::from(next.id.is_some());
            slots.extend(next.encode_into(&mut batch));
            if batch.len() >= BATCH_BYTES_MAX {
                break;
            }
            match queued.try_recv() {
                Ok(more) => next = more,
                Err(_) => break,
            }
        }
        let bytes = batch.len() as u64;
        tokio::select! {
            written = send.write_chunk(batch.freeze()) => written?,
            _ = end.cancelled() => return Ok(()),
        }
        slots.clear();
        let stats = &inner.stats;
        stats.control_batches.fetch_add(1, Ordering::Relaxed);
        stats
            .control_messages
            .fetch_add(messages, Ordering::Relaxed);
        stats.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// One frame read off a lane; `id` is 0 for kinds without one.
struct Frame {
    header: Header,
    id: u64,
    body: Bytes,
}

/// Reads frames off a lane's stream. A header is checked against
/// `message_bytes_max` as soon as its 24 bytes are in, before the body is
/// waited for; a frame that has begun must be complete within
/// `request_read_timeout`.
struct FrameReader {
    recv: RecvStream,
    buf: BytesMut,
    max_bytes: u64,
    frame_timeout: Duration,
    /// When the frame begun in `buf` must be complete.
    deadline: Option<Instant>,
}

impl FrameReader {
    fn new(recv: RecvStream, inner: &Inner) -> FrameReader {
        FrameReader {
            recv,
            buf: BytesMut::new(),
            max_bytes: inner.limits.message_bytes_max,
            frame_timeout: inner.limits.request_read_timeout,
            deadline: None,
        }
    }

    /// The next whole frame, or `None` where the stream ends between
    /// frames. Cancel-safe: bytes read so far stay in the buffer.
    async fn next(&mut self, inner: &Inner) -> Result<Option<Frame>, ReadFail> {
        loop {
            if let Some(frame) = self.parse()? {
                return Ok(Some(frame));
            }
            let read = self.recv.read_chunk(READ_CHUNK_BYTES, true);
            let chunk = match self.deadline {
                Some(at) => tokio::time::timeout_at(at, read)
                    .await
                    .map_err(|_| FrameError::Stalled)?,
                None => read.await,
            };
            match chunk {
                Ok(Some(chunk)) => {
                    inner
                        .stats
                        .bytes_in
                        .fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                    self.buf.extend_from_slice(&chunk.bytes);
                }
                Ok(None) if self.buf.is_empty() => return Ok(None),
                Ok(None) => return Err(ReadFail::Frame(FrameError::Truncated)),
                Err(e) => return Err(ReadFail::Stream(e.into())),
            }
        }
    }

    /// Takes one whole frame off the buffer, if there is one.
    fn parse(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let incomplete = |deadline: &mut Option<Instant>, timeout: Duration| {
            deadline.get_or_insert_with(|| Instant::now() + timeout);
            Ok(None)
        };
        if self.buf.len() < HEADER_BYTES {
            return incomplete(&mut self.deadline, self.frame_timeout);
        }
        let mut head = [0u8; HEADER_BYTES];
        head.copy_from_slice(&self.buf[..HEADER_BYTES]);
        let header = Header::decode(&head, self.max_bytes)?;
        let id_bytes = if header.kind.carries_id() {
            LANE_ID_BYTES
        } else {
            0
        };
        let frame_bytes = HEADER_BYTES + id_bytes + header.length as usize;
        if self.buf.len() < frame_bytes {
            return incomplete(&mut self.deadline, self.frame_timeout);
        }
        self.deadline = None;
        let mut frame = self.buf.split_to(frame_bytes).freeze();
        let id = if id_bytes > 0 {
            // The length check above covers the id; a shortfall here is a
            // frame the peer cut short.
            fixed::u64_le(&frame, HEADER_BYTES).map_err(|_| FrameError::Truncated)?
        } else {
            0
        };
        let body = frame.split_off(HEADER_BYTES + id_bytes);
        Ok(Some(Frame { header, id, body }))
    }

    /// Tells the peer this side reads no more.
    fn stop(&mut self) {
        let _ = self.recv.stop(STREAM_PROTOCOL);
    }
}
