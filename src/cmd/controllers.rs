//! The controllers a cell-operator subcommand (`stele cell`, `node`,
//! `tablet`, `intent`) talks to, and its output switch.

use clap::Args;
use stele_client::admin::Admin;

/// Where a local controller listens by default (`stele dev --nodes N`).
pub const DEFAULT_CONTROLLERS: &str = "http://127.0.0.1:7450";

#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The cell's controllers: `URL,...` (any one will do).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_CONTROLLERS, env = "STELE_CONTROLLERS")]
    pub controllers: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A leader-following admin client of the target's controllers.
pub fn admin(t: &Target) -> anyhow::Result<Admin> {
    Ok(Admin::with_tls(
        t.controllers.clone(),
        crate::security::cli(),
    )?)
}
