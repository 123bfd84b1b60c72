//! What a `landlock` sandbox grants, as paths: pure, given the facts of
//! the host (its system directories and the entries of the directories
//! that hold a secret).
//!
//! Landlock grants by hierarchy: a rule on a directory covers everything
//! beneath it. So a directory that holds a secret (`/etc`, for
//! `/etc/shadow`; `/etc/ssl`, for `/etc/ssl/private`) is never granted
//! itself: its entries are, one by one, all but the secret, and the
//! directory gets only the right to be listed.

use std::path::{Path, PathBuf};

use hako_proto::{ConfineSpec, Rlimits};
use hako_view::HostFacts;

/// The device files a command may read, write and send ioctls to.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Everything the plan needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanInput {
    /// The workspace (canonical).
    pub workspace: PathBuf,
    /// The sandbox's private temporary directory (canonical).
    pub tmp: PathBuf,
    /// `--ro` directories (read and execute).
    pub ro: Vec<PathBuf>,
    /// `--rw` directories (every right).
    pub rw: Vec<PathBuf>,
    /// `--net host`.
    pub host_network: bool,
    /// Scoped signals and abstract sockets are required.
    pub scoped: bool,
    /// Limits set by `setrlimit`.
    pub rlimits: Rlimits,
    /// The sandbox's cgroups.
    pub cgroup_procs: Vec<PathBuf>,
}

/// Lists a directory's entries (full paths), sorted; empty when it cannot
/// be read.
pub type ListDir<'a> = &'a dyn Fn(&Path) -> Vec<PathBuf>;

/// The secrets under `/etc` that are never granted: the view's masked
/// files and directories, and the ssh host private keys.
pub fn etc_secrets(facts: &HostFacts) -> Vec<PathBuf> {
    facts
        .masked_etc_files()
        .chain(hako_view::MASKED_ETC_DIRS.iter().map(PathBuf::from))
        .collect()
}

/// Adds to `grant` every entry of `dir` but `secrets`, descending into
/// the entries that hold one (which go to `list`, to be listed only).
fn grant_around(
    dir: &Path,
    secrets: &[PathBuf],
    list_dir: ListDir<'_>,
    grant: &mut Vec<PathBuf>,
    list: &mut Vec<PathBuf>,
) {
    list.push(dir.to_path_buf());
    for entry in list_dir(dir) {
        if secrets.iter().any(|s| s == &entry) {
            continue;
        }
        if secrets.iter().any(|s| s.starts_with(&entry)) {
            grant_around(&entry, secrets, list_dir, grant, list);
        } else {
            grant.push(entry);
        }
    }
}

/// The directories a write grant must stay out of: the system the
/// sandbox reads, and the kernel's and devices' files.
const SYSTEM: &[&str] = &[
    "/proc", "/sys", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/libx32", "/boot",
];

/// Refuses a workspace or `--rw` directory that is `/` or holds or lies in
/// a system directory (every right there would undo the ruleset: `/etc`
/// as the workspace is `/etc/shadow` writable), and a `--ro` directory that
/// is `/` or holds a secret under `/etc` (Landlock would grant it with
/// everything beneath). Pure.
pub fn check(
    workspace: &Path,
    ro: &[PathBuf],
    rw: &[PathBuf],
    facts: &HostFacts,
) -> Result<(), String> {
    let writable = std::iter::once(workspace).chain(rw.iter().map(PathBuf::as_path));
    for path in writable {
        let what = if path == workspace {
            "the workspace"
        } else {
            "--rw"
        };
        if path == Path::new("/") {
            return Err(format!("{what} is /, which holds the whole system: every right there would leave nothing confined; cd to a project directory or pass --workspace DIR"));
        }
        if let Some(dir) = SYSTEM
            .iter()
            .find(|d| path.starts_with(d) || Path::new(d).starts_with(path))
        {
            return Err(format!(
                "{what} {} overlaps {dir}, which the sandbox may only read: choose a directory outside the system directories",
                path.display()
            ));
        }
    }
    let secrets = etc_secrets(facts);
    for path in ro {
        if path == Path::new("/") {
            return Err("--ro / would grant reading the whole system, its secrets included; name the directories to read".into());
        }
        if let Some(secret) = secrets.iter().find(|s| s.starts_with(path)) {
            return Err(format!(
                "--ro {} would grant reading {}, a secret the sandbox never shows; name the directories beneath it to read",
                path.display(),
                secret.display()
            ));
        }
    }
    Ok(())
}

