//! Subcommands, one file each.

mod audit;
mod bench;
mod checkpoint;
mod commit;
mod diff;
mod discard;
mod doctor;
mod fs;
mod gc;
mod image;
mod mcp;
mod named;
mod rm;
mod rollback;
mod run;
mod serve;
mod shell;
mod vm;

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Args, Subcommand, ValueEnum};
use hako_core::{Isolation, NetMode};
use hako_runtime::limits::{
    parse_cpus, parse_file_size, parse_handles, parse_max_output, parse_memory, parse_open_files,
    parse_pids,
};
use hako_runtime::{parse_key_value, parse_resolve, BackendArg, Plan, SandboxFlags};

pub use run::RunArgs;

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox.
    Run(run::RunArgs),
    /// Open an interactive shell in a sandbox, on this terminal.
    Shell(shell::ShellArgs),
    /// Read, write and list files in a sandbox, through the fence.
    Fs(fs::FsArgs),
    /// Show which backends work on this host, and why the others don't.
    Doctor(doctor::DoctorArgs),
    /// Measure backends against the reference tools on this host.
    Bench(bench::BenchArgs),
    /// Build local images for the container backends (no registry needed).
    Image(image::ImageArgs),
    /// Build the vm backend's guest image (kernel and initramfs).
    Vm(vm::VmArgs),
    /// Remove containers and bundles left by hako processes that are gone.
    Gc(gc::GcArgs),
    /// Check or show an audit log (`--audit FILE`).
    Audit(audit::AuditArgs),
    /// Serve the HTTP/JSON API to remote clients (a bearer token required).
    Serve(serve::ServeArgs),
    /// Serve an agent's tools over MCP (stdio, or HTTP with --http), each acting inside a sandbox.
    Mcp(mcp::McpArgs),
    /// Show what a copy-on-write sandbox changed, as a diff, and its hash.
    Diff(diff::DiffArgs),
    /// Apply a copy-on-write sandbox's changes (all or named) to the workspace.
    Commit(commit::CommitArgs),
    /// Throw away a copy-on-write sandbox's changes (all or named).
    Discard(discard::DiscardArgs),
    /// Remove a named sandbox and its state.
    Rm(rm::RmArgs),
    /// Record a named copy-on-write sandbox's layer as a checkpoint (or --list them).
    Checkpoint(checkpoint::CheckpointArgs),
    /// Return a named copy-on-write sandbox's layer to a checkpoint.
    Rollback(rollback::RollbackArgs),
}

/// Runs a subcommand and returns the process exit code.
pub fn dispatch(command: Command) -> u8 {
    match command {
        Command::Run(args) => run::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Shell(args) => shell::run(args),
        Command::Fs(args) => fs::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Image(args) => image::run(args),
        Command::Vm(args) => vm::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Diff(args) => diff::run(args),
        Command::Commit(args) => commit::run(args),
        Command::Discard(args) => discard::run(args),
        Command::Rm(args) => rm::run(args),
        Command::Checkpoint(args) => checkpoint::run(args),
        Command::Rollback(args) => rollback::run(args),
    }
}

/// `--backend NAME`: clap's view of [`BackendArg`], whose names are the
/// runtime's; only the help lines are the command line's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendFlag(pub BackendArg);

impl ValueEnum for BackendFlag {
    fn value_variants<'a>() -> &'a [Self] {
        const ALL: [BackendFlag; BackendArg::ALL.len()] = {
            let mut all = [BackendFlag(BackendArg::Auto); BackendArg::ALL.len()];
            let mut i = 0;
            while i < all.len() {
                all[i] = BackendFlag(BackendArg::ALL[i]);
                i += 1;
            }
            all
        };
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self.0 {
            BackendArg::Auto => {
                "The strongest isolating backend that works on this host (never host)"
            }
            BackendArg::Host => "Host processes and the file fence; trusted code only",
            BackendArg::Linux => "Linux namespaces, Landlock, seccomp; rootless",
            BackendArg::Landlock => {
                "Landlock and seccomp, no namespace: for unprivileged containers and CI"
            }
            BackendArg::Docker => {
                "A locked-down Docker or Podman container (`--runtime runsc` for gVisor)"
            }
            BackendArg::Gvisor => "gVisor's runsc, driven directly; no daemon",
            BackendArg::Vm => {
                "A QEMU virtual machine per sandbox (image: `hako vm build`); KVM, else emulated"
            }
        };
        Some(PossibleValue::new(self.0.name()).help(help))
    }
}

