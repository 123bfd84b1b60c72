//! The `linux` backend: Isolation `Process`, rootless and daemonless.
//!
//! Opening a sandbox clones its pid 1 into new user, mount, pid, network,
//! IPC, UTS and cgroup namespaces; pid 1 builds a read-only view of the
//! system on a fresh tmpfs root with the workspace bound read-write at its
//! own path, `pivot_root`s into it, loads the seccomp filter on itself, and
//! then serves every command of the sandbox (`hako-guest`'s protocol): each
//! runs under a supervisor with rlimits, Landlock, `no_new_privs` and no
//! capabilities. The network namespace has only loopback; in network mode
//! `allow` the guest's forwarder passes connections to an egress proxy
//! outside (see [`hako_driver::network`]), and in mode `host` the sandbox
//! stays in the host's network namespace. See README.md beside this file
//! for the order in which each protection is applied.

pub mod plan;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hako_core::{
    Capabilities, Error, Isolation, LimitMechanism, NetworkAccess, NetworkPolicy, Result,
    SandboxSpec,
};
use hako_driver::network::{NetworkSetup, NET_DIR};
use hako_driver::sandbox::{
    common_limits, open_workspace, GuestConfig, GuestSandbox, GuestStart, Launcher, OPTIONAL,
};
use hako_driver::{InProcessGuest, LaunchOptions};
use hako_proto::{LinuxSpec, MountOp};

use crate::plan::{PlanInput, Rlimits};
use hako_driver::cgroup::Cgroups;

pub use hako_core::Limits;
pub use hako_driver::connection::locate_guest;

/// The guest's code, linked into this backend: a single-threaded caller
/// (the `hako` CLI) starts the guest in a fork of itself with it rather
/// than by executing `hako-guest`.
const IN_PROCESS: InProcessGuest = InProcessGuest {
    serve_forked: hako_guest::in_process::serve_forked,
    spawn_linux_pid1: hako_guest::in_process::spawn_linux_pid1,
};

/// The backend's name.
pub const NAME: &str = "linux";

/// How a linux sandbox is set up: what it is (the one spec every backend
/// is opened from) and how this process launches it.
#[derive(Debug, Clone)]
pub struct LinuxConfig {
    /// The sandbox: workspace, environment, output cap, limits, binds,
    /// network (`None` is `none`) and `best_effort` (run even when a
    /// requested protection cannot be enforced here; it is then left out
    /// of [`Capabilities`]).
    pub spec: SandboxSpec,
    /// Where the workspace appears inside; `None` means its own path.
    pub mount_point: Option<PathBuf>,
    /// The fence's settings, the guest binary, the idle lease and the
    /// driver's options.
    pub launch: LaunchOptions,
}

impl LinuxConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        LinuxConfig::from_spec(SandboxSpec::new(workspace.into()))
    }

    /// A linux sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        LinuxConfig {
            spec,
            mount_point: None,
            launch: LaunchOptions::default(),
        }
    }
}

/// The sandbox's namespaces: built once by the guest, whose pid 1 serves
/// every command inside them for the sandbox's life.
#[derive(Debug)]
struct Namespaces {
    spec: LinuxSpec,
    mount_point: PathBuf,
    cgroups: Mutex<Option<Cgroups>>,
}

impl Launcher for Namespaces {
    fn start(&self) -> Result<GuestStart> {
        Ok(GuestStart::Local {
            plan: Box::new(hako_driver::sandbox::LocalPlan {
                linux: Some(self.spec.clone()),
                ..Default::default()
            }),
            in_process: Some(IN_PROCESS),
        })
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        Some(self.mount_point.join(rel))
    }

    fn waits_for_guest(&self) -> bool {
        self.cgroups.lock().map_or(true, |c| c.is_some())
    }

    fn close(&self, _guest_exited_cleanly: bool) {
        // Called after the guest is gone, and with it every process.
        if let Ok(mut cgroups) = self.cgroups.lock() {
            if let Some(mut cgroups) = cgroups.take() {
                cgroups.remove();
            }
        }
    }
}

fn backend_err(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: NAME.into(),
        op,
        message: message.into(),
    }
}

/// A sandbox whose commands run in fresh Linux namespaces.
#[derive(Debug)]
pub struct LinuxSandbox {
    inner: GuestSandbox,
}

hako_driver::delegate_sandbox!(LinuxSandbox, inner);

