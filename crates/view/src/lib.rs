//! The read-only view of the host that the `linux` and `gvisor` backends
//! both give a sandbox.
//!
//! A sandbox sees the host's system directories ([`SYSTEM_DIRS`]) bound
//! read-only, or recreated as the same symlinks on a merged-/usr system,
//! and never sees the host's secrets: the files and directories under
//! `/etc` in [`MASKED_ETC_FILES`] and [`MASKED_ETC_DIRS`], the ssh host
//! private keys, and the kernel's files under `/proc` in
//! [`MASKED_PROC_FILES`] and [`MASKED_PROC_DIRS`] (with
//! [`READ_ONLY_PROC_DIRS`] read-only).
//!
//! This crate owns that description and gathers the facts about this host
//! it depends on ([`host_facts`]); nothing else. Each backend turns it into
//! mounts its own way: `hako-linux` into the mount-op queue its pid 1
//! replays, `hako-container`'s gvisor into an OCI bundle and the binds of
//! `hako-guest --host-view`. Both depend on this crate and neither on the
//! other.

use std::path::{Path, PathBuf};

pub mod user;

/// What a host path is, as far as the view cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPath {
    /// A directory (bound read-only).
    Dir,
    /// A symlink (recreated as the same symlink).
    Symlink(PathBuf),
    /// Not there.
    Absent,
}

/// Facts about the host that the view depends on, gathered by the caller
/// ([`host_facts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// The system directories ([`SYSTEM_DIRS`]) and what each is.
    pub system: Vec<(PathBuf, HostPath)>,
    /// Files under `/etc/ssh` whose names are private host keys
    /// ([`is_ssh_host_key`]), sorted.
    pub ssh_host_keys: Vec<PathBuf>,
    /// The invoking user's uid.
    pub uid: u32,
    /// The invoking user's gid.
    pub gid: u32,
}

impl HostFacts {
    /// The system directories that are directories on this host: those
    /// bound read-only into the view.
    pub fn bound_dirs(&self) -> impl Iterator<Item = &Path> {
        self.system
            .iter()
            .filter(|(_, kind)| *kind == HostPath::Dir)
            .map(|(path, _)| path.as_path())
    }

    /// Every secret file under `/etc` the view masks: [`MASKED_ETC_FILES`],
    /// then the ssh host private keys.
    pub fn masked_etc_files(&self) -> impl Iterator<Item = PathBuf> + '_ {
        MASKED_ETC_FILES
            .iter()
            .map(PathBuf::from)
            .chain(self.ssh_host_keys.iter().cloned())
    }
}

/// Directories a toolchain needs, bound read-only when they are
/// directories and recreated when they are symlinks (merged-/usr systems).
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Files under `/etc` that are never visible inside.
pub const MASKED_ETC_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/security/opasswd",
];

/// Directories under `/etc` that are hidden behind an empty tmpfs.
pub const MASKED_ETC_DIRS: &[&str] = &["/etc/sudoers.d", "/etc/ssl/private"];

/// Files under `/proc` hidden behind `/dev/null`.
pub const MASKED_PROC_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/kmsg",
    "/proc/sysrq-trigger",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
];

/// Directories under `/proc` made read-only.
pub const READ_ONLY_PROC_DIRS: &[&str] = &["/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs"];

/// Directories under `/proc` hidden behind an empty tmpfs.
pub const MASKED_PROC_DIRS: &[&str] = &["/proc/acpi", "/proc/scsi", "/proc/firmware"];

/// Every path under `/proc` the view masks: [`MASKED_PROC_FILES`], then
/// [`MASKED_PROC_DIRS`].
pub fn masked_proc_paths() -> impl Iterator<Item = &'static str> {
    MASKED_PROC_FILES.iter().chain(MASKED_PROC_DIRS).copied()
}

/// Whether a file name under `/etc/ssh` is a host's private key
/// (`ssh_host_*_key`; the public halves end in `.pub` and stay visible).
pub fn is_ssh_host_key(name: &str) -> bool {
    name.starts_with("ssh_host_") && name.ends_with("_key")
}

