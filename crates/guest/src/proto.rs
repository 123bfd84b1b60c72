//! The framed messages between hako and the guest.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Frames
//! are bounded by [`MAX_FRAME`]: a larger length is refused before anything is
//! read into memory.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use hako_core::ExitStatus;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The protocol version the guest speaks. Version 2 added the network
/// spec, version 3 the seal ([`Seal`]): a guest that would ignore either
/// must refuse the handshake instead.
pub const VERSION: u32 = 3;
/// The largest frame either side accepts: 16 MiB.
pub const MAX_FRAME: u32 = 16 << 20;

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
    /// `/proc/PID/fd`, `/proc/PID/mem` and `ptrace`. Under gVisor, which
    /// does not honour "not dumpable", this is what keeps a command from
    /// opening the guest's link to hako (`/proc/1/fd/N`) and writing
    /// frames on it. A guest that cannot keep it refuses to serve.
    #[serde(default)]
    pub guard: bool,
}

/// The guest's descriptor directories in `/proc`, which a gVisor guest
/// hides behind an empty read-only tmpfs when it seals itself
/// ([`Seal::mask_dirs`]). Its link to hako is a pair of host pipes at
/// `/proc/1/fd/N`; gVisor lets a process of the same uid open another's
/// descriptors whatever its dumpable flag or capabilities, and commands run
/// as the guest's uid. Linux refuses that open by "not dumpable" and by
/// the guard ([`Seal::guard`]); under gVisor the mask is what refuses it.
/// The guest is pid 1 and single-threaded, so these two paths are every
/// way to its descriptors; its supervisors hold nothing that can be opened
/// again through `/proc` (a unix socket, a signalfd).
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
    },
}

/// Which output stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamId {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One decoded frame. A frame's payload is JSON when its first byte is `{`;
/// otherwise the first byte tags a binary frame:
///
/// - `1` output: command id (u64), stream (`1` stdout, `2` stderr), offset
///   of the chunk in the stream (u64), bytes;
/// - `2` stdin: command id (u64), bytes.
///
/// Integers are big-endian. Output offsets number the bytes of each stream,
/// so a reader can tell a gap or a repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<T> {
    /// A control message.
    Message(T),
    /// Output of a command (guest to hako).
    Output {
        /// The command.
        id: u64,
        /// Which stream.
        stream: StreamId,
        /// Offset of `data` in the stream.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Input for a command (hako to guest).
    Stdin {
        /// The command.
        id: u64,
        /// The bytes.
        data: Vec<u8>,
    },
}

const TAG_OUTPUT: u8 = 1;
const TAG_STDIN: u8 = 2;
/// The largest chunk of data one frame carries.
pub const MAX_CHUNK: usize = 64 * 1024;

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

/// Encodes a frame: length prefix and payload.
pub fn encode<T: Serialize>(frame: &Frame<T>) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; 4];
    match frame {
        Frame::Message(msg) => serde_json::to_writer(&mut out, msg).map_err(io::Error::other)?,
        Frame::Output {
            id,
            stream,
            offset,
            data,
        } => {
            out.push(TAG_OUTPUT);
            out.extend_from_slice(&id.to_be_bytes());
            out.push(match stream {
                StreamId::Stdout => 1,
                StreamId::Stderr => 2,
            });
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(data);
        }
        Frame::Stdin { id, data } => {
            out.push(TAG_STDIN);
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(data);
        }
    }
    let len = u32::try_from(out.len() - 4)
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn be_u64(bytes: &[u8]) -> io::Result<u64> {
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| invalid("binary frame too short"))
}

/// Decodes a frame's payload (without its length prefix).
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> io::Result<Frame<T>> {
    match payload.first() {
        Some(b'{') => serde_json::from_slice(payload)
            .map(Frame::Message)
            .map_err(|e| invalid(format!("malformed message: {e}"))),
        Some(&TAG_OUTPUT) => {
            let id = be_u64(&payload[1..])?;
            let stream = match payload.get(9) {
                Some(1) => StreamId::Stdout,
                Some(2) => StreamId::Stderr,
                other => return Err(invalid(format!("unknown output stream {other:?}"))),
            };
            let offset = be_u64(&payload[10..])?;
            Ok(Frame::Output {
                id,
                stream,
                offset,
                data: payload[18..].to_vec(),
            })
        }
        Some(&TAG_STDIN) => Ok(Frame::Stdin {
            id: be_u64(&payload[1..])?,
            data: payload[9..].to_vec(),
        }),
        Some(tag) => Err(invalid(format!("unknown frame tag {tag}"))),
        None => Err(invalid("empty frame")),
    }
}

