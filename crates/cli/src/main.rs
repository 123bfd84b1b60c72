//! The `hako` command line.

mod backend;
mod cmd;
mod exit;
mod log;

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
    log::init();
    cmd::dispatch(parse())
}

/// `hako run` on its own: the subcommand started most often, and the one
/// whose cold start is measured, parsed without building every other
/// subcommand's arguments first.
#[derive(Debug, Parser)]
#[command(name = "hako")]
struct RunOnly {
    #[command(subcommand)]
    command: RunOnlyCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RunOnlyCommand {
    Run(cmd::RunArgs),
}

/// Parses the command line. `hako run ...` is tried with [`RunOnly`] first;
/// anything it does not accept (help, a bad flag, another subcommand) is
/// parsed by the full [`Cli`], so that every message is the full one.
fn parse() -> cmd::Command {
    if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
        if let Ok(RunOnly {
            command: RunOnlyCommand::Run(args),
        }) = RunOnly::try_parse()
        {
            return cmd::Command::Run(args);
        }
    }
    Cli::parse().command
}
