//! What a gvisor sandbox's bundle is, as data: the OCI `config.json`
//! (mounts, limits, capabilities, the seal's masks), the root view's mount
//! points, and the `runsc` argv (through `--host-view` where the view binds
//! host directories). Pure but for building the view's mount points, and
//! unit-tested without `runsc`.

use std::path::{Path, PathBuf};

use hako_container::{RunNetwork, GUEST_INSIDE};
use hako_core::{CowLayers, Limits};
use hako_driver::network::NET_DIR;
use hako_proto::{Seal, GUEST_FD_DIRS};
use hako_view::{HostFacts, HostPath};
use serde_json::{json, Value};

use crate::host_view;

/// Everything the bundle says about one sandbox.
#[derive(Debug, Clone)]
pub struct BundlePlan {
    /// The workspace (host path = path inside).
    pub workspace: PathBuf,
    /// The static guest on the host.
    pub guest: PathBuf,
    /// The root directory.
    pub root: PathBuf,
    /// Whether `root` is a view hako built (host directories are bound
    /// into it) rather than an image.
    pub host_view: bool,
    /// uid and gid commands run as.
    pub user: (u32, u32),
    /// Limits (memory and CPUs only when they can be enforced; pids by the
    /// guest's seal, see [`BundlePlan::seal`]).
    pub limits: Limits,
    /// Size of `/tmp`, bytes.
    pub tmp_size: u64,
    /// Extra read-only binds.
    pub ro: Vec<PathBuf>,
    /// Extra read-write binds.
    pub rw: Vec<PathBuf>,
    /// Host paths under `/etc` that exist and are masked (by the guest:
    /// see [`BundlePlan::seal`]).
    pub masked_files: Vec<PathBuf>,
    /// See `masked_files`.
    pub masked_dirs: Vec<PathBuf>,
    /// The host's system directories that are real directories (bound).
    pub system_dirs: Vec<PathBuf>,
    /// The network.
    pub network: RunNetwork,
    /// A copy-on-write workspace: the host view mounts it over the
    /// workspace's path before `runsc` starts (see `crate::host_view`), and
    /// the bundle binds that path as always.
    pub cow: Option<CowLayers>,
}

fn bind(src: &Path, dst: &Path, read_only: bool) -> Value {
    json!({
        "destination": dst,
        "type": "bind",
        "source": src,
        "options": ["rbind", "rprivate", if read_only { "ro" } else { "rw" }],
    })
}

/// The capabilities the guest starts with, to seal itself with and drop
/// before it serves anything (see [`BundlePlan::seal`]): mounting the
/// masks, and emptying the bounding set.
pub const SEAL_CAPABILITIES: &[&str] = &["CAP_SYS_ADMIN", "CAP_SETPCAP"];

impl BundlePlan {
    /// What the guest does to itself before it serves: the masks (a bind
    /// in the bundle costs runsc a gofer connection each, about 7 ms of a
    /// cold start apiece here; a mount the guest makes inside is the
    /// Sentry's alone), then no capability left and the seccomp policy
    /// installed. Serving starts only once all of it held.
    pub fn seal(&self) -> Seal {
        // An image has no host secrets to hide.
        let (mask_files, mask_dirs) = if self.host_view {
            (self.masked_files.clone(), self.masked_dirs.clone())
        } else {
            (Vec::new(), Vec::new())
        };
        // Last, the guest's own descriptors (see `GUEST_FD_DIRS`).
        let mut mask_dirs = mask_dirs;
        mask_dirs.extend(GUEST_FD_DIRS.iter().map(PathBuf::from));
        Seal {
            mask_files,
            mask_dirs,
            seccomp: true,
            guard: true,
            // Counted by gVisor's kernel, not on the host (see
            // `Seal::pids_max`): never in the bundle's resources.
            pids_max: self.limits.pids,
        }
    }
}

