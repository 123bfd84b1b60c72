use serde::{Deserialize, Serialize};

use crate::isolation::Isolation;

/// What a sandbox actually enforces, read back from what was applied, never
/// from what was requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The backend's name (`host`, `linux`, ...).
    pub backend: String,
    /// The strength of the boundary.
    pub isolation: Isolation,
    /// What the code inside can reach on the network.
    pub network: NetworkAccess,
    /// How the file fence resolves paths.
    pub fence: FenceResolver,
    /// Each limit in force and the mechanism that enforces it.
    pub limits: Vec<LimitReport>,
    /// Whether the environment is built from a minimal base plus an allowlist
    /// (host secrets stripped).
    pub env_sanitised: bool,
    /// Whether only file descriptors 0, 1 and 2 reach the command.
    pub fds_closed: bool,
    /// The Landlock ABI in force, if Landlock is applied.
    pub landlock_abi: Option<u32>,
    /// How a `vm` sandbox's CPU runs: `kvm` (hardware virtualisation) or
    /// `tcg` (QEMU's emulator, which QEMU does not count as a security
    /// boundary); `None` for the other backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    /// Whether a seccomp filter is applied to every command.
    pub seccomp: bool,
    /// What the sandbox's commands share with the processes around it
    /// (a `linux` sandbox has its own of each): empty for a boundary of
    /// its own.
    pub shared: Vec<Shared>,
    /// What this sandbox is known to get wrong on this host, each in one
    /// line naming what fails, why, and the fix: a gVisor release that
    /// refuses the flags GNU `ls -la` and `stat` pass to `statx` (which
    /// `auto` checks for, and passes over), or a protection a
    /// `--best-effort` sandbox runs without. Empty for most.
    pub defects: Vec<String>,
    /// The optional capabilities this sandbox offers.
    pub optional: Optional,
}

/// Something a sandbox's commands share with the processes around them,
/// where a `linux` sandbox has a namespace (or a device directory) of its
/// own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shared {
    /// The process table: other processes are visible in `/proc` (what
    /// else a command can do to them is the backend's to say).
    Processes,
    /// The network namespace: interfaces, routes, ports and connections
    /// are visible (whether sockets can be made is [`NetworkAccess`]).
    Network,
    /// The mount table.
    Mounts,
    /// System V IPC and POSIX message queues.
    Ipc,
    /// The device directory (`/dev`): no private one.
    Devices,
    /// The host name.
    Hostname,
}

impl Shared {
    /// Every kind, in this order.
    pub const ALL: [Shared; 6] = [
        Shared::Processes,
        Shared::Network,
        Shared::Mounts,
        Shared::Ipc,
        Shared::Devices,
        Shared::Hostname,
    ];

    /// `[Network]` where the sandbox uses the host's network, else none:
    /// what a backend with namespaces of its own shares.
    pub fn network_if(access: NetworkAccess) -> Vec<Shared> {
        if access == NetworkAccess::Host {
            vec![Shared::Network]
        } else {
            Vec::new()
        }
    }
}

/// Network reach of the code inside a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// Loopback only, in a namespace of its own.
    None,
    /// Only through the egress proxy's allowlist.
    Allowlist,
    /// Whatever the host can reach.
    Host,
}

/// How the file fence resolves a path against the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceResolver {
    /// The kernel resolves with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
    Openat2,
    /// Component by component with `O_NOFOLLOW`, symlinks followed by hand
    /// within the root (for kernels without openat2).
    ComponentWalk,
}

/// A kind of resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Wall-clock deadline of one command.
    Timeout,
    /// Bytes kept of each output stream.
    OutputBytes,
    /// Bytes loaded by a whole-file read.
    ReadBytes,
    /// Entries returned by one directory listing.
    DirEntries,
    /// Memory.
    Memory,
    /// Number of processes.
    Pids,
    /// CPU share.
    Cpus,
    /// Largest file a command may write.
    FileSize,
    /// Open file descriptors per process.
    OpenFiles,
}

/// The mechanism that enforces a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitMechanism {
    /// The supervisor inside the boundary (hako-guest).
    Supervisor,
    /// hako itself, outside the boundary.
    Hako,
    /// cgroup v2.
    CgroupV2,
    /// cgroup v1.
    CgroupV1,
    /// `setrlimit`.
    Rlimit,
    /// The container runtime (Docker, Podman, runsc), with its own cgroups.
    Runtime,
    /// A cgroup of the sandbox's own kernel (gVisor's), set up by the
    /// guest before it serves: it counts the processes inside, not the
    /// runtime's own threads on the host.
    SandboxKernel,
    /// The size of the sandbox's virtual machine (its memory and virtual
    /// CPUs, as the VMM gives them): a bound on the whole guest, its
    /// kernel included.
    VmSize,
}

/// One limit in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReport {
    /// Which limit.
    pub kind: LimitKind,
    /// Its value (milliseconds for time, bytes for sizes, a count otherwise);
    /// `None` where it applies per command and the command sets it.
    pub value: Option<u64>,
    /// What enforces it.
    pub mechanism: LimitMechanism,
}

/// The optional capabilities a sandbox offers, as reported in
/// [`Capabilities`]. Discover them in code through the accessors on
/// [`Sandbox`](crate::Sandbox).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Optional {
    /// `read_file_limit`.
    pub read_limit: bool,
    /// `append_file`.
    pub append: bool,
    /// `make_dir_all`.
    pub make_dir_all: bool,
    /// `workdir`.
    pub workdir: bool,
    /// `stat`.
    pub stat: bool,
    /// Streamed exec output.
    pub exec_stream: bool,
    /// Stateful shell sessions.
    #[serde(default)]
    pub sessions: bool,
    /// Long-lived processes with handles.
    #[serde(default)]
    pub processes: bool,
}

/// Resource limits a caller asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory, bytes.
    pub memory: Option<u64>,
    /// Processes.
    pub pids: Option<u64>,
    /// CPUs (a share; e.g. 0.5 is half a CPU), in thousandths.
    pub cpus_milli: Option<u64>,
    /// Largest file a command may write, bytes.
    pub file_size: Option<u64>,
    /// Open descriptors per process.
    pub open_files: Option<u64>,
}
