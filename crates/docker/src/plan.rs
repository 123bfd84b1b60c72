//! What a docker sandbox's container is, as data: the run plan, and the
//! `docker run` argv it renders to (every lockdown flag, limits, binds, the
//! network, the seccomp profile). Pure, and unit-tested without a daemon.

use std::io::Write;
use std::path::{Path, PathBuf};

use hako_container::{
    cpus_decimal, gvisor_host_memory, memory_watch, Engine, EngineKind, Owner, RunNetwork,
    GUEST_INSIDE, LABEL_PID, LABEL_START,
};
use hako_core::{Error, Limits, Result};
use hako_driver::network::NET_DIR;
use hako_proto::{MemoryWatch, Seal, GUEST_FD_DIRS};

use crate::NAME;

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
    /// A copy-on-write workspace: the volume mounted at the workspace's
    /// path in place of its bind (see [`crate::cow`]).
    pub cow: Option<CowVolume>,
}

/// A copy-on-write workspace's volume: the engine's local driver mounts
/// overlayfs, the workspace its lower layer and `upper` taking every
/// change, when the container starts (see [`crate::cow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CowVolume {
    /// The volume's name (the container's).
    pub name: String,
    /// The upper layer.
    pub upper: PathBuf,
    /// overlayfs's work directory.
    pub work: PathBuf,
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

    /// How the guest tells that `--memory` killed a command (under
    /// gVisor, it enforces the limit itself: see
    /// [`hako_container::memory_watch`]).
    pub fn memory_watch(&self) -> Option<MemoryWatch> {
        memory_watch(&self.limits, is_gvisor_runtime(self.runtime.as_deref()))
    }

    /// What the guest does to itself before it serves, when
    /// [`RunPlan::sealed`].
    pub fn seal(&self) -> Option<Seal> {
        self.sealed.then(|| Seal {
            mask_dirs: GUEST_FD_DIRS.iter().map(PathBuf::from).collect(),
            seccomp: true,
            guard: true,
            // Counted by gVisor's kernel (see `Seal::pids_max`), instead
            // of `--pids-limit`.
            pids_max: self.limits.pids,
            ..Seal::default()
        })
    }
}

fn bind(src: &Path, dst: &Path, read_only: bool) -> String {
    let mut spec = format!("type=bind,src={},dst={}", src.display(), dst.display());
    if read_only {
        spec.push_str(",readonly");
    }
    spec
}

