use std::path::{Path, PathBuf};

use crate::capabilities::Capabilities;
use crate::command::{Command, ExitStatus, Output};
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

    /// Tears everything down: afterwards no process started in the sandbox
    /// is running, nothing it set up on the host (a temporary directory, a
    /// cgroup) is left, and every operation returns [`Error::Closed`]. The
    /// sandbox's own guest may still be exiting when this returns (and the
    /// kernel freeing its namespaces); it is reaped in the background.
    /// Idempotent; dropping a sandbox closes it too.
    fn close(&self) -> Result<()>;

    /// Bounded reads, if offered.
    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        None
    }

    /// Replacing a file only if it still holds what was read (an edit
    /// without a lost update), if offered.
    fn replace_unchanged(&self) -> Option<&dyn ReplaceUnchanged> {
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

    /// Long-lived processes with handles, if offered.
    fn processes(&self) -> Option<&dyn Processes> {
        None
    }

    /// The egress proxy's decisions, if the sandbox has one (`allow` mode).
    fn network_events(&self) -> Option<&dyn NetworkEvents> {
        None
    }
}

/// The record of an egress proxy's decisions.
pub trait NetworkEvents {
    /// Every decision recorded since the last call, oldest first (at most
    /// a bounded number are kept between calls; the oldest are dropped
    /// first, and `dropped` says how many).
    fn take_network_events(&self) -> (Vec<crate::network::NetEvent>, u64);
}

/// Bounded reads.
pub trait ReadLimit {
    /// Reads at most `max` bytes from the start of a regular file; never
    /// loads more than that into memory.
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome>;
}

/// Replacing a file only if nothing changed it since it was read: the
/// write of an edit (read, change, write back) that must not undo what
/// the sandbox wrote meanwhile.
pub trait ReplaceUnchanged {
    /// Like [`Sandbox::write_file`], but refused with
    /// [`FenceError::ChangedMeanwhile`](crate::FenceError::ChangedMeanwhile)
    /// (nothing written) unless the file still holds exactly `read`, as
    /// checked just before the rename that replaces it.
    fn replace_unchanged(&self, path: &Path, data: &[u8], read: &[u8]) -> Result<()>;
}

/// Writes the result of an edit: replaces `path` with `data` only if it
/// still holds `read`, what the edit was computed from, through the
/// sandbox's [`ReplaceUnchanged`] (checked just before the rename). A
/// sandbox without it gets the next best: the file is read again and
/// compared just before the write. Either way a file changed meanwhile is
/// refused with [`FenceError::ChangedMeanwhile`](crate::FenceError::ChangedMeanwhile)
/// and nothing is written.
pub fn replace_if_unchanged(
    sandbox: &dyn Sandbox,
    path: &Path,
    data: &[u8],
    read: &[u8],
) -> Result<()> {
    if let Some(replace) = sandbox.replace_unchanged() {
        return replace.replace_unchanged(path, data, read);
    }
    let now = match sandbox.read_limit() {
        Some(limited) => limited
            .read_file_limit(path, read.len() as u64 + 1)
            .map(|o| o.data),
        None => sandbox.read_file(path),
    };
    match now {
        Ok(now) if now == read => sandbox.write_file(path, data),
        Ok(_) | Err(Error::Fence(crate::FenceError::NotFound { .. })) => {
            Err(Error::Fence(crate::FenceError::ChangedMeanwhile {
                path: path.to_path_buf(),
            }))
        }
        Err(e) => Err(e),
    }
}

