//! A docker sandbox: its configuration, preparing the container (the
//! image's and runtime's checks, the static guest, the seccomp profile,
//! the network) and opening it, in guest mode or exec mode.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};

use hako_container::runner::{CliRunner, Runner};
use hako_container::{
    base_env, limit_reports, limit_reports_pids_inside, locate_static_guest, ContainerLauncher,
    Engine, EngineKind, NotReady, Owner, RunNetwork, DEFAULT_TMP_SIZE,
};
use hako_core::{Capabilities, Error, Isolation, NetworkPolicy, Result, SandboxSpec};
use hako_driver::network::NetworkSetup;
use hako_driver::sandbox::{common_limits, open_workspace, GuestConfig, GuestSandbox, OPTIONAL};
use hako_driver::LaunchOptions;

use crate::cow::{Volume, VolumeLauncher};
use crate::exec_mode::{DockerExecSandbox, EXEC_MODE_OPTIONAL};
use crate::plan::{
    check_run_plan, is_gvisor_runtime, keeper_argv, run_argv, write_seccomp_profile, CowVolume,
    RunPlan,
};
use crate::{DEFAULT_IMAGE, NAME};

/// How a docker sandbox is set up: what it is (the one spec every backend
/// is opened from) and how this process launches it.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The sandbox: workspace (bound read-write at the same path, or with
    /// `cow` an overlay volume there: see the `cow` module), image
    /// (`None` is [`DEFAULT_IMAGE`]), OCI runtime (`runsc` for gVisor;
    /// `None` is the daemon's default), environment, output cap, limits,
    /// binds, network (`None` is `none`) and `best_effort` (run even when
    /// a protection cannot be applied here, such as a gVisor runtime that
    /// does not apply the seccomp profile; it is then left out of the
    /// capabilities). Its `no_guest` is the caller's choice of
    /// [`DockerExecSandbox`] over [`DockerSandbox`].
    pub spec: SandboxSpec,
    /// The fence's settings, the statically linked `hako-guest` (`None`
    /// chooses: see [`locate_static_guest`]), the idle lease and the
    /// driver's options.
    pub launch: LaunchOptions,
    /// Size of the private `/tmp`, bytes.
    pub tmp_size: u64,
    /// The runtime CLI; `None` chooses (see [`Engine::choose`]).
    pub engine: Option<Engine>,
    /// Runs the CLI (tests record instead).
    pub runner: Arc<dyn Runner>,
}

impl DockerConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        DockerConfig::from_spec(SandboxSpec::new(workspace.into()))
    }

    /// A docker sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        DockerConfig {
            spec,
            launch: LaunchOptions::default(),
            tmp_size: DEFAULT_TMP_SIZE,
            engine: None,
            runner: Arc::new(CliRunner),
        }
    }
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

