use std::path::Path;

use crate::capabilities::Capabilities;
use crate::command::{Command, Output};
use crate::error::{Error, Result};
use crate::fs::{DirListing, Metadata, ReadOutcome};
use crate::isolation::Isolation;

/// The boundary an agent acts inside.
///
/// Every path is sandbox-relative (an absolute path is accepted only when it
/// lies under the sandbox's [`Workdir`]) and is resolved by the backend's
/// file fence: no path resolves outside the root, whatever `..`, symlinks or
/// concurrent renames it meets.
///
/// Required methods are the few every backend can implement faithfully;
/// richer powers are optional traits reached through the accessors below,
/// each `None` by default.
pub trait Sandbox: Send + Sync {
    /// What this sandbox actually enforces.
    fn capabilities(&self) -> &Capabilities;

    /// Runs a command to completion. A non-zero exit is an `Ok` output;
    /// errors are for the machinery (could not start, died) and for commands
    /// that cannot run (not found, not executable, malformed).
    fn exec(&self, command: &Command) -> Result<Output>;

    /// Reads a whole regular file, up to the sandbox's read limit (beyond it:
    /// [`FenceError::FileTooLarge`](crate::FenceError::FileTooLarge)).
    fn read_file(&self, path: &Path) -> Result<Vec<u8>>;

    /// Replaces a file's contents atomically (a temporary file in the same
    /// directory, then a rename): a reader sees the old or the new contents,
    /// never a mix, and a refused or failed write changes nothing.
    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()>;

    /// Removes a file, a symlink (not its target) or an empty directory.
    /// Never recursive.
    fn remove(&self, path: &Path) -> Result<()>;

    /// Lists a directory from `lstat` data, sorted by name.
    fn list_dir(&self, path: &Path) -> Result<DirListing>;

    /// Tears everything down: afterwards no process, mount or temporary
    /// directory of this sandbox is left, and every operation returns
    /// [`Error::Closed`]. Idempotent; dropping a sandbox closes it too.
    fn close(&self) -> Result<()>;

    /// Bounded reads, if offered.
    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        None
    }

    /// Appends, if offered.
    fn append(&self) -> Option<&dyn AppendFile> {
        None
    }

    /// `mkdir -p`, if offered.
    fn make_dir_all(&self) -> Option<&dyn MakeDirAll> {
        None
    }

    /// The in-sandbox absolute working directory, if offered.
    fn workdir(&self) -> Option<&dyn Workdir> {
        None
    }

    /// `lstat`, if offered.
    fn stat(&self) -> Option<&dyn StatPath> {
        None
    }

    /// Streamed exec output, if offered.
    fn exec_stream(&self) -> Option<&dyn ExecStream> {
        None
    }

    /// Stateful shell sessions, if offered.
    fn sessions(&self) -> Option<&dyn Sessions> {
        None
    }
}

/// Bounded reads.
pub trait ReadLimit {
    /// Reads at most `max` bytes from the start of a regular file; never
    /// loads more than that into memory.
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome>;
}

/// Appending without reading the file first.
pub trait AppendFile {
    /// Appends `data` to a regular file, creating it if missing.
    fn append_file(&self, path: &Path, data: &[u8]) -> Result<()>;
}

/// Creating a directory and its missing parents.
pub trait MakeDirAll {
    /// Like `mkdir -p`, inside the root.
    fn make_dir_all(&self, path: &Path) -> Result<()>;
}

/// The absolute working directory commands start in, as the code inside sees
/// it (for the model's prompt).
pub trait Workdir {
    /// The absolute path of the sandbox root inside the sandbox.
    fn workdir(&self) -> &Path;
}

/// `lstat` of one path.
pub trait StatPath {
    /// The path's own metadata; a symlink is reported as a symlink.
    fn stat(&self, path: &Path) -> Result<Metadata>;
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A callback that receives output chunks as they are produced.
pub type OutputSink<'a> = dyn FnMut(Stream, &[u8]) + Send + 'a;

/// Exec with output delivered as it is produced.
pub trait ExecStream {
    /// Like [`Sandbox::exec`], and calls `sink` with each chunk of output as
    /// it arrives (within the per-stream cap; bytes past it are counted, not
    /// delivered). The returned output holds the same bytes.
    fn exec_stream(&self, command: &Command, sink: &mut OutputSink<'_>) -> Result<Output>;
}

/// The policy gate: refuses a sandbox weaker than `required`, with an error
/// that names both levels.
pub fn require_isolation(sandbox: &dyn Sandbox, required: Isolation) -> Result<()> {
    let caps = sandbox.capabilities();
    if caps.isolation < required {
        return Err(Error::IsolationTooWeak {
            required,
            actual: caps.isolation,
            backend: caps.backend.clone(),
        });
    }
    Ok(())
}

/// A session, named by the sandbox that opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How a session starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// The directory its shell starts in: sandbox-relative, fenced like every
    /// other path. `None` means the sandbox root.
    pub cwd: Option<std::path::PathBuf>,
    /// Variables exported in the shell, over the sandbox's sanitised base.
    pub env: Vec<(String, String)>,
}

/// Stateful shells: the commands run in one session share its working
/// directory, environment, shell variables, functions and background jobs,
/// as in a terminal.
///
/// Each command's output and exit status are delimited exactly: output and
/// status travel on separate channels, so nothing a command prints can end
/// it early or fake its status. A session runs one command at a time;
/// sessions run concurrently. A command's deadline kills the processes it
/// started and leaves the session usable (if the shell itself does not stop,
/// for example in a builtin loop, the session ends and says so).
pub trait Sessions {
    /// Starts a shell.
    fn open_session(&self, options: &SessionOptions) -> Result<SessionId>;

    /// Runs a command in the session's shell and returns once its status is
    /// known. [`Program::Shell`](crate::Program::Shell) is run as given; an
    /// argument vector is quoted for the shell. The command's stdin is
    /// empty; `cwd`, `env` and `stdin` must be unset (`cd` and `export`
    /// inside the session instead), `timeout` and `max_output` apply. `sink`
    /// receives output as it comes.
    fn session_exec(
        &self,
        session: SessionId,
        command: &Command,
        sink: Option<&mut OutputSink<'_>>,
    ) -> Result<Output>;

    /// Ends the session: its shell and every process started in it are
    /// killed. Idempotent for a session that has ended.
    fn close_session(&self, session: SessionId) -> Result<()>;
}