/// What the guest is told to enforce, and the directories that may only
/// be listed (a Landlock rule of their own: see [`crate`]'s use).
pub fn plan(input: &PlanInput, facts: &HostFacts, list_dir: ListDir<'_>) -> ConfineSpec {
    let secrets = etc_secrets(facts);
    let mut read = Vec::new();
    let mut listed = Vec::new();
    for dir in facts.bound_dirs() {
        if secrets.iter().any(|s| s.starts_with(dir)) {
            grant_around(dir, &secrets, list_dir, &mut read, &mut listed);
        } else {
            read.push(dir.to_path_buf());
        }
    }
    // The kernel's view of processes: what a command may do to another is
    // Landlock's scope and ptrace rules; writes are refused.
    read.push(PathBuf::from("/proc"));
    read.extend(input.ro.iter().cloned());
    let mut write = vec![input.workspace.clone(), input.tmp.clone()];
    write.extend(input.rw.iter().cloned());
    let rlimits = input.rlimits.specs();
    ConfineSpec {
        read,
        list: listed,
        write,
        devices: DEVICES.iter().map(PathBuf::from).collect(),
        host_network: input.host_network,
        scoped: input.scoped,
        rlimits,
        cgroup_procs: input.cgroup_procs.clone(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hako_view::HostPath;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn facts() -> HostFacts {
        HostFacts {
            system: vec![
                (p("/usr"), HostPath::Dir),
                (p("/bin"), HostPath::Symlink(p("usr/bin"))),
                (p("/etc"), HostPath::Dir),
            ],
            ssh_host_keys: vec![p("/etc/ssh/ssh_host_ed25519_key")],
            uid: 1000,
            gid: 1000,
        }
    }

    fn tree(dir: &Path) -> Vec<PathBuf> {
        let names: &[&str] = match dir.to_str().unwrap() {
            "/etc" => &[
                "passwd",
                "shadow",
                "gshadow",
                "ssl",
                "ssh",
                "hosts",
                "sudoers.d",
            ],
            "/etc/ssl" => &["certs", "private", "openssl.cnf"],
            "/etc/ssh" => &[
                "ssh_config",
                "ssh_host_ed25519_key",
                "ssh_host_ed25519_key.pub",
            ],
            _ => &[],
        };
        names.iter().map(|n| dir.join(n)).collect()
    }

    fn input() -> PlanInput {
        PlanInput {
            workspace: p("/home/u/proj"),
            tmp: p("/tmp/hako-landlock-1"),
            ro: vec![p("/opt/sdk")],
            rw: vec![p("/srv/cache")],
            host_network: false,
            scoped: true,
            rlimits: Rlimits::default(),
            cgroup_procs: vec![],
        }
    }

    #[test]
    fn no_secret_under_etc_is_granted_nor_any_parent_of_one() {
        let spec = plan(&input(), &facts(), &tree);
        for secret in [
            "/etc",
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/ssl",
            "/etc/ssl/private",
            "/etc/sudoers.d",
            "/etc/ssh",
            "/etc/ssh/ssh_host_ed25519_key",
        ] {
            assert!(!spec.read.contains(&p(secret)), "{secret} granted");
            assert!(!spec.write.contains(&p(secret)), "{secret} granted");
        }
        for allowed in [
            "/etc/passwd",
            "/etc/hosts",
            "/etc/ssl/certs",
            "/etc/ssl/openssl.cnf",
            "/etc/ssh/ssh_config",
            "/etc/ssh/ssh_host_ed25519_key.pub",
            "/usr",
            "/proc",
            "/opt/sdk",
        ] {
            assert!(spec.read.contains(&p(allowed)), "{allowed} not granted");
        }
        assert_eq!(spec.list, [p("/etc"), p("/etc/ssl"), p("/etc/ssh")]);
    }

    #[test]
    fn a_workspace_or_rw_that_is_or_touches_the_system_is_refused() {
        for ws in [
            "/",
            "/etc",
            "/etc/ssl",
            "/usr/local/src",
            "/proc/self",
            "/dev",
        ] {
            let mut i = input();
            i.workspace = p(ws);
            assert!(
                check(&i.workspace, &i.ro, &i.rw, &facts()).is_err(),
                "{ws} accepted"
            );
        }
        let mut i = input();
        i.rw = vec![p("/")];
        assert!(check(&i.workspace, &i.ro, &i.rw, &facts())
            .unwrap_err()
            .contains("--rw is /"));
        for ro in ["/", "/etc", "/etc/ssl"] {
            let mut i = input();
            i.ro = vec![p(ro)];
            assert!(
                check(&i.workspace, &i.ro, &i.rw, &facts()).is_err(),
                "--ro {ro} accepted"
            );
        }
        let mut i = input();
        i.ro = vec![p("/etc/ssl/certs"), p("/opt/sdk")];
        assert_eq!(check(&i.workspace, &i.ro, &i.rw, &facts()), Ok(()));
        assert_eq!(
            {
                let i = input();
                check(&i.workspace, &i.ro, &i.rw, &facts())
            },
            Ok(())
        );
    }

    #[test]
    fn writes_only_in_the_workspace_the_private_tmp_and_rw_binds() {
        let spec = plan(&input(), &facts(), &tree);
        assert_eq!(
            spec.write,
            [
                p("/home/u/proj"),
                p("/tmp/hako-landlock-1"),
                p("/srv/cache")
            ]
        );
        assert!(!spec.read.iter().any(|r| r.starts_with("/home")));
        assert!(spec.devices.contains(&p("/dev/null")));
        assert!(!spec.devices.iter().any(|d| d.starts_with("/dev/pts")));
        assert!(spec
            .rlimits
            .iter()
            .any(|r| r.resource == hako_proto::RlimitResource::Core));
    }
}