/// The bundle's `config.json`.
pub fn config_json(plan: &BundlePlan) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", format!("size={}", plan.tmp_size)]}),
    ];
    // A host view's system directories and the guest are bound on the
    // host side, into the root view (see `view_argv`); an image's root has
    // no system directory to bind and gets the guest as a bundle mount.
    if !plan.host_view {
        mounts.push(bind(&plan.guest, Path::new(GUEST_INSIDE), true));
    }
    for dir in &plan.ro {
        mounts.push(bind(dir, dir, true));
    }
    for dir in &plan.rw {
        mounts.push(bind(dir, dir, false));
    }
    mounts.push(bind(&plan.workspace, &plan.workspace, false));
    if let RunNetwork::Proxy(dir) = &plan.network {
        mounts.push(bind(dir, Path::new(NET_DIR), true));
    }
    let mut rlimits = Vec::new();
    if let Some(n) = plan.limits.open_files {
        rlimits.push(json!({"type": "RLIMIT_NOFILE", "hard": n, "soft": n}));
    } else {
        rlimits.push(json!({"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}));
    }
    if let Some(n) = plan.limits.file_size {
        rlimits.push(json!({"type": "RLIMIT_FSIZE", "hard": n, "soft": n}));
    }
    let mut resources = serde_json::Map::new();
    if let Some(memory) = plan.limits.memory {
        // The host cgroup holds gVisor's own kernel too: room for it, the
        // guest enforcing `--memory` inside (`MemoryWatch::Watch`).
        let memory = hako_container::gvisor_host_memory(memory);
        resources.insert("memory".into(), json!({"limit": memory, "swap": memory}));
    }
    // No `pids` here: a host cgroup's limit also counts gVisor's own host
    // threads, and hitting it ends the whole sandbox. The guest applies
    // it inside instead (`BundlePlan::seal`).
    if let Some(milli) = plan.limits.cpus_milli {
        resources.insert(
            "cpu".into(),
            json!({"quota": milli * 100, "period": 100_000}),
        );
    }
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    if plan.network != RunNetwork::Host {
        namespaces.push(json!({"type": "network"}));
    }
    let mut linux = serde_json::Map::new();
    linux.insert("namespaces".into(), namespaces.into());
    linux.insert("resources".into(), resources.into());
    // No seccomp here: the guest installs the policy on itself once its
    // masks are mounted (see `BundlePlan::seal`).
    linux.insert(
        "maskedPaths".into(),
        json!(hako_view::masked_proc_paths().collect::<Vec<_>>()),
    );
    linux.insert(
        "readonlyPaths".into(),
        json!(hako_view::READ_ONLY_PROC_DIRS),
    );
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": plan.user.0, "gid": plan.user.1},
            "args": [GUEST_INSIDE, "--stdio"],
            "env": [format!("PATH={}", hako_core::env::DEFAULT_PATH)],
            "cwd": plan.workspace,
            "capabilities": {
                "bounding": SEAL_CAPABILITIES, "effective": SEAL_CAPABILITIES,
                "permitted": SEAL_CAPABILITIES, "inheritable": [], "ambient": []
            },
            "rlimits": rlimits,
            "noNewPrivileges": true,
        },
        "root": {"path": plan.root, "readonly": true},
        "hostname": "hako",
        "mounts": mounts,
        "linux": linux,
    })
}

impl BundlePlan {
    /// What a host view binds into its root on the host side, read-only:
    /// `(host source, path inside)`. Each bind a bundle lists costs `runsc`
    /// a gofer connection at every start; these are served through the
    /// root's. Empty for an image's root.
    pub fn host_binds(&self) -> Vec<(PathBuf, PathBuf)> {
        if !self.host_view {
            return Vec::new();
        }
        self.system_dirs
            .iter()
            .map(|dir| (dir.clone(), dir.clone()))
            .chain([(self.guest.clone(), PathBuf::from(GUEST_INSIDE))])
            .collect()
    }
}

/// The argv prefix that starts `runsc` through the guest's `--host-view`
/// mode (see `crate::host_view`): it mounts the plan's copy-on-write
/// workspace and [`host_binds`](BundlePlan::host_binds) in a mount
/// namespace of its own, and leaves a cleaner that removes `bundle` once
/// `runsc` has exited.
pub fn view_argv(plan: &BundlePlan, bundle: &Path) -> Vec<String> {
    let mut argv = vec![
        plan.guest.display().to_string(),
        host_view::FLAG.into(),
        plan.root.display().to_string(),
    ];
    for (source, inside) in plan.host_binds() {
        argv.extend([
            "--bind".into(),
            source.display().to_string(),
            inside.display().to_string(),
        ]);
    }
    if let Some(cow) = &plan.cow {
        argv.extend([
            host_view::COW_FLAG.into(),
            plan.workspace.display().to_string(),
            cow.upper.display().to_string(),
            cow.work.display().to_string(),
        ]);
    }
    argv.extend(["--remove".into(), bundle.display().to_string(), "--".into()]);
    argv
}