impl Prepared {
    /// `guest`: the static guest is needed (guest mode).
    fn new(config: &DockerConfig, guest: bool, optional: hako_core::Optional) -> Result<Self> {
        let spec = &config.spec;
        if spec.cow.is_some() && !guest {
            return Err(Error::Unsupported {
                backend: NAME.into(),
                capability: crate::cow::WITHOUT_GUEST,
            });
        }
        let fence = open_workspace(&spec.workspace, &config.launch.fence)?;
        let network = NetworkSetup::new(&spec.network.clone().unwrap_or_else(NetworkPolicy::none))?;
        if network.spec.is_some() && !guest {
            return Err(network.unavailable(
                NAME,
                "without the guest (--no-guest) nothing inside relays to the egress proxy",
            ));
        }
        let runner = Arc::clone(&config.runner);
        let engine = match &config.engine {
            Some(engine) => Arc::new(engine.clone()),
            None => hako_container::engine::shared(runner.as_ref())?,
        };
        if spec.cow.is_some()
            && engine.kind == EngineKind::Podman
            && !hako_sys::rustix::process::geteuid().is_root()
        {
            return Err(Error::Unsupported {
                backend: NAME.into(),
                capability: crate::cow::ROOTLESS_PODMAN,
            });
        }
        collect_once(&engine, &runner);
        let with_guest = guest;
        let guest = if with_guest {
            locate_static_guest(NAME, config.launch.guest.as_deref())?
        } else {
            PathBuf::new()
        };
        if spec.image.is_none() {
            // First use without an image: hako builds its default one.
            hako_container::image::ensure_default(&engine, runner.as_ref(), DEFAULT_IMAGE)?;
        }
        let runtime = spec
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
        let owner = Owner::current();
        let profile = write_seccomp_profile(gvisor, sealed, &owner)?;
        let name = hako_container::unique_name("hako");
        let plan = RunPlan {
            cow: spec.cow.as_ref().map(|layers| CowVolume {
                name: name.clone(),
                upper: layers.upper.clone(),
                work: layers.work.clone(),
            }),
            name,
            owner,
            workspace: fence.workdir().to_path_buf(),
            guest,
            seccomp_profile: profile.path().to_path_buf(),
            image: spec.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.into()),
            runtime,
            limits: spec.limits,
            tmp_size: config.tmp_size,
            user,
            sealed,
            ro: spec.ro.clone(),
            rw: spec.rw.clone(),
            network: RunNetwork::of(&network),
        };
        check_run_plan(&plan)?;
        if gvisor {
            check_gvisor_network(&engine, runner.as_ref(), &plan, &network)?;
        }
        if with_guest && gvisor && !plan.sealed && !spec.best_effort {
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
        if gvisor && !plan.sealed && plan.limits.pids.is_some() && !spec.best_effort {
            // Only a sealing guest can limit processes inside gVisor; the
            // runtime's host cgroup also counts gVisor's own threads, so a
            // command that reaches the limit ends the whole container.
            return Err(Error::Backend {
                backend: NAME.into(),
                op: "apply limits",
                message: format!(
                    "under the gVisor runtime {} --pids is applied inside the sandbox by the guest, which needs the guest started as root; without it the limit would fall on the runtime's host cgroup, which also counts gVisor's own threads (a command reaching it ends the whole sandbox); run hako as root with the guest, use --backend gvisor, or pass --best-effort to take the host cgroup's limit",
                    plan.runtime.as_deref().unwrap_or("")
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
        if !seccomp && !spec.best_effort {
            return Err(Error::Backend {
                backend: NAME.into(),
                op: "plan the container",
                message: format!(
                    "the daemon's runtime {} does not apply the seccomp profile (its runtimeArgs lack --oci-seccomp); add it in /etc/docker/daemon.json, or pass --best-effort to run without the filter",
                    plan.runtime.as_deref().unwrap_or("")
                ),
            });
        }
        let mut limits = common_limits(spec.max_output, &fence);
        limits.extend(if plan.seal().is_some_and(|s| s.pids_max.is_some()) {
            limit_reports_pids_inside(&spec.limits)
        } else {
            limit_reports(&spec.limits)
        });
        if is_gvisor_runtime(plan.runtime.as_deref()) {
            hako_container::memory_by_the_guest(&mut limits);
        }
        let caps = Capabilities {
            backend: NAME.into(),
            isolation,
            network: network.access,
            fence: fence.resolver(),
            limits,
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            accelerator: None,
            seccomp,
            shared: hako_core::Shared::network_if(network.access),
            defects: Vec::new(),
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
        // The copy-on-write volume, made before the container that mounts
        // it; removed with it (by the launcher's close, or dropped here on
        // the way out of a failure).
        let volume = match &plan.cow {
            Some(cow) => Some(Volume::create(&engine, &runner, &plan, cow)?),
            None => None,
        };
        let launcher = ContainerLauncher {
            backend: NAME,
            program: engine.name(),
            runner: Arc::clone(&runner),
            name: plan.name.clone(),
            argv: run_argv(&engine, &plan),
            workspace: plan.workspace.clone(),
            cleanup: vec![engine.command(["rm", "--force", plan.name.as_str()])],
            keep: Mutex::new(vec![Box::new(profile)]),
            network: network.spec.clone(),
            seal: plan.seal(),
            memory: plan.memory_watch(),
            self_cleaning: false,
        };
        let launcher: Box<dyn hako_driver::sandbox::Launcher> = match volume {
            Some(volume) => Box::new(VolumeLauncher {
                inner: launcher,
                volume,
            }),
            None => Box::new(launcher),
        };
        let mut env = base_env(&config.spec.env);
        network.apply_env(&mut env);
        let mut inner = GuestSandbox::new(GuestConfig {
            backend: NAME,
            fence,
            caps,
            base_env: env,
            guest: None,
            max_output: config.spec.max_output,
            idle_timeout: config.launch.idle_timeout,
            driver: config.launch.driver.clone(),
            launcher,
            proxy: network.proxy,
        })?;
        if let Some(cow) = &plan.cow {
            // The fence opened above is on the workspace itself, the
            // overlay's lower layer: its file operations (and the
            // commands' working directories) go through the layered view
            // instead, now that the engine has mounted it.
            let view = crate::cow::open_view(
                &engine,
                runner.as_ref(),
                cow,
                &plan.workspace,
                config.launch.fence.clone(),
            );
            match view {
                Ok(view) => inner.set_fence(view),
                Err(e) => {
                    let _ = hako_core::Sandbox::close(&inner);
                    return Err(e);
                }
            }
        }
        Ok(DockerSandbox {
            inner,
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
            base_env: base_env(&config.spec.env),
            max_output: config.spec.max_output,
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
    (engine.kind == EngineKind::Podman && hybrid && hako_container::engine::on_path("runc"))
        .then(|| "runc".to_string())
}

/// Whether a docker sandbox of `image` can start here: a runtime that
/// answers, the image present locally (or, for the default image, one hako
/// can build on first use), and a static guest. The reason when not (for
/// tests that skip without one); [`readiness`] gives the hint too.
pub fn ready(image: &str, runtime: Option<&str>) -> std::result::Result<(), String> {
    readiness(image, runtime).map_err(|e| e.to_string())
}

/// [`ready`], with the hint that fits the cause found: the engine missing
/// or its daemon down, the image missing (and, for the default image,
/// what stops hako from building it), the OCI runtime not registered with
/// the daemon (whether or not it is installed), or no static guest.
pub fn readiness(image: &str, runtime: Option<&str>) -> std::result::Result<(), NotReady> {
    let engine = hako_container::engine::shared(&CliRunner).map_err(|e| NotReady {
        reason: e.to_string(),
        hint: engine_hint(),
    })?;
    // The image first: one call that also fails when the daemon is down,
    // which is then asked why (`info`) only when it does.
    let present = hako_container::image::present(&engine, &CliRunner, image).unwrap_or(false);
    if !present {
        if let Err(why) = engine.works(&CliRunner) {
            return Err(NotReady {
                reason: format!("{} does not answer: {why}", engine.name()),
                hint: daemon_hint(&engine, &why),
            });
        }
        if image != DEFAULT_IMAGE {
            return Err(NotReady {
                reason: format!("the {} image {image} is not present", engine.name()),
                hint: format!(
                    "build or load it ({} images lists what is there), or leave out --image for hako's own",
                    engine.name()
                ),
            });
        }
        if let Some(why) = hako_container::image::cannot_build_default() {
            return Err(NotReady {
                reason: format!(
                    "the {} image {image} is not present and cannot be built here",
                    engine.name()
                ),
                hint: why,
            });
        }
    }
    if let Some(runtime) = runtime.filter(|_| engine.kind == EngineKind::Docker) {
        let runtimes = daemon_runtimes(&engine, &CliRunner).map_err(|e| NotReady {
            reason: e.to_string(),
            hint: engine_hint(),
        })?;
        if runtimes.get(runtime).is_none() {
            return Err(NotReady {
                reason: format!("dockerd has no runtime named {runtime}"),
                hint: runtime_hint(runtime, hako_container::engine::on_path(runtime)),
            });
        }
    }
    hako_container::static_guest_ready().map(|_| ())
}

/// What to do when no container engine works.
fn engine_hint() -> String {
    "install Docker (Debian: `sudo apt-get install docker.io`) and start dockerd, or install podman"
        .into()
}

/// What to do when the engine is installed but `info` fails, by what it
/// said.
fn daemon_hint(engine: &Engine, said: &str) -> String {
    let said = said.to_ascii_lowercase();
    if said.contains("not installed") {
        engine_hint()
    } else if said.contains("permission denied") {
        format!(
            "you may not use the {} daemon's socket: add yourself to the docker group (`sudo usermod -aG docker $USER`, then log in again), or run hako with sudo",
            engine.name()
        )
    } else if engine.kind == EngineKind::Docker {
        "start the daemon: `sudo systemctl start docker` (or `sudo dockerd` where there is no systemd)".into()
    } else {
        format!("check that `{} info` works", engine.argv.join(" "))
    }
}

/// What to do when the daemon has no runtime `runtime`: register it when
/// it is installed, install it first when not.
fn runtime_hint(runtime: &str, installed: bool) -> String {
    let register = format!(
        "register it in /etc/docker/daemon.json as {{\"runtimes\":{{\"{runtime}\":{{\"path\":\"<path of {runtime}>\",\"runtimeArgs\":[\"--network=none\",\"--oci-seccomp\"]}}}}}} and reload dockerd (`sudo kill -HUP $(pidof dockerd)`)"
    );
    if installed {
        format!("{runtime} is installed but dockerd does not know it: {register}")
    } else {
        format!("install {runtime} (gVisor; Debian: `sudo apt-get install runsc`), then {register}")
    }
}

/// Removes, once per process, the containers and copy-on-write volumes of
/// hako processes that are gone (a `kill -9` leaves its container behind
/// only until then, and its volume until then at the latest).
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
                if let Err(e) = crate::gc::collect_volumes(&engine, runner.as_ref()) {
                    tracing::debug!("docker: collecting stale volumes: {e}");
                }
                crate::gc::collect_profiles();
            });
        if let Err(e) = spawned {
            tracing::debug!("docker: cannot start collecting stale containers: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_runtime_not_registered_is_told_apart_from_one_not_installed() {
        let installed = runtime_hint("runsc", true);
        assert!(installed.starts_with("runsc is installed but dockerd does not know it: register it in /etc/docker/daemon.json"), "{installed}");
        assert!(!installed.contains("apt-get install"), "{installed}");
        let missing = runtime_hint("runsc", false);
        assert!(missing.starts_with("install runsc"), "{missing}");
        assert!(missing.contains("register it"), "{missing}");
    }

    #[test]
    fn a_daemon_that_does_not_answer_gets_the_hint_of_what_it_said() {
        let docker = Engine {
            argv: vec!["docker".into()],
            kind: EngineKind::Docker,
        };
        let hint = daemon_hint(&docker, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?");
        assert!(hint.starts_with("start the daemon"), "{hint}");
        let hint = daemon_hint(
            &docker,
            "Got permission denied while trying to connect to the Docker daemon socket",
        );
        assert!(hint.contains("docker group"), "{hint}");
        let hint = daemon_hint(&docker, "not installed");
        assert!(hint.starts_with("install Docker"), "{hint}");
    }

    #[test]
    fn cow_without_the_guest_is_refused_with_a_typed_error_before_any_container_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DockerConfig::new(dir.path());
        let recorder = Arc::new(hako_container::runner::Recorder::default());
        config.runner = recorder.clone();
        config.spec.cow = Some(hako_core::CowLayers {
            upper: dir.path().join("upper"),
            work: dir.path().join("work"),
        });
        let err = DockerExecSandbox::new(config).unwrap_err();
        assert!(
            matches!(err, hako_core::Error::Unsupported { ref backend, capability } if backend == NAME && capability.contains("exec mode")),
            "{err}"
        );
        assert!(recorder.calls().is_empty(), "{:?}", recorder.calls());
    }
}
