//! The cell controller: node membership and health leases, placement, the
//! tablet table, move orchestration and the route map.
//!
//! - [`state`]: the replicated state and its commands (one openraft group of
//!   1, 3 or 5 controllers, through `stele_node::raft::quorum`).
//! - [`placement`]: pure placement, repair, balance and validation logic.
//! - [`server`]: a controller process: gRPC API, health leases and the
//!   scheduler that places, repairs and finishes intents while it leads.

pub mod autosplit;
pub mod placement;
pub mod server;
pub mod state;

pub use server::{Controller, ControllerOptions};
