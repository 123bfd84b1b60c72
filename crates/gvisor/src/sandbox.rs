//! A gvisor sandbox: its configuration, writing its bundle into hako's
//! private directory, and opening it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once, OnceLock};

use hako_container::runner::{CliRunner, Runner};
use hako_container::{
    base_env, limit_reports_pids_inside, locate_static_guest, ContainerLauncher, Owner, RunNetwork,
    DEFAULT_TMP_SIZE,
};
use hako_core::{Capabilities, Error, Isolation, NetworkPolicy, Result, SandboxSpec};
use hako_driver::network::NetworkSetup;
use hako_driver::sandbox::{
    common_limits, open_workspace, GuestConfig, GuestSandbox, GuestStart, Launcher, OPTIONAL,
};
use hako_driver::LaunchOptions;
use hako_fence::{Fence, FenceOptions};

use crate::bundle::{build_view, config_json, run_argv, BundlePlan};
use crate::gc::BUNDLE_PREFIX;
use crate::host_view;
use crate::{NAME, RUNSC_VAR};

/// How a gvisor sandbox is set up: what it is (the one spec every backend
/// is opened from) and how this process launches it.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// The sandbox: workspace (bound read-write at the same path, or seen
    /// through an overlayfs with `cow`, see [`GvisorSandbox::new`]), image
    /// (a root file system directory; `None` is a read-only view of the
    /// host's system directories), environment, output cap, limits, binds,
    /// network (`None` is `none`) and `best_effort` (run even when a limit
    /// cannot be enforced, without it).
    pub spec: SandboxSpec,
    /// The fence's settings, the statically linked `hako-guest` (`None`
    /// chooses), the idle lease and the driver's options.
    pub launch: LaunchOptions,
    /// Size of the private `/tmp`, bytes.
    pub tmp_size: u64,
    /// The `runsc` binary; `None` is `$HAKO_RUNSC`, else `runsc`.
    pub runsc: Option<PathBuf>,
    /// Runs `runsc` (tests record instead).
    pub runner: Arc<dyn Runner>,
}

impl GvisorConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        GvisorConfig::from_spec(SandboxSpec::new(workspace.into()))
    }

    /// A gvisor sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        GvisorConfig {
            spec,
            launch: LaunchOptions::default(),
            tmp_size: DEFAULT_TMP_SIZE,
            runsc: None,
            runner: Arc::new(CliRunner),
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

/// The `runsc` to run.
pub fn runsc_path(configured: Option<&Path>) -> PathBuf {
    configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(RUNSC_VAR).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("runsc"))
}

/// A sandbox whose commands run on gVisor's kernel.
#[derive(Debug)]
pub struct GvisorSandbox {
    inner: GuestSandbox,
    name: String,
}

hako_driver::delegate_sandbox!(GvisorSandbox, inner);

