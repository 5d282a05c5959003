//! Stele storage node: journal, segments, catalog, tablets and their Raft glue.

pub mod catalog;
pub mod error;
pub mod fsutil;

pub use error::{Error, Result};
