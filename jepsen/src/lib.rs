//! Fault injection against real `stele` processes and history checking.
//!
//! Built so far: the history format ([`history`]) and the list-append
//! checker ([`checker::list_append`]). The runner, nemeses and workloads
//! come with the jepsen issue; nothing else may depend on this crate.

pub mod checker;
pub mod history;
