//! The `hako` command line.

// The entry point is `main` below, not Rust's runtime start-up: see it.
#![cfg_attr(not(test), no_main)]

mod cmd;
mod exit;
mod log;
mod show;

use clap::Parser;

/// hako: run commands and touch files inside a sandbox whose strength is
/// typed and enforced.
#[derive(Debug, Parser)]
#[command(name = "hako", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

// The process's entry point: the C library calls `main`, defined here by
// the macro, in place of Rust's runtime start-up, which would first read
// all of `/proc/self/maps` to find where this thread's stack ends (about a
// tenth of `hako`'s start; see `hako_sys::start`).
#[cfg(not(test))]
hako_sys::entry_point!(run);
// A test build has the test harness's entry point instead.
#[cfg(test)]
const _: fn() -> u8 = run;

/// Everything `hako` does: its exit code. Started under one of the
/// guest's names (`hako-guest`: see `hako_guest_bin::is_guest_name`), it
/// is the guest, exactly as the `hako-guest` executable is; so a `hako`
/// installed alone carries its guest, which the driver starts from this
/// executable when no `hako-guest` is beside it (see
/// `hako_driver::connection::locate_guest`).
fn run() -> u8 {
    let mut args = std::env::args_os();
    let guest_name = args
        .next()
        .is_some_and(|argv0| hako_guest_bin::is_guest_name(&argv0));
    // gVisor's host view, which the gvisor backend starts from the static
    // guest's file by its path: a static `hako` standing in for that guest
    // (see `hako_container::locate_static_guest`) is started so too.
    let host_view = args
        .next()
        .is_some_and(|first| first == hako_gvisor::host_view::FLAG);
    if guest_name || host_view {
        return hako_guest_bin::main();
    }
    hako_driver::connection::set_carries_guest();
    log::init();
    // The egress proxies' connections are budgeted from the soft limit
    // (see `hako_net::ConnectionBudget`); without it, hako works with less.
    match hako_sys::rlimit::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(?limit, "open files limit"),
        Err(e) => tracing::debug!(error = %e, "cannot raise the open files limit"),
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn run_alone_parses_every_command_line_as_the_full_parser_does() {
        let lines: [&[&str]; 3] = [
            &["hako", "run", "--", "true"],
            &[
                "hako",
                "run",
                "--backend",
                "linux",
                "--timeout",
                "5s",
                "--env",
                "A=1",
                "--cwd",
                "sub",
                "--",
                "sh",
                "-c",
                "echo hi",
            ],
            &[
                "hako", "run", "--json", "--stdin", "--memory", "256M", "--", "cat",
            ],
        ];
        for argv in lines {
            let full = Cli::try_parse_from(argv).expect("the full parser takes it");
            let RunOnly {
                command: RunOnlyCommand::Run(args),
            } = RunOnly::try_parse_from(argv).expect("the run-only parser takes it");
            assert_eq!(
                format!("{:?}", full.command),
                format!("{:?}", cmd::Command::Run(args)),
                "{argv:?}"
            );
        }
        // What it refuses goes to the full parser, whose message is shown.
        assert!(RunOnly::try_parse_from(["hako", "run", "--bogus", "--", "true"]).is_err());
        assert!(RunOnly::try_parse_from(["hako", "fs", "ls", "."]).is_err());
    }
}