/// `--min-isolation LEVEL`: clap's view of [`Isolation`], so that `--help`
/// and a bad value list the levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsolationFlag(pub Isolation);

impl ValueEnum for IsolationFlag {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            IsolationFlag(Isolation::None),
            IsolationFlag(Isolation::Process),
            IsolationFlag(Isolation::Kernel),
            IsolationFlag(Isolation::Vm),
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self.0 {
            Isolation::None => "Anything, the host backend included",
            Isolation::Process => {
                "Namespaces, Landlock, seccomp or a container (linux, landlock, docker)"
            }
            Isolation::Kernel => {
                "A kernel of the sandbox's own in front of the host's (gvisor, docker --runtime runsc)"
            }
            Isolation::Vm => "A virtual machine of its own (no backend provides it yet)",
        };
        Some(PossibleValue::new(self.0.as_str()).help(help))
    }
}

/// `--net MODE`: clap's view of [`NetMode`], so that `--help` and a bad
/// value list the modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetFlag(pub NetMode);

impl ValueEnum for NetFlag {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            NetFlag(NetMode::None),
            NetFlag(NetMode::Allow),
            NetFlag(NetMode::Host),
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self.0 {
            NetMode::None => "Loopback only (the default of every isolating backend)",
            NetMode::Allow => "Only what --allow names, through hako's egress proxy",
            NetMode::Host => "The host's network, unfiltered; must be asked for",
        };
        Some(PossibleValue::new(self.0.name()).help(help))
    }
}

