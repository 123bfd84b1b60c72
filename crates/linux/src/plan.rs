//! Turning a configuration into the guest's [`LinuxSpec`]: pure, so every
//! mount, mask and rule can be unit-tested without a kernel. What the view
//! of the host holds (system directories, masked secrets) is `hako-view`'s,
//! shared with the gvisor backend; the order pid 1 mounts it in is this
//! module's.

use std::path::{Path, PathBuf};

use hako_proto::{LandlockSpec, LinuxSpec, MountOp};
use hako_view::{
    HostFacts, HostPath, MASKED_ETC_DIRS, MASKED_ETC_FILES, MASKED_PROC_DIRS, MASKED_PROC_FILES,
    READ_ONLY_PROC_DIRS,
};

/// Device nodes bound into the sandbox's `/dev` (all writable, as programs
/// expect; Landlock allows writing exactly these).
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The uid used inside when the invoking user is root: the command never
/// runs as root inside.
pub const ROOT_INVOKER_INNER_ID: u32 = 1000;

pub use hako_proto::Rlimits;

/// Everything the plan needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanInput {
    /// The workspace on the host (canonical).
    pub workspace: PathBuf,
    /// Where it appears inside (by default the same path).
    pub mount_point: PathBuf,
    /// Extra read-only binds (host path, same path inside).
    pub ro: Vec<PathBuf>,
    /// Extra read-write binds.
    pub rw: Vec<PathBuf>,
    /// Limits.
    pub rlimits: Rlimits,
    /// Whether Landlock must be enforced (`false` with `--best-effort`).
    pub landlock_required: bool,
    /// Size of the private /tmp, e.g. `512m`.
    pub tmp_size: String,
    /// `cgroup.procs` files of the sandbox's cgroups.
    pub cgroup_procs: Vec<PathBuf>,
    /// The memory cgroup's count of OOM kills, when it limits memory.
    pub oom_counter: Option<PathBuf>,
    /// A copy-on-write workspace: the workspace is the lower layer of an
    /// overlay at the mount point, every change in `upper`.
    pub cow: Option<hako_core::CowLayers>,
    /// The sandbox user's home, `HOME` inside (from
    /// [`hako_view::user::home`]): a private, empty, writable tmpfs there
    /// unless the workspace or a bind already holds it.
    pub home: PathBuf,
}

/// Whether the sandbox's home gets a tmpfs of its own: not when the
/// workspace or a bind holds it (then it is that directory, as bound).
pub fn home_is_private(input: &PlanInput) -> bool {
    !std::iter::once(&input.mount_point)
        .chain(&input.ro)
        .chain(&input.rw)
        .any(|bound| input.home.starts_with(bound))
}

/// Why a configuration cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

