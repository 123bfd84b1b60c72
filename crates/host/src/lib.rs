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

use hako_core::env::EnvPolicy;
use hako_core::{Capabilities, Isolation, NetworkAccess, Result, DEFAULT_MAX_OUTPUT};
use hako_driver::sandbox::{
    common_limits, open_workspace, GuestConfig, GuestSandbox, GuestStart, Launcher, OPTIONAL,
};
use hako_driver::{DriverOptions, InProcessGuest};
use hako_fence::FenceOptions;

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

/// How a host sandbox is set up.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The sandbox root: commands start here and every file operation is
    /// fenced to it.
    pub workspace: PathBuf,
    /// Which host variables pass, and what is set.
    pub env: EnvPolicy,
    /// Cap on each of stdout and stderr kept per command.
    pub max_output: usize,
    /// Fence settings (resolver, read and listing limits).
    pub fence: FenceOptions,
    /// The `hako-guest` binary; `None` chooses (see
    /// [`hako_driver::connection::Connection::start`]).
    pub guest: Option<PathBuf>,
    /// Close the sandbox after this long with no call in progress and no
    /// long-lived process running.
    pub idle_timeout: Option<std::time::Duration>,
    /// How the caller has the driver read and close the sandbox.
    pub driver: DriverOptions,
    /// The network: only `host` can be had here (anything else is
    /// refused when the sandbox opens).
    pub network: hako_core::NetworkPolicy,
}

impl HostConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        HostConfig {
            workspace: workspace.into(),
            env: EnvPolicy::default(),
            max_output: DEFAULT_MAX_OUTPUT,
            fence: FenceOptions::default(),
            guest: None,
            idle_timeout: None,
            driver: DriverOptions::default(),
            network: hako_core::NetworkPolicy::host(),
        }
    }
}

/// What the host backend builds around a command: nothing.
#[derive(Debug)]
struct InPlace;

impl Launcher for InPlace {
    fn start(&self) -> Result<GuestStart> {
        Ok(GuestStart::Local {
            linux: None,
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

impl HostSandbox {
    /// Opens the workspace and starts the sandbox's guest.
    pub fn new(config: HostConfig) -> Result<Self> {
        if config.network.mode != hako_core::NetMode::Host {
            return Err(hako_core::Error::NetworkUnavailable {
                backend: NAME.into(),
                mode: config.network.mode.name(),
                reason: "its commands are host processes on the host's network; use --backend linux (or docker, gvisor) for `none` or `allow`".into(),
            });
        }
        let fence = open_workspace(&config.workspace, &config.fence)?;
        let base_env = hako_driver::sandbox::base_env(&config.env);
        let caps = Capabilities {
            backend: NAME.to_string(),
            isolation: Isolation::None,
            network: NetworkAccess::Host,
            fence: fence.resolver(),
            limits: common_limits(config.max_output, &fence),
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            seccomp: false,
            optional: OPTIONAL,
        };
        Ok(HostSandbox {
            inner: GuestSandbox::new(GuestConfig {
                backend: NAME,
                fence,
                caps,
                base_env,
                guest: config.guest.clone(),
                max_output: config.max_output,
                idle_timeout: config.idle_timeout,
                driver: config.driver.clone(),
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