/// The most descriptors one frame carries.
pub const MAX_FDS: usize = 8;

/// Sends `bytes` (whole frames) with `fds` attached to the first of them.
pub fn send_with_fds(
    stream: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use hako_sys::rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space =
        [std::mem::MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one frame"));
    }
    // A stop and continue of the process can interrupt the call (gVisor
    // does): try again, the descriptors not yet sent.
    let sent = loop {
        match sendmsg(
            stream,
            &[io::IoSlice::new(bytes)],
            &mut ancillary,
            SendFlags::NOSIGNAL,
        ) {
            Err(hako_sys::rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut rest = stream;
    rest.write_all(&bytes[sent..])
}

/// Reads exactly one frame's payload and every descriptor that came with
/// it (close-on-exec), blocking; end of file before any byte is
/// `UnexpectedEof`.
pub fn recv_with_fds(
    stream: &std::os::unix::net::UnixStream,
) -> io::Result<(Vec<u8>, Vec<std::os::fd::OwnedFd>)> {
    use hako_sys::rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut fds = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut want = 4usize;
    while buf.len() < want {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit();
            hako_sys::rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        // Never read past this frame: what follows is not ours.
        let mut chunk = vec![0u8; want - buf.len()];
        let got = match recvmsg(
            stream,
            &mut [io::IoSliceMut::new(&mut chunk)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            // A stop and continue of the process can interrupt the wait
            // (gVisor does): nothing was received, wait again.
            Err(hako_sys::rustix::io::Errno::INTR) => continue,
            other => other?,
        };
        for message in ancillary.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if got.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "end of file before a whole frame",
            ));
        }
        buf.extend_from_slice(&chunk[..got.bytes]);
        if want == 4 && buf.len() == 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if len > MAX_FRAME {
                return Err(invalid(format!(
                    "frame of {len} bytes is over the {MAX_FRAME}-byte limit"
                )));
            }
            want = 4 + len as usize;
        }
    }
    buf.drain(..4);
    Ok((buf, fds))
}

/// Writes one control message as a frame.
pub fn write_frame<T: Serialize>(mut w: impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(&Frame::Message(msg))?)?;
    w.flush()
}

/// Reads one frame's payload, refusing a length over [`MAX_FRAME`] before
/// reading it.
pub fn read_payload(mut r: impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(invalid(format!(
            "frame of {len} bytes is over the {MAX_FRAME}-byte limit"
        )));
    }
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() != len as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated frame",
        ));
    }
    Ok(body)
}

/// Reads one frame.
pub fn read_any<T: DeserializeOwned>(r: impl Read) -> io::Result<Frame<T>> {
    decode(&read_payload(r)?)
}

/// Reads one frame that must be a control message.
pub fn read_frame<T: DeserializeOwned>(r: impl Read) -> io::Result<T> {
    match read_any(r)? {
        Frame::Message(msg) => Ok(msg),
        _ => Err(invalid("expected a control message, got a data frame")),
    }
}

/// What [`Decoder::next_frame`] found in the bytes received so far.
#[derive(Debug)]
pub enum Decoded<T> {
    /// A whole frame.
    Frame(Frame<T>),
    /// A whole frame that could not be decoded; the stream goes on.
    Bad(String),
    /// More bytes are needed.
    Incomplete,
}

/// Splits a byte stream into frames as bytes arrive, for a reader that must
/// not block. A frame over [`MAX_FRAME`] is reported once and its bytes are
/// skipped as they come, so the stream stays in step.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    skip: u64,
}

