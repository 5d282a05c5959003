//! The directory's metrics, through the `metrics` facade (the binary
//! exports them; docs/OPERATIONS.md "Metrics"): lookups counted as they
//! are answered, the state's gauges set when a scrape asks ([`observe`]).
//! Every member applies the same state: take `max` over the members.

use std::collections::BTreeMap;

use ::metrics::{counter, gauge};
use tonic::{Code, Status};

use crate::server::Directory;

/// Lookup results as the counter labels them.
const RESULTS: [&str; 3] = ["found", "not_found", "error"];

/// One `GetNamespace` answered (a created-on-first-use namespace is found).
pub(crate) fn record_lookup<T>(r: &Result<T, Status>) {
    let result = match r {
        Ok(_) => "found",
        Err(s) if s.code() == Code::NotFound => "not_found",
        Err(_) => "error",
    };
    counter!("stele_directory_lookups_total", "result" => result).increment(1);
}

/// Sets the directory's gauges from `d`'s applied state; run by the binary
/// before each render.
pub fn observe(d: &Directory) {
    for r in RESULTS {
        counter!("stele_directory_lookups_total", "result" => r).increment(0);
    }
    gauge!("stele_directory_leader").set(if d.quorum.is_leader() { 1.0 } else { 0.0 });
    let s = d.quorum.state();
    gauge!("stele_directory_generation").set(s.generation as f64);
    gauge!("stele_directory_cells").set(s.cells.len() as f64);
    // Bounded by the cells: a directory holds tens of them, not thousands.
    let mut by_cell: BTreeMap<&str, u64> = s.cells.keys().map(|c| (c.as_str(), 0)).collect();
    for ns in s.namespaces.values() {
        *by_cell.entry(ns.cell.as_str()).or_default() += 1;
    }
    for (cell, n) in by_cell {
        gauge!("stele_directory_namespaces", "cell" => cell.to_string()).set(n as f64);
    }
}