impl LinuxSandbox {
    /// Opens the workspace, plans the sandbox and builds it: the namespaces
    /// and the filesystem view are held by the sandbox's pid 1 until
    /// `close`, so a host that cannot build them fails here, with the reason.
    pub fn new(config: LinuxConfig) -> Result<Self> {
        let LinuxConfig {
            spec: wanted,
            mount_point,
            launch,
        } = config;
        let fence = open_workspace(&wanted.workspace, &launch.fence)?;
        // Before anything is made on the host: a bad allowlist fails here.
        let network =
            NetworkSetup::new(&wanted.network.clone().unwrap_or_else(NetworkPolicy::none))?;
        let limits = wanted.limits;
        // cgroups where they can be made; rlimits otherwise.
        let cgroups = hako_driver::cgroup::for_sandbox(NAME, &limits, wanted.best_effort)?;
        let cg_mechanism = cgroups.as_ref().map(|c| c.mechanism);
        let workspace = fence.workdir().to_path_buf();
        // The home is the host user's home path (so `--ro ~/.cargo` is at
        // `~/.cargo` inside), or the HOME set for the sandbox; never the
        // host's home directory itself, only its path.
        let asked_home = wanted
            .env
            .set
            .iter()
            .rev()
            .find(|(name, _)| name == "HOME")
            .map(|(_, value)| std::ffi::OsString::from(value))
            .or_else(|| std::env::var_os("HOME"));
        let home = hako_view::user::home(asked_home.as_deref().map(std::path::Path::new));
        let input = PlanInput {
            mount_point: mount_point.unwrap_or_else(|| workspace.clone()),
            workspace,
            ro: wanted.ro.clone(),
            rw: wanted.rw.clone(),
            rlimits: Rlimits {
                address_space: limits.memory.filter(|_| cg_mechanism.is_none()),
                nproc: limits.pids.filter(|_| cg_mechanism.is_none()),
                fsize: limits.file_size,
                nofile: limits.open_files,
            },
            landlock_required: !wanted.best_effort,
            tmp_size: "512m".into(),
            cgroup_procs: cgroups
                .as_ref()
                .map(Cgroups::procs_files)
                .unwrap_or_default(),
            oom_counter: cgroups.as_ref().and_then(Cgroups::oom_counter),
            cow: wanted.cow.clone(),
            home,
        };
        // No host home directory inside: HOME is the sandbox user's own
        // (private and empty unless the workspace or a bind holds it), and
        // the user's names are the sandbox user's, unless set explicitly.
        let home_text = input.home.to_string_lossy().into_owned();
        let mut base_env = hako_driver::sandbox::base_env_defaulting(
            &wanted.env,
            &[
                ("HOME", home_text.as_str()),
                ("USER", hako_view::user::NAME),
                ("LOGNAME", hako_view::user::NAME),
                ("TMPDIR", "/tmp"),
            ],
        );
        network.apply_env(&mut base_env);
        let mut reports = common_limits(wanted.max_output, &fence);
        // CPUs only by a cgroup: without one the limit was refused or
        // dropped (--best-effort) above.
        let enforced = Limits {
            cpus_milli: limits.cpus_milli.filter(|_| cg_mechanism.is_some()),
            ..limits
        };
        reports.extend(hako_driver::sandbox::resource_limit_reports(
            &enforced,
            cg_mechanism.unwrap_or(LimitMechanism::Rlimit),
        ));
        let landlock_abi = hako_sys::confine::landlock_abi().filter(|&abi| abi > 0);
        let caps = Capabilities {
            backend: NAME.into(),
            isolation: Isolation::Process,
            network: network.access,
            fence: fence.resolver(),
            limits: reports,
            env_sanitised: true,
            fds_closed: true,
            landlock_abi,
            accelerator: None,
            seccomp: true,
            shared: hako_core::Shared::network_if(network.access),
            defects: Vec::new(),
            optional: OPTIONAL,
        };
        let spec =
            plan::plan(&input, &hako_view::host_facts()).map_err(|e| backend_err("plan", e.0));
        let spec = spec.map(|mut spec| {
            spec.host_network = network.access == NetworkAccess::Host;
            if let Some(dir) = network.socket_dir() {
                spec.mounts.push(MountOp::Bind {
                    source: dir,
                    path: NET_DIR.into(),
                    read_only: true,
                });
            }
            spec.network = network.spec.clone();
            spec
        });
        let spec = match spec {
            Ok(spec) => spec,
            Err(err) => {
                if let Some(mut cg) = cgroups {
                    cg.remove();
                }
                return Err(err);
            }
        };
        let namespaces = Namespaces {
            spec,
            mount_point: input.mount_point.clone(),
            cgroups: Mutex::new(cgroups),
        };
        let cow = wanted.cow.is_some();
        let mut sandbox = LinuxSandbox {
            inner: GuestSandbox::new(GuestConfig {
                backend: NAME,
                fence,
                caps,
                base_env,
                guest: launch.guest.clone(),
                max_output: wanted.max_output,
                idle_timeout: launch.idle_timeout,
                driver: launch.driver.clone(),
                launcher: Box::new(namespaces),
                proxy: network.proxy,
            })?,
        };
        if cow {
            // The fence opened above is on the workspace itself, the
            // overlay's lower layer: a write through it would land behind
            // the commands' view. Its file operations (and the commands'
            // working directories) go through the layered view instead,
            // reached by `/proc/PID/root` of the sandbox's pid 1 (a process
            // of this user, which this one may look into).
            let view = sandbox
                .inner
                .guest_pid()
                .and_then(pid1_of)
                .map(|pid| {
                    let inside = input
                        .mount_point
                        .strip_prefix("/")
                        .unwrap_or(&input.mount_point);
                    PathBuf::from(format!("/proc/{pid}/root")).join(inside)
                })
                .ok_or_else(|| {
                    backend_err("open the layered view", "cannot find the sandbox's pid 1")
                })
                .and_then(|root| {
                    hako_fence::Fence::open_as(&root, &input.workspace, launch.fence.clone())
                        .map_err(|e| backend_err("open the layered view", e.to_string()))
                });
            match view {
                Ok(fence) => sandbox.inner.set_fence(fence),
                Err(e) => {
                    let _ = hako_core::Sandbox::close(&sandbox.inner);
                    return Err(e);
                }
            }
        }
        Ok(sandbox)
    }
}

/// The sandbox's pid 1, given the guest's process: itself when this
/// process cloned pid 1 (its mount namespace is not ours), else its only
/// child (the launcher's).
fn pid1_of(guest: i32) -> Option<i32> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    if ns(&guest.to_string()).is_some_and(|theirs| Some(theirs) != ns("self")) {
        return Some(guest);
    }
    let children = std::fs::read_to_string(format!("/proc/{guest}/task/{guest}/children")).ok()?;
    let mut pids = children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok());
    let pid1 = pids.next()?;
    (ns(&pid1.to_string()).is_some_and(|theirs| Some(theirs) != ns("self"))).then_some(pid1)
}