/// Writes `data` to `path` as [`Sandbox::write_file`] does, first creating
/// the missing parent directories through the sandbox's [`MakeDirAll`]
/// (`mkdir -p` inside the root, which never follows a symlink out of it and
/// never creates a dangling symlink's target). Every front end writes a
/// file through this, so a write that creates `notes/x.txt` works, or is
/// refused, the same way from each. Returns the parent directory made
/// (with its own missing parents), if one was, for the audit log.
///
/// Only a write refused with
/// [`FenceError::NotFound`](crate::FenceError::NotFound) is retried after
/// the parents are made; every other refusal (a symlink leading out, a
/// file in the way) is returned as it is. A sandbox without `MakeDirAll`
/// gets the `NotFound` of its write.
pub fn write_file_creating_parents(
    sandbox: &dyn Sandbox,
    path: &Path,
    data: &[u8],
) -> Result<Option<PathBuf>> {
    let not_found = match sandbox.write_file(path, data) {
        Ok(()) => return Ok(None),
        Err(err @ Error::Fence(crate::FenceError::NotFound { .. })) => err,
        Err(err) => return Err(err),
    };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    match (parent, sandbox.make_dir_all()) {
        (Some(parent), Some(mkdir)) => {
            mkdir.make_dir_all(parent)?;
            sandbox.write_file(path, data)?;
            Ok(Some(parent.to_path_buf()))
        }
        _ => Err(not_found),
    }
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

/// A long-lived process, named by the sandbox that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(pub u64);

impl std::fmt::Display for ProcessId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How a long-lived process starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnOptions {
    /// Labels to find it by in [`Processes::list`].
    pub tags: Vec<String>,
    /// Keep its stdin open for [`Processes::write_stdin`] (after the
    /// command's own `stdin` bytes, if any) until
    /// [`Processes::close_stdin`]; otherwise stdin ends after those bytes.
    pub live_stdin: bool,
    /// Bytes of stdout kept for reading back (default 1 MiB); older bytes
    /// are dropped and reported as lost. stderr keeps a tail of a quarter of
    /// this (at least 64 KiB).
    pub ring_bytes: Option<usize>,
    /// Run on a new pseudo-terminal of this size inside the sandbox: it is
    /// the process's stdin, stdout, stderr and controlling terminal. Its
    /// output (echo included) is read as [`Stream::Stdout`];
    /// [`Processes::write_stdin`] types into it (implies `live_stdin`);
    /// [`Processes::resize`] changes its size.
    pub pty: Option<TermSize>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// A slice of a process's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSlice {
    /// The bytes, from `offset`.
    pub data: Vec<u8>,
    /// Offset of `data` in the stream (later than asked for when the bytes
    /// asked for were dropped from the buffer).
    pub offset: u64,
    /// Bytes asked for that were dropped from the buffer before this read.
    pub lost: u64,
    /// Offset to read from next.
    pub next: u64,
    /// The stream has ended (the process is gone) and `next` is its end.
    pub ended: bool,
}

/// What a process is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    /// Its handle.
    pub id: ProcessId,
    /// The program and arguments it was started with.
    pub argv: Vec<String>,
    /// Its tags.
    pub tags: Vec<String>,
    /// How it ended; `None` while it runs.
    pub status: Option<ExitStatus>,
    /// Why it could not run, when it never started or its machinery failed.
    pub error: Option<String>,
    /// Whether its deadline killed it.
    pub timed_out: bool,
    /// Whether the sandbox's memory limit killed it (see
    /// [`Output::oom_killed`]).
    pub oom_killed: bool,
    /// Bytes written to stdout so far.
    pub stdout_total: u64,
    /// Bytes written to stderr so far.
    pub stderr_total: u64,
}

impl ProcessState {
    /// Whether it has ended (or never started).
    pub fn finished(&self) -> bool {
        self.status.is_some() || self.error.is_some()
    }
}

/// Long-lived processes with durable handles: start one with live stdin
/// and stdout (a language server over stdio), read its output from any
/// offset still buffered (after a caller went away and came back), wait for
/// it (memoised), kill it (idempotent), list them.
///
/// Three clocks stay apart: a command's `timeout` is the process deadline
/// (the tree is killed, the state says `timed_out`); a caller's wait
/// ([`Processes::wait`], [`Processes::read_output`]) only bounds how long
/// that call blocks; the sandbox's idle lease, where a backend has one,
/// counts running processes as activity.
pub trait Processes {
    /// Starts `command` and returns its handle at once. The command's
    /// `max_output` does not apply (see [`SpawnOptions::ring_bytes`]).
    fn spawn(&self, command: &Command, options: &SpawnOptions) -> Result<ProcessId>;

