//! Stele storage node: journal, segments, catalog, tablets and their Raft glue.
//!
//! See docs/ARCHITECTURE.md for the picture.

pub mod agent;
pub mod agent_sync;
pub mod catalog;
mod catalog_group;
pub mod cert_request;
pub mod certs;
pub mod disk;
pub mod endpoints;
pub mod error;
pub mod fixed;
pub mod fsutil;
// The decoders of untrusted bytes, for fuzz/ only.
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz_api;
pub mod journal;
pub mod load;
pub mod metrics;
pub mod node;
pub mod ownership;
pub mod peering;
pub mod policy;
pub mod raft;
pub mod replicas;
pub mod sealer;
pub mod segment;
pub mod service;
pub mod tablet;
pub mod tier;
pub mod trace;
pub mod transport;

pub use error::{Error, Result};
pub use node::{Node, NodeOptions};
