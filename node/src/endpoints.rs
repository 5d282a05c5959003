//! The node's address book: the client endpoint of each node of the cell
//! (for leader hints in redirects and descriptors) and the node-to-node
//! transport, once it exists (for its counters in status).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use crate::transport::{Transport, TransportStats};

pub struct Endpoints {
    node_id: u64,
    /// This node's client endpoint, advertised in routes.
    advertise: String,
    /// Endpoints given at start-up (a static cell's peers).
    fixed: BTreeMap<u64, String>,
    /// Endpoints learned from the controller.
    learned: RwLock<BTreeMap<u64, String>>,
    /// The transport is bound before the node opens (its groups need it)
    /// and handed over afterwards, for status only.
    transport: OnceLock<Arc<Transport>>,
    /// Peer endpoints from the controller that could not be dialled.
    bad_peer_endpoints: AtomicU64,
}

impl Endpoints {
    pub fn new(node_id: u64, advertise: String, fixed: BTreeMap<u64, String>) -> Endpoints {
        Endpoints {
            node_id,
            advertise,
            fixed,
            learned: Default::default(),
            transport: OnceLock::new(),
            bad_peer_endpoints: AtomicU64::new(0),
        }
    }

    /// Records the client endpoints of other nodes (from the controller).
    pub fn learn(&self, endpoints: impl IntoIterator<Item = (u64, String)>) {
        let mut map = self.learned.write().expect("lock poisoned");
        for (node, ep) in endpoints {
            map.insert(node, ep);
        }
    }

    /// The client endpoint of `node`, or empty if unknown.
    pub fn endpoint_of(&self, node: u64) -> String {
        if node == self.node_id {
            return self.advertise.clone();
        }
        if let Some(ep) = self.fixed.get(&node) {
            return ep.clone();
        }
        self.learned
            .read()
            .expect("lock poisoned")
            .get(&node)
            .cloned()
            .unwrap_or_default()
    }

    /// Counts a peer endpoint the controller sent that cannot be dialled.
    pub fn count_bad_peer_endpoint(&self) {
        self.bad_peer_endpoints.fetch_add(1, Ordering::Relaxed);
    }

    pub fn bad_peer_endpoints(&self) -> u64 {
        self.bad_peer_endpoints.load(Ordering::Relaxed)
    }

    /// Lets status report the transport's counters (the first call wins).
    pub fn set_transport(&self, transport: Arc<Transport>) {
        let _ = self.transport.set(transport);
    }

    /// The transport's counters, if this node has peers.
    pub fn transport_stats(&self) -> Option<TransportStats> {
        self.transport.get().map(|t| t.stats())
    }
}
