//! Routing client for Stele cells.
//!
//! ```text
//! Client::append(ns, records)
//!   ├─ validate (stele_proto::limits) ─ refuse before any byte is sent
//!   ├─ vshard(ns, routing key) ─▶ RouteTable ─▶ one group per tablet
//!   └─ per group: AppendRequest{tablet, generation, batch_id} ─▶ leader
//!         Retry kind    ─▶ backoff with jitter, same batch_id
//!         Redirect kind ─▶ fix routes (StaleRoute / NotLeader / TabletNotFound), same batch_id
//!         Refuse kind   ─▶ return at once
//! ```
//!
//! Code map:
//! - [`client`]: the handle to a cell, its options, route loading, channels
//!   and the one timed attempt.
//! - `append`, `read`, `scan`: the data calls; each says only where an
//!   attempt goes, how to send it and what its reply means.
//! - `driver`: the one retry loop every data call runs through (attempts,
//!   backoff with jitter, deadline, route repairs on redirects).
//! - [`retry`]: the retry policy, pure.
//! - [`routes`]: the route cache, pure.
//! - `watch`: keeps the cache current from the controllers' pushed route
//!   changes.
//! - [`records`]: record helpers and the limits checked before sending.
//! - [`admin`]: the leader-following client of a quorum (controllers,
//!   directory), shared with the node's agent and ownership lookups.
//! - [`batcher`]: coalesces small appends; [`global`]: routes across cells
//!   through the directory.
//!
//! One tonic channel is kept per endpoint, because a tablet's leader may
//! live on any node of the cell.
//!
//! **Architecture invariant:** this crate depends on no workspace crate but
//! `stele-proto`.
//!
//! **Architecture invariant:** every data call retries through
//! `driver`; no other module loops over attempts.

pub mod admin;
mod append;
pub mod batcher;
pub mod client;
mod driver;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod global;
mod read;
pub mod records;
pub mod retry;
pub mod routes;
mod scan;
mod watch;

pub use append::AppendOutcome;
pub(crate) use append::new_batch_id;
pub use batcher::{Batcher, BatcherOptions};
pub use client::{Client, ClientOptions, RouteStats};
pub use error::{Error, Result};
pub use global::{GlobalClient, Placement};
pub use read::ScanPage;
pub use records::{chunk, record, record_bytes, record_vshard, validate};
pub use retry::RetryPolicy;
pub use routes::{Route, RouteTable};
pub use scan::NsCursor;
pub use stele_proto::pb::{
    Condition, Consistency, Position, ReadOptions, Record, Row, StatusResponse, TabletDescriptor,
};
