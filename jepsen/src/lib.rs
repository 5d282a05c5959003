//! Fault injection against real `stele` processes and history checking.
//!
//! - [`history`]: the history format (invoke/ok/fail/info events).
//! - [`checker::list_append`]: the list-append checker.
//! - [`cell`]: a cell of real `stele server` processes with kill, pause,
//!   partitions and packet loss.
//! - [`gateway`]: `stele gateway` processes and the workload through them.
//! - [`netns`]: network namespaces behind a bridge and nftables rules.
//! - [`run`]: one run: clients, a nemesis, heal, final reads, check, store.
//! - [`s3proxy`]: a proxy in front of the S3 server for the `s3` nemesis.
//! - [`tls`]: the cell's certificates, and TLS on its gRPC.
//!
//! The `stele-jepsen` binary runs one seeded run or the CI smoke. Nothing
//! else may depend on this crate.

pub mod cell;
pub mod checker;
pub mod gateway;
pub mod history;
pub mod netns;
pub mod run;
pub mod s3proxy;
pub mod tls;