/// Gathers [`HostFacts`] from this host.
pub fn host_facts() -> HostFacts {
    let system = SYSTEM_DIRS
        .iter()
        .map(|d| {
            let path = PathBuf::from(d);
            let kind = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&path)
                    .map(HostPath::Symlink)
                    .unwrap_or(HostPath::Absent),
                Ok(m) if m.is_dir() => HostPath::Dir,
                _ => HostPath::Absent,
            };
            (path, kind)
        })
        .collect();
    let mut ssh_host_keys: Vec<PathBuf> = std::fs::read_dir("/etc/ssh")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(is_ssh_host_key)
                })
                .collect()
        })
        .unwrap_or_default();
    ssh_host_keys.sort();
    HostFacts {
        system,
        ssh_host_keys,
        uid: hako_sys::rustix::process::geteuid().as_raw(),
        gid: hako_sys::rustix::process::getegid().as_raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn only_private_ssh_host_keys_are_secret() {
        for name in [
            "ssh_host_ed25519_key",
            "ssh_host_rsa_key",
            "ssh_host_ecdsa_key",
        ] {
            assert!(is_ssh_host_key(name), "{name}");
        }
        for name in [
            "ssh_host_ed25519_key.pub",
            "sshd_config",
            "ssh_config",
            "moduli",
            "host_key",
        ] {
            assert!(!is_ssh_host_key(name), "{name}");
        }
    }

    #[test]
    fn secrets_are_masked_inside_the_bound_etc_and_in_proc() {
        assert!(SYSTEM_DIRS.contains(&"/etc"));
        for path in MASKED_ETC_FILES.iter().chain(MASKED_ETC_DIRS) {
            assert!(Path::new(path).starts_with("/etc"), "{path}");
        }
        for path in masked_proc_paths().chain(READ_ONLY_PROC_DIRS.iter().copied()) {
            assert!(Path::new(path).starts_with("/proc"), "{path}");
        }
        assert!(MASKED_ETC_FILES.contains(&"/etc/shadow"));
        assert!(MASKED_ETC_DIRS.contains(&"/etc/ssl/private"));
        assert!(masked_proc_paths().any(|m| m == "/proc/kcore"));
    }

    #[test]
    fn masked_proc_paths_are_the_files_then_the_dirs() {
        let all: Vec<&str> = masked_proc_paths().collect();
        assert_eq!(all.len(), MASKED_PROC_FILES.len() + MASKED_PROC_DIRS.len());
        assert_eq!(&all[..MASKED_PROC_FILES.len()], MASKED_PROC_FILES);
        assert_eq!(&all[MASKED_PROC_FILES.len()..], MASKED_PROC_DIRS);
    }

    #[test]
    fn only_directories_are_bound_and_masked_files_include_the_host_keys() {
        let facts = HostFacts {
            system: vec![
                (p("/usr"), HostPath::Dir),
                (p("/bin"), HostPath::Symlink(p("usr/bin"))),
                (p("/lib32"), HostPath::Absent),
                (p("/etc"), HostPath::Dir),
            ],
            ssh_host_keys: vec![p("/etc/ssh/ssh_host_ed25519_key")],
            uid: 1000,
            gid: 1000,
        };
        assert_eq!(
            facts.bound_dirs().collect::<Vec<_>>(),
            [Path::new("/usr"), Path::new("/etc")]
        );
        let masked: Vec<PathBuf> = facts.masked_etc_files().collect();
        assert_eq!(masked.len(), MASKED_ETC_FILES.len() + 1);
        assert_eq!(masked[0], p("/etc/shadow"));
        assert_eq!(masked.last(), Some(&p("/etc/ssh/ssh_host_ed25519_key")));
    }

    #[test]
    fn this_hosts_facts_cover_every_system_dir_in_order() {
        let facts = host_facts();
        let paths: Vec<&Path> = facts.system.iter().map(|(p, _)| p.as_path()).collect();
        let want: Vec<&Path> = SYSTEM_DIRS.iter().map(Path::new).collect();
        assert_eq!(paths, want);
        // Every test host has a /usr and an /etc.
        assert!(facts.bound_dirs().any(|d| d == Path::new("/usr")));
        assert!(facts.bound_dirs().any(|d| d == Path::new("/etc")));
        let mut sorted = facts.ssh_host_keys.clone();
        sorted.sort();
        assert_eq!(facts.ssh_host_keys, sorted);
        for key in &facts.ssh_host_keys {
            assert!(key.starts_with("/etc/ssh"), "{key:?}");
            let name = key.file_name().and_then(|n| n.to_str()).unwrap_or("");
            assert!(is_ssh_host_key(name), "{key:?}");
        }
        assert_eq!(facts.uid, hako_sys::rustix::process::geteuid().as_raw());
    }
}