fn is_under(path: &Path, dir: &str) -> bool {
    path.starts_with(dir)
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

/// The spec for one command.
pub fn plan(input: &PlanInput, facts: &HostFacts) -> Result<LinuxSpec, PlanError> {
    for path in std::iter::once(&input.mount_point)
        .chain(&input.ro)
        .chain(&input.rw)
    {
        if !path.is_absolute() || path == Path::new("/") {
            return Err(PlanError(format!(
                "{} must be an absolute path other than /",
                path.display()
            )));
        }
        if let Some(dir) = ["/proc", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib"]
            .iter()
            .find(|d| is_under(path, d))
        {
            return Err(PlanError(format!(
                "{} is under {dir}, which the sandbox builds itself; choose another mount point",
                path.display()
            )));
        }
    }
    let mut mounts = Vec::new();
    for (path, kind) in &facts.system {
        match kind {
            HostPath::Dir => mounts.push(MountOp::Bind {
                source: path.clone(),
                path: path.clone(),
                read_only: true,
            }),
            HostPath::Symlink(target) => mounts.push(MountOp::Symlink {
                target: target.clone(),
                path: path.clone(),
            }),
            HostPath::Absent => {}
        }
    }
    for file in MASKED_ETC_FILES {
        mounts.push(MountOp::MaskFile { path: p(file) });
    }
    for dir in MASKED_ETC_DIRS {
        mounts.push(MountOp::MaskDir { path: p(dir) });
    }
    for key in &facts.ssh_host_keys {
        mounts.push(MountOp::MaskFile { path: key.clone() });
    }
    let inner = |id: u32| {
        if id == 0 {
            ROOT_INVOKER_INNER_ID
        } else {
            id
        }
    };
    let (uid, gid) = (inner(facts.uid), inner(facts.gid));
    // A user of the sandbox's own, over the host's users.
    mounts.push(MountOp::File {
        path: p("/etc/passwd"),
        contents: hako_view::user::passwd(uid, gid, &input.home),
    });
    mounts.push(MountOp::File {
        path: p("/etc/group"),
        contents: hako_view::user::group(gid),
    });
    mounts.push(MountOp::Tmpfs {
        path: p("/tmp"),
        options: format!("mode=1777,size={}", input.tmp_size),
    });
    // Before the workspace and the binds, which may lie under it.
    let private_home = home_is_private(input);
    if private_home {
        mounts.push(MountOp::Tmpfs {
            path: input.home.clone(),
            options: format!("mode=0700,uid={uid},gid={gid},size={}", input.tmp_size),
        });
    }
    mounts.push(MountOp::Tmpfs {
        path: p("/dev"),
        options: "mode=0755,size=64k".into(),
    });
    for node in DEV_NODES {
        let path = Path::new("/dev").join(node);
        mounts.push(MountOp::DevNode {
            source: path.clone(),
            path,
        });
    }
    mounts.push(MountOp::Devpts {
        path: p("/dev/pts"),
    });
    mounts.push(MountOp::Symlink {
        target: p("pts/ptmx"),
        path: p("/dev/ptmx"),
    });
    mounts.push(MountOp::Tmpfs {
        path: p("/dev/shm"),
        options: format!("mode=1777,size={}", input.tmp_size),
    });
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        mounts.push(MountOp::Symlink {
            target: p(target),
            path: Path::new("/dev").join(name),
        });
    }
    mounts.push(MountOp::ReadOnly { path: p("/dev") });
    mounts.push(MountOp::Proc { path: p("/proc") });
    for dir in READ_ONLY_PROC_DIRS {
        mounts.push(MountOp::ReadOnlySelf { path: p(dir) });
    }
    for file in MASKED_PROC_FILES {
        mounts.push(MountOp::MaskFile { path: p(file) });
    }
    for dir in MASKED_PROC_DIRS {
        mounts.push(MountOp::MaskDir { path: p(dir) });
    }
    mounts.push(match &input.cow {
        None => MountOp::Bind {
            source: input.workspace.clone(),
            path: input.mount_point.clone(),
            read_only: false,
        },
        Some(cow) => MountOp::Overlay {
            lower: input.workspace.clone(),
            upper: cow.upper.clone(),
            work: cow.work.clone(),
            path: input.mount_point.clone(),
        },
    });
    for (paths, read_only) in [(&input.ro, true), (&input.rw, false)] {
        for path in paths {
            mounts.push(MountOp::Bind {
                source: path.clone(),
                path: path.clone(),
                read_only,
            });
        }
    }
    let mut write_dirs = vec![
        input.mount_point.clone(),
        p("/tmp"),
        p("/dev/shm"),
        p("/dev/pts"),
    ];
    if private_home {
        write_dirs.push(input.home.clone());
    }
    write_dirs.extend(input.rw.iter().cloned());
    let write_files = DEV_NODES
        .iter()
        .map(|n| Path::new("/dev").join(n))
        .collect();
    let rlimits = input.rlimits.specs();
    Ok(LinuxSpec {
        uid: (uid, facts.uid),
        gid: (gid, facts.gid),
        hostname: "hako".into(),
        mounts,
        rlimits,
        landlock: Some(LandlockSpec {
            write_dirs,
            write_files,
            required: input.landlock_required,
        }),
        seccomp: true,
        cgroup_procs: input.cgroup_procs.clone(),
        oom_counter: input.oom_counter.clone(),
        // Set by the backend from its network policy.
        host_network: false,
        network: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_proto::RlimitResource;

    fn facts(uid: u32) -> HostFacts {
        HostFacts {
            system: vec![
                (p("/usr"), HostPath::Dir),
                (p("/bin"), HostPath::Symlink(p("usr/bin"))),
                (p("/lib32"), HostPath::Absent),
                (p("/etc"), HostPath::Dir),
            ],
            ssh_host_keys: vec![p("/etc/ssh/ssh_host_ed25519_key")],
            uid,
            gid: uid,
        }
    }

    fn input() -> PlanInput {
        PlanInput {
            workspace: p("/home/u/proj"),
            mount_point: p("/home/u/proj"),
            ro: vec![],
            rw: vec![],
            rlimits: Rlimits::default(),
            landlock_required: true,
            tmp_size: "512m".into(),
            cgroup_procs: vec![],
            oom_counter: None,
            cow: None,
            home: p("/home/u"),
        }
    }

    #[test]
    fn a_cow_workspace_is_an_overlay_in_place_of_the_bind_and_its_layers_are_not_bound() {
        let mut i = input();
        i.cow = Some(hako_core::CowLayers {
            upper: p("/home/u/.local/state/hako/n/upper"),
            work: p("/home/u/.local/state/hako/n/work"),
        });
        let spec = plan(&i, &facts(1000)).unwrap();
        assert!(spec.mounts.contains(&MountOp::Overlay {
            lower: p("/home/u/proj"),
            upper: p("/home/u/.local/state/hako/n/upper"),
            work: p("/home/u/.local/state/hako/n/work"),
            path: p("/home/u/proj"),
        }));
        assert!(!spec.mounts.iter().any(|m| matches!(m,
            MountOp::Bind { source, .. } if source.starts_with("/home/u"))));
    }

    #[test]
    fn system_dirs_are_read_only_and_symlinks_recreated() {
        let spec = plan(&input(), &facts(1000)).unwrap();
        assert!(spec.mounts.contains(&MountOp::Bind {
            source: p("/usr"),
            path: p("/usr"),
            read_only: true
        }));
        assert!(spec.mounts.contains(&MountOp::Symlink {
            target: p("usr/bin"),
            path: p("/bin")
        }));
        assert!(!spec
            .mounts
            .iter()
            .any(|m| matches!(m, MountOp::Bind { path, .. } if path == Path::new("/lib32"))));
    }

    #[test]
    fn secrets_in_etc_are_masked_after_etc_is_bound() {
        let spec = plan(&input(), &facts(1000)).unwrap();
        let at = |op: &MountOp| spec.mounts.iter().position(|m| m == op).unwrap();
        let etc = at(&MountOp::Bind {
            source: p("/etc"),
            path: p("/etc"),
            read_only: true,
        });
        for masked in [
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/ssh/ssh_host_ed25519_key",
        ] {
            assert!(at(&MountOp::MaskFile { path: p(masked) }) > etc, "{masked}");
        }
        assert!(
            at(&MountOp::MaskDir {
                path: p("/etc/sudoers.d")
            }) > etc
        );
    }

    #[test]
    fn the_workspace_is_bound_read_write_at_its_own_path_after_tmp() {
        let mut i = input();
        i.workspace = p("/tmp/x/ws");
        i.mount_point = p("/tmp/x/ws");
        let spec = plan(&i, &facts(1000)).unwrap();
        let ws = spec
            .mounts
            .iter()
            .position(|m| {
                m == &MountOp::Bind {
                    source: p("/tmp/x/ws"),
                    path: p("/tmp/x/ws"),
                    read_only: false,
                }
            })
            .unwrap();
        let tmp = spec
            .mounts
            .iter()
            .position(|m| matches!(m, MountOp::Tmpfs { path, .. } if path == Path::new("/tmp")))
            .unwrap();
        assert!(tmp < ws);
    }

    #[test]
    fn no_host_home_is_visible() {
        let spec = plan(&input(), &facts(1000)).unwrap();
        for m in &spec.mounts {
            if let MountOp::Bind { source, .. } = m {
                assert!(
                    source == Path::new("/home/u/proj") || !source.starts_with("/home"),
                    "{source:?}"
                );
                assert!(!source.starts_with("/root"), "{source:?}");
            }
        }
    }

    #[test]
    fn root_invokers_run_as_a_non_root_uid_inside() {
        let spec = plan(&input(), &facts(0)).unwrap();
        assert_eq!(spec.uid, (ROOT_INVOKER_INNER_ID, 0));
        let spec = plan(&input(), &facts(1234)).unwrap();
        assert_eq!(spec.uid, (1234, 1234));
    }

    #[test]
    fn landlock_allows_writes_only_to_the_workspace_tmp_and_devices() {
        let spec = plan(&input(), &facts(1000)).unwrap();
        let ll = spec.landlock.unwrap();
        assert_eq!(
            ll.write_dirs,
            [
                p("/home/u/proj"),
                p("/tmp"),
                p("/dev/shm"),
                p("/dev/pts"),
                p("/home/u")
            ]
        );
        assert!(ll.write_files.contains(&p("/dev/null")));
        assert!(ll.required);
        assert!(spec.seccomp);
    }

    #[test]
    fn the_sandbox_user_has_its_own_passwd_group_and_private_home() {
        let spec = plan(&input(), &facts(0)).unwrap();
        let at = |f: &dyn Fn(&MountOp) -> bool| spec.mounts.iter().position(f).unwrap();
        let etc = at(&|m| matches!(m, MountOp::Bind { path, .. } if path == Path::new("/etc")));
        let passwd =
            at(&|m| matches!(m, MountOp::File { path, .. } if path == Path::new("/etc/passwd")));
        let group =
            at(&|m| matches!(m, MountOp::File { path, .. } if path == Path::new("/etc/group")));
        assert!(etc < passwd && etc < group);
        let MountOp::File { contents, .. } = &spec.mounts[passwd] else {
            unreachable!()
        };
        assert!(
            contents.contains("\nhako:x:1000:1000:hako:/home/u:/bin/sh\n"),
            "{contents}"
        );
        // The home: private, the user's, made before the workspace inside it.
        let home =
            at(&|m| matches!(m, MountOp::Tmpfs { path, .. } if path == Path::new("/home/u")));
        let MountOp::Tmpfs { options, .. } = &spec.mounts[home] else {
            unreachable!()
        };
        assert!(
            options.starts_with("mode=0700,uid=1000,gid=1000,"),
            "{options}"
        );
        let ws =
            at(&|m| matches!(m, MountOp::Bind { path, .. } if path == Path::new("/home/u/proj")));
        assert!(home < ws);
        assert!(spec.landlock.unwrap().write_dirs.contains(&p("/home/u")));
    }

    #[test]
    fn a_home_the_workspace_or_a_bind_holds_is_not_covered() {
        for (home, ro, rw) in [
            ("/home/u/proj", vec![], vec![]),
            ("/home/u/proj/sub", vec![], vec![]),
            ("/home/u", vec![p("/home")], vec![]),
            ("/home/u", vec![], vec![p("/home/u")]),
        ] {
            let mut i = input();
            i.home = p(home);
            i.ro = ro;
            i.rw = rw;
            assert!(!home_is_private(&i), "{home}");
            let spec = plan(&i, &facts(1000)).unwrap();
            assert!(
                !spec
                    .mounts
                    .iter()
                    .any(|m| matches!(m, MountOp::Tmpfs { path, .. } if path == Path::new(home))),
                "{home}"
            );
        }
    }

    #[test]
    fn mount_points_inside_system_dirs_are_refused() {
        for bad in ["/usr/src/x", "/proc/x", "/", "relative"] {
            let mut i = input();
            i.mount_point = p(bad);
            assert!(plan(&i, &facts(1000)).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_become_rlimits_and_core_dumps_are_off() {
        let mut i = input();
        i.rlimits = Rlimits {
            address_space: Some(256 << 20),
            nproc: Some(128),
            fsize: Some(10 << 20),
            nofile: None,
        };
        let spec = plan(&i, &facts(1000)).unwrap();
        let got: Vec<(RlimitResource, u64)> =
            spec.rlimits.iter().map(|r| (r.resource, r.value)).collect();
        assert_eq!(
            got,
            [
                (RlimitResource::Core, 0),
                (RlimitResource::AddressSpace, 256 << 20),
                (RlimitResource::Nproc, 128),
                (RlimitResource::Fsize, 10 << 20),
            ]
        );
    }
}
