//! A transport's settings and their check.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::error::{Error, Result};
use super::resolve::{Resolve, SystemResolver};
use crate::certs::NodeIdentity;

/// Settings of a transport; `new` fills in the defaults.
#[derive(Debug, Clone)]
pub struct TransportOptions {
    pub node_id: u64,
    pub listen: SocketAddr,
    pub identity: NodeIdentity,
    /// Largest request or response body, checked before allocating.
    pub message_bytes_max: u64,
    /// Bound on handshake + hello, each way.
    pub connect_timeout: Duration,
    /// A connection with no traffic (keep-alives included) for this long is closed.
    pub idle_timeout: Duration,
    pub keepalive: Duration,
    /// Bound on receiving one whole request frame, on a request stream or
    /// (once its first byte is in) on a control lane.
    pub request_read_timeout: Duration,
    /// Control requests up to this size share the connection's control
    /// lane; larger ones get a stream of their own so they cannot hold
    /// the lane up.
    pub control_lane_body_bytes_max: u64,
    /// Control requests queued on one lane for its writer; more callers wait.
    pub control_queue_max: usize,
    /// Control calls from one lane being handled, or answered but not yet
    /// written, at once; the lane's reader waits beyond that.
    pub control_inflight_max: usize,
    /// Concurrent streams a peer may open on one connection; more wait.
    pub streams_max: u32,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    /// Looks up a peer's `HOST:PORT` on every dial.
    pub resolver: Arc<dyn Resolve>,
}

impl TransportOptions {
    pub fn new(node_id: u64, listen: SocketAddr, identity: NodeIdentity) -> TransportOptions {
        TransportOptions {
            node_id,
            listen,
            identity,
            message_bytes_max: 64 << 20,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            keepalive: Duration::from_secs(5),
            request_read_timeout: Duration::from_secs(60),
            control_lane_body_bytes_max: 64 << 10,
            control_queue_max: 4096,
            control_inflight_max: 4096,
            streams_max: 1024,
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(2),
            resolver: Arc::new(SystemResolver),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |s: &str| Err(Error::Config(s.to_string()));
        if self.identity.node_id() != self.node_id {
            return Err(Error::Config(format!(
                "node_id {} but the certificate names node {}",
                self.node_id,
                self.identity.node_id()
            )));
        }
        if self.message_bytes_max == 0 || self.message_bytes_max > u64::from(u32::MAX) {
            return bad("message_bytes_max must be in 1..=u32::MAX");
        }
        if self.connect_timeout.is_zero() || self.request_read_timeout.is_zero() {
            return bad("connect_timeout and request_read_timeout must be positive");
        }
        if self.keepalive.is_zero() || self.keepalive >= self.idle_timeout {
            return bad("keepalive must be positive and shorter than idle_timeout");
        }
        if self.streams_max == 0 {
            return bad("streams_max must be positive");
        }
        if self.control_queue_max == 0
            || self.control_inflight_max == 0
            || self.control_inflight_max >= Semaphore::MAX_PERMITS
        {
            return bad("control_queue_max and control_inflight_max must be positive");
        }
        if self.reconnect_backoff_min.is_zero()
            || self.reconnect_backoff_min > self.reconnect_backoff_max
        {
            return bad("need 0 < reconnect_backoff_min <= reconnect_backoff_max");
        }
        Ok(())
    }
}
