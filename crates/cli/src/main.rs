//! The `hako` command line.

mod backend;
mod cmd;
mod exit;

use std::process::ExitCode;

use clap::Parser;

/// hako: run commands and touch files inside a sandbox whose strength is
/// typed and enforced.
#[derive(Debug, Parser)]
#[command(name = "hako", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAKO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    cmd::dispatch(cli.command)
}
