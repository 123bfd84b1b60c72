//! The framed messages between hako and the guest.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Frames
//! are bounded by [`MAX_FRAME`]: a larger length is refused before anything is
//! read into memory.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use hako_core::ExitStatus;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The protocol version the guest speaks.
pub const VERSION: u32 = 1;
/// The largest frame either side accepts: 16 MiB.
pub const MAX_FRAME: u32 = 16 << 20;

/// Run one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Must equal [`VERSION`].
    pub version: u32,
    /// Program and arguments; the program is looked up in `PATH` from `env`.
    pub argv: Vec<String>,
    /// The complete environment of the command.
    pub env: Vec<(String, String)>,
    /// The process deadline in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Build a `linux` sandbox around the command first; `None` runs it
    /// where the guest is (the `host` backend).
    #[serde(default)]
    pub linux: Option<LinuxSpec>,
}

/// The first frame hako sends a guest: one command, or holding a sandbox's
/// namespaces open for the commands that follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Run one command.
    Run(RunRequest),
    /// Build the namespaces and the filesystem view of `spec` and hold them
    /// until the control socket closes; reply [`HoldReply`].
    Hold(LinuxSpec),
}

/// The reply to [`Request::Hold`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReply {
    /// The sandbox is up; its pid 1 has this pid in the guest's namespace.
    Holding {
        /// Pid of the holder (pid 1 of the sandbox's namespace).
        pid: i32,
    },
    /// It could not be built.
    Refused {
        /// Why.
        message: String,
    },
}

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
    /// The command's working directory, absolute, inside.
    pub cwd: PathBuf,
    /// Resource limits set on the command (`setrlimit`).
    pub rlimits: Vec<RlimitSpec>,
    /// Landlock write rules, if Landlock is to be applied.
    pub landlock: Option<LandlockSpec>,
    /// Apply the default seccomp policy to the command.
    pub seccomp: bool,
    /// Run in the namespaces held by this process (see [`Request::Hold`])
    /// instead of building new ones: `mounts` is then ignored.
    #[serde(default)]
    pub enter: Option<i32>,
    /// `cgroup.procs` files the guest joins before anything else, so that
    /// everything it starts is counted against the sandbox's cgroups.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
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

/// The guest's one reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunReply {
    /// The command ran; every process it started is gone.
    Finished {
        /// How the command's first process ended.
        status: ExitStatus,
        /// Whether the deadline killed it.
        timed_out: bool,
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

/// Writes one frame.
pub fn write_frame<T: Serialize>(mut w: impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame, refusing a length over [`MAX_FRAME`] before reading it.
pub fn read_frame<T: DeserializeOwned>(mut r: impl Read) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() != len as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated frame",
        ));
    }
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let req = RunRequest {
            version: VERSION,
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("PATH".into(), "/bin".into())],
            timeout_ms: Some(5),
            linux: None,
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &req).unwrap();
        assert_eq!(read_frame::<RunRequest>(&buf[..]).unwrap(), req);
    }

    #[test]
    fn oversized_frame_is_refused_without_reading_it() {
        let mut buf = (MAX_FRAME + 1).to_be_bytes().to_vec();
        buf.extend_from_slice(b"{}");
        let err = read_frame::<RunRequest>(&buf[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_and_malformed_frames_are_errors() {
        let mut buf = 100u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{\"version\"");
        assert!(read_frame::<RunRequest>(&buf[..]).is_err());
        let mut buf = 3u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{x}");
        assert!(read_frame::<RunRequest>(&buf[..]).is_err());
    }
}
