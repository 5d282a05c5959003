//! What a transport knows about one peer node, and the rule that picks one
//! connection when both nodes dial each other at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::lane::Lanes;

/// Whether a node `local` refuses an incoming connection from `remote`
/// because the pair already has (or is about to have) the winning one.
///
/// The winner is the connection dialed by the smaller node id. `local`
/// refuses only when it is the smaller id and its own dial is in flight or
/// live; the larger id always accepts. Both sides apply the same rule, so
/// exactly one of two simultaneous dials survives. A connection from a
/// peer that restarted (its hello names another boot id than the live
/// connection's) replaces the old one, which is dead even if QUIC has not
/// noticed yet (a killed process sends no close, and its successor cannot
/// reset the old connection: its reset key is new).
pub(super) fn refuse_incoming(
    local: u64,
    remote: u64,
    dialing: bool,
    live_dialed_by_us: bool,
    peer_restarted: bool,
) -> bool {
    local < remote && (dialing || (live_dialed_by_us && !peer_restarted))
}

/// The pair's connection and what rides on it.
#[derive(Clone)]
pub(super) struct Link {
    pub conn: quinn::Connection,
    pub dialed_by_us: bool,
    /// The peer process's boot id from the hello exchange (0: unknown).
    pub remote_boot: u64,
    pub lanes: Arc<Lanes>,
}

impl Link {
    pub fn new(conn: quinn::Connection, dialed_by_us: bool, remote_boot: u64) -> Link {
        Link {
            conn,
            dialed_by_us,
            remote_boot,
            lanes: Arc::default(),
        }
    }
}

pub(super) struct PeerState {
    /// Where the peer listens, resolved on each dial.
    pub addr: Option<stele_proto::addr::HostPort>,
    pub conn: Option<Link>,
    pub dialing: bool,
    pub backoff: Duration,
    pub next_dial_at: Option<Instant>,
}

pub(super) struct Peer {
    pub id: u64,
    /// Held by the one task dialing this peer.
    pub dial_lock: tokio::sync::Mutex<()>,
    pub state: Mutex<PeerState>,
    /// Woken whenever a connection is installed.
    pub installed: Notify,
}

impl Peer {
    pub fn new(id: u64) -> Peer {
        Peer {
            id,
            dial_lock: tokio::sync::Mutex::new(()),
            state: Mutex::new(PeerState {
                addr: None,
                conn: None,
                dialing: false,
                backoff: Duration::ZERO,
                next_dial_at: None,
            }),
            installed: Notify::new(),
        }
    }

    pub fn live_link(&self) -> Option<Link> {
        let st = self.state.lock().unwrap();
        st.conn
            .as_ref()
            .filter(|l| l.conn.close_reason().is_none())
            .cloned()
    }

    /// Waits until a live connection is installed, or `deadline`.
    pub async fn wait_installed(&self, deadline: Instant) -> Option<Link> {
        loop {
            let notified = self.installed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(link) = self.live_link() {
                return Some(link);
            }
            tokio::time::timeout_at(deadline, notified).await.ok()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_incoming;

    #[test]
    fn simultaneous_dials_leave_one_winner() {
        // Both sides dialing: only the smaller refuses, so the smaller's
        // connection is the one both keep.
        for (a, b) in [(1, 2), (2, 1), (7, 400)] {
            let a_refuses = refuse_incoming(a, b, true, false, false);
            let b_refuses = refuse_incoming(b, a, true, false, false);
            assert!(a_refuses ^ b_refuses, "{a} {b}");
            assert_eq!(a_refuses, a < b);
        }
        // Smaller side's dial already live: still refuses the late one...
        assert!(refuse_incoming(1, 2, false, true, false));
        // ...unless the peer restarted: its live connection is dead.
        assert!(!refuse_incoming(1, 2, false, true, true));
        // Nothing going on: accept (first contact or a restarted peer).
        assert!(!refuse_incoming(1, 2, false, false, false));
        // The larger side always accepts.
        assert!(!refuse_incoming(2, 1, true, true, false));
    }
}
