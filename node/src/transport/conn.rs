//! One request and its response on one bidirectional QUIC stream: the
//! caller's side (`call_on`) and the receiver's side (`serve_stream`).
//! Bulk requests and large control requests travel this way; a stream
//! that opens with a lane-open frame is a control lane and is handed to
//! `lane::serve`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use quinn::{ReadExactError, RecvStream, SendStream, VarInt};

use super::error::{Error, RemoteError, Result, StreamError};
use super::frame::{FrameError, FrameKind, HEADER_BYTES, Header, LANE_VERSION};
use super::{Inner, MsgKind, Request, lane};

/// Stream error codes sent with `stop`/`reset`.
pub(super) const STREAM_PROTOCOL: VarInt = VarInt::from_u32(1);

/// Control streams are scheduled before bulk ones on the same connection
/// (quinn sends the highest priority first).
pub(super) fn priority(kind: MsgKind) -> i32 {
    match kind {
        MsgKind::Control => 1,
        MsgKind::Bulk => 0,
    }
}

/// Why reading a frame failed: the peer's bytes were bad, or the stream or
/// connection went away (not the frame's fault, so not counted).
#[derive(Debug)]
pub(super) enum ReadFail {
    Frame(FrameError),
    Stream(StreamError),
}

impl From<FrameError> for ReadFail {
    fn from(e: FrameError) -> ReadFail {
        ReadFail::Frame(e)
    }
}

fn read_exact_fail(e: ReadExactError) -> ReadFail {
    match e {
        ReadExactError::FinishedEarly(_) => ReadFail::Frame(FrameError::Truncated),
        ReadExactError::ReadError(e) => ReadFail::Stream(e.into()),
    }
}

/// Reads one whole frame and the end of the stream. The body buffer is
/// allocated only after the header's length passed `max_bytes`.
pub(super) async fn read_frame(
    recv: &mut RecvStream,
    max_bytes: u64,
    inner: &Inner,
) -> Result<(Header, Bytes), ReadFail> {
    let header = read_header(recv, max_bytes, inner).await?;
    let body = read_body(recv, header, inner).await?;
    read_end(recv).await?;
    Ok((header, body))
}

/// Reads and bounds one header (`max_bytes` is `message_bytes_max`).
async fn read_header(
    recv: &mut RecvStream,
    max_bytes: u64,
    inner: &Inner,
) -> Result<Header, ReadFail> {
    let mut head = [0u8; HEADER_BYTES];
    recv.read_exact(&mut head).await.map_err(read_exact_fail)?;
    inner
        .stats
        .bytes_in
        .fetch_add(HEADER_BYTES as u64, Ordering::Relaxed);
    Ok(Header::decode(&head, max_bytes)?)
}

/// Reads the body of a frame whose header passed `read_header`.
async fn read_body(
    recv: &mut RecvStream,
    header: Header,
    inner: &Inner,
) -> Result<Bytes, ReadFail> {
    let mut body = vec![0u8; header.length as usize];
    recv.read_exact(&mut body).await.map_err(read_exact_fail)?;
    inner
        .stats
        .bytes_in
        .fetch_add(u64::from(header.length), Ordering::Relaxed);
    Ok(Bytes::from(body))
}

/// Checks that the stream ends here.
async fn read_end(recv: &mut RecvStream) -> Result<(), ReadFail> {
    let mut probe = [0u8; 1];
    match recv.read(&mut probe).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(ReadFail::Frame(FrameError::TrailingBytes)),
        Err(e) => Err(ReadFail::Stream(e.into())),
    }
}

/// What a stream opened by a peer starts with.
enum Opening {
    Request(Header, Bytes),
    Lane,
}

/// Reads a request frame and the end of the stream, or a lane-open frame
/// of a lane version this build speaks.
async fn read_opening(
    recv: &mut RecvStream,
    max_bytes: u64,
    inner: &Inner,
) -> Result<Opening, ReadFail> {
    let header = read_header(recv, max_bytes, inner).await?;
    if header.kind != FrameKind::LaneOpen {
        let body = read_body(recv, header, inner).await?;
        read_end(recv).await?;
        return Ok(Opening::Request(header, body));
    }
    if header.length != 1 {
        return Err(ReadFail::Frame(FrameError::BadLaneOpen(header.length)));
    }
    let version = read_body(recv, header, inner).await?;
    if version[0] != LANE_VERSION {
        return Err(ReadFail::Frame(FrameError::BadLaneVersion(version[0])));
    }
    Ok(Opening::Lane)
}

pub(super) async fn write_frame(
    send: &mut SendStream,
    header: Header,
    body: Bytes,
    inner: &Inner,
) -> Result<(), StreamError> {
    send.write_all(&header.encode()).await?;
    let n = body.len() as u64;
    if !body.is_empty() {
        send.write_chunk(body).await?;
    }
    send.finish()?;
    inner
        .stats
        .bytes_out
        .fetch_add(HEADER_BYTES as u64 + n, Ordering::Relaxed);
    Ok(())
}

pub(crate) fn encode_remote_error(e: &RemoteError) -> Bytes {
    let mut out = Vec::new();
    // Serializing a plain enum into a Vec cannot fail.
    ciborium::into_writer(e, &mut out).expect("CBOR encoding of RemoteError");
    Bytes::from(out)
}

pub(crate) fn decode_remote_error(body: &[u8]) -> Result<RemoteError, FrameError> {
    ciborium::from_reader(body).map_err(|e| FrameError::ErrorBody {
        reason: e.to_string(),
    })
}

