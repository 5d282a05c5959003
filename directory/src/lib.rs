//! The global directory: which cell holds each namespace, and the registry
//! of cells. A small Raft quorum of its own (built on
//! `stele_quorum`), never on the data path: clients and nodes
//! resolve a namespace once and cache the answer; clients keep it current
//! from the pushed namespace map (`WatchNamespaces`).

pub mod backup;
pub mod console;
pub mod metrics;
pub mod server;
pub mod state;
pub mod watch;

pub use server::{Directory, DirectoryOptions};
