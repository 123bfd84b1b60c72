//! The `host` backend: Isolation `None`, for trusted code only.
//!
//! Each command runs as a child process on the host, under `hako-guest`,
//! which puts the command in a session of its own, becomes the subreaper of
//! everything it starts, enforces the deadline and, when the command ends,
//! kills and reaps every process it left behind. The environment is built
//! from a minimal base plus an allowlist, and only stdio reaches the command.
//! File operations go through the fence.
//!
//! What this backend does not do: it does not stop a command from reading,
//! writing or connecting to anything the invoking user can. The fence
//! confines hako's own file operations, not the command's.

use std::path::{Path, PathBuf};

use hako_core::{Capabilities, Isolation, Limits, NetMode, NetworkAccess, Result, SandboxSpec};
use hako_driver::sandbox::{
    common_limits, open_workspace, GuestConfig, GuestSandbox, GuestStart, Launcher, OPTIONAL,
};
use hako_driver::{InProcessGuest, LaunchOptions};

pub use hako_driver::connection::locate_guest;

/// The guest's code, linked into this backend: a single-threaded caller
/// (the `hako` CLI) starts the guest in a fork of itself with it rather
/// than by executing `hako-guest`.
const IN_PROCESS: InProcessGuest = InProcessGuest {
    serve_forked: hako_guest::in_process::serve_forked,
    spawn_linux_pid1: hako_guest::in_process::spawn_linux_pid1,
};

/// The backend's name.
pub const NAME: &str = "host";

/// How a host sandbox is set up: what it is (the one spec every backend
/// is opened from) and how this process launches it.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The sandbox: its workspace (commands start there and every file
    /// operation is fenced to it), environment and output cap. The host
    /// backend has no boundary to put limits, binds or a network policy
    /// in: asking for them is refused when it opens (limits run without
    /// with `best_effort`), and its network is the host's.
    pub spec: SandboxSpec,
    /// The fence's settings, the guest binary, the idle lease and the
    /// driver's options.
    pub launch: LaunchOptions,
}

impl HostConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        HostConfig::from_spec(SandboxSpec::new(workspace.into()))
    }

    /// A host sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        HostConfig {
            spec,
            launch: LaunchOptions::default(),
        }
    }
}

/// What the host backend builds around a command: nothing.
#[derive(Debug)]
struct InPlace;

impl Launcher for InPlace {
    fn start(&self) -> Result<GuestStart> {
        Ok(GuestStart::Local {
            plan: Box::default(),
            in_process: Some(IN_PROCESS),
        })
    }

    fn cwd_inside(&self, _rel: &Path) -> Option<PathBuf> {
        // The guest shares hako's view: it gets the directory itself.
        None
    }
}

/// A sandbox whose commands are host processes.
#[derive(Debug)]
pub struct HostSandbox {
    inner: GuestSandbox,
}

hako_driver::delegate_sandbox!(HostSandbox, inner);

/// The host backend enforces no resource limit and has no view to bind
/// into: asking for either is refused rather than pretended (limits run
/// without, when `best_effort` says so). Pure.
pub fn refuse_what_it_cannot_enforce(spec: &SandboxSpec) -> Result<()> {
    let limits = spec.limits != Limits::default();
    if (limits && !spec.best_effort) || !spec.ro.is_empty() || !spec.rw.is_empty() {
        return Err(hako_core::Error::Backend {
            backend: NAME.into(),
            op: "open",
            message: "the host backend cannot enforce --memory, --pids, --cpus, --max-file-size, --max-open-files, --ro or --rw; use --backend linux (or --best-effort to run without the limits)".into(),
        });
    }
    Ok(())
}

impl HostSandbox {
    /// Opens the workspace and starts the sandbox's guest.
    pub fn new(config: HostConfig) -> Result<Self> {
        let HostConfig { spec, launch } = config;
        // Its commands are host processes: no layer can stand between
        // them and the workspace.
        spec.refuse_cow(NAME)?;
        refuse_what_it_cannot_enforce(&spec)?;
        if let Some(network) = spec.network.as_ref().filter(|n| n.mode != NetMode::Host) {
            return Err(hako_core::Error::NetworkUnavailable {
                backend: NAME.into(),
                mode: network.mode.name(),
                reason: "its commands are host processes on the host's network; use --backend linux (or docker, gvisor) for `none` or `allow`".into(),
            });
        }
        let fence = open_workspace(&spec.workspace, &launch.fence)?;
        let base_env = hako_driver::sandbox::base_env(&spec.env);
        let caps = Capabilities {
            backend: NAME.to_string(),
            isolation: Isolation::None,
            network: NetworkAccess::Host,
            fence: fence.resolver(),
            limits: common_limits(spec.max_output, &fence),
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            accelerator: None,
            seccomp: false,
            shared: hako_core::Shared::ALL.to_vec(),
            defects: Vec::new(),
            optional: OPTIONAL,
        };
        Ok(HostSandbox {
            inner: GuestSandbox::new(GuestConfig {
                backend: NAME,
                fence,
                caps,
                base_env,
                guest: launch.guest,
                max_output: spec.max_output,
                idle_timeout: launch.idle_timeout,
                driver: launch.driver,
                launcher: Box::new(InPlace),
                proxy: None,
            })?,
        })
    }

    /// The base environment every command starts from.
    pub fn base_env(&self) -> &[(String, String)] {
        self.inner.base_env()
    }
}
