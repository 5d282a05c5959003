//! Stele storage node: journal, segments, catalog, tablets and their Raft glue.

pub mod fsutil;
pub mod journal;
