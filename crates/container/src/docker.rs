//! The `docker` backend: one locked-down container per sandbox, started
//! once through the Docker or Podman CLI with the static guest as its
//! entrypoint; every command is a protocol round trip to that guest.
//!
//! What it enforces: the runtime's namespaces (no network but loopback),
//! a read-only root with a size-limited private `/tmp`, no capabilities,
//! `no-new-privileges`, hako's seccomp policy rendered to the runtime's
//! profile, the invoking user's uid and gid, cgroup limits through the
//! runtime, and the workspace as the only writable host directory. With
//! `--runtime runsc` the container runs on gVisor's kernel (Isolation
//! Kernel). What it does not: with runc or crun the container shares the
//! host kernel, and a kernel bug is an escape; the daemon (dockerd) runs
//! as root, so access to its socket is root on the host.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use hako_core::env::EnvPolicy;
use hako_core::{
    Capabilities, Error, Isolation, Limits, NetworkAccess, NetworkPolicy, Result,
    DEFAULT_MAX_OUTPUT,
};
use hako_driver::network::{NetworkSetup, NET_DIR};
use hako_driver::sandbox::{common_limits, open_workspace, GuestConfig, GuestSandbox, OPTIONAL};
use hako_fence::FenceOptions;
use hako_proto::{Seal, GUEST_FD_DIRS};

use crate::common::{
    self, base_env, cpus_decimal, limit_reports, locate_static_guest, ContainerLauncher, Owner,
    GUEST_INSIDE, LABEL_PID, LABEL_START,
};
use crate::engine::{Engine, EngineKind};
use crate::exec_mode::{DockerExecSandbox, EXEC_MODE_OPTIONAL};
use crate::runner::{CliRunner, Runner};

/// The backend's name.
pub const NAME: &str = "docker";

/// The image used when none is named: what `hako image build` makes.
pub const DEFAULT_IMAGE: &str = "hako-busybox:latest";

/// Size of the private `/tmp` when none is given.
pub const DEFAULT_TMP_SIZE: u64 = 512 << 20;

/// How a docker sandbox is set up.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The workspace on the host; bound read-write at the same path.
    pub workspace: PathBuf,
    /// The image.
    pub image: String,
    /// The OCI runtime (`runsc` for gVisor); `None` is the daemon's default.
    pub runtime: Option<String>,
    /// Which host variables pass, and what is set.
    pub env: EnvPolicy,
    /// Cap on each of stdout and stderr kept per command.
    pub max_output: usize,
    /// Fence settings.
    pub fence: FenceOptions,
    /// The statically linked `hako-guest`; `None` chooses (see
    /// [`locate_static_guest`]).
    pub guest: Option<PathBuf>,
    /// Extra read-only binds (same path inside).
    pub ro: Vec<PathBuf>,
    /// Extra read-write binds (same path inside).
    pub rw: Vec<PathBuf>,
    /// Resource limits.
    pub limits: Limits,
    /// Size of the private `/tmp`, bytes.
    pub tmp_size: u64,
    /// Close the sandbox after this long idle.
    pub idle_timeout: Option<Duration>,
    /// How the caller has the driver read and close the sandbox.
    pub driver: hako_driver::DriverOptions,
    /// Run even when a protection cannot be applied here (it is then left
    /// out of the capabilities): for now, a gVisor runtime that does not
    /// apply the seccomp profile.
    pub best_effort: bool,
    /// The runtime CLI; `None` chooses (see [`Engine::choose`]).
    pub engine: Option<Engine>,
    /// The network: `none` (the default), `allow` through the egress
    /// proxy, or `host`.
    pub network: NetworkPolicy,
    /// Runs the CLI (tests record instead).
    pub runner: Arc<dyn Runner>,
}

impl DockerConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        DockerConfig {
            workspace: workspace.into(),
            image: DEFAULT_IMAGE.into(),
            runtime: None,
            env: EnvPolicy::default(),
            max_output: DEFAULT_MAX_OUTPUT,
            fence: FenceOptions::default(),
            guest: None,
            ro: Vec::new(),
            rw: Vec::new(),
            limits: Limits::default(),
            tmp_size: DEFAULT_TMP_SIZE,
            idle_timeout: None,
            driver: hako_driver::DriverOptions::default(),
            best_effort: false,
            engine: None,
            network: NetworkPolicy::none(),
            runner: Arc::new(CliRunner),
        }
    }
}