/// Flags that pick and shape a sandbox, shared by every subcommand that
/// opens one: clap's view of the runtime's [`SandboxFlags`], which parses
/// them and the profile into one spec.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// Read sandbox settings from a TOML profile (every flag below is a key
    /// of the same name, `-` written `_`); flags given here win, and list
    /// flags add to the profile's lists.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Backend to use [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendFlag>,
    /// Sandbox root [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Set a variable inside the sandbox (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Pass a host variable (repeatable; `PREFIX*` passes non-secret names).
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Bytes kept of each of stdout and stderr (e.g. 512K, 10M; at most 1G) [default: 1M].
    #[arg(long, value_name = "SIZE", value_parser = parse_max_output)]
    pub max_output: Option<usize>,
    /// Memory limit (e.g. 256M; at least 16M).
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// Most processes at once (at least 16).
    #[arg(long, value_name = "N", value_parser = parse_pids)]
    pub pids: Option<u64>,
    /// CPU share (e.g. 0.5, 2; from 0.01 to 4096).
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    pub cpus: Option<u64>,
    /// Largest file a command may write (e.g. 10M; at least 1).
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub max_file_size: Option<u64>,
    /// Most open files per process (from 16 to 1048576).
    #[arg(long, value_name = "N", value_parser = parse_open_files)]
    pub max_open_files: Option<u64>,
    /// Most shell sessions open at once in one sandbox [default: 16].
    #[arg(long, value_name = "N", value_parser = parse_handles)]
    pub max_sessions: Option<usize>,
    /// Most long-lived processes running at once in one sandbox [default: 32].
    #[arg(long, value_name = "N", value_parser = parse_handles)]
    pub max_processes: Option<usize>,
    /// Refuse to run unless the sandbox is at least this strong [default: none].
    #[arg(long, value_name = "LEVEL", value_enum)]
    pub min_isolation: Option<IsolationFlag>,
    /// Let an emulated VM (QEMU's TCG, where KVM does not work) stand for
    /// --min-isolation vm; TCG is not a hardware boundary.
    #[arg(long)]
    pub allow_emulated_vm: bool,
    /// Extra read-only bind, same path inside (linux, docker, gvisor; repeatable).
    #[arg(long = "ro", value_name = "DIR")]
    pub ro: Vec<PathBuf>,
    /// Extra read-write bind, same path inside (linux, docker, gvisor; repeatable).
    #[arg(long = "rw", value_name = "DIR")]
    pub rw: Vec<PathBuf>,
    /// Run even when a requested protection or limit cannot be enforced here.
    #[arg(long)]
    pub best_effort: bool,
    /// Image: a name for --backend docker [default: hako-busybox:latest], a
    /// root directory for --backend gvisor [default: a read-only view of
    /// the host's system directories].
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// OCI runtime for --backend docker (e.g. runsc for gVisor, runc, crun).
    #[arg(long, value_name = "NAME")]
    pub runtime: Option<String>,
    /// --backend docker without the guest, for images where the static
    /// guest cannot run: each command is a `docker exec`. Weaker: no
    /// sessions, processes or terminals, background processes outlive their
    /// command, and a deadline restarts the container.
    #[arg(long)]
    pub no_guest: bool,
    /// Network [default: none, or host for --backend host; allow when
    /// --allow is given].
    #[arg(long = "net", value_name = "MODE", value_enum)]
    pub net: Option<NetFlag>,
    /// Let the sandbox reach HOST[:PORT] through the egress proxy
    /// (repeatable): a name (ports 80 and 443 unless one is given),
    /// `*.example.org` (its subdomains), an IP address, or `localhost:PORT`
    /// (that port on the host's loopback, also reachable inside as
    /// 127.0.0.1:PORT); or a URL of a host, `https://HOST[:PORT]` (port 443
    /// for https, 80 for http, unless one is given; never a path).
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    pub allow: Vec<String>,
    /// Have the egress proxy resolve NAME to ADDR instead of asking the
    /// system's resolver (repeatable, like curl --resolve).
    #[arg(long = "resolve", value_name = "NAME=ADDR", value_parser = parse_resolve)]
    pub resolve: Vec<(String, std::net::IpAddr)>,
    /// Copy-on-write workspace: changes land in a private layer, never in
    /// the workspace; review them with `hako diff NAME` (linux; auto
    /// picks it).
    #[arg(long)]
    pub cow: bool,
    /// Keep the --cow layers as the named sandbox NAME (a second run
    /// continues on them) [default: a temporary layer, gone when the
    /// sandbox closes].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Where named sandboxes are kept [default: $XDG_STATE_HOME/hako, else ~/.local/state/hako].
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

impl SandboxArgs {
    /// The flags as the runtime takes them: it parses the profile and
    /// builds the spec ([`SandboxFlags::spec`]).
    pub fn flags(&self) -> SandboxFlags {
        SandboxFlags {
            profile: self.profile.clone(),
            backend: self.backend.map(|BackendFlag(b)| b),
            workspace: self.workspace.clone(),
            env: self.env.clone(),
            pass_env: self.pass_env.clone(),
            max_output: self.max_output,
            memory: self.memory,
            pids: self.pids,
            cpus: self.cpus,
            max_file_size: self.max_file_size,
            max_open_files: self.max_open_files,
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            best_effort: self.best_effort,
            image: self.image.clone(),
            runtime: self.runtime.clone(),
            no_guest: self.no_guest,
            net: self.net.map(|NetFlag(mode)| mode),
            allow: self.allow.clone(),
            resolve: self.resolve.clone(),
            min_isolation: self.min_isolation.map(|IsolationFlag(level)| level),
            allow_emulated_vm: self.allow_emulated_vm,
            max_sessions: self.max_sessions,
            max_processes: self.max_processes,
            cow: self.cow,
            name: self.name.clone(),
            state: self.state.clone(),
        }
    }

    /// The backend, the backend-neutral settings and the copy-on-write
    /// workspace these flags (and the profile, if one is given) describe.
    pub fn plan(&self) -> Result<Plan, String> {
        self.flags().plan()
    }
}

/// `--timeout DUR`: from 1ms to 24h.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    hako_runtime::limits::parse_timeout(s)
}
