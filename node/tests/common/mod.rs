//! Helpers shared by the node's integration tests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use stele_node::{Node, NodeOptions};

/// Opens a node on a data directory a just-stopped node of this process
/// used: the old node's last references (Raft tasks winding down) can
/// outlive its `shutdown` by a moment under load, holding the catalog's
/// lock, so the open is retried on that one error for a few seconds.
#[allow(dead_code)] // not every test binary opens nodes this way
pub async fn open_when_released(opts: NodeOptions) -> Arc<Node> {
    open_retrying(|| Node::open(opts.clone())).await
}

/// `open` (a node open of any kind), retried as [`open_when_released`] says.
pub async fn open_retrying<F, Fut>(open: F) -> Arc<Node>
where
    F: Fn() -> Fut,
    Fut: Future<Output = stele_node::Result<Arc<Node>>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match open().await {
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
