//! One module per subcommand of `stele`: its flags (a clap `Args` struct or
//! `Subcommand` enum) and its `run`. `main.rs` names them in the command
//! line and dispatches to them.
//!
//! ```text
//! dev, server          flags -> options -> crate::server / crate::dev_cell
//! append, scan, bench, status   the data API through stele-client (client.rs)
//! cell, node, tablet, intent, token   the controllers (controllers.rs)
//! directory, ns, cell register|list|retire (registry.rs)   the directory
//! cert, restore        local files: certificates, a restore from the bucket
//! config               `stele server` config files (crate::config)
//! ```

pub mod append;
pub mod bench;
pub mod cell;
pub mod cert;
pub mod client;
pub mod completions;
pub mod config;
pub mod controllers;
pub mod dev;
pub mod directory;
pub mod duration;
pub mod formats;
pub mod health;
pub mod intent;
pub mod node;
pub mod ns;
pub mod progress;
pub mod registry;
pub mod restore;
pub mod restore_cell;
pub mod scan;
pub mod server;
pub mod sim;
pub mod status;
pub mod table;
pub mod tablet;
pub mod token;