/// The `runsc` argv that runs the bundle, attached, after the plan's
/// [`view_argv`]; `cgroups`: a limit needs the sandbox's cgroup. With the
/// egress proxy, gVisor is let open host unix sockets (`--host-uds=open`):
/// the bundle binds only the proxy's.
///
/// Run by a user without root, `runsc` is started the way `runsc --rootless
/// do` starts itself: in a user namespace where that user is root (with no
/// more on the host than the user has), with no cgroups.
pub fn run_argv(
    runsc: &Path,
    state: &Path,
    bundle: &Path,
    id: &str,
    rootless: bool,
    cgroups: bool,
    plan: &BundlePlan,
) -> Vec<String> {
    let network = &plan.network;
    let mut argv = Vec::new();
    if rootless {
        argv.extend(["unshare", "--user", "--map-root-user", "--"].map(String::from));
    }
    argv.extend(view_argv(plan, bundle));
    argv.extend([
        runsc.display().to_string(),
        "--root".into(),
        state.display().to_string(),
        match network {
            RunNetwork::Host => "--network=host".into(),
            RunNetwork::None | RunNetwork::Proxy(_) => "--network=none".into(),
        },
    ]);
    if let RunNetwork::Proxy(_) = network {
        argv.push("--host-uds=open".into());
    }
    if rootless {
        argv.push("--rootless".into());
    }
    // A cgroup costs tens of milliseconds to set up and enforces nothing
    // when no memory, pids or CPU limit is asked for.
    if rootless || !cgroups {
        argv.push("--ignore-cgroups".into());
    }
    argv.extend([
        "run".into(),
        "--bundle".into(),
        bundle.display().to_string(),
        id.to_string(),
    ]);
    argv
}

/// Creates `path` (and parents) inside the root view, for a mount point.
fn mount_point(root: &Path, path: &Path, file: bool) -> std::io::Result<()> {
    let inside = host_view::in_view(root, path);
    if file {
        if let Some(parent) = inside.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(inside, b"")
    } else {
        std::fs::create_dir_all(inside)
    }
}

