//! The `landlock` backend: Isolation `Process`, with no namespace and no
//! privilege, for where the others cannot run (an unprivileged container,
//! a CI runner, a Kubernetes pod: Docker's default seccomp profile and
//! Ubuntu's AppArmor refuse user namespaces, but allow Landlock and
//! seccomp).
//!
//! The guest is a process of the host, as on `host`: the subreaper of
//! every command, with deadlines and tree kills. Before it serves it joins
//! the sandbox's cgroups (where one can be made), builds a Landlock
//! ruleset over the whole filesystem (read and execute on the system
//! directories and `/proc`, entry by entry around the secrets under
//! `/etc`; every right in the workspace and a private temporary directory
//! hako makes, which `TMPDIR` and `HOME` point at; a few device files;
//! nothing else, the home directory included), and installs the default
//! seccomp policy on itself. Every supervisor then enforces the ruleset
//! (with TCP refused where the kernel handles it, ABI 4, and signals and
//! abstract unix sockets scoped to the sandbox, ABI 6, required),
//! `no_new_privs`, no capabilities, and a second seccomp filter that
//! refuses what the shared namespaces would reach: network sockets under
//! `--net none`, unix sockets below Landlock ABI 9 (which cannot confine
//! connecting to a socket file by its path), System V IPC and POSIX
//! message queues. See `README.md` beside this file for what it does not
//! isolate.

pub mod plan;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hako_core::{
    Capabilities, Error, Isolation, LimitMechanism, Limits, NetMode, NetworkAccess, Result,
    SandboxSpec, Shared,
};
use hako_driver::cgroup::Cgroups;
use hako_driver::sandbox::{
    common_limits, open_workspace, GuestConfig, GuestSandbox, GuestStart, Launcher, LocalPlan,
    OPTIONAL,
};
use hako_driver::{InProcessGuest, LaunchOptions};
use hako_proto::{ConfineSpec, MemoryWatch, Rlimits};

pub use hako_driver::connection::locate_guest;

/// The guest's code, linked into this backend: a single-threaded caller
/// (the `hako` CLI) starts the guest in a fork of itself with it rather
/// than by executing `hako-guest`.
const IN_PROCESS: InProcessGuest = InProcessGuest {
    serve_forked: hako_guest::in_process::serve_forked,
    spawn_linux_pid1: hako_guest::in_process::spawn_linux_pid1,
};

/// The backend's name.
pub const NAME: &str = "landlock";

/// What a `landlock` sandbox's commands share with the processes around
/// them: every namespace, and `/dev`.
pub const SHARED: [Shared; 6] = Shared::ALL;

/// How a landlock sandbox is set up: what it is (the one spec every
/// backend is opened from) and how this process launches it.
#[derive(Debug, Clone)]
pub struct LandlockConfig {
    /// The sandbox: workspace, environment, output cap, limits, `--ro` and
    /// `--rw` directories (granted at their own paths), network (`none` or
    /// `host`; `allow` is refused) and `best_effort`.
    pub spec: SandboxSpec,
    /// The fence's settings, the guest binary, the idle lease and the
    /// driver's options.
    pub launch: LaunchOptions,
}

impl LandlockConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        LandlockConfig::from_spec(SandboxSpec::new(workspace.into()))
    }

    /// A landlock sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        LandlockConfig {
            spec,
            launch: LaunchOptions::default(),
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

/// Whether this kernel can run a `landlock` sandbox, and if not, why:
/// Landlock itself, and (unless `best_effort`) its scoping of signals and
/// abstract unix sockets (ABI 6). Restricts nothing.
pub fn ready(best_effort: bool) -> std::result::Result<(), String> {
    ready_with(hako_sys::confine::landlock_policy_status(), best_effort)
}

/// [`ready`], given what the kernel's Landlock offers.
fn ready_with(
    status: Option<hako_sys::confine::PolicyStatus>,
    best_effort: bool,
) -> std::result::Result<(), String> {
    match status {
        None => Err("this kernel offers no Landlock (Linux 5.13 or later with `landlock` in the lsm= list), or an outer seccomp filter refuses it".into()),
        Some(status) if !status.scoped && !best_effort => Err(format!(
            "this kernel's Landlock is ABI {}: scoping signals and abstract unix sockets to the sandbox needs ABI 6 (Linux 6.12); without it a command could signal any process of its user",
            status.abi
        )),
        Some(_) => Ok(()),
    }
}