/// How the workspace is mounted: bound read-write at its own path, or,
/// copy-on-write, the overlay volume there in its place. The engine never
/// copies the image's files into the volume (`volume-nocopy`, Podman's
/// `nocopy`, which only `--volume` takes: a workspace with a colon is
/// refused for `--cow`, see [`check_run_plan`]).
fn workspace_mount(engine: &Engine, plan: &RunPlan) -> [String; 2] {
    match (&plan.cow, engine.kind) {
        (None, _) => [
            "--mount".into(),
            bind(&plan.workspace, &plan.workspace, false),
        ],
        (Some(cow), EngineKind::Docker) => [
            "--mount".into(),
            format!(
                "type=volume,src={},dst={},volume-nocopy",
                cow.name,
                plan.workspace.display()
            ),
        ],
        (Some(cow), EngineKind::Podman) => [
            "--volume".into(),
            format!("{}:{}:nocopy", cow.name, plan.workspace.display()),
        ],
    }
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
        // The engine stopping the container (its daemon shutting down,
        // `docker stop`) sends pid 1, the guest, SIGTERM, which it
        // ignores, and kills it after this many seconds: the guest keeps
        // nothing to save, so the sandbox is reported lost at once rather
        // than after Docker's 10 s.
        "--stop-timeout".into(),
        "1".into(),
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
    ];
    a.extend(workspace_mount(engine, plan));
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
        // Under gVisor the container's cgroup also holds gVisor's own
        // kernel: room for it, the guest enforcing the limit inside.
        let memory = if is_gvisor_runtime(plan.runtime.as_deref()) {
            gvisor_host_memory(memory)
        } else {
            memory
        };
        // No swap beyond the memory limit.
        a.extend([
            "--memory".into(),
            memory.to_string(),
            "--memory-swap".into(),
            memory.to_string(),
        ]);
    }
    // A sealing guest limits processes inside, in gVisor's own pids
    // controller: the host cgroup `--pids-limit` sets also counts
    // gVisor's threads, and hitting it ends the whole container. Unsealed
    // under gVisor only with --best-effort (see `Prepared::new`).
    if let Some(pids) = limits.pids.filter(|_| !plan.sealed) {
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
/// [`hako_container::seccomp_profile`] for what changes under gVisor).
pub fn write_seccomp_profile(
    gvisor: bool,
    sealed: bool,
    owner: &hako_container::Owner,
) -> Result<tempfile::NamedTempFile> {
    let profile = hako_container::seccomp_profile(gvisor, sealed);
    let io = |source| Error::Io {
        op: "write the seccomp profile",
        source,
    };
    // In hako's private directory, like every file hako leaves for a
    // runtime to read, named after its owner so that what a hako killed
    // outright leaves is collected (see `gc::collect_profiles`).
    let mut file = tempfile::Builder::new()
        .prefix(&format!(
            "{}{}-{}-",
            crate::gc::PROFILE_PREFIX,
            owner.pid,
            owner.start
        ))
        .suffix(".json")
        .tempfile_in(hako_container::private::private_dir()?)
        .map_err(io)?;
    serde_json::to_writer(&mut file, &profile).map_err(|e| io(e.into()))?;
    file.flush().map_err(io)?;
    Ok(file)
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
    if let Some(cow) = &plan.cow {
        check_cow(plan, cow).map_err(refuse)?;
    }
    Ok(())
}

/// A copy-on-write workspace's paths go into overlayfs's options, where a
/// comma ends an option and a colon separates lower layers (a backslash
/// escapes either): none may hold one. Its layers must be out of the
/// sandbox's reach, outside the workspace and every bind, and no bind
/// inside them (`hako_layers::state` makes them so; a caller that
/// builds the spec itself is held to the same).
fn check_cow(plan: &RunPlan, cow: &CowVolume) -> std::result::Result<(), String> {
    for path in [&plan.workspace, &cow.upper, &cow.work] {
        let text = path.to_str().unwrap_or("");
        if text.is_empty()
            || text.contains([',', ':', '\\', '"', '\n', '\r'])
            || !path.is_absolute()
        {
            return Err(format!(
                "cannot use {path:?} for --cow: an overlay layer's path must be absolute UTF-8 and hold no comma, colon, backslash, quote or newline (overlayfs's option syntax)"
            ));
        }
    }
    let reachable = std::iter::once(&plan.workspace)
        .chain(&plan.ro)
        .chain(&plan.rw);
    for dir in reachable {
        for layer in [&cow.upper, &cow.work] {
            if layer.starts_with(dir) || dir.starts_with(layer) {
                return Err(format!(
                    "refused --cow layer {layer:?}: the sandbox could reach it through {dir:?}; keep the layers outside the workspace and every bind"
                ));
            }
        }
    }
    Ok(())
}

/// The argv that makes a copy-on-write workspace's volume: the engine's
/// local driver, which mounts overlayfs when the container starts, with
/// the workspace as its lower layer. `userxattr` keeps overlayfs's marks
/// (whiteouts, opaque directories) in `user.overlay.*`, which the review
/// engine reads as any user, and implies no redirected directories and no
/// metacopy, which it refuses (`hako_layers::scan`). Labelled with its
/// owner, like the container, so that what a hako killed outright leaves
/// is collected (see [`crate::gc::collect_volumes`]).
pub fn volume_create_argv(engine: &Engine, plan: &RunPlan, cow: &CowVolume) -> Vec<String> {
    engine.command([
        "volume".to_string(),
        "create".into(),
        "--driver".into(),
        "local".into(),
        "--opt".into(),
        "type=overlay".into(),
        "--opt".into(),
        "device=overlay".into(),
        "--opt".into(),
        format!(
            "o=lowerdir={},upperdir={},workdir={},userxattr",
            plan.workspace.display(),
            cow.upper.display(),
            cow.work.display()
        ),
        "--label".into(),
        format!("{LABEL_PID}={}", plan.owner.pid),
        "--label".into(),
        format!("{LABEL_START}={}", plan.owner.start),
        cow.name.clone(),
    ])
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
            cow: None,
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
        assert_eq!(seal.pids_max, None);
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
        assert!(mounts(&hako_container::seccomp_profile(true, false)) > 0);
        assert_eq!(mounts(&hako_container::seccomp_profile(true, true)), 0);
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
            "--stop-timeout",
            "1",
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
    fn a_sealed_gvisor_guest_limits_processes_inside_not_in_the_host_cgroup() {
        let mut p = plan();
        p.runtime = Some("runsc".into());
        p.user = (0, 0);
        p.sealed = true;
        p.limits.pids = Some(128);
        let argv = run_argv(&docker(), &p);
        assert!(!argv.iter().any(|a| a == "--pids-limit"), "{argv:?}");
        assert_eq!(p.seal().and_then(|s| s.pids_max), Some(128));
    }

    #[test]
    fn the_memory_limit_is_the_kernels_under_runc_and_the_guests_under_gvisor() {
        let mut p = plan();
        p.limits.memory = Some(64 << 20);
        let argv = run_argv(&docker(), &p).join(" ");
        assert!(
            argv.contains("--memory 67108864 --memory-swap 67108864"),
            "{argv}"
        );
        assert!(
            matches!(p.memory_watch(), Some(MemoryWatch::Counter(files)) if files.iter().any(|f| f.ends_with("memory.oom_control"))),
            "{:?}",
            p.memory_watch()
        );
        p.runtime = Some("runsc".into());
        let argv = run_argv(&docker(), &p).join(" ");
        let host = gvisor_host_memory(64 << 20);
        assert!(host >= (64 << 20) + hako_container::GVISOR_MEMORY_HEADROOM);
        assert!(argv.contains(&format!("--memory {host} ")), "{argv}");
        assert_eq!(
            p.memory_watch(),
            Some(MemoryWatch::Watch { limit: 64 << 20 })
        );
        p.limits.memory = None;
        assert_eq!(p.memory_watch(), None);
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
            // Under gVisor: room for its own kernel above --memory, which
            // the guest enforces inside.
            "--memory 536870912 --memory-swap 536870912",
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

    fn cow(p: &mut RunPlan) {
        p.cow = Some(CowVolume {
            name: p.name.clone(),
            upper: "/s/n/upper".into(),
            work: "/s/n/work".into(),
        });
    }

    #[test]
    fn a_cow_workspace_is_its_overlay_volume_in_place_of_the_bind() {
        let mut p = plan();
        cow(&mut p);
        check_run_plan(&p).unwrap_or_else(|e| panic!("{e}"));
        let argv = run_argv(&docker(), &p);
        let joined = argv.join(" ");
        assert!(
            joined.contains("--mount type=volume,src=hako-1-0-0,dst=/w,volume-nocopy"),
            "{joined}"
        );
        assert!(!joined.contains("type=bind,src=/w"), "{joined}");
        // Neither layer is in the container but through the view.
        assert!(!joined.contains("/s/n"), "{joined}");
        let podman = Engine::from_words("podman").unwrap_or_else(|| panic!("parsed"));
        let joined = run_argv(&podman, &p).join(" ");
        assert!(joined.contains("--volume hako-1-0-0:/w:nocopy"), "{joined}");
        assert!(!joined.contains("type=bind,src=/w"), "{joined}");
        let cow = p.cow.clone().unwrap();
        assert_eq!(
            volume_create_argv(&docker(), &p, &cow),
            [
                "docker",
                "volume",
                "create",
                "--driver",
                "local",
                "--opt",
                "type=overlay",
                "--opt",
                "device=overlay",
                "--opt",
                "o=lowerdir=/w,upperdir=/s/n/upper,workdir=/s/n/work,userxattr",
                "--label",
                "hako.owner.pid=42",
                "--label",
                "hako.owner.start=7",
                "hako-1-0-0"
            ]
        );
    }

    #[test]
    fn overlay_option_injection_through_a_cow_path_is_refused() {
        for bad in ["/w:/etc", "/w,upperdir=/etc", "/w\\x", "relative"] {
            let mut p = plan();
            cow(&mut p);
            p.workspace = bad.into();
            assert!(check_run_plan(&p).is_err(), "workspace {bad:?} accepted");
            let mut p = plan();
            cow(&mut p);
            p.cow.as_mut().unwrap().upper = bad.into();
            assert!(check_run_plan(&p).is_err(), "upper {bad:?} accepted");
        }
        // A colon is fine in a plain workspace's bind.
        let mut p = plan();
        p.workspace = "/w:x".into();
        check_run_plan(&p).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn cow_layers_the_sandbox_could_reach_are_refused() {
        let cases: [(&str, &str, &str); 4] = [
            ("/w/.state/upper", "", ""),
            ("/s/n/upper", "/s", ""),
            ("/s/n/upper", "", "/s/n"),
            ("/s/n/upper", "", "/s/n/upper/x"),
        ];
        for (upper, ro, rw) in cases {
            let mut p = plan();
            cow(&mut p);
            p.cow.as_mut().unwrap().upper = upper.into();
            p.ro = [ro]
                .iter()
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect();
            p.rw = [rw]
                .iter()
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect();
            let err = check_run_plan(&p).unwrap_err().to_string();
            assert!(err.contains("could reach"), "{upper} {ro} {rw}: {err}");
        }
        let mut p = plan();
        cow(&mut p);
        p.ro = vec!["/data".into()];
        p.rw = vec!["/w/cache".into()];
        check_run_plan(&p).unwrap_or_else(|e| panic!("{e}"));
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
        let file = write_seccomp_profile(false, false, &hako_container::Owner::current())
            .unwrap_or_else(|e| panic!("{e}"));
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
