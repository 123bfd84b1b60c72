//! The control messages: the handshake ([`Hello`], with its [`Seal`] and
//! [`NetSpec`]), what hako asks of the guest ([`ToGuest`]) and what the
//! guest answers ([`FromGuest`]), and a supervisor's reply to the guest
//! inside ([`RunReply`]).

use std::path::PathBuf;

use hako_core::ExitStatus;
use serde::{Deserialize, Serialize};

use crate::{LinuxSpec, RlimitSpec};

/// The first frame hako sends: the protocol version, and what the guest is
/// to build before it serves commands. The guest answers [`FromGuest::Ready`]
/// or [`FromGuest::Refused`] (and then exits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal [`VERSION`].
    pub version: u32,
    /// Build a `linux` sandbox first and serve from its pid 1; `None` serves
    /// where the guest is (the `host` backend).
    #[serde(default)]
    pub linux: Option<LinuxSpec>,
    /// The sandbox's end of the egress proxy, for a guest that serves
    /// where it is (a container's); a `linux` sandbox carries its own in
    /// [`LinuxSpec::network`].
    #[serde(default)]
    pub network: Option<NetSpec>,
    /// What a guest that serves where it is must still do to itself before
    /// it reads any command (a gVisor sandbox's init, started with the
    /// privilege to mask).
    #[serde(default)]
    pub seal: Option<Seal>,
    /// How a guest that serves where it is (a container's) tells that the
    /// sandbox's memory limit killed a command ([`FromGuest::Exited`]'s
    /// `oom_killed`); a `linux` sandbox carries its counter in
    /// [`LinuxSpec::oom_counter`].
    #[serde(default)]
    pub memory: Option<MemoryWatch>,
    /// What a guest that serves where it is, with no namespace of its own
    /// (the `landlock` backend's, a process of the host), puts on every
    /// command it starts.
    #[serde(default)]
    pub confine: Option<ConfineSpec>,
}

/// The confinement of commands that share the namespaces of the processes
/// around them (the `landlock` backend): a Landlock ruleset over the whole
/// filesystem, seccomp (the default policy, and refusing the network and
/// IPC that the shared namespaces would reach), `no_new_privs`, no
/// capabilities, and limits. The guest joins `cgroup_procs` first, builds
/// the ruleset, installs the default seccomp policy on itself, and has
/// every supervisor enforce the rest before it is given a command. A guest
/// that cannot enforce any of it refuses to serve, naming what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfineSpec {
    /// Read and execute beneath these (host paths; Landlock grants by
    /// hierarchy: the entries to allow, never a parent that holds a
    /// secret).
    pub read: Vec<PathBuf>,
    /// Directories that may be listed only (those that hold a secret:
    /// their other entries are in `read`).
    #[serde(default)]
    pub list: Vec<PathBuf>,
    /// Every right beneath these (the workspace, the private temporary
    /// directory, `--rw` binds).
    pub write: Vec<PathBuf>,
    /// Device files that may be read, written and receive ioctls.
    pub devices: Vec<PathBuf>,
    /// The network is the host's (`--net host`); otherwise no socket but a
    /// unix one may be made, and TCP is refused by Landlock too where the
    /// kernel can.
    pub host_network: bool,
    /// Signals and abstract unix sockets scoped to the sandbox (Landlock
    /// ABI 6) are required; `false` only with best effort, on an older
    /// kernel.
    pub scoped: bool,
    /// Resource limits set on each command (`setrlimit`).
    pub rlimits: Vec<RlimitSpec>,
    /// `cgroup.procs` files the guest joins before anything else.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
}

/// How the guest learns that the memory limit killed a process.
///
/// A command is reported killed for memory when the count of kills rose
/// while it ran, hako did not kill it (deadline, kill, close), and it ended
/// by `SIGKILL` (or, run by a shell that reports its child's end, with
/// status 137). A guest that cannot open what it is told to watch refuses
/// to serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryWatch {
    /// The kernel enforces the limit and counts its kills in the first of
    /// these files (paths inside) that opens: a cgroup v1
    /// `memory.oom_control` or a v2 `memory.events` (`oom_kill N`).
    Counter(Vec<PathBuf>),
    /// Nothing inside enforces the limit (gVisor: the host cgroup holds
    /// gVisor's own kernel too, and its memory controller inside does not
    /// enforce): the guest watches the memory its commands use and, past
    /// `limit` bytes, kills the process that uses the most, counting the
    /// kill as the kernel would. The host's limit, set higher, stays the
    /// backstop.
    Watch {
        /// The sandbox's `--memory`, in bytes.
        limit: u64,
    },
}

