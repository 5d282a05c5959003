//! Helpers shared by the node's integration tests.

use std::sync::Arc;
use std::time::Duration;

use stele_node::{Node, NodeOptions};

/// Opens a node on a data directory a just-stopped node of this process
/// used: the old node's last references (Raft tasks winding down) can
/// outlive its `shutdown` by a moment under load, holding the catalog's
/// lock, so the open is retried on that one error for a few seconds.
pub async fn open_when_released(opts: NodeOptions) -> Arc<Node> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match Node::open(opts.clone()).await {
            Ok(node) => return node,
            Err(e)
                if e.to_string().contains("Cannot acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("open node: {e}"),
        }
    }
}