impl GvisorSandbox {
    /// Writes the bundle, starts `runsc run` and waits for the guest.
    ///
    /// With `spec.cow`, the host view mounts an overlayfs over the
    /// workspace's path in its own mount namespace before it becomes
    /// `runsc` (the workspace its lower layer, `cow`'s directories its
    /// upper and work), so gVisor's gofer serves the layered view and the
    /// real workspace is never written; an overlay that cannot be mounted
    /// fails the start, naming why. The file operations then go through
    /// the same view, reached through the runtime's client.
    pub fn new(config: GvisorConfig) -> Result<Self> {
        let spec = &config.spec;
        let fence = open_workspace(&spec.workspace, &config.launch.fence)?;
        // What the real workspace is, to make sure the layered view is not it.
        let real = hako_sys::rustix::fs::fstat(fence.root())
            .map(|st| (st.st_dev, st.st_ino))
            .map_err(|e| backend_err("open the workspace", e.to_string()))?;
        let network = NetworkSetup::new(&spec.network.clone().unwrap_or_else(NetworkPolicy::none))?;
        let runner = Arc::clone(&config.runner);
        collect_once();
        let guest = locate_static_guest(NAME, config.launch.guest.as_deref())?;
        // What this runsc is known to get wrong (cached per binary): said
        // in the capabilities, so that no caller is surprised.
        let defects: Vec<String> = crate::everyday::everyday_tools_work_with(
            &runsc_path(config.runsc.as_deref()),
            Some(&guest),
            hako_container::private::private_dir().ok().as_deref(),
        )
        .err()
        .into_iter()
        .collect();
        let rootless = !hako_sys::rustix::process::geteuid().is_root();
        let mut limits = spec.limits;
        // --pids is applied inside by the guest's seal (gVisor's own pids
        // controller), with or without root; memory and CPUs need runsc's
        // host cgroups.
        if rootless && (limits.memory.is_some() || limits.cpus_milli.is_some()) {
            if !spec.best_effort {
                return Err(backend_err(
                    "apply limits",
                    "--memory and --cpus need runsc's cgroups, which only root gets; run as root or pass --best-effort",
                ));
            }
            (limits.memory, limits.cpus_milli) = (None, None);
        }
        let io = |op: &'static str| move |e: std::io::Error| backend_err(op, e.to_string());
        let owner = Owner::current();
        // In hako's private directory, where no other user can plant or
        // swap anything; `runsc` reaches it as root, and rootless as the
        // user its user namespace maps to root.
        let dir = tempfile::Builder::new()
            .prefix(&format!("{BUNDLE_PREFIX}{}-", owner.pid))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(hako_container::private::private_dir()?)
            .map_err(io("create the bundle"))?;
        std::fs::write(
            dir.path().join("owner"),
            host_view::owner_line(owner.pid, owner.start),
        )
        .map_err(io("create the bundle"))?;
        let workspace = fence.workdir().to_path_buf();
        let facts = hako_view::host_facts();
        let (root, host_view) = match &spec.image {
            Some(rootfs) => (PathBuf::from(rootfs), false),
            None => (dir.path().join("rootfs"), true),
        };
        let plan = BundlePlan {
            workspace: workspace.clone(),
            guest,
            root: root.clone(),
            host_view,
            // Rootless: root of runsc's user namespace is the invoking user.
            user: if rootless {
                (0, 0)
            } else {
                (facts.uid, facts.gid)
            },
            limits,
            tmp_size: config.tmp_size,
            ro: spec.ro.clone(),
            rw: spec.rw.clone(),
            masked_files: facts
                .masked_etc_files()
                // Without root, a file the user cannot read needs no mask
                // (the sandbox, as that user, cannot read it either), and
                // runsc's gofer cannot open it to mount over it.
                .filter(|p| p.is_file() && (!rootless || std::fs::File::open(p).is_ok()))
                .collect(),
            masked_dirs: hako_view::MASKED_ETC_DIRS
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.is_dir() && (!rootless || std::fs::read_dir(p).is_ok()))
                .collect(),
            system_dirs: facts.bound_dirs().map(Path::to_path_buf).collect(),
            network: RunNetwork::of(&network),
            cow: spec.cow.clone(),
        };
        if host_view {
            build_view(&plan, &facts).map_err(io("build the root view"))?;
        }
        let config_path = dir.path().join("config.json");
        let text = serde_json::to_vec_pretty(&config_json(&plan))
            .map_err(|e| backend_err("write the bundle", e.to_string()))?;
        std::fs::write(&config_path, text).map_err(io("write the bundle"))?;
        let state = dir.path().join("state");
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&state)
            .map_err(io("create the bundle"))?;
        let name = hako_container::unique_name("hako");
        let runsc = runsc_path(config.runsc.as_deref());
        let cgroups = limits.memory.is_some() || limits.cpus_milli.is_some();
        let argv = run_argv(&runsc, &state, dir.path(), &name, rootless, cgroups, &plan);
        let mut cleanup_argv = vec![
            runsc.display().to_string(),
            "--root".into(),
            state.display().to_string(),
        ];
        if rootless {
            cleanup_argv.push("--rootless".into());
        }
        cleanup_argv.extend(["delete".into(), "--force".into(), name.clone()]);
        let mut reports = common_limits(spec.max_output, &fence);
        reports.extend(limit_reports_pids_inside(&limits));
        hako_container::memory_by_the_guest(&mut reports);
        let caps = Capabilities {
            backend: NAME.into(),
            isolation: Isolation::Kernel,
            network: network.access,
            fence: fence.resolver(),
            limits: reports,
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            accelerator: None,
            seccomp: true,
            shared: hako_core::Shared::network_if(network.access),
            defects,
            optional: OPTIONAL,
        };
        let launcher = ContainerLauncher {
            backend: NAME,
            program: "runsc",
            runner,
            name: name.clone(),
            argv,
            workspace,
            cleanup: vec![cleanup_argv],
            keep: Mutex::new(vec![Box::new(dir)]),
            network: network.spec.clone(),
            seal: Some(plan.seal()),
            memory: hako_container::memory_watch(&limits, true),
            self_cleaning: true,
        };
        let client = Arc::new(OnceLock::new());
        let launcher: Box<dyn Launcher> = match &spec.cow {
            None => Box::new(launcher),
            Some(_) => Box::new(CowLauncher {
                inner: launcher,
                client: Arc::clone(&client),
            }),
        };
        let mut env = base_env(&spec.env);
        network.apply_env(&mut env);
        let mut inner = GuestSandbox::new(GuestConfig {
            backend: NAME,
            fence,
            caps,
            base_env: env,
            guest: None,
            max_output: spec.max_output,
            idle_timeout: config.launch.idle_timeout,
            driver: config.launch.driver.clone(),
            launcher,
            proxy: network.proxy,
        })?;
        if spec.cow.is_some() {
            // The fence opened above is on the workspace itself, the
            // overlay's lower layer: a write through it would land behind
            // the commands' view. Its file operations (and the commands'
            // working directories) go through the layered view instead.
            let view = layered_view(
                client.get().copied(),
                &plan.workspace,
                config.launch.fence.clone(),
                real,
            );
            match view {
                Ok(view) => inner.set_fence(view),
                Err(e) => {
                    let _ = hako_core::Sandbox::close(&inner);
                    return Err(e);
                }
            }
        }
        Ok(GvisorSandbox { inner, name })
    }

    /// The container's id (as `runsc list` shows it).
    pub fn container(&self) -> &str {
        &self.name
    }
}

