//! Fault injection against real `stele` processes and history checking.
//!
//! Nothing is built here yet (see the jepsen issue). Nothing may depend on
//! this crate.
