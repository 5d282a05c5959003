//! The cell controller: node membership and health leases, placement, the
//! tablet table, move orchestration and the route map.
//!
//! - [`state`]: the replicated state and its commands (one openraft group of
//!   1, 3 or 5 controllers, through `stele_quorum`).
//! - [`placement`]: pure placement, repair, balance and validation logic.
//! - [`autosplit`]: pure automatic split and merge decisions from load.
//! - [`health`]: the leader's soft state (heartbeats, leases, reports,
//!   load samples), pure, with the clock passed in.
//! - [`scheduler`]: what the leader proposes in one pass, a pure function
//!   of the state, the health view and the time.
//! - [`driver`]: proposes what the scheduler plans, once per tick.
//! - [`restart`]: making a node safe to restart (quorum check, leader
//!   hand-off), the plan pure.
//! - [`api`]: the gRPC API.
//! - [`routes_feed`]: route changes pushed to watching clients.
//! - [`server`]: a controller process: its quorum, services and driver.
//! - [`backup`]: the leader's backups of the cell state to the bucket.
//! - [`tokens`]: namespace tokens: signing keys, issue, revoke, what
//!   nodes verify with.
//! - [`orders`]: what a heartbeat answer orders a node to do.
//! - [`load`]: each node's recent load (bounded rings) for the console.
//! - [`console`]: the console's view of the cell, a pure function of the
//!   state and the health view.

pub mod api;
pub mod autosplit;
pub mod backup;
pub mod book;
pub mod console;
mod driver;
pub mod error;
pub mod formats;
pub mod health;
mod heartbeat;
pub mod load;
pub mod metrics;
pub mod orders;
pub mod placement;
pub mod restart;
pub mod routes_feed;
pub mod scheduler;
pub mod server;
pub mod state;
pub mod tokens;

pub use error::{Error, Result};
pub use server::{Controller, ControllerOptions};
