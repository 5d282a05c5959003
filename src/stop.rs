//! Graceful stop of a node process on SIGTERM or Ctrl-C: every tablet it
//! leads is handed to a caught-up voter (`Node::drain_leadership`), then the
//! data API stops taking calls and lets those in flight end, then the
//! caller shuts the node down (journal synced and closed). The whole stop
//! is bounded by `--shutdown-deadline-ms`; a second signal cuts the
//! hand-off short. Controller and directory members stop at once: their
//! quorum elects a new leader (OPERATIONS.md, "Graceful stop").

use std::time::Duration;

use stele_node::Node;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// SIGTERM and SIGINT, as one stream.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT.
    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Hands off leaderships, then stops `server` (the data API, cancelled by
/// `cancel`) and waits for its in-flight calls, all within the node's
/// drain deadline. Returns when the caller may shut the node down.
pub async fn graceful(
    node: &Node,
    signals: &mut Signals,
    cancel: &CancellationToken,
    server: tokio::task::JoinHandle<stele_node::Result<()>>,
) {
    // Probes say "not ready" from the first moment of the stop.
    crate::http::health().set_ready(false);
    let deadline = node.options.drain_deadline;
    let until = tokio::time::Instant::now() + deadline;
    eprintln!(
        "stele: stopping: handing off leaderships (deadline {} ms; a second signal stops at once)",
        deadline.as_millis()
    );
    tokio::select! {
        report = node.drain_leadership(deadline) => {
            eprintln!(
                "stele: handed off {} tablets in {} ms; {} still led here",
                report.handed_off,
                report.elapsed.as_millis(),
                report.still_leading
            );
        }
        _ = signals.next() => {
            eprintln!("stele: second signal: stopping without waiting for the hand-off");
        }
    }
    // Leaders have moved: clients sent here are redirected. Stop taking
    // calls and let those in flight end, within what is left.
    cancel.cancel();
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    if tokio::time::timeout(left.max(Duration::from_millis(100)), server)
        .await
        .is_err()
    {
        eprintln!("stele: deadline reached with calls in flight: stopping anyway");
    }
}