/// What a container's guest does to itself, in this order, before it
/// serves anything, for runtimes where doing it inside is cheaper than
/// asking the runtime (under gVisor, each bind in the bundle costs the
/// runtime a gofer connection; a mount the guest makes is the Sentry's
/// alone): hide each path, then set `no_new_privs`, drop every capability
/// (which must leave none but the guard, see [`Seal::guard`]: the
/// container gives the guest `CAP_SYS_ADMIN` and `CAP_SETPCAP` for this
/// step only), and install the default seccomp policy. Any step that fails
/// ends the guest with [`FromGuest::Refused`]; nothing is served unsealed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// Files hidden behind `/dev/null` (a path that does not exist inside
    /// is skipped: there is nothing to hide).
    pub mask_files: Vec<PathBuf>,
    /// Directories hidden behind an empty read-only tmpfs (likewise).
    pub mask_dirs: Vec<PathBuf>,
    /// Install the default seccomp policy last.
    pub seccomp: bool,
    /// Keep `CAP_SETPCAP` in the guest's permitted set (never effective,
    /// and gone from the bounding set, so no command gets it): commands
    /// run as the guest's uid, and a process holding a permitted
    /// capability its caller lacks is out of the caller's reach through
    /// `ptrace` and `/proc/PID/mem` (and, on Linux, `/proc/PID/fd`).
    /// gVisor, which does not honour "not dumpable", checks it for
    /// `ptrace` and memory, not for descriptors: there the guest's own
    /// descriptors are hidden instead ([`GUEST_FD_DIRS`]). A guest that
    /// cannot keep it refuses to serve.
    #[serde(default)]
    pub guard: bool,
    /// At most this many processes (and threads) in the whole sandbox,
    /// counted by gVisor's own kernel, not the host's: the guest mounts
    /// the Sentry's `pids` cgroup controller, creates a group with this
    /// `pids.max`, joins it (as pid 1, before it forks anything, so every
    /// process of the sandbox is counted, as on `linux`) and hides the
    /// hierarchy behind an empty read-only tmpfs ([`PIDS_CGROUP_DIR`]).
    /// A fork past it fails with `EAGAIN` inside; the sandbox goes on. A
    /// limit on the runtime's host cgroup would also count gVisor's own
    /// host threads and end the whole sandbox instead.
    #[serde(default)]
    pub pids_max: Option<u64>,
}

/// Where a sealing guest mounts the `pids` hierarchy for
/// [`Seal::pids_max`]: a directory it then covers with an empty
/// read-only tmpfs (a covered hierarchy keeps its limit; an unmounted one
/// would lose it), and that the seal masks in any case
/// ([`GUEST_FD_DIRS`]).
pub const PIDS_CGROUP_DIR: &str = GUEST_FD_DIRS[0];

/// The guest's descriptor directories in `/proc`, which a gVisor guest
/// hides behind an empty read-only tmpfs when it seals itself
/// ([`Seal::mask_dirs`]). Its link to hako is a pair of host pipes at
/// `/proc/1/fd/N`; gVisor lets a process of the same uid open another's
/// descriptors whatever its dumpable flag or capabilities, and commands run
/// as the guest's uid. Linux refuses that open by "not dumpable" and by
/// the guard ([`Seal::guard`]); under gVisor the mask is what refuses it.
/// The guest is pid 1 and single-threaded, so these two paths are every
/// way to its descriptors; its supervisors hold nothing that can be opened
/// again through `/proc` (a unix socket, a signalfd) but, for a moment
/// after starting a command, that command's own stdin, stdout and stderr.
pub const GUEST_FD_DIRS: [&str; 2] = ["/proc/1/fd", "/proc/1/task/1/fd"];

/// The sandbox's end of the egress proxy (network mode `allow`): listeners
/// on loopback inside that relay every connection to the proxy's unix
/// socket, which hako serves outside the boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetSpec {
    /// The proxy's socket, as a path inside the sandbox.
    pub socket: PathBuf,
    /// The listeners, on 127.0.0.1 (and ::1 where the sandbox has it).
    pub listeners: Vec<NetListener>,
}

