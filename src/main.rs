mod ops;

use clap::{Parser, Subcommand};

// Temporary wiring of the client subcommands so they can be run; the
// integrator owns this file and replaces it.
#[derive(Parser)]
#[command(name = "stele")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Append one record.
    Append(ops::AppendArgs),
    /// Print records of a key or a namespace.
    Scan(ops::ScanArgs),
    /// Measure durable appends against a cell, or the device with --fsync-probe.
    Bench(ops::BenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Append(args) => ops::run_append(args).await,
        Command::Scan(args) => ops::run_scan(args).await,
        Command::Bench(args) => ops::run_bench(args).await,
    }
}