impl Decoder {
    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        let skipped = usize::try_from(self.skip)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        self.skip -= skipped as u64;
        self.buf.extend_from_slice(&bytes[skipped..]);
    }

    /// Whether a frame was begun and not finished.
    pub fn mid_frame(&self) -> bool {
        !self.buf.is_empty() || self.skip > 0
    }

    /// The next frame, if the bytes so far hold one.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Decoded<T> {
        let Some(len) = self.buf.get(..4) else {
            return Decoded::Incomplete;
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        if len > MAX_FRAME {
            let have = (self.buf.len() - 4) as u64;
            self.skip = u64::from(len).saturating_sub(have);
            self.buf.drain(..(4 + (have.min(u64::from(len)) as usize)));
            return Decoded::Bad(format!(
                "frame of {len} bytes is over the {MAX_FRAME}-byte limit; skipped"
            ));
        }
        let end = 4 + len as usize;
        if self.buf.len() < end {
            return Decoded::Incomplete;
        }
        let result = decode(&self.buf[4..end]);
        self.buf.drain(..end);
        match result {
            Ok(frame) => Decoded::Frame(frame),
            Err(err) => Decoded::Bad(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec() -> ToGuest {
        ToGuest::Exec(ExecRequest {
            id: 7,
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("PATH".into(), "/bin".into())],
            cwd: Cwd::Path("/w".into()),
            timeout_ms: Some(5),
            stdin: false,
            max_output: 10,
            pty: None,
        })
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &exec()).unwrap();
        assert_eq!(read_frame::<ToGuest>(&buf[..]).unwrap(), exec());
        let output = Frame::<FromGuest>::Output {
            id: 3,
            stream: StreamId::Stderr,
            offset: 1 << 40,
            data: b"{not json".to_vec(),
        };
        let bytes = encode(&output).unwrap();
        assert_eq!(read_any::<FromGuest>(&bytes[..]).unwrap(), output);
        let stdin = Frame::<ToGuest>::Stdin {
            id: 9,
            data: vec![0, 1, 2],
        };
        let bytes = encode(&stdin).unwrap();
        assert_eq!(read_any::<ToGuest>(&bytes[..]).unwrap(), stdin);
    }

    /// A control frame is told from a binary one by its first byte `{`:
    /// every message must serialise as a JSON object (a unit variant would
    /// be a bare string, which the decoder takes for an unknown tag).
    #[test]
    fn every_control_message_is_a_json_object_and_round_trips() {
        let from = [
            FromGuest::Ready { version: VERSION },
            FromGuest::Refused {
                message: "m".into(),
            },
            FromGuest::Exited {
                id: 1,
                status: ExitStatus::Code(0),
                timed_out: false,
                stdout_total: 0,
                stderr_total: 0,
            },
            FromGuest::SpawnFailed {
                id: 1,
                kind: SpawnFailure::NotFound,
                errno: None,
                message: "m".into(),
            },
            FromGuest::SessionOpened { id: 1 },
            FromGuest::SessionEnded {
                id: 1,
                message: "m".into(),
            },
            FromGuest::Bye {},
            FromGuest::Failed {
                id: None,
                message: "m".into(),
            },
        ];
        for msg in from {
            let bytes = encode(&Frame::Message(&msg)).unwrap();
            assert_eq!(bytes[4], b'{', "{msg:?}");
            assert_eq!(
                read_any::<FromGuest>(&bytes[..]).unwrap(),
                Frame::Message(msg)
            );
        }
        let to = [
            ToGuest::Hello(Box::new(Hello {
                version: VERSION,
                linux: None,
                network: None,
                seal: None,
            })),
            exec(),
            ToGuest::CloseStdin { id: 1 },
            ToGuest::Kill { id: 1 },
            ToGuest::Resize {
                id: 1,
                rows: 2,
                cols: 3,
            },
            ToGuest::OpenSession(SessionRequest {
                id: 1,
                shell: None,
                env: vec![],
                cwd: Cwd::Fd,
            }),
            ToGuest::SessionExec(SessionExecRequest {
                id: 2,
                session: 1,
                script: "x".into(),
                timeout_ms: None,
                max_output: 1,
            }),
            ToGuest::CloseSession { id: 1 },
        ];
        for msg in to {
            let bytes = encode(&Frame::Message(&msg)).unwrap();
            assert_eq!(bytes[4], b'{', "{msg:?}");
            assert_eq!(
                read_any::<ToGuest>(&bytes[..]).unwrap(),
                Frame::Message(msg)
            );
        }
    }

    #[test]
    fn oversized_frame_is_refused_without_reading_it() {
        let mut buf = (MAX_FRAME + 1).to_be_bytes().to_vec();
        buf.extend_from_slice(b"{}");
        let err = read_frame::<ToGuest>(&buf[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_and_malformed_frames_are_errors() {
        let mut buf = 100u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{\"version\"");
        assert!(read_frame::<ToGuest>(&buf[..]).is_err());
        let mut buf = 3u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{x}");
        assert!(read_frame::<ToGuest>(&buf[..]).is_err());
        for payload in [&[1u8, 0, 0][..], &[2, 0], &[9, 9], &[]] {
            assert!(decode::<ToGuest>(payload).is_err(), "{payload:?}");
        }
    }

    /// Arbitrary bytes, and valid frames with bytes flipped, cut or
    /// inserted, fed in random pieces: the decoder never panics, never
    /// holds more than one frame's bytes, and a valid frame after a reset
    /// still decodes.
    #[test]
    fn the_decoder_survives_arbitrary_input() {
        let budget: u64 = std::env::var("HAKO_FUZZ_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let valid: Vec<Vec<u8>> = vec![
            encode(&Frame::Message(exec())).unwrap(),
            encode(&Frame::<FromGuest>::Output {
                id: 1,
                stream: StreamId::Stdout,
                offset: 3,
                data: b"abc".to_vec(),
            })
            .unwrap(),
            encode(&Frame::<ToGuest>::Stdin {
                id: 2,
                data: vec![0; 40],
            })
            .unwrap(),
            encode(&Frame::Message(FromGuest::Exited {
                id: 1,
                status: ExitStatus::Signal(9),
                timed_out: true,
                stdout_total: 5,
                stderr_total: 0,
            }))
            .unwrap(),
        ];
        for _ in 0..budget {
            let mut bytes = match next() % 3 {
                0 => (0..next() % 64).map(|_| next() as u8).collect::<Vec<u8>>(),
                _ => valid[next() as usize % valid.len()].clone(),
            };
            for _ in 0..(next() % 4) {
                if bytes.is_empty() {
                    break;
                }
                let at = next() as usize % bytes.len();
                match next() % 3 {
                    0 => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, next() as u8),
                }
            }
            let _ = decode::<ToGuest>(&bytes);
            let _ = decode::<FromGuest>(&bytes);
            let mut decoder = Decoder::default();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = 1 + next() as usize % rest.len();
                decoder.push(&rest[..n]);
                rest = &rest[n..];
                while let Decoded::Frame(_) | Decoded::Bad(_) = decoder.next_frame::<ToGuest>() {}
                assert!(decoder.buf.len() <= 4 + MAX_FRAME as usize);
            }
        }
    }

    #[test]
    fn decoder_reports_bad_frames_and_stays_in_step() {
        let good = encode(&Frame::Message(exec())).unwrap();
        let mut stream = Vec::new();
        // Malformed JSON, then an oversized frame (length only, body sent
        // in pieces), then a good frame: the decoder reports two problems
        // and still finds the good frame.
        stream.extend_from_slice(&3u32.to_be_bytes());
        stream.extend_from_slice(b"{x}");
        let big = MAX_FRAME + 10;
        stream.extend_from_slice(&big.to_be_bytes());
        let mut decoder = Decoder::default();
        decoder.push(&stream);
        assert!(matches!(decoder.next_frame::<ToGuest>(), Decoded::Bad(_)));
        assert!(matches!(decoder.next_frame::<ToGuest>(), Decoded::Bad(m) if m.contains("limit")));
        let body = vec![b'x'; big as usize];
        for piece in body.chunks(1 << 20) {
            decoder.push(piece);
            assert!(matches!(
                decoder.next_frame::<ToGuest>(),
                Decoded::Incomplete
            ));
        }
        assert!(!decoder.mid_frame());
        // A good frame split byte by byte.
        for (i, b) in good.iter().enumerate() {
            decoder.push(&[*b]);
            let next = decoder.next_frame::<ToGuest>();
            if i + 1 < good.len() {
                assert!(matches!(next, Decoded::Incomplete));
            } else {
                assert!(matches!(next, Decoded::Frame(Frame::Message(m)) if m == exec()));
            }
        }
    }
}