/// Whether `runtime` names gVisor.
pub fn is_gvisor_runtime(runtime: Option<&str>) -> bool {
    runtime.is_some_and(|r| {
        Path::new(r)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "runsc" || n.starts_with("runsc-") || n == "gvisor")
    })
}

/// Everything `docker run` is told about one sandbox's container.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The container's name.
    pub name: String,
    /// The hako process that owns it.
    pub owner: Owner,
    /// The workspace (host path = path inside).
    pub workspace: PathBuf,
    /// The static guest on the host.
    pub guest: PathBuf,
    /// The seccomp profile file.
    pub seccomp_profile: PathBuf,
    /// The image.
    pub image: String,
    /// The OCI runtime.
    pub runtime: Option<String>,
    /// Limits.
    pub limits: Limits,
    /// Size of `/tmp`, bytes.
    pub tmp_size: u64,
    /// uid and gid commands run as.
    pub user: (u32, u32),
    /// The guest seals itself before it serves (see [`RunPlan::seals`]).
    pub sealed: bool,
    /// Extra read-only binds.
    pub ro: Vec<PathBuf>,
    /// Extra read-write binds.
    pub rw: Vec<PathBuf>,
    /// The network.
    pub network: RunNetwork,
}

impl RunPlan {
    /// Whether a guest started as `user` under `runtime` seals itself:
    /// under a gVisor runtime, started as root. gVisor lets a process open
    /// the descriptors of another of its uid through `/proc/PID/fd`
    /// whatever its dumpable flag, and commands run as the guest's uid: the
    /// guest hides its own descriptor directories, which needs
    /// `CAP_SYS_ADMIN` and a profile that lets it mount, then installs the
    /// full filter itself. (runc's kernel honours "not dumpable", which the
    /// guest sets.) A container of another uid gets no capability from the
    /// runtime: see `Prepared::new` for what is refused then.
    pub fn seals(user: (u32, u32), runtime: Option<&str>) -> bool {
        user.0 == 0 && is_gvisor_runtime(runtime)
    }

    /// What the guest does to itself before it serves, when
    /// [`RunPlan::sealed`].
    pub fn seal(&self) -> Option<Seal> {
        self.sealed.then(|| Seal {
            mask_dirs: GUEST_FD_DIRS.iter().map(PathBuf::from).collect(),
            seccomp: true,
            guard: true,
            ..Seal::default()
        })
    }
}

/// The network a container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunNetwork {
    /// `--network none`: loopback only.
    None,
    /// `--network none`, and the egress proxy's socket directory (this host
    /// path) bound read-only at [`NET_DIR`].
    Proxy(PathBuf),
    /// `--network host`.
    Host,
}

impl RunNetwork {
    /// What a sandbox's network setup asks of its container.
    pub fn of(network: &NetworkSetup) -> RunNetwork {
        match (network.access, network.socket_dir()) {
            (NetworkAccess::Host, _) => RunNetwork::Host,
            (_, Some(dir)) => RunNetwork::Proxy(dir),
            (_, None) => RunNetwork::None,
        }
    }
}

fn bind(src: &Path, dst: &Path, read_only: bool) -> String {
    let mut spec = format!("type=bind,src={},dst={}", src.display(), dst.display());
    if read_only {
        spec.push_str(",readonly");
    }
    spec
}

/// The `docker run` (or `podman run`) argv that starts a sandbox's
/// container: attached on stdin and stdout (the guest's link), removed
/// when it ends, and locked down.
pub fn run_argv(engine: &Engine, plan: &RunPlan) -> Vec<String> {
    let mut a: Vec<String> = vec!["run".into(), "--interactive".into(), "--rm".into()];
    a.extend(lockdown_args(engine, plan));
    if plan.sealed {
        // What the guest seals itself with (see `RunPlan::sealed`); it
        // empties the bounding set, so no command gets either.
        for cap in ["SYS_ADMIN", "SETPCAP"] {
            a.extend(["--cap-add".into(), cap.into()]);
        }
    }
    a.extend([
        "--mount".into(),
        bind(&plan.guest, Path::new(GUEST_INSIDE), true),
        "--entrypoint".into(),
        GUEST_INSIDE.into(),
        plan.image.clone(),
        "--stdio".into(),
    ]);
    engine.command(a)
}