/// overlayfs's `f_type`.
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;

/// The fence of a copy-on-write sandbox: the workspace as its commands see
/// it, the overlay the host view mounted over the workspace's path in the
/// mount namespace it left to `runsc`, reached by `/proc/PID/root` of the
/// runtime's client (`client`: the host view, which became `runsc run`
/// and is hako's child, not yet reaped, so its pid names it for sure).
/// Checked to be an overlay, and not the real workspace (`real`: its device
/// and inode): never a fence that would write the workspace in its place.
fn layered_view(
    client: Option<u32>,
    workspace: &Path,
    options: FenceOptions,
    real: (u64, u64),
) -> Result<Fence> {
    let err = |message: String| backend_err("open the layered view", message);
    let pid = client.ok_or_else(|| err("the runtime's client was not started".into()))?;
    let root = PathBuf::from(format!("/proc/{pid}/root"))
        .join(workspace.strip_prefix("/").unwrap_or(workspace));
    let fence = Fence::open_as(&root, workspace, options).map_err(|e| err(e.to_string()))?;
    let fs = hako_sys::rustix::fs::fstatfs(fence.root()).map_err(|e| err(e.to_string()))?;
    #[allow(clippy::unnecessary_cast)] // `f_type`'s type differs by target
    if fs.f_type as i64 != OVERLAYFS_SUPER_MAGIC {
        return Err(err(format!(
            "{} is not the overlay the host view mounts (file system type {:#x})",
            root.display(),
            fs.f_type
        )));
    }
    let st = hako_sys::rustix::fs::fstat(fence.root()).map_err(|e| err(e.to_string()))?;
    if (st.st_dev, st.st_ino) == real {
        return Err(err(format!(
            "{} is the workspace itself, not its layered view",
            root.display()
        )));
    }
    Ok(fence)
}

/// The launcher of a copy-on-write sandbox: the container's, which it
/// runs, keeping the pid of the runtime's client (for [`layered_view`]);
/// and closing always waits for the client, so that the overlay, which
/// lives as long as its mount namespace, is gone before the layers are
/// let go (reviewed, committed, or mounted by the next sandbox).
#[derive(Debug)]
struct CowLauncher {
    inner: ContainerLauncher,
    client: Arc<OnceLock<u32>>,
}

impl Launcher for CowLauncher {
    fn start(&self) -> Result<GuestStart> {
        let start = self.inner.start()?;
        if let GuestStart::Piped { child, .. } = &start {
            let _ = self.client.set(child.id());
        }
        Ok(start)
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        self.inner.cwd_inside(rel)
    }

    fn close(&self, guest_exited_cleanly: bool) {
        self.inner.close(guest_exited_cleanly);
    }

    fn waits_for_guest(&self) -> bool {
        true
    }

    fn cleans_up_after_itself(&self) -> bool {
        self.inner.cleans_up_after_itself()
    }

    fn abandon(&self) {
        self.inner.abandon();
    }
}

