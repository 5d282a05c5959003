//! Checkers: each turns a paired history (and the state read after
//! healing) into a report of anomalies; an empty report is a pass.

pub mod list_append;
pub mod register;
pub mod set;