/// One loopback port inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetListener {
    /// The port.
    pub port: u16,
    /// `None`: the proxy's own port (bytes are relayed as they come);
    /// `Some(p)`: a forwarded host port, each connection first asks the
    /// proxy for `localhost:p`.
    pub forward: Option<u16>,
}

/// Where a command starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cwd {
    /// The directory whose descriptor travels with this frame
    /// (`SCM_RIGHTS`), opened by hako through the fence: no path is
    /// resolved again.
    Fd,
    /// An absolute path, resolved inside the sandbox.
    Path(PathBuf),
}

/// Start one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Chosen by hako, unique on the connection; every event of this command
    /// carries it.
    pub id: u64,
    /// Program and arguments; the program is looked up in `PATH` from `env`.
    pub argv: Vec<String>,
    /// The complete environment of the command.
    pub env: Vec<(String, String)>,
    /// Where it starts.
    pub cwd: Cwd,
    /// The process deadline in milliseconds: on expiry the whole tree is
    /// killed and the result says so.
    pub timeout_ms: Option<u64>,
    /// Give the command a stdin pipe fed by [`Frame::Stdin`] frames and
    /// closed by [`ToGuest::CloseStdin`]; otherwise stdin is `/dev/null`.
    pub stdin: bool,
    /// Bytes of each output stream forwarded; the rest is only counted.
    pub max_output: u64,
    /// Run on a new pseudo-terminal of this size (rows, columns): the
    /// terminal is the command's stdin, stdout, stderr and controlling
    /// terminal; its output comes as stdout, stdin frames are typed input.
    #[serde(default)]
    pub pty: Option<(u16, u16)>,
}

/// A control message from hako to the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToGuest {
    /// The handshake (first frame only; boxed: it is by far the largest
    /// frame, and is sent once).
    Hello(Box<Hello>),
    /// Start a command.
    Exec(ExecRequest),
    /// No more input for this command's stdin.
    CloseStdin {
        /// The command.
        id: u64,
    },
    /// Kill this command's whole tree (idempotent; an unknown id is
    /// ignored, it may have just ended).
    Kill {
        /// The command.
        id: u64,
    },
    /// Set the window size of a command's terminal (the command gets
    /// SIGWINCH); ignored for a command without one.
    Resize {
        /// The command.
        id: u64,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// Start a shell session; answered by [`FromGuest::SessionOpened`] or
    /// [`FromGuest::Failed`].
    OpenSession(SessionRequest),
    /// Run a script in a session's shell; answered like [`ToGuest::Exec`].
    SessionExec(SessionExecRequest),
    /// End a session (its shell and everything started in it are killed);
    /// answered by [`FromGuest::SessionEnded`].
    CloseSession {
        /// The session.
        id: u64,
    },
}

/// Start a shell session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRequest {
    /// Chosen by hako, unique on the connection (shared with command ids).
    pub id: u64,
    /// The shell and its arguments; `None` lets the guest choose (`bash
    /// --noprofile --norc` where it exists, else `sh`). It reads its script
    /// from stdin.
    pub shell: Option<Vec<String>>,
    /// The shell's complete environment.
    pub env: Vec<(String, String)>,
    /// Where it starts.
    pub cwd: Cwd,
}

/// Run a script in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionExecRequest {
    /// The command's id, as for [`ExecRequest::id`].
    pub id: u64,
    /// The session.
    pub session: u64,
    /// Shell text, run by the session's shell itself (`eval`), with stdin
    /// from `/dev/null`.
    pub script: String,
    /// The deadline in milliseconds: on expiry every process the script
    /// started is killed and the result says so; the session stays.
    pub timeout_ms: Option<u64>,
    /// Bytes of each output stream forwarded; the rest is only counted.
    pub max_output: u64,
}