/// The root of a host view: mount points for every bind and the host's
/// usr-merge symlinks.
pub(crate) fn build_view(plan: &BundlePlan, facts: &HostFacts) -> std::io::Result<()> {
    let root = &plan.root;
    std::fs::create_dir_all(root)?;
    for (path, kind) in &facts.system {
        match kind {
            HostPath::Dir => mount_point(root, path, false)?,
            HostPath::Symlink(target) => {
                let inside = host_view::in_view(root, path);
                std::os::unix::fs::symlink(target, inside)?;
            }
            HostPath::Absent => {}
        }
    }
    for dir in ["/proc", "/dev", "/tmp", "/sys"] {
        mount_point(root, Path::new(dir), false)?;
    }
    for dir in plan.ro.iter().chain(&plan.rw).chain([&plan.workspace]) {
        mount_point(root, dir, false)?;
    }
    if let RunNetwork::Proxy(_) = plan.network {
        mount_point(root, Path::new(NET_DIR), false)?;
    }
    mount_point(root, Path::new(GUEST_INSIDE), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bundle's mount at `destination`, if it has one.
    fn mount_at(config: &Value, destination: &str) -> Option<Value> {
        config["mounts"]
            .as_array()?
            .iter()
            .find(|m| m["destination"] == json!(destination))
            .cloned()
    }

    fn plan() -> BundlePlan {
        BundlePlan {
            workspace: "/w".into(),
            guest: "/g".into(),
            root: "/b/rootfs".into(),
            host_view: true,
            user: (1000, 1000),
            limits: Limits {
                memory: Some(1 << 28),
                pids: Some(64),
                cpus_milli: Some(500),
                file_size: Some(1 << 20),
                open_files: Some(100),
            },
            tmp_size: 1 << 20,
            ro: vec![],
            rw: vec![],
            masked_files: vec!["/etc/shadow".into()],
            masked_dirs: vec!["/etc/sudoers.d".into()],
            system_dirs: vec!["/usr".into(), "/etc".into()],
            network: RunNetwork::None,
            cow: None,
        }
    }

    #[test]
    fn the_bundle_is_locked_down() {
        let config = config_json(&plan());
        let process = &config["process"];
        assert_eq!(process["args"], json!([GUEST_INSIDE, "--stdio"]));
        assert_eq!(process["noNewPrivileges"], json!(true));
        assert_eq!(process["user"], json!({"uid": 1000, "gid": 1000}));
        // Only what the guest needs to seal itself, and none it could pass
        // on: nothing inheritable or ambient.
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(
                process["capabilities"][set],
                json!(["CAP_SYS_ADMIN", "CAP_SETPCAP"]),
                "{set}"
            );
        }
        for set in ["inheritable", "ambient"] {
            assert_eq!(process["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(config["root"]["readonly"], json!(true));
        let namespaces = config["linux"]["namespaces"].to_string();
        for ns in ["pid", "network", "ipc", "uts", "mount"] {
            assert!(namespaces.contains(ns), "{ns}");
        }
        // The guest loads the filter itself, after its masks.
        assert!(config["linux"].get("seccomp").is_none());
        let r = &config["linux"]["resources"];
        // Room for gVisor's own kernel above `--memory`, which the guest
        // enforces inside.
        let host = hako_container::gvisor_host_memory(1 << 28);
        assert!(host >= (1 << 28) + hako_container::GVISOR_MEMORY_HEADROOM);
        assert_eq!(r["memory"]["limit"], json!(host));
        // The process limit is the guest's, counted by gVisor's kernel
        // (a host cgroup's would count gVisor's own threads too).
        assert!(r.get("pids").is_none(), "{r}");
        assert_eq!(plan().seal().pids_max, Some(64));
        assert_eq!(r["cpu"]["quota"], json!(50_000));
        let find = |dst: &str| mount_at(&config, dst);
        let ws = find("/w").unwrap_or_else(|| panic!("workspace mount"));
        assert!(ws["options"].to_string().contains("\"rw\""));
        // The system directories and the guest are in the root view
        // (bound on the host side), which is read-only as a whole.
        for inside in ["/usr", "/etc", GUEST_INSIDE] {
            assert!(find(inside).is_none(), "{inside} is no bundle mount");
        }
        assert!(
            find("/etc/shadow").is_none(),
            "masks are the guest's, not gofer mounts"
        );
        assert!(find("/home").is_none(), "no host home directory");
    }

    #[test]
    fn a_host_views_system_directories_and_guest_are_bound_on_the_host_side() {
        let mut p = plan();
        let view = view_argv(&p, Path::new("/b"));
        assert_eq!(
            view,
            [
                "/g",
                "--host-view",
                "/b/rootfs",
                "--bind",
                "/usr",
                "/usr",
                "--bind",
                "/etc",
                "/etc",
                "--bind",
                "/g",
                GUEST_INSIDE,
                "--remove",
                "/b",
                "--"
            ]
        );
        // Rootless, the view is mounted inside runsc's user namespace, and
        // runsc comes after it.
        let argv = run_argv(
            Path::new("runsc"),
            Path::new("/s"),
            Path::new("/b"),
            "id",
            true,
            false,
            &p,
        );
        assert_eq!(&argv[..4], ["unshare", "--user", "--map-root-user", "--"]);
        assert_eq!(&argv[4..4 + view.len()], &view[..]);
        assert_eq!(argv[4 + view.len()], "runsc");
        // An image's root binds nothing on the host: the guest is a
        // read-only bundle mount there.
        p.host_view = false;
        assert_eq!(
            view_argv(&p, Path::new("/b")),
            ["/g", "--host-view", "/b/rootfs", "--remove", "/b", "--"]
        );
        let config = config_json(&p);
        let guest = mount_at(&config, GUEST_INSIDE).unwrap();
        assert_eq!(guest["source"], "/g");
        assert!(guest["options"].to_string().contains("\"ro\""));
    }

    #[test]
    fn a_cow_workspace_is_mounted_by_the_host_view_and_bound_as_always() {
        let mut p = plan();
        p.cow = Some(CowLayers {
            upper: "/s/upper".into(),
            work: "/s/work".into(),
        });
        let view = view_argv(&p, Path::new("/b"));
        let at = view.iter().position(|a| a == "--cow").unwrap();
        assert_eq!(view[at + 1..at + 4], ["/w", "/s/upper", "/s/work"]);
        assert_eq!(view[at + 4..], ["--remove", "/b", "--"]);
        // An image's root too: the overlay is the host view's, whatever
        // the root.
        p.host_view = false;
        assert!(view_argv(&p, Path::new("/b")).contains(&"--cow".to_string()));
        // The bundle binds the workspace's path (the overlay there), and
        // neither layer.
        let config = config_json(&p);
        let ws = mount_at(&config, "/w").unwrap();
        assert_eq!(ws["source"], "/w");
        let text = config.to_string();
        assert!(
            !text.contains("/s/upper") && !text.contains("/s/work"),
            "{text}"
        );
    }

    #[test]
    fn the_seal_masks_the_host_views_secrets_and_installs_seccomp() {
        let mut p = plan();
        assert_eq!(
            p.seal(),
            Seal {
                mask_files: vec!["/etc/shadow".into()],
                mask_dirs: vec![
                    "/etc/sudoers.d".into(),
                    "/proc/1/fd".into(),
                    "/proc/1/task/1/fd".into()
                ],
                seccomp: true,
                guard: true,
                pids_max: Some(64),
            }
        );
        // An image has no host secrets to hide, but still gets the filter.
        p.host_view = false;
        assert_eq!(
            p.seal(),
            Seal {
                mask_dirs: vec!["/proc/1/fd".into(), "/proc/1/task/1/fd".into()],
                seccomp: true,
                guard: true,
                pids_max: Some(64),
                ..Seal::default()
            }
        );
    }

    #[test]
    fn network_modes_render_in_the_bundle_and_the_runsc_flags() {
        let mut p = plan();
        let has_netns = |v: &Value| {
            v["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["type"] == "network")
        };
        assert!(has_netns(&config_json(&p)));
        p.network = RunNetwork::Proxy("/tmp/hako-net-x".into());
        let config = config_json(&p);
        assert!(has_netns(&config));
        let mount = mount_at(&config, NET_DIR).unwrap();
        assert_eq!(mount["source"], "/tmp/hako-net-x");
        assert!(mount["options"].to_string().contains("\"ro\""));
        let argv = |network: &RunNetwork| {
            let mut plan = plan();
            plan.network = network.clone();
            run_argv(
                Path::new("runsc"),
                Path::new("/s"),
                Path::new("/b"),
                "id",
                false,
                false,
                &plan,
            )
        };
        let proxied = argv(&p.network);
        assert!(
            proxied.contains(&"--host-uds=open".to_string()),
            "{proxied:?}"
        );
        assert!(proxied.contains(&"--network=none".to_string()));
        assert!(!argv(&RunNetwork::None).contains(&"--host-uds=open".to_string()));
        p.network = RunNetwork::Host;
        assert!(!has_netns(&config_json(&p)));
        assert!(argv(&RunNetwork::Host).contains(&"--network=host".to_string()));
    }

    #[test]
    fn runsc_argv_has_no_network() {
        // An image's root: no host view to bind first.
        let mut image = plan();
        image.host_view = false;
        let argv = |rootless, cgroups| {
            run_argv(
                Path::new("runsc"),
                Path::new("/s"),
                Path::new("/b"),
                "id",
                rootless,
                cgroups,
                &image,
            )
        };
        let view = ["/g", "--host-view", "/b/rootfs", "--remove", "/b", "--"];
        assert_eq!(&argv(false, true)[..view.len()], view);
        assert_eq!(
            argv(false, true)[view.len()..],
            [
                "runsc",
                "--root",
                "/s",
                "--network=none",
                "run",
                "--bundle",
                "/b",
                "id"
            ]
        );
        assert!(argv(false, false).contains(&"--ignore-cgroups".to_string()));
        let rootless = argv(true, true);
        assert_eq!(
            &rootless[..4],
            ["unshare", "--user", "--map-root-user", "--"]
        );
        assert_eq!(&rootless[4..4 + view.len()], view);
        assert!(rootless.contains(&"--rootless".to_string()));
        assert!(rootless.contains(&"--ignore-cgroups".to_string()));
    }
}
