//! `stele`: one binary, roles and operator commands by subcommand.
//!
//! This file is the command line (clap) and its dispatch only: each
//! subcommand's flags and work are in its module under `cmd/`, the server
//! assembly in `server.rs` (and `dev_cell.rs` for a cell of child
//! processes), the storage flags they share in `tuning.rs`. Behaviour lives
//! in `stele-node` (the server) and `stele-client` (everything that talks
//! to one).

mod addresses;
mod cmd;
mod config;
mod console;
mod dev_cell;
mod gateway;
mod http;
mod logging;
mod metrics;
mod otel;
mod security;
mod server;
mod stop;
mod switches;
mod tuning;

use clap::{CommandFactory, Subcommand};

#[derive(clap::Parser)]
#[command(
    name = "stele",
    version = VERSION,
    about = "Stele: a Raft-replicated, multi-tablet storage cluster"
)]
struct Cli {
    /// TLS for the commands that call a cell: DIR/ca.pem (the cell CA) and,
    /// when present, DIR/operator.pem + operator.key (the operator API).
    #[arg(long, env = "STELE_CERTS_DIR")]
    certs_dir: Option<std::path::PathBuf>,
    /// A file holding the namespace token data commands send (or set
    /// STELE_TOKEN; never on the command line).
    #[arg(long, env = "STELE_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// How log lines are written to stderr (levels: RUST_LOG).
    #[arg(long, env = "STELE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: logging::LogFormat,
    /// Export the servers' tracing spans to this OpenTelemetry collector
    /// (OTLP/gRPC, e.g. http://127.0.0.1:4317; or set
    /// OTEL_EXPORTER_OTLP_ENDPOINT). Needs a build with the `otel` feature.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a single-node cell on embedded defaults (plaintext, loopback).
    Dev(Box<cmd::dev::DevArgs>),
    /// Run a storage node, a controller, or both (`--roles`).
    Server(Box<cmd::server::ServerArgs>),
    /// Create and inspect a controller-managed cell.
    #[command(subcommand)]
    Cell(cmd::cell::CellCommand),
    /// Storage nodes of a cell: list, drain, decommission.
    #[command(subcommand, name = "node")]
    NodeCmd(cmd::node::NodeCommand),
    /// Tablets of a cell: list, show, move, transfer leadership, split.
    #[command(subcommand)]
    Tablet(cmd::tablet::TabletCommand),
    /// Operator intents (moves, transfers, splits): show, abort.
    #[command(subcommand)]
    Intent(cmd::intent::IntentCommand),
    /// The global directory quorum: create it, see its state.
    #[command(subcommand)]
    Directory(cmd::directory::DirectoryCommand),
    /// Namespaces: create, list, show, update (through the directory).
    #[command(subcommand)]
    Ns(cmd::ns::NsCommand),
    /// Append one record.
    Append(cmd::append::AppendArgs),
    /// Read records of a key or a namespace.
    Scan(cmd::scan::ScanArgs),
    /// Measure durable appends against a running cell, or the raw fsync rate of a device.
    Bench(cmd::bench::BenchArgs),
    /// Print one node's counters (journal, seals, peers, pacer).
    Status(cmd::status::StatusArgs),
    /// Cell CA and node certificates for node-to-node mutual TLS.
    #[command(subcommand)]
    Cert(cmd::cert::CertCommand),
    /// Namespace tokens for clients of the data API: issue, revoke, list.
    #[command(subcommand)]
    Token(cmd::token::TokenCommand),
    /// Rebuild a cell's tablets from its object store into a new data directory.
    Restore(cmd::restore::RestoreArgs),
    /// `stele server` config files: check one, print the default.
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
    /// Probe a server's HTTP status listener (`/readyz`, `/healthz`): exit 0 only on 200.
    Health(cmd::health::HealthArgs),
    /// Print a shell completion script: `source <(stele completions bash)`.
    Completions(cmd::completions::CompletionsArgs),
    /// Simulations that measure the controllers at full size.
    #[command(subcommand)]
    Sim(cmd::sim::SimCommand),
    /// Run an HTTP/JSON gateway to a cell: stateless, any number side by side.
    Gateway(gateway::GatewayArgs),
}

fn main() -> std::process::ExitCode {
    // Before anything else runs: a build without `fault-injection` refuses
    // the unsafe switches rather than ignoring them.
    if let Err(refused) = switches::check_environment() {
        eprintln!("error: {refused}");
        return std::process::ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the cause chain; RUST_BACKTRACE stays for panics.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The version this binary reports (`stele --version`, heartbeats, cell
/// status): the crate version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("STELE_BUILD_LABEL"),
    ")"
);

fn run() -> anyhow::Result<()> {
    stele_proto::formats::set_binary_version(VERSION.into());
    let cli: Cli = config::parse_cli()?;
    if let Command::Completions(a) = cli.command {
        // No runtime, logging or credentials: the script is all it prints.
        return cmd::completions::run(a, Cli::command());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (exports, who) = telemetry(&cli.command);
    let env = std::env::var(otel::ENDPOINT_ENV).ok();
    let choice = otel::choose(cli.otlp_endpoint.as_deref(), env, exports)?;
    let flush = {
        // The exporter's gRPC channel starts on the runtime.
        let _entered = runtime.enter();
        let export = match (&choice, &who) {
            (otel::Choice::Export(url), Some(who)) => Some((url.as_str(), who)),
            _ => None,
        };
        logging::init(cli.log_format, export)?
    };
    if let otel::Choice::Unsupported(url) = &choice {
        tracing::warn!(
            "{}={url} is set, but this stele was built without the otel feature: no spans are exported",
            otel::ENDPOINT_ENV
        );
    }
    security::set_cli(cli.certs_dir.as_deref(), cli.token_file.as_deref())?;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Dev(a) => cmd::dev::run(*a).await,
            Command::Server(a) => cmd::server::run(*a).await,
            Command::Cert(c) => cmd::cert::run(c),
            Command::Token(c) => cmd::token::run(c).await,
            Command::Append(a) => cmd::append::run(a).await,
            Command::Scan(a) => cmd::scan::run(a).await,
            Command::Bench(a) => cmd::bench::run(a).await,
            Command::Status(a) => cmd::status::run(a).await,
            Command::Cell(c) => cmd::cell::run(c).await,
            Command::NodeCmd(c) => cmd::node::run(c).await,
            Command::Tablet(c) => cmd::tablet::run(c).await,
            Command::Intent(c) => cmd::intent::run(c).await,
            Command::Directory(c) => cmd::directory::run(c).await,
            Command::Ns(c) => cmd::ns::run(c).await,
            Command::Restore(a) => cmd::restore::run(a).await,
            Command::Config(c) => cmd::config::run(c),
            Command::Health(a) => cmd::health::run(a).await,
            Command::Sim(c) => cmd::sim::run(c).await,
            Command::Gateway(a) => gateway::run(a).await,
            Command::Completions(_) => unreachable!("handled before the runtime starts"),
        }
    });
    // Buffered spans go out while the runtime still runs.
    flush.run();
    result
}

/// Whether `command` runs servers whose spans can be exported (or hands
/// the collector to its children: a dev cell), and who its process is.
fn telemetry(command: &Command) -> (bool, Option<otel::Identity>) {
    match command {
        Command::Server(a) => (true, Some(a.telemetry())),
        Command::Dev(a) => (true, a.telemetry()),
        _ => (false, None),
    }
}
