//! `stele config check FILE` and `stele config default`: a `stele server`
//! config file checked exactly as the server reads it, and the file of
//! every key with its default (`crate::config`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, FromArgMatches, Subcommand};

use crate::cmd::server::ServerArgs;
use crate::config;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Read FILE as `stele server --config FILE` would (STELE_* environment
    /// variables included) and print `ok`, or fail naming the key.
    Check { file: PathBuf },
    /// Print a commented config file of every key, its help, its
    /// environment variable and its default.
    Default,
}

/// The `stele server` command with its environment variables and `--config`.
fn server_command() -> clap::Command {
    config::prepare(ServerArgs::augment_args(clap::Command::new(config::SERVER)))
}

pub fn run(c: ConfigCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match c {
        ConfigCommand::Check { file } => {
            let (_args, m) = config::parse_server_file::<ServerArgs>(&file)?;
            // The server reads the secrets' files at start: so does the check.
            crate::tuning::ColdTierArgs::from_arg_matches(&m)?.credentials()?;
            writeln!(out, "ok: {}", file.display())?;
        }
        ConfigCommand::Default => write!(out, "{}", config::default_file(&server_command()))?,
    }
    Ok(())
}

/// Every environment variable `stele server` reads a setting from (a dev
/// cell clears them for its children, which take every setting as flags).
pub fn server_env_vars() -> Vec<String> {
    server_command()
        .get_arguments()
        .filter_map(|a| Some(a.get_env()?.to_string_lossy().into_owned()))
        .collect()
}
