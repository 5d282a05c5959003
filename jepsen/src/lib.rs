//! Fault injection against real `stele` processes and history checking.
//!
//! - [`history`]: the history format (invoke/ok/fail/info events).
//! - [`checker::list_append`]: the list-append checker.
//! - [`cell`]: a cell of real `stele server` processes with kill, pause and
//!   partition (through the transport's peer filter).
//! - [`run`]: one run: clients, a nemesis, heal, final reads, check, store.
//!
//! The `stele-jepsen` binary runs one seeded run or the CI smoke. Nothing
//! else may depend on this crate.

pub mod cell;
pub mod checker;
pub mod history;
pub mod run;