/// A control message from the guest to hako.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromGuest {
    /// The handshake succeeded; commands may be sent.
    Ready {
        /// The version the guest speaks.
        version: u32,
    },
    /// The handshake or building the sandbox failed; the guest exits.
    Refused {
        /// Why.
        message: String,
        /// The OS error number behind it, if there was one (hako names
        /// the limit when it means the machine ran out of something).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errno: Option<i32>,
    },
    /// A command ended and every process it started is gone; all of its
    /// output was sent before this.
    Exited {
        /// The command.
        id: u64,
        /// How its first process ended.
        status: ExitStatus,
        /// Whether the deadline killed it.
        timed_out: bool,
        /// Whether the sandbox's memory limit killed it (see
        /// [`MemoryWatch`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        oom_killed: bool,
        /// Bytes it wrote to stdout, forwarded or not.
        stdout_total: u64,
        /// Bytes it wrote to stderr, forwarded or not.
        stderr_total: u64,
    },
    /// A command never started.
    SpawnFailed {
        /// The command.
        id: u64,
        /// The kind of failure.
        kind: SpawnFailure,
        /// The OS error number, if there was one.
        errno: Option<i32>,
        /// A readable message.
        message: String,
    },
    /// A session's shell is running.
    SessionOpened {
        /// The session.
        id: u64,
    },
    /// A session ended: closed on request, or its shell exited or was
    /// killed. The answer to [`ToGuest::CloseSession`].
    SessionEnded {
        /// The session.
        id: u64,
        /// How.
        message: String,
    },
    /// The last frame: every command and session has ended and every
    /// process of the sandbox but the guest itself is gone; the guest exits.
    /// (A struct variant: every control message is a JSON object.)
    Bye {},
    /// A request failed (bad frame, duplicate id, empty argv, ...); the
    /// guest stays up. `id` names the command when there is one.
    Failed {
        /// The command, if the request named one.
        id: Option<u64>,
        /// Why.
        message: String,
        /// The OS error number behind it, if there was one (hako names
        /// the limit when it means the machine ran out of something).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errno: Option<i32>,
    },
}

/// Why the command could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnFailure {
    /// The program does not exist.
    NotFound,
    /// The program exists and cannot be executed.
    CannotExecute,
    /// Anything else.
    Other,
}

/// A supervisor's one reply to the guest about its command (inside the
/// guest; hako sees it as [`FromGuest`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunReply {
    /// The command ran; every process it started is gone.
    Finished {
        /// How the command's first process ended.
        status: ExitStatus,
        /// Whether the deadline killed it.
        timed_out: bool,
        /// The supervisor could not become the tree's subreaper (gVisor
        /// before 2023 refuses it for all but pid 1): processes that left
        /// the command's group went to the guest, pid 1, to be killed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        orphans_to_guest: bool,
    },
    /// The command never started.
    SpawnFailed {
        /// The kind of failure.
        kind: SpawnFailure,
        /// The OS error number, if there was one.
        errno: Option<i32>,
        /// A readable message.
        message: String,
    },
    /// The request was refused (bad frame, wrong version, empty argv).
    Refused {
        /// Why.
        message: String,
    },
}

/// What hako tells a `vm` sandbox's init before the protocol starts, on
/// the link, as one line: [`VM_BOOT_PREFIX`] then this as JSON. It is what
/// differs between VMs started from one snapshot: fresh randomness (a
/// restored kernel would otherwise repeat its random numbers), and the
/// shared directories to mount (their devices are added after the
/// restore).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmBoot {
    /// Random bytes, hex, mixed into the kernel's pool, which is then
    /// reseeded.
    pub seed: String,
    /// The virtio-fs shares to mount, in order.
    pub mounts: Vec<VmMount>,
    /// `RLIMIT_FSIZE` for every process of the guest's (`--max-file-size`).
    #[serde(default)]
    pub file_size: Option<u64>,
    /// `RLIMIT_NOFILE` likewise (`--max-open-files`).
    #[serde(default)]
    pub open_files: Option<u64>,
    /// Network mode `allow`: where the guest's bridge listens for the
    /// forwarder (the proxy's socket as the sandbox sees it); it carries
    /// each connection over the `hako-net` port to hako's bridge.
    #[serde(default)]
    pub net: Option<PathBuf>,
}

/// One virtio-fs share of a `vm` sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmMount {
    /// The device's tag (`[a-z0-9-]`, at most 36 bytes).
    pub tag: String,
    /// Where it is mounted inside (absolute, no `..`).
    pub path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// What starts the [`VmBoot`] line.
pub const VM_BOOT_PREFIX: &str = "hako-vm-boot ";
/// The longest [`VmBoot`] line the guest reads.
pub const VM_BOOT_MAX: usize = 64 << 10;