/// The guest's confinement, the sandbox's cgroups and its private
/// temporary directory, held for the sandbox's life.
#[derive(Debug)]
struct Confined {
    confine: ConfineSpec,
    memory: Option<MemoryWatch>,
    cgroups: Mutex<Option<Cgroups>>,
    tmp: PathBuf,
}

impl Launcher for Confined {
    fn start(&self) -> Result<GuestStart> {
        Ok(GuestStart::Local {
            plan: Box::new(LocalPlan {
                linux: None,
                confine: Some(self.confine.clone()),
                memory: self.memory.clone(),
            }),
            in_process: Some(IN_PROCESS),
        })
    }

    fn cwd_inside(&self, _rel: &Path) -> Option<PathBuf> {
        // The guest shares hako's view: it gets the directory itself.
        None
    }

    fn waits_for_guest(&self) -> bool {
        true
    }

    fn close(&self, _guest_exited_cleanly: bool) {
        // Called after the guest is gone, and with it every command.
        if let Ok(mut cgroups) = self.cgroups.lock() {
            if let Some(mut cgroups) = cgroups.take() {
                cgroups.remove();
            }
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        // A sandbox that never started is never closed.
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// A sandbox whose commands are host processes confined by Landlock and
/// seccomp.
#[derive(Debug)]
pub struct LandlockSandbox {
    inner: GuestSandbox,
}

hako_driver::delegate_sandbox!(LandlockSandbox, inner);

/// Removes the private temporary directories that hako processes no
/// longer alive left in `base` (a hako killed with SIGKILL closes
/// nothing): those named `hako-landlock-PID-...`, owned by this user,
/// whose PID is gone. A PID alive again under another process keeps its
/// directory until that one ends too. Returns what was removed.
pub fn remove_stale_tmp(base: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let me = hako_sys::rustix::process::geteuid().as_raw();
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("hako-landlock-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if ours
            && pid != 0
            && !Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::remove_dir_all(&path).is_ok()
        {
            removed.push(path);
        }
    }
    removed
}

/// Makes the sandbox's private temporary directory (mode 0700) in the
/// system's temporary directory (first removing what dead hako processes
/// left there, once per process).
fn make_tmp() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = std::fs::canonicalize(std::env::temp_dir())
        .map_err(|e| backend_err("make its temporary directory", e.to_string()))?;
    static COLLECT: std::sync::Once = std::sync::Once::new();
    COLLECT.call_once(|| {
        remove_stale_tmp(&base);
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!(
        "hako-landlock-{}-{}-{nanos:08x}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            backend_err(
                "make its temporary directory",
                format!("{}: {e}", dir.display()),
            )
        })?;
    Ok(dir)
}

impl LandlockSandbox {
    /// Checks what this kernel offers, makes the private temporary
    /// directory and cgroups, and starts the guest, which builds the
    /// confinement: a kernel or host that cannot enforce it fails here,
    /// naming what is missing.
    pub fn new(config: LandlockConfig) -> Result<Self> {
        let LandlockConfig { spec, launch } = config;
        // Nothing can stand between the commands and the workspace.
        spec.refuse_cow(NAME)?;
        let mode = spec.network.as_ref().map_or(NetMode::None, |n| n.mode);
        if mode == NetMode::Allow {
            return Err(Error::NetworkUnavailable {
                backend: NAME.into(),
                mode: mode.name(),
                reason: "its commands share the host's network namespace and Landlock filters TCP by port alone, not by address: a connection to the egress proxy's port at any other address could not be stopped; use --net none, or a backend with a network namespace (linux, docker, gvisor)".into(),
            });
        }
        let status = hako_sys::confine::landlock_policy_status();
        ready_with(status, spec.best_effort).map_err(|why| backend_err("open", why))?;
        let fence = open_workspace(&spec.workspace, &launch.fence)?;
        let limits = spec.limits;
        // cgroups where they can be made; rlimits otherwise.
        let cgroups = hako_driver::cgroup::for_sandbox(NAME, &limits, spec.best_effort)?;
        let by_cgroup = cgroups.as_ref().map(|c| c.mechanism);
        let rlimits = Rlimits {
            address_space: limits.memory.filter(|_| by_cgroup.is_none()),
            nproc: limits.pids.filter(|_| by_cgroup.is_none()),
            fsize: limits.file_size,
            nofile: limits.open_files,
        };
        // Without ABI 6 (and only with --best-effort, see `ready`): run,
        // and say what is missing.
        let scoped = status.is_some_and(|s| s.scoped) || !spec.best_effort;
        let mut defects = Vec::new();
        if !scoped {
            defects.push(format!(
                "signals and abstract unix sockets are not scoped to the sandbox: this kernel's Landlock (ABI {}) cannot (ABI 6, Linux 6.12), so a command can signal any process of its user (--best-effort)",
                status.map_or(0, |s| s.abi)
            ));
        }
        let workspace = fence.workdir().to_path_buf();
        let facts = hako_view::host_facts();
        plan::check(&workspace, &spec.ro, &spec.rw, &facts)
            .map_err(|why| backend_err("plan", why))?;
        let tmp = make_tmp()?;
        let input = plan::PlanInput {
            workspace,
            tmp: tmp.clone(),
            ro: spec.ro.clone(),
            rw: spec.rw.clone(),
            host_network: mode == NetMode::Host,
            scoped,
            rlimits,
            cgroup_procs: cgroups
                .as_ref()
                .map(Cgroups::procs_files)
                .unwrap_or_default(),
        };
        let list_dir = |dir: &Path| -> Vec<PathBuf> {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            entries.sort();
            entries
        };
        let confine = plan::plan(&input, &facts, &list_dir);
        let memory = cgroups
            .as_ref()
            .and_then(Cgroups::oom_counter)
            .map(|c| MemoryWatch::Counter(vec![c]));
        let tmp_str = tmp.to_string_lossy().into_owned();
        // No host home directory: HOME and TMPDIR are the private
        // temporary directory unless set explicitly.
        let base_env = hako_driver::sandbox::base_env_defaulting(
            &spec.env,
            &[("HOME", &tmp_str), ("TMPDIR", &tmp_str)],
        );
        let mut reports = common_limits(spec.max_output, &fence);
        let enforced = Limits {
            cpus_milli: limits.cpus_milli.filter(|_| by_cgroup.is_some()),
            pids: limits
                .pids
                .filter(|_| by_cgroup.is_some() || !hako_sys::rustix::process::geteuid().is_root()),
            ..limits
        };
        reports.extend(hako_driver::sandbox::resource_limit_reports(
            &enforced,
            by_cgroup.unwrap_or(LimitMechanism::Rlimit),
        ));
        let caps = Capabilities {
            backend: NAME.into(),
            isolation: Isolation::Process,
            network: if mode == NetMode::Host {
                NetworkAccess::Host
            } else {
                NetworkAccess::None
            },
            fence: fence.resolver(),
            limits: reports,
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: status.map(|s| s.abi),
            accelerator: None,
            seccomp: true,
            shared: SHARED.to_vec(),
            defects,
            optional: OPTIONAL,
        };
        let launcher = Confined {
            confine,
            memory,
            cgroups: Mutex::new(cgroups),
            tmp,
        };
        // A guest that fails to start has the launcher closed, which
        // removes the directory and the cgroups.
        let inner = GuestSandbox::new(GuestConfig {
            backend: NAME,
            fence,
            caps,
            base_env,
            guest: launch.guest,
            max_output: spec.max_output,
            idle_timeout: launch.idle_timeout,
            driver: launch.driver,
            launcher: Box::new(launcher),
            proxy: None,
        })?;
        Ok(LandlockSandbox { inner })
    }

    /// The base environment every command starts from.
    pub fn base_env(&self) -> &[(String, String)] {
        self.inner.base_env()
    }
}