    /// Up to `max` bytes of `stream` from `offset`. With `wait`, blocks up
    /// to that long for bytes past `offset` (or the end) when none are
    /// there yet.
    fn read_output(
        &self,
        id: ProcessId,
        stream: Stream,
        offset: u64,
        max: usize,
        wait: Option<std::time::Duration>,
    ) -> Result<OutputSlice>;

    /// Writes to the process's live stdin.
    fn write_stdin(&self, id: ProcessId, data: &[u8]) -> Result<()>;

    /// Ends the process's stdin.
    fn close_stdin(&self, id: ProcessId) -> Result<()>;

    /// Sets the size of the process's terminal (the process gets
    /// `SIGWINCH`); an error for a process without one.
    fn resize(&self, id: ProcessId, size: TermSize) -> Result<()>;

    /// Waits up to `wait` (forever with `None`) for the process to end and
    /// returns its state, ended or not. Asking again returns the same end.
    fn wait(&self, id: ProcessId, wait: Option<std::time::Duration>) -> Result<ProcessState>;

    /// Kills the process and everything it started. Killing one that has
    /// ended does nothing.
    fn kill(&self, id: ProcessId) -> Result<()>;

    /// Every process started and not yet forgotten, oldest first.
    fn list(&self) -> Result<Vec<ProcessState>>;
}

/// What [`exec_or_detach`] returns.
#[derive(Debug)]
pub enum Waited {
    /// The command ended within the caller's wait.
    Finished(Output),
    /// It is still running: its handle, and what it wrote so far.
    Running {
        /// The process, for [`Processes`].
        id: ProcessId,
        /// stdout so far (`next` is where to read on from).
        stdout: OutputSlice,
        /// stderr so far.
        stderr: OutputSlice,
    },
}

/// The caller's clock: starts `command` as a long-lived process and waits
/// up to `wait` for it. If it ends in time, the result is its [`Output`]
/// (up to `command.max_output` of each stream, default 1 MiB); otherwise
/// the caller gets a handle and the output so far, and the process keeps
/// running (its own deadline, `command.timeout`, still applies).
pub fn exec_or_detach(
    processes: &dyn Processes,
    command: &Command,
    wait: std::time::Duration,
) -> Result<Waited> {
    let start = std::time::Instant::now();
    let max = command.max_output.unwrap_or(crate::DEFAULT_MAX_OUTPUT);
    let ring = max.max(64 << 10);
    let id = processes.spawn(
        command,
        &SpawnOptions {
            ring_bytes: Some(ring),
            ..SpawnOptions::default()
        },
    )?;
    let state = processes.wait(id, Some(wait))?;
    let stdout = processes.read_output(id, Stream::Stdout, 0, max, None)?;
    let stderr = processes.read_output(id, Stream::Stderr, 0, max, None)?;
    if !state.finished() {
        return Ok(Waited::Running { id, stdout, stderr });
    }
    let Some(status) = state.status else {
        return Err(Error::Backend {
            backend: "process".into(),
            op: "run command",
            message: state.error.unwrap_or_default(),
        });
    };
    Ok(Waited::Finished(Output {
        status,
        stdout_truncated: state.stdout_total > stdout.data.len() as u64,
        stderr_truncated: state.stderr_total > stderr.data.len() as u64,
        stdout_total: state.stdout_total,
        stderr_total: state.stderr_total,
        stdout: stdout.data,
        stderr: stderr.data,
        duration: start.elapsed(),
        timed_out: state.timed_out,
        oom_killed: state.oom_killed,
    }))
}