/// Removes, once per process, the bundles (and any container state in
/// them) of hako processes that are gone (see [`crate::gc`]).
fn collect_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let report = match crate::gc::collect_bundles(&CliRunner, &runsc_path(None)) {
            Ok(report) => report,
            Err(e) => return tracing::warn!("gvisor: not collecting stale bundles: {e}"),
        };
        for entry in &report.skipped {
            tracing::warn!("gvisor: skipped {entry}");
        }
        for e in &report.failed {
            tracing::warn!("gvisor: stale bundle: {e}");
        }
    });
}

/// Whether `runsc` runs here (for tests that skip without it); the
/// reason when not. Whether it also runs everyday tools (an old `runsc`
/// fails `ls -la`), which `auto` asks next, is
/// [`crate::everyday_tools_work`]. [`readiness`] gives the hint too.
pub fn ready() -> std::result::Result<(), String> {
    readiness().map_err(|e| e.to_string())
}

/// [`ready`], with the hint that fits the cause found: `runsc` missing,
/// `runsc` there but failing, or no static guest.
pub fn readiness() -> std::result::Result<(), hako_container::NotReady> {
    runsc_readiness(&runsc_path(None))?;
    hako_container::static_guest_ready().map(|_| ())
}

/// Whether `runsc` (at `runsc`) answers `--version`.
fn runsc_readiness(runsc: &Path) -> std::result::Result<(), hako_container::NotReady> {
    use hako_container::NotReady;
    match CliRunner.output(&[runsc.display().to_string(), "--version".into()]) {
        Ok(out) if out.success => Ok(()),
        Ok(out) => Err(NotReady {
            reason: format!("{} --version failed: {}", runsc.display(), out.message()),
            hint: format!(
                "runsc is installed but does not run: check `{} --version` by hand, or point {RUNSC_VAR} at a working runsc",
                runsc.display()
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NotReady {
            reason: format!("{} is not installed", runsc.display()),
            hint: format!(
                "install gVisor's runsc (Debian: `sudo apt-get install runsc`), or set {RUNSC_VAR} to its path"
            ),
        }),
        Err(e) => Err(NotReady {
            reason: format!("{} cannot run: {e}", runsc.display()),
            hint: format!("make {} executable, or set {RUNSC_VAR} to a runsc that is", runsc.display()),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn runsc_missing_and_runsc_failing_get_different_hints() {
        let missing = runsc_readiness(Path::new("/nonexistent/runsc")).unwrap_err();
        assert!(missing.reason.ends_with("is not installed"), "{missing}");
        assert!(
            missing.hint.starts_with("install gVisor's runsc"),
            "{missing}"
        );
        // A program that is there but fails `--version`.
        let failing = runsc_readiness(Path::new("/bin/false")).unwrap_err();
        assert!(failing.reason.contains("--version failed"), "{failing}");
        assert!(!failing.hint.contains("apt-get install"), "{failing}");
    }

    #[test]
    fn a_cow_sandbox_s_launcher_always_waits_for_the_client_and_delegates_the_rest() {
        let launcher = ContainerLauncher {
            backend: NAME,
            program: "runsc",
            runner: Arc::new(CliRunner),
            name: "n".into(),
            argv: vec![],
            workspace: "/w".into(),
            cleanup: vec![],
            keep: Mutex::new(vec![]),
            network: None,
            seal: None,
            memory: None,
            self_cleaning: true,
        };
        let cow = CowLauncher {
            inner: launcher,
            client: Arc::new(OnceLock::new()),
        };
        assert!(cow.waits_for_guest());
        assert!(cow.cleans_up_after_itself());
        assert_eq!(cow.cwd_inside(Path::new("d")), Some(PathBuf::from("/w/d")));
    }

    #[test]
    fn a_layered_view_that_is_not_an_overlay_or_is_the_workspace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().canonicalize().unwrap();
        let st = std::fs::metadata(&ws).unwrap();
        let real = (
            std::os::unix::fs::MetadataExt::dev(&st),
            std::os::unix::fs::MetadataExt::ino(&st),
        );
        // This process's own root: the workspace itself, seen as it is.
        let me = std::process::id();
        let err = layered_view(Some(me), &ws, FenceOptions::default(), real).unwrap_err();
        assert!(
            err.to_string().contains("not the overlay") || err.to_string().contains("itself"),
            "{err}"
        );
        let err = layered_view(None, &ws, FenceOptions::default(), real).unwrap_err();
        assert!(err.to_string().contains("not started"), "{err}");
    }
}