/// The `docker run` argv of a container for `docker exec` mode (an image
/// where the static guest cannot run): detached, with the runtime's init
/// (which reaps) and `sleep` from the image keeping it up, and the same
/// lockdown. Removed by hako, not by `--rm`, so that a deadline can restart
/// it.
pub fn keeper_argv(engine: &Engine, plan: &RunPlan) -> Vec<String> {
    let mut a: Vec<String> = vec!["run".into(), "--detach".into(), "--init".into()];
    a.extend(lockdown_args(engine, plan));
    a.extend([
        "--entrypoint".into(),
        "sleep".into(),
        plan.image.clone(),
        "2147483647".into(),
    ]);
    engine.command(a)
}

/// The flags every sandbox container gets: name and owner labels, no
/// network, a read-only root, no capabilities, the seccomp profile, the
/// user, the workspace, the extra binds and the limits.
fn lockdown_args(engine: &Engine, plan: &RunPlan) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--pull".into(),
        "never".into(),
        "--name".into(),
        plan.name.clone(),
        "--label".into(),
        format!("{LABEL_PID}={}", plan.owner.pid),
        "--label".into(),
        format!("{LABEL_START}={}", plan.owner.start),
        // The guest's frames are not a log: keep them out of the daemon's.
        "--log-driver".into(),
        "none".into(),
        "--network".into(),
        match plan.network {
            RunNetwork::Host => "host".into(),
            RunNetwork::None | RunNetwork::Proxy(_) => "none".into(),
        },
        "--hostname".into(),
        "hako".into(),
        "--read-only".into(),
        "--tmpfs".into(),
        format!("/tmp:rw,nosuid,nodev,size={}", plan.tmp_size),
        "--cap-drop".into(),
        "ALL".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
        "--security-opt".into(),
        format!("seccomp={}", plan.seccomp_profile.display()),
        "--user".into(),
        format!("{}:{}", plan.user.0, plan.user.1),
        "--workdir".into(),
        plan.workspace.display().to_string(),
        "--mount".into(),
        bind(&plan.workspace, &plan.workspace, false),
    ];
    if let RunNetwork::Proxy(dir) = &plan.network {
        a.extend(["--mount".into(), bind(dir, Path::new(NET_DIR), true)]);
    }
    for dir in &plan.ro {
        a.extend(["--mount".into(), bind(dir, dir, true)]);
    }
    for dir in &plan.rw {
        a.extend(["--mount".into(), bind(dir, dir, false)]);
    }
    let limits = &plan.limits;
    if let Some(memory) = limits.memory {
        // No swap beyond the memory limit.
        a.extend([
            "--memory".into(),
            memory.to_string(),
            "--memory-swap".into(),
            memory.to_string(),
        ]);
    }
    if let Some(pids) = limits.pids {
        a.extend(["--pids-limit".into(), pids.to_string()]);
    }
    if let Some(milli) = limits.cpus_milli {
        a.extend(["--cpus".into(), cpus_decimal(milli)]);
    }
    if let Some(size) = limits.file_size {
        a.extend(["--ulimit".into(), format!("fsize={size}:{size}")]);
    }
    match (limits.open_files, engine.kind) {
        (Some(n), _) => a.extend(["--ulimit".into(), format!("nofile={n}:{n}")]),
        // runc under Podman fails to raise these to Podman's defaults on
        // hosts with hybrid cgroups: give them explicitly.
        (None, EngineKind::Podman) => a.extend(["--ulimit".into(), "nofile=1024:1024".into()]),
        (None, EngineKind::Docker) => {}
    }
    if engine.kind == EngineKind::Podman {
        a.extend(["--ulimit".into(), "nproc=4096:4096".into()]);
    }
    if let Some(runtime) = &plan.runtime {
        a.extend(["--runtime".into(), runtime.clone()]);
    }
    a
}

/// hako's seccomp policy as a profile file the runtime's CLI reads (see
/// [`common::seccomp_profile`] for what changes under gVisor).
pub fn write_seccomp_profile(gvisor: bool, sealed: bool) -> Result<tempfile::NamedTempFile> {
    let profile = common::seccomp_profile(gvisor, sealed);
    let io = |source| Error::Io {
        op: "write the seccomp profile",
        source,
    };
    // In hako's private directory, like every file hako leaves for a
    // runtime to read.
    let mut file = tempfile::Builder::new()
        .prefix("hako-seccomp-")
        .suffix(".json")
        .tempfile_in(crate::private::private_dir()?)
        .map_err(io)?;
    serde_json::to_writer(&mut file, &profile).map_err(|e| io(e.into()))?;
    file.flush().map_err(io)?;
    Ok(file)
}