/// Sends `req` to `peer` on a new stream of `conn` and waits for the answer.
pub(super) async fn call_on(
    inner: &Inner,
    peer: u64,
    conn: &quinn::Connection,
    req: Request,
) -> Result<Bytes> {
    let lost = |reason: String| Error::ConnectionLost { peer, reason };
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(e.to_string()))?;
    inner.stats.streams.fetch_add(1, Ordering::Relaxed);
    let _ = send.set_priority(priority(req.kind));
    let header = Header {
        kind: match req.kind {
            MsgKind::Control => FrameKind::Control,
            MsgKind::Bulk => FrameKind::Bulk,
        },
        group: req.group,
        target: req.target_replica,
        length: req.body.len() as u32,
    };
    write_frame(&mut send, header, req.body, inner)
        .await
        .map_err(|e| lost(e.to_string()))?;
    let (head, body) = match read_frame(&mut recv, inner.limits.message_bytes_max, inner).await {
        Ok(frame) => frame,
        Err(ReadFail::Stream(e)) => return Err(lost(e.to_string())),
        Err(ReadFail::Frame(e)) => {
            inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Protocol {
                peer,
                reason: e.to_string(),
            });
        }
    };
    match head.kind {
        FrameKind::Ok => Ok(body),
        FrameKind::Err => match decode_remote_error(&body) {
            Ok(error) => Err(Error::Remote { peer, error }),
            Err(e) => {
                inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                Err(Error::Protocol {
                    peer,
                    reason: e.to_string(),
                })
            }
        },
        other => {
            inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            Err(Error::Protocol {
                peer,
                reason: format!("response of kind {other:?}"),
            })
        }
    }
}

/// Serves one stream opened by `peer`: a request (read, check, dispatch to
/// the handler, answer) or a control lane. Bad frames are counted and
/// answered with an error frame when the stream still allows it; they
/// never end the connection.
pub(super) async fn serve_stream(
    inner: Arc<Inner>,
    peer: u64,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    inner.stats.streams.fetch_add(1, Ordering::Relaxed);
    let max = inner.limits.message_bytes_max;
    let read = tokio::time::timeout(
        inner.limits.request_read_timeout,
        read_opening(&mut recv, max, &inner),
    )
    .await;
    let reject = |inner: &Inner, error: RemoteError, mut send: SendStream, mut recv: RecvStream| {
        inner.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer, %error, "rejected a request frame");
        let _ = recv.stop(STREAM_PROTOCOL);
        let inner_bytes = encode_remote_error(&error);
        async move {
            let header = Header {
                kind: FrameKind::Err,
                group: 0,
                target: 0,
                length: inner_bytes.len() as u32,
            };
            let _ = send.write_all(&header.encode()).await;
            let _ = send.write_chunk(inner_bytes).await;
            let _ = send.finish();
        }
    };
    let (head, body) = match read {
        Err(_elapsed) => {
            let reason = "request not complete within request_read_timeout".to_string();
            reject(&inner, RemoteError::Protocol { reason }, send, recv).await;
            return;
        }
        Ok(Err(ReadFail::Stream(_))) => return,
        Ok(Err(ReadFail::Frame(FrameError::TooLarge { length, max_bytes }))) => {
            let error = RemoteError::TooLarge {
                bytes: u64::from(length),
                max_bytes,
            };
            reject(&inner, error, send, recv).await;
            return;
        }
        Ok(Err(ReadFail::Frame(e))) => {
            let reason = e.to_string();
            reject(&inner, RemoteError::Protocol { reason }, send, recv).await;
            return;
        }
        Ok(Ok(Opening::Lane)) => return lane::serve(inner, peer, send, recv).await,
        Ok(Ok(Opening::Request(head, body))) => (head, body),
    };
    let kind = match head.kind {
        FrameKind::Control => MsgKind::Control,
        FrameKind::Bulk => MsgKind::Bulk,
        other => {
            let reason = format!("frame kind {other:?} where a request was expected");
            reject(&inner, RemoteError::Protocol { reason }, send, recv).await;
            return;
        }
    };
    let _ = send.set_priority(priority(kind));
    let req = Request {
        group: head.group,
        target_replica: head.target,
        kind,
        body,
    };
    let answer = tokio::select! {
        answer = inner.handler.handle(peer, req) => answer,
        _ = inner.cancel.cancelled() => Err(RemoteError::ShuttingDown),
    };
    let (kind, body) = answer_frame(&inner, answer);
    let header = Header {
        kind,
        group: head.group,
        target: head.target,
        length: body.len() as u32,
    };
    let _ = write_frame(&mut send, header, body, &inner).await;
}

/// The kind (`Ok` or `Err`) and body that answer a handler's `answer`.
/// Counts unknown targets; an answer that would break the caller's
/// `message_bytes_max` is replaced by an `Internal` error saying so.
pub(super) fn answer_frame(
    inner: &Inner,
    answer: Result<Bytes, RemoteError>,
) -> (FrameKind, Bytes) {
    let error = match answer {
        Ok(body) if body.len() as u64 <= inner.limits.message_bytes_max => {
            return (FrameKind::Ok, body);
        }
        Ok(body) => RemoteError::Internal {
            reason: format!("response of {} bytes exceeds message_bytes_max", body.len()),
        },
        Err(error) => {
            if matches!(
                error,
                RemoteError::UnknownGroup { .. } | RemoteError::UnknownReplica { .. }
            ) {
                inner.stats.unknown_targets.fetch_add(1, Ordering::Relaxed);
            }
            error
        }
    };
    (FrameKind::Err, encode_remote_error(&error))
}
