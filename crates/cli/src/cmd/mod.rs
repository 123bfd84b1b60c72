//! Subcommands, one file each.

mod bench;
mod doctor;
mod fs;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use hako_core::env::EnvPolicy;
use hako_core::units;

use crate::backend::{BackendArg, SandboxSpec};

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox.
    Run(run::RunArgs),
    /// Read, write and list files in a sandbox, through the fence.
    Fs(fs::FsArgs),
    /// Show which backends work on this host, and why the others don't.
    Doctor(doctor::DoctorArgs),
    /// Measure backends against the reference tools on this host.
    Bench(bench::BenchArgs),
}

/// Runs a subcommand and returns the process exit code.
pub fn dispatch(command: Command) -> ExitCode {
    let code = match command {
        Command::Run(args) => run::run(args),
        Command::Fs(args) => fs::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Bench(args) => bench::run(args),
    };
    ExitCode::from(code)
}

/// Flags that pick and shape a sandbox, shared by `run` and `fs`.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// Backend to use.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// Sandbox root [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Set a variable inside the sandbox (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Pass a host variable (repeatable; `PREFIX*` passes non-secret names).
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Bytes kept of each of stdout and stderr (e.g. 512K, 10M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1M")]
    pub max_output: usize,
}

impl SandboxArgs {
    /// The backend-neutral settings these flags describe.
    pub fn spec(&self) -> std::io::Result<SandboxSpec> {
        let workspace = match &self.workspace {
            Some(dir) => dir.clone(),
            None => std::env::current_dir()?,
        };
        Ok(SandboxSpec {
            workspace,
            env: EnvPolicy {
                pass: self.pass_env.clone(),
                set: self.env.clone(),
            },
            max_output: self.max_output,
        })
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if !hako_core::env::valid_name(k) {
        return Err(format!("invalid variable name {k:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn parse_size(s: &str) -> Result<usize, String> {
    let n = units::parse_size(s).map_err(|e| e.to_string())?;
    usize::try_from(n).map_err(|_| format!("size {s} is too large"))
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}