/// A sandbox whose commands run in a container of its own.
#[derive(Debug)]
pub struct DockerSandbox {
    inner: GuestSandbox,
    name: String,
}

hako_driver::delegate_sandbox!(DockerSandbox, inner);

/// What both modes decide before a container starts.
struct Prepared {
    fence: hako_fence::Fence,
    runner: Arc<dyn Runner>,
    engine: Arc<Engine>,
    plan: RunPlan,
    profile: tempfile::NamedTempFile,
    caps: Capabilities,
    network: NetworkSetup,
}

/// Refuses what the runtime's CLI would read as something else: an image
/// that looks like a flag, and a bind path with a character of `--mount`'s
/// comma-separated syntax (a path `/a,dst=/etc` would add an option).
pub fn check_run_plan(plan: &RunPlan) -> Result<()> {
    let refuse = |message: String| Error::Backend {
        backend: NAME.into(),
        op: "plan the container",
        message,
    };
    if plan.image.is_empty() || plan.image.starts_with('-') {
        return Err(refuse(format!("{:?} is not an image name", plan.image)));
    }
    let guest = (!plan.guest.as_os_str().is_empty()).then_some(&plan.guest);
    let proxy = match &plan.network {
        RunNetwork::Proxy(dir) => Some(dir),
        RunNetwork::None | RunNetwork::Host => None,
    };
    for path in [&plan.workspace, &plan.seccomp_profile]
        .into_iter()
        .chain(guest)
        .chain(proxy)
        .chain(&plan.ro)
        .chain(&plan.rw)
    {
        let text = path.to_str().ok_or_else(|| {
            refuse(format!(
                "{} is not valid UTF-8; it cannot be bound",
                path.display()
            ))
        })?;
        if text.contains([',', '"', '\n', '\r']) || !path.is_absolute() {
            return Err(refuse(format!(
                "cannot bind {text:?}: a bind path must be absolute and hold no comma, quote or newline (the runtime's --mount syntax)"
            )));
        }
    }
    Ok(())
}

impl Prepared {
    /// `guest`: the static guest is needed (guest mode).
    fn new(config: &DockerConfig, guest: bool, optional: hako_core::Optional) -> Result<Self> {
        let fence = open_workspace(&config.workspace, &config.fence)?;
        let network = NetworkSetup::new(&config.network)?;
        if network.spec.is_some() && !guest {
            return Err(network.unavailable(
                NAME,
                "without the guest (--no-guest) nothing inside relays to the egress proxy",
            ));
        }
        let runner = Arc::clone(&config.runner);
        let engine = match &config.engine {
            Some(engine) => Arc::new(engine.clone()),
            None => crate::engine::shared(runner.as_ref())?,
        };
        collect_once(&engine, &runner);
        let with_guest = guest;
        let guest = if with_guest {
            locate_static_guest(NAME, config.guest.as_deref())?
        } else {
            PathBuf::new()
        };
        let runtime = config
            .runtime
            .clone()
            .or_else(|| podman_runtime_default(&engine));
        let gvisor = is_gvisor_runtime(runtime.as_deref());
        let user = (
            hako_sys::rustix::process::geteuid().as_raw(),
            hako_sys::rustix::process::getegid().as_raw(),
        );
        let sealed = with_guest && RunPlan::seals(user, runtime.as_deref());
        // A sealing guest mounts its masks, then installs the whole
        // policy itself; the runtime's profile lets it mount until then.
        let profile = write_seccomp_profile(gvisor, sealed)?;
        let plan = RunPlan {
            name: common::unique_name("hako"),
            owner: Owner::current(),
            workspace: fence.workdir().to_path_buf(),
            guest,
            seccomp_profile: profile.path().to_path_buf(),
            image: config.image.clone(),
            runtime,
            limits: config.limits,
            tmp_size: config.tmp_size,
            user,
            sealed,
            ro: config.ro.clone(),
            rw: config.rw.clone(),
            network: RunNetwork::of(&network),
        };
        check_run_plan(&plan)?;
        if gvisor {
            check_gvisor_network(&engine, runner.as_ref(), &plan, &network)?;
        }
        if with_guest && gvisor && !plan.sealed && !config.best_effort {
            // Not dumpable is no protection under gVisor, and a container
            // of another uid than root gets no capability to guard with.
            return Err(Error::Backend {
                backend: NAME.into(),
                op: "plan the container",
                message: format!(
                    "under the gVisor runtime {} the guest keeps commands away from its link to hako with a capability, which a container started as uid {} does not get; run hako as root, use --backend gvisor, or pass --best-effort to run with commands able to reach the guest's descriptors",
                    plan.runtime.as_deref().unwrap_or(""),
                    plan.user.0
                ),
            });
        }
        let isolation = if gvisor {
            Isolation::Kernel
        } else {
            Isolation::Process
        };
        // runsc applies a container's seccomp profile only when registered
        // with --oci-seccomp: ask the daemon, and fail closed.
        let seccomp =
            !gvisor || runtime_applies_seccomp(&engine, runner.as_ref(), plan.runtime.as_deref())?;
        if !seccomp && !config.best_effort {
            return Err(Error::Backend {
                backend: NAME.into(),
                op: "plan the container",
                message: format!(
                    "the daemon's runtime {} does not apply the seccomp profile (its runtimeArgs lack --oci-seccomp); add it in /etc/docker/daemon.json, or pass --best-effort to run without the filter",
                    plan.runtime.as_deref().unwrap_or("")
                ),
            });
        }
        let mut limits = common_limits(config.max_output, &fence);
        limits.extend(limit_reports(&config.limits));
        let caps = Capabilities {
            backend: NAME.into(),
            isolation,
            network: network.access,
            fence: fence.resolver(),
            limits,
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            seccomp,
            optional,
        };
        Ok(Prepared {
            fence,
            runner,
            engine,
            plan,
            profile,
            caps,
            network,
        })
    }
}

