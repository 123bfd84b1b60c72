//! How the guest builds a `linux` sandbox ([`LinuxSpec`]): the mount
//! operations of its view, its limits and its Landlock ruleset, planned by
//! the `hako-linux` crate and carried out by the guest.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::MemoryWatch;
use crate::NetSpec;

/// How the guest builds a `linux` sandbox: new namespaces, a filesystem view
/// on a fresh tmpfs root, and the confinement applied to the command.
///
/// Planned by the `hako-linux` crate (pure), carried out by the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinuxSpec {
    /// (uid inside, uid outside) of the one mapped user.
    pub uid: (u32, u32),
    /// (gid inside, gid outside) of the one mapped group.
    pub gid: (u32, u32),
    /// Host name inside.
    pub hostname: String,
    /// The filesystem view, built in this order on an empty tmpfs that then
    /// becomes the root.
    pub mounts: Vec<MountOp>,
    /// Resource limits set on the command (`setrlimit`).
    pub rlimits: Vec<RlimitSpec>,
    /// Landlock write rules, if Landlock is to be applied.
    pub landlock: Option<LandlockSpec>,
    /// Apply the default seccomp policy to the command.
    pub seccomp: bool,
    /// `cgroup.procs` files the guest joins before anything else, so that
    /// everything it starts is counted against the sandbox's cgroups.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
    /// The kernel's count of the sandbox's memory cgroup's OOM kills (v1
    /// `memory.oom_control`, v2 `memory.events`), a host path that pid 1
    /// opens read-only before it builds its view (see [`MemoryWatch`]).
    #[serde(default)]
    pub oom_counter: Option<PathBuf>,
    /// Stay in the host's network namespace (network mode `host`).
    #[serde(default)]
    pub host_network: bool,
    /// The sandbox's end of the egress proxy (network mode `allow`).
    #[serde(default)]
    pub network: Option<NetSpec>,
}

/// One step of building the filesystem view. Paths are absolute paths
/// inside the sandbox; sources are host paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum MountOp {
    /// A directory (and its parents) on whatever is mounted there.
    Dir {
        /// Where.
        path: PathBuf,
    },
    /// A fresh tmpfs.
    Tmpfs {
        /// Where.
        path: PathBuf,
        /// tmpfs options, e.g. `mode=1777,size=64m`.
        options: String,
    },
    /// A bind mount of a host file or directory (recursive), always
    /// `nosuid,nodev`.
    Bind {
        /// Host path.
        source: PathBuf,
        /// Where.
        path: PathBuf,
        /// Read-only.
        read_only: bool,
    },
    /// A host device node bound over an empty file (user namespaces cannot
    /// create device nodes).
    DevNode {
        /// Host path, e.g. `/dev/null`.
        source: PathBuf,
        /// Where.
        path: PathBuf,
    },
    /// A new procfs for the sandbox's pid namespace.
    Proc {
        /// Where.
        path: PathBuf,
    },
    /// A new devpts instance (its own ptmx).
    Devpts {
        /// Where.
        path: PathBuf,
    },
    /// Hide a file, if it exists, behind `/dev/null`.
    MaskFile {
        /// What.
        path: PathBuf,
    },
    /// A read-only file of the sandbox's own holding `contents`, bound
    /// over `path` if that exists (the sandbox user's `/etc/passwd` and
    /// `/etc/group` over the host's).
    File {
        /// What.
        path: PathBuf,
        /// What the file holds.
        contents: String,
    },
    /// Hide a directory, if it exists, behind an empty read-only tmpfs.
    MaskDir {
        /// What.
        path: PathBuf,
    },
    /// Bind a path onto itself, read-only, if it exists (e.g. `/proc/sys`).
    ReadOnlySelf {
        /// What.
        path: PathBuf,
    },
    /// A symlink.
    Symlink {
        /// What it points to.
        target: PathBuf,
        /// Where.
        path: PathBuf,
    },
    /// Remount a mount point read-only.
    ReadOnly {
        /// What.
        path: PathBuf,
    },
    /// An overlayfs mount (`--cow`): `lower` seen through it, read-only,
    /// every change landing in `upper` (`work` is overlayfs's work
    /// directory beside it); mounted with `userxattr`, as a user namespace
    /// must, and `nosuid,nodev`.
    Overlay {
        /// Host path of the lower layer (the workspace).
        lower: PathBuf,
        /// Host path of the upper layer.
        upper: PathBuf,
        /// Host path of the work directory.
        work: PathBuf,
        /// Where.
        path: PathBuf,
    },
}

/// A resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    /// `RLIMIT_AS`: address space, bytes.
    AddressSpace,
    /// `RLIMIT_NPROC`: processes of this user.
    Nproc,
    /// `RLIMIT_FSIZE`: largest file, bytes.
    Fsize,
    /// `RLIMIT_NOFILE`: open descriptors.
    Nofile,
    /// `RLIMIT_CORE`: core dump size.
    Core,
}

/// `setrlimit(resource, value, value)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitSpec {
    /// Which.
    pub resource: RlimitResource,
    /// Soft and hard limit.
    pub value: u64,
}

/// The resource limits a `linux` or `landlock` sandbox sets on each
/// command with `setrlimit` (those not left to a cgroup).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// Address space, bytes (`--memory` without a cgroup).
    pub address_space: Option<u64>,
    /// Processes (`--pids` without a cgroup).
    pub nproc: Option<u64>,
    /// Largest file, bytes (`--max-file-size`).
    pub fsize: Option<u64>,
    /// Open descriptors (`--max-open-files`).
    pub nofile: Option<u64>,
}

impl Rlimits {
    /// What the guest is told: no core dumps, then each limit given.
    pub fn specs(&self) -> Vec<RlimitSpec> {
        let mut specs = vec![RlimitSpec {
            resource: RlimitResource::Core,
            value: 0,
        }];
        for (resource, value) in [
            (RlimitResource::AddressSpace, self.address_space),
            (RlimitResource::Nproc, self.nproc),
            (RlimitResource::Fsize, self.fsize),
            (RlimitResource::Nofile, self.nofile),
        ] {
            if let Some(value) = value {
                specs.push(RlimitSpec { resource, value });
            }
        }
        specs
    }
}

/// Landlock: where the command may write. Reads are not restricted by
/// Landlock (the filesystem view decides what exists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockSpec {
    /// Directories the command may write beneath.
    pub write_dirs: Vec<PathBuf>,
    /// Single files the command may write (device nodes).
    pub write_files: Vec<PathBuf>,
    /// Fail when Landlock cannot be fully enforced.
    pub required: bool,
}