/// A gVisor runtime reaches the proxy's socket only when the daemon runs
/// it with `--host-uds=open` (gVisor refuses host sockets otherwise), and
/// shares the host's network only when it was not registered with
/// `--network=none`. Asked of the daemon; refused (fail closed) when not.
fn check_gvisor_network(
    engine: &Engine,
    runner: &dyn Runner,
    plan: &RunPlan,
    network: &NetworkSetup,
) -> Result<()> {
    let runtime = plan.runtime.as_deref().unwrap_or("");
    let args: Vec<String> = if engine.kind == EngineKind::Docker {
        daemon_runtimes(engine, runner)?[runtime]["runtimeArgs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let has = |flag: &str| args.iter().any(|a| a == flag);
    match &plan.network {
        RunNetwork::Proxy(_)
            if !(has("--host-uds=open") || has("--host-uds=all") || has("--fsgofer-host-uds")) =>
        {
            Err(network.unavailable(
                NAME,
                format!("the runtime {runtime} reaches the egress proxy's socket only with --host-uds=open in its runtimeArgs (daemon.json)"),
            ))
        }
        RunNetwork::Host if has("--network=none") || engine.kind != EngineKind::Docker => {
            Err(network.unavailable(
                NAME,
                format!("the runtime {runtime} is registered with --network=none"),
            ))
        }
        _ => Ok(()),
    }
}

impl DockerSandbox {
    /// Starts the sandbox's container and waits for its guest; a runtime
    /// that is missing, a daemon that is down or an image that is not
    /// there fails here, with the runtime's own words.
    pub fn new(config: DockerConfig) -> Result<Self> {
        let Prepared {
            fence,
            runner,
            engine,
            plan,
            profile,
            caps,
            network,
        } = Prepared::new(&config, true, OPTIONAL)?;
        let launcher = ContainerLauncher {
            backend: NAME,
            program: engine.name(),
            runner,
            name: plan.name.clone(),
            argv: run_argv(&engine, &plan),
            workspace: plan.workspace.clone(),
            cleanup: vec![engine.command(["rm", "--force", plan.name.as_str()])],
            keep: Mutex::new(vec![Box::new(profile)]),
            network: network.spec.clone(),
            seal: plan.seal(),
            self_cleaning: false,
        };
        let mut env = base_env(&config.env);
        network.apply_env(&mut env);
        Ok(DockerSandbox {
            inner: GuestSandbox::new(GuestConfig {
                backend: NAME,
                fence,
                caps,
                base_env: env,
                guest: None,
                max_output: config.max_output,
                idle_timeout: config.idle_timeout,
                driver: config.driver.clone(),
                launcher: Box::new(launcher),
                proxy: network.proxy,
            })?,
            name: plan.name,
        })
    }

    /// The container's name.
    pub fn container(&self) -> &str {
        &self.name
    }
}

impl DockerExecSandbox {
    /// `docker exec` mode: starts the same locked-down container, kept up
    /// by the image's `sleep`, and runs each command with `docker exec`
    /// (see [`crate::exec_mode`] for what this mode does not do).
    pub fn new(config: DockerConfig) -> Result<Self> {
        let Prepared {
            fence,
            runner,
            engine,
            plan,
            profile,
            caps,
            network: _,
        } = Prepared::new(&config, false, EXEC_MODE_OPTIONAL)?;
        let out = runner
            .output(&keeper_argv(&engine, &plan))
            .map_err(|e| Error::Backend {
                backend: NAME.into(),
                op: "start the container",
                message: format!("cannot run {}: {e}", engine.name()),
            })?;
        if !out.success {
            // A failed `run --detach` may still have created it.
            let _ = runner.output(&engine.command(["rm", "--force", plan.name.as_str()]));
            return Err(Error::Backend {
                backend: NAME.into(),
                op: "start the container",
                message: format!("container {}: {}", plan.name, out.message()),
            });
        }
        Ok(DockerExecSandbox {
            engine,
            runner,
            name: plan.name,
            fence,
            caps,
            base_env: base_env(&config.env),
            max_output: config.max_output,
            workspace: plan.workspace,
            user: plan.user,
            closed: std::sync::atomic::AtomicBool::new(false),
            keep: Mutex::new(Some(profile)),
        })
    }
}

/// The daemon's runtimes (`docker info`'s `Runtimes`: name to path and
/// arguments), asked once per process and engine.
fn daemon_runtimes(engine: &Engine, runner: &dyn Runner) -> Result<serde_json::Value> {
    static ASKED: Mutex<Option<(Vec<String>, serde_json::Value)>> = Mutex::new(None);
    let fail = |message: String| Error::Backend {
        backend: NAME.into(),
        op: "ask the daemon about its runtimes",
        message,
    };
    let mut asked = ASKED.lock().map_err(|_| fail("lock poisoned".into()))?;
    if let Some((argv, runtimes)) = asked.as_ref() {
        if *argv == engine.argv {
            return Ok(runtimes.clone());
        }
    }
    let out = runner
        .output(&engine.command(["info", "--format", "{{json .Runtimes}}"]))
        .map_err(|e| fail(e.to_string()))?;
    if !out.success {
        return Err(fail(out.message()));
    }
    let runtimes: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    *asked = Some((engine.argv.clone(), runtimes.clone()));
    Ok(runtimes)
}

/// Whether the daemon runs `runtime` (a gVisor one) with `--oci-seccomp`.
/// Podman passes no arguments of its own to a runtime: there, no.
fn runtime_applies_seccomp(
    engine: &Engine,
    runner: &dyn Runner,
    runtime: Option<&str>,
) -> Result<bool> {
    let Some(runtime) = runtime else {
        return Ok(false);
    };
    if engine.kind == EngineKind::Podman {
        return Ok(false);
    }
    Ok(daemon_runtimes(engine, runner)?[runtime]["runtimeArgs"]
        .as_array()
        .is_some_and(|args| args.iter().any(|a| a == "--oci-seccomp")))
}

/// Podman's default runtime, crun, refuses to run on hosts with hybrid
/// cgroups (v1 controllers beside a v2 hierarchy): there, runc is asked for
/// when it is installed.
fn podman_runtime_default(engine: &Engine) -> Option<String> {
    let hybrid = Path::new("/sys/fs/cgroup/unified").is_dir()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    (engine.kind == EngineKind::Podman && hybrid && crate::engine::on_path("runc"))
        .then(|| "runc".to_string())
}

/// Whether a docker sandbox of `image` can start here: a runtime that
/// answers, the image present locally, and a static guest. The reason when
/// not (for `hako doctor` and for tests that skip without one).
pub fn ready(image: &str, runtime: Option<&str>) -> std::result::Result<(), String> {
    let engine = crate::engine::shared(&CliRunner).map_err(|e| e.to_string())?;
    let out = CliRunner
        .output(&engine.command(["image", "inspect", "--format", "{{.Id}}", image]))
        .map_err(|e| e.to_string())?;
    if !out.success {
        return Err(format!(
            "image {image} is not present ({}); build it with `hako image build`",
            out.message()
        ));
    }
    if let Some(runtime) = runtime.filter(|_| engine.kind == EngineKind::Docker) {
        let runtimes = daemon_runtimes(&engine, &CliRunner).map_err(|e| e.to_string())?;
        if runtimes.get(runtime).is_none() {
            return Err(format!(
                "the daemon has no runtime named {runtime}; register it in /etc/docker/daemon.json"
            ));
        }
    }
    locate_static_guest(NAME, None)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Removes, once per process, the containers of hako processes that are
/// gone (a `kill -9` leaves its container behind only until then).
/// On a thread of its own: the sandbox does not wait for it.
fn collect_once(engine: &Arc<Engine>, runner: &Arc<dyn Runner>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let (engine, runner) = (Arc::clone(engine), Arc::clone(runner));
        let spawned = std::thread::Builder::new()
            .name("hako-docker-gc".into())
            .spawn(move || {
                if let Err(e) = crate::gc::collect(&engine, runner.as_ref()) {
                    tracing::debug!("docker: collecting stale containers: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::debug!("docker: cannot start collecting stale containers: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RunPlan {
        RunPlan {
            name: "hako-1-0-0".into(),
            owner: Owner { pid: 42, start: 7 },
            workspace: "/w".into(),
            guest: "/g/hako-guest".into(),
            seccomp_profile: "/p.json".into(),
            image: "img:1".into(),
            runtime: None,
            limits: Limits::default(),
            tmp_size: 1 << 20,
            user: (1000, 100),
            sealed: false,
            ro: Vec::new(),
            rw: Vec::new(),
            network: RunNetwork::None,
        }
    }

    fn docker() -> Engine {
        Engine {
            argv: vec!["docker".into()],
            kind: EngineKind::Docker,
        }
    }

    #[test]
    fn a_root_guest_under_gvisor_seals_itself_and_is_given_what_it_needs_for_it() {
        assert!(RunPlan::seals((0, 0), Some("runsc")));
        assert!(!RunPlan::seals((0, 0), Some("runc")));
        assert!(!RunPlan::seals((0, 0), None));
        assert!(!RunPlan::seals((1000, 100), Some("runsc")));
        let mut p = plan();
        let argv = run_argv(&docker(), &p);
        assert!(!argv.iter().any(|a| a == "--cap-add"), "{argv:?}");
        assert_eq!(p.seal(), None);
        p.sealed = true;
        let argv = run_argv(&docker(), &p);
        for cap in ["SYS_ADMIN", "SETPCAP"] {
            assert!(
                argv.windows(2).any(|w| w[0] == "--cap-add" && w[1] == cap),
                "{cap}: {argv:?}"
            );
        }
        // Every capability goes first, so only what the guest seals with
        // is added back.
        let drop = argv.iter().position(|a| a == "--cap-drop").unwrap();
        let add = argv.iter().position(|a| a == "--cap-add").unwrap();
        assert!(drop < add);
        let seal = p.seal().unwrap();
        assert!(seal.seccomp && seal.guard);
        assert_eq!(
            seal.mask_dirs,
            [
                PathBuf::from("/proc/1/fd"),
                PathBuf::from("/proc/1/task/1/fd")
            ]
        );
        // The profile leaves `mount` to the filter the guest installs.
        let mounts = |profile: &serde_json::Value| {
            profile["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == "mount"))
                .count()
        };
        assert!(mounts(&common::seccomp_profile(true, false)) > 0);
        assert_eq!(mounts(&common::seccomp_profile(true, true)), 0);
    }

    #[test]
    fn network_modes_render_as_network_flags_and_the_proxy_socket_bind() {
        let mut p = plan();
        p.network = RunNetwork::Proxy("/tmp/hako-net-x".into());
        let argv = run_argv(&docker(), &p).join(" ");
        assert!(argv.contains("--network none"), "{argv}");
        assert!(
            argv.contains("--mount type=bind,src=/tmp/hako-net-x,dst=/run/hako-net,readonly"),
            "{argv}"
        );
        p.network = RunNetwork::Host;
        let argv = run_argv(&docker(), &p).join(" ");
        assert!(
            argv.contains("--network host") && !argv.contains("hako-net"),
            "{argv}"
        );
        // A socket directory is a bind path like any other.
        p.network = RunNetwork::Proxy("/tmp/a,dst=/etc".into());
        assert!(check_run_plan(&p).is_err());
    }

    #[test]
    fn docker_run_argv_is_locked_down_by_default() {
        let argv = run_argv(&docker(), &plan());
        let expected: Vec<&str> = vec![
            "docker",
            "run",
            "--interactive",
            "--rm",
            "--pull",
            "never",
            "--name",
            "hako-1-0-0",
            "--label",
            "hako.owner.pid=42",
            "--label",
            "hako.owner.start=7",
            "--log-driver",
            "none",
            "--network",
            "none",
            "--hostname",
            "hako",
            "--read-only",
            "--tmpfs",
            "/tmp:rw,nosuid,nodev,size=1048576",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--security-opt",
            "seccomp=/p.json",
            "--user",
            "1000:100",
            "--workdir",
            "/w",
            "--mount",
            "type=bind,src=/w,dst=/w",
            "--mount",
            "type=bind,src=/g/hako-guest,dst=/.hako-guest,readonly",
            "--entrypoint",
            "/.hako-guest",
            "img:1",
            "--stdio",
        ];
        assert_eq!(argv, expected);
    }

    #[test]
    fn limits_runtime_and_binds_reach_the_argv() {
        let mut p = plan();
        p.limits = Limits {
            memory: Some(256 << 20),
            pids: Some(128),
            cpus_milli: Some(1500),
            file_size: Some(10_000_000),
            open_files: Some(64),
        };
        p.runtime = Some("runsc".into());
        p.ro = vec!["/data".into()];
        p.rw = vec!["/cache".into()];
        let argv = run_argv(&docker(), &p).join(" ");
        for part in [
            "--mount type=bind,src=/data,dst=/data,readonly",
            "--mount type=bind,src=/cache,dst=/cache ",
            "--memory 268435456 --memory-swap 268435456",
            "--pids-limit 128",
            "--cpus 1.500",
            "--ulimit fsize=10000000:10000000",
            "--ulimit nofile=64:64",
            "--runtime runsc --mount type=bind,src=/g/hako-guest,dst=/.hako-guest,readonly --entrypoint /.hako-guest img:1 --stdio",
        ] {
            assert!(argv.contains(part), "{part:?} missing from {argv}");
        }
    }

    #[test]
    fn podman_gets_explicit_ulimits_and_its_leading_words() {
        let engine = Engine::from_words("sudo podman").unwrap_or_else(|| panic!("parsed"));
        let argv = run_argv(&engine, &plan());
        assert_eq!(&argv[..3], ["sudo", "podman", "run"]);
        let joined = argv.join(" ");
        assert!(joined.contains("--ulimit nofile=1024:1024"));
        assert!(joined.contains("--ulimit nproc=4096:4096"));
    }

    #[test]
    fn mount_option_injection_through_a_bind_path_is_refused() {
        check_run_plan(&plan()).unwrap_or_else(|e| panic!("{e}"));
        for bad in ["/w,dst=/etc", "/w\"x", "/w\nx", "relative"] {
            let mut p = plan();
            p.workspace = bad.into();
            assert!(check_run_plan(&p).is_err(), "{bad:?} accepted");
            let mut p = plan();
            p.ro = vec![bad.into()];
            assert!(check_run_plan(&p).is_err(), "--ro {bad:?} accepted");
        }
    }

    #[test]
    fn an_image_that_looks_like_a_flag_is_refused() {
        for bad in ["--privileged", "-v", ""] {
            let mut p = plan();
            p.image = bad.into();
            assert!(check_run_plan(&p).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn gvisor_is_recognised_by_runtime_name() {
        assert!(is_gvisor_runtime(Some("runsc")));
        assert!(is_gvisor_runtime(Some("/usr/bin/runsc")));
        assert!(!is_gvisor_runtime(Some("runc")));
        assert!(!is_gvisor_runtime(Some("crun")));
        assert!(!is_gvisor_runtime(None));
    }

    #[test]
    fn the_seccomp_profile_is_the_linux_policy_rendered() {
        let file = write_seccomp_profile(false, false).unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(file.path()).unwrap_or_else(|e| panic!("{e}"));
        let profile: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            profile,
            hako_seccomp::to_oci(&hako_seccomp::default_policy())
        );
        assert!(text.contains("\"ptrace\""));
    }
}
