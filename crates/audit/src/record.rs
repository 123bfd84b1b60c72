//! The records every front end writes: one typed [`Record`] per effect,
//! built here once, so that `hako run`, `hako serve` and `hako mcp` write
//! the same kind with the same fields (a field that does not apply is
//! `null`, never left out, except where a kind's `op` says which fields
//! follow).
//!
//! A line of the log is a record's fields with the chain's own (`seq`,
//! `at_ms`, `kind`, `prev`, `hash`); verifying reads lines, never these
//! types, so a log written before them still verifies.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hako_core::{Capabilities, Command, ExitStatus, Isolation, NetEvent, NetworkAccess, Output};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::sha256_hex;

/// The longest error message a record keeps, in characters (longer ones
/// are cut, with `...`): an error can quote what a client sent (a value
/// of the wrong type, a whole file), and a record says what failed, not
/// what was sent.
pub const MAX_MESSAGE_CHARS: usize = 500;

/// Which front end wrote a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrontEnd {
    /// `hako run`.
    Run,
    /// `hako serve`, the HTTP API.
    Serve,
    /// `hako mcp`, the MCP server.
    Mcp,
    /// The review commands (`hako commit`, `hako discard`, `hako rm`,
    /// `hako rollback`).
    Review,
}

/// One effect, as the audit log records it. Its kind (the `kind` of its
/// line) and fields are listed in the README's audit log section.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// `sandbox` (op `open`): a sandbox was opened.
    SandboxOpened(SandboxOpened),
    /// `sandbox` (op `close`): a sandbox was closed; everything started in
    /// it was killed.
    SandboxClosed(SandboxClosed),
    /// `sandbox` (op `lost`): a sandbox was lost while open (its guest
    /// ended without being asked to: killed, its container or its
    /// engine stopped); nothing more ran in it. Written once, by the
    /// first call that found it lost; its `close` follows.
    SandboxLost(SandboxLost),
    /// `exec`: a command ran (or, handed back as a process, still runs).
    Exec(Exec),
    /// `file`: a file operation through the fence.
    File(File),
    /// `process`: something done to a long-lived process.
    Process(Process),
    /// `session`: a shell session opened or closed.
    Session(Session),
    /// `net`: one decision of the egress proxy (the event's own fields).
    Net(NetEvent),
    /// `net`: decisions left out because too many were made.
    NetDropped {
        /// How many.
        dropped: u64,
    },
    /// `refusal`: a policy refused what was asked (a path outside the
    /// workspace, a boundary too weak, a log in a writable place).
    Refusal(Failure),
    /// `error`: what was asked failed otherwise (bad input, not found).
    Error(Failure),
    /// `review`: a copy-on-write sandbox's changes committed to the
    /// workspace, discarded, or the sandbox removed.
    Review(Review),
}

/// What a review operation did to a copy-on-write sandbox: a review
/// command (`hako commit`, ...), or an agent's call through `hako mcp`
/// or `hako serve`; the same record whoever did it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Review {
    /// Who did it.
    pub front_end: FrontEnd,
    /// The sandbox's name; `null` for a temporary layer (a `--cow`
    /// sandbox without `--name`).
    pub name: Option<String>,
    /// The server's id of the sandbox (`hako serve`); `null` otherwise.
    pub sandbox: Option<u64>,
    /// The operation and what it changed.
    #[serde(flatten)]
    pub op: ReviewOp,
}

/// One path a commit wrote or removed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Committed {
    /// The path, relative to the workspace.
    pub path: String,
    /// `added`, `modified`, `deleted`, `mode_changed` or `type_changed`.
    pub status: String,
    /// SHA-256 of what was written (a file's content, a symlink's
    /// target); `null` for a removal or a directory.
    pub sha256: Option<String>,
}

/// A review operation, written as the record's `op` and its fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ReviewOp {
    /// Changes applied to the workspace (all of them, or the part applied
    /// before a commit stopped: `complete` says which).
    Commit {
        /// The hash of the changes committed (what `--expect` compares;
        /// not `hash`, which is the chain's own field).
        diff_hash: String,
        /// Each path written or removed, in order.
        changes: Vec<Committed>,
        /// Whether the commit applied everything it set out to.
        complete: bool,
    },
    /// Changes thrown away from the sandbox's layer.
    Discard {
        /// The paths discarded (relative to the workspace).
        paths: Vec<String>,
    },
    /// The sandbox's layer returned to a checkpoint.
    Rollback {
        /// The checkpoint's number.
        checkpoint: u64,
    },
    /// The sandbox and its state removed.
    Remove,
}

impl Record {
    /// The record's kind: the `kind` of its line.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::SandboxOpened(_) | Record::SandboxClosed(_) | Record::SandboxLost(_) => {
                "sandbox"
            }
            Record::Exec(_) => "exec",
            Record::File(_) => "file",
            Record::Process(_) => "process",
            Record::Session(_) => "session",
            Record::Net(_) | Record::NetDropped { .. } => "net",
            Record::Refusal(_) => "refusal",
            Record::Error(_) => "error",
            Record::Review(_) => "review",
        }
    }

    /// The record's own fields, as its line carries them.
    pub fn fields(&self) -> Map<String, Value> {
        let value = match self {
            Record::SandboxOpened(r) => with_op("open", r),
            Record::SandboxClosed(r) => with_op("close", r),
            Record::SandboxLost(r) => with_op("lost", r),
            Record::Exec(r) => serde_json::to_value(r),
            Record::File(r) => serde_json::to_value(r),
            Record::Process(r) => serde_json::to_value(r),
            Record::Session(r) => serde_json::to_value(r),
            Record::Net(r) => serde_json::to_value(r),
            Record::NetDropped { dropped } => Ok(serde_json::json!({ "dropped": dropped })),
            Record::Refusal(r) | Record::Error(r) => serde_json::to_value(r),
            Record::Review(r) => serde_json::to_value(r),
        };
        match value {
            Ok(Value::Object(map)) => map,
            // Every type above is a struct of plain fields: it always
            // encodes as an object.
            _ => Map::new(),
        }
    }
}

fn with_op(op: &str, r: &impl Serialize) -> serde_json::Result<Value> {
    let mut value = serde_json::to_value(r)?;
    if let Value::Object(map) = &mut value {
        map.insert("op".into(), Value::from(op));
    }
    Ok(value)
}

/// `sandbox`, op `open`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SandboxOpened {
    /// Who opened it.
    pub front_end: FrontEnd,
    /// Its id, where the front end numbers its sandboxes (`hako serve`).
    pub sandbox: Option<u64>,
    /// The backend.
    pub backend: String,
    /// The isolation it enforces.
    pub isolation: Isolation,
    /// What it can reach.
    pub network: NetworkAccess,
    /// Its working directory (the workspace, as seen inside), if it has one.
    pub workdir: Option<PathBuf>,
}

impl SandboxOpened {
    /// The record of a sandbox with `caps` opened by `front_end`.
    pub fn new(front_end: FrontEnd, sandbox: Option<u64>, caps: &Capabilities) -> Self {
        SandboxOpened {
            front_end,
            sandbox,
            backend: caps.backend.clone(),
            isolation: caps.isolation,
            network: caps.network,
            workdir: None,
        }
    }
}

/// `sandbox`, op `close`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SandboxClosed {
    /// Who closed it.
    pub front_end: FrontEnd,
    /// Its id, where the front end numbers its sandboxes (`hako serve`).
    pub sandbox: Option<u64>,
}

/// `sandbox`, op `lost`: what was lost, and why as far as hako could
/// tell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SandboxLost {
    /// Whose sandbox it was.
    pub front_end: FrontEnd,
    /// Its id, where the front end numbers its sandboxes (`hako serve`).
    pub sandbox: Option<u64>,
    /// The backend.
    pub backend: String,
    /// The call that found it lost (`run command`, `open a session`, ...).
    pub during: String,
    /// What was lost and why (what became of its guest, container or
    /// runtime), cut to [`MAX_MESSAGE_CHARS`].
    pub reason: String,
}

impl SandboxLost {
    /// The record of `err` if it says the sandbox was lost
    /// ([`hako_core::Error::SandboxLost`]); `None` for any other error.
    pub fn from_error(
        front_end: FrontEnd,
        sandbox: Option<u64>,
        err: &hako_core::Error,
    ) -> Option<Self> {
        match err {
            hako_core::Error::SandboxLost {
                backend,
                op,
                reason,
            } => Some(SandboxLost {
                front_end,
                sandbox,
                backend: backend.clone(),
                during: (*op).to_string(),
                reason: shorten(reason, MAX_MESSAGE_CHARS),
            }),
            _ => None,
        }
    }
}

/// `exec`: the same fields whichever front end ran the command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exec {
    /// Who ran it.
    pub front_end: FrontEnd,
    /// The MCP tool that ran it (`run_command`), for `hako mcp`.
    pub tool: Option<String>,
    /// The backend it ran on.
    pub backend: String,
    /// The sandbox's id, where the front end numbers them (`hako serve`).
    pub sandbox: Option<u64>,
    /// The shell session it ran in, if any.
    pub session: Option<u64>,
    /// The shell line, when it was given as one.
    pub command: Option<String>,
    /// What was executed (`null` for a line a session's shell ran).
    pub argv: Option<Vec<String>>,
    /// Its working directory, relative to the workspace, if one was given.
    pub cwd: Option<PathBuf>,
    /// Still running, handed back as [`process`](Exec::process).
    pub running: bool,
    /// Its process handle, when it was handed back running.
    pub process: Option<u64>,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    /// Whether its deadline killed it.
    pub timed_out: bool,
    /// Whether the sandbox's memory limit killed it.
    pub oom_killed: bool,
    /// How long it ran (or, still running, had run when handed back).
    pub duration_ms: u64,
    /// Bytes it wrote to stdout (all of them, not only those kept).
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr.
    pub stderr_bytes: u64,
}

impl Exec {
    /// A command `front_end` ran on `backend`, not yet ended: its argv, its
    /// shell line if it is one, and its working directory.
    pub fn new(front_end: FrontEnd, backend: &str, command: &Command) -> Self {
        Exec {
            front_end,
            tool: None,
            backend: backend.to_string(),
            sandbox: None,
            session: None,
            command: match &command.program {
                hako_core::Program::Shell(line) => Some(line.clone()),
                hako_core::Program::Argv(_) => None,
            },
            argv: Some(command.program.argv()),
            cwd: command.cwd.clone(),
            running: false,
            process: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            oom_killed: false,
            duration_ms: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
        }
    }

    /// Run in shell session `session`: a shell line is run by the
    /// session's shell, not executed as an argv of its own.
    pub fn in_session(mut self, session: Option<u64>) -> Self {
        self.session = session;
        if session.is_some() && self.command.is_some() {
            self.argv = None;
        }
        self
    }

    /// How it ended.
    pub fn ended(
        mut self,
        status: ExitStatus,
        timed_out: bool,
        duration: Duration,
        stdout_bytes: u64,
        stderr_bytes: u64,
    ) -> Self {
        self.exit_code = status.code();
        self.signal = status.signal();
        self.timed_out = timed_out;
        self.duration_ms = millis(duration);
        self.stdout_bytes = stdout_bytes;
        self.stderr_bytes = stderr_bytes;
        self
    }

    /// Killed by the sandbox's memory limit (or not).
    pub fn oom_killed(mut self, oom_killed: bool) -> Self {
        self.oom_killed = oom_killed;
        self
    }

    /// How it ended, from its output.
    pub fn output(self, out: &Output) -> Self {
        self.ended(
            out.status,
            out.timed_out,
            out.duration,
            out.stdout_total,
            out.stderr_total,
        )
        .oom_killed(out.oom_killed)
    }

    /// Still running after `waited`, handed back as `process`.
    pub fn still_running(
        mut self,
        process: u64,
        waited: Duration,
        stdout_bytes: u64,
        stderr_bytes: u64,
    ) -> Self {
        self.running = true;
        self.process = Some(process);
        self.duration_ms = millis(waited);
        self.stdout_bytes = stdout_bytes;
        self.stderr_bytes = stderr_bytes;
        self
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `file`: what was done (`op`) to which path, and the op's own fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct File {
    /// Who did it.
    pub front_end: FrontEnd,
    /// The sandbox's id, where the front end numbers them (`hako serve`).
    pub sandbox: Option<u64>,
    /// The path, as given (relative to the workspace).
    pub path: PathBuf,
    /// The operation and what it found or changed.
    #[serde(flatten)]
    pub op: FileOp,
}

/// A file operation, written as the record's `op` and its fields. The
/// content read or written is never recorded: its size and SHA-256 are.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FileOp {
    /// Read (at most a bound: `truncated` says the file was longer).
    Read {
        /// Bytes read.
        size: u64,
        /// Whether the file held more than was read.
        truncated: bool,
        /// SHA-256 of what was read.
        sha256: String,
    },
    /// Written whole.
    Write {
        /// Bytes written.
        size: u64,
        /// SHA-256 of what was written.
        sha256: String,
    },
    /// Edited in place.
    Edit {
        /// Bytes after the edit.
        size: u64,
        /// SHA-256 after the edit.
        sha256: String,
        /// SHA-256 before it.
        sha256_before: String,
        /// How many places were replaced.
        replacements: u64,
    },
    /// Removed.
    Remove,
    /// A directory made, with its missing parents (`mkdir -p`).
    MakeDir,
    /// A directory listed.
    List {
        /// Entries listed.
        entries: u64,
    },
    /// Paths under it matched against a glob.
    Glob {
        /// The pattern.
        pattern: String,
        /// Paths that matched.
        matches: u64,
    },
    /// Files under it searched for a pattern.
    Grep {
        /// The regular expression.
        pattern: String,
        /// The glob files were limited to, if any.
        glob: Option<String>,
        /// Files searched.
        files: u64,
        /// Lines that matched.
        matches: u64,
    },
}

impl FileOp {
    /// `data` was read; `truncated` when the file held more.
    pub fn read(data: &[u8], truncated: bool) -> Self {
        FileOp::Read {
            size: data.len() as u64,
            truncated,
            sha256: sha256_hex(data),
        }
    }

    /// `data` was written.
    pub fn write(data: &[u8]) -> Self {
        FileOp::Write {
            size: data.len() as u64,
            sha256: sha256_hex(data),
        }
    }

    /// `before` became `after` by `replacements` replacements.
    pub fn edit(before: &[u8], after: &[u8], replacements: u64) -> Self {
        FileOp::Edit {
            size: after.len() as u64,
            sha256: sha256_hex(after),
            sha256_before: sha256_hex(before),
            replacements,
        }
    }
}

impl File {
    /// `op` on `path`, by `front_end`.
    pub fn new(front_end: FrontEnd, sandbox: Option<u64>, path: &Path, op: FileOp) -> Self {
        File {
            front_end,
            sandbox,
            path: path.to_path_buf(),
            op,
        }
    }
}

/// `process`: what was done (`op`) to a long-lived process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Process {
    /// Its handle.
    pub process: u64,
    /// The sandbox's id, where the front end numbers them (`hako serve`).
    pub sandbox: Option<u64>,
    /// The operation and its fields.
    #[serde(flatten)]
    pub op: ProcessOp,
}

/// An operation on a process, written as the record's `op` and its fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ProcessOp {
    /// Part of its output was read.
    ReadOutput {
        /// `stdout` or `stderr`.
        stream: String,
        /// Where the part starts in the stream.
        offset: u64,
        /// Bytes read.
        bytes: u64,
        /// SHA-256 of them.
        sha256: String,
        /// Whether the process had ended.
        ended: bool,
        /// Its exit code, if it had exited.
        exit_code: Option<i32>,
    },
    /// Bytes were written to its stdin.
    SendInput {
        /// How many.
        bytes: u64,
        /// SHA-256 of them.
        sha256: String,
        /// Whether its stdin was closed after.
        closed_stdin: bool,
    },
    /// It was killed, with everything it started.
    Kill {
        /// Whether it had ended when the record was written.
        ended: bool,
        /// Its exit code, if it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
    /// Still running when its sandbox was closed, which killed it.
    KilledAtClose {
        /// Its command.
        argv: Vec<String>,
    },
}

/// `session`: a shell session opened (`op` `open`) or closed (`close`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Session {
    /// `open` or `close`.
    pub op: SessionOp,
    /// The session.
    pub session: u64,
    /// The sandbox's id, where the front end numbers them (`hako serve`).
    pub sandbox: Option<u64>,
}

/// What happened to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionOp {
    /// Opened.
    Open,
    /// Closed; everything started in it was killed.
    Close,
}

/// `refusal` or `error`: what failed, where, and why. The message is cut
/// to [`MAX_MESSAGE_CHARS`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// Who was asked.
    pub front_end: FrontEnd,
    /// The MCP tool that was called, for `hako mcp`.
    pub tool: Option<String>,
    /// The backend, once one was chosen.
    pub backend: Option<String>,
    /// The sandbox's id, where the front end numbers them (`hako serve`).
    pub sandbox: Option<u64>,
    /// The command, when one was refused.
    pub argv: Option<Vec<String>>,
    /// The path, when a file operation was refused.
    pub path: Option<PathBuf>,
    /// Why.
    pub error: String,
    /// The exit code `hako run` exits with for it.
    pub exit_code: Option<u8>,
}

impl Failure {
    /// A failure of `front_end` saying `error` (cut to
    /// [`MAX_MESSAGE_CHARS`]); the other fields are filled in as they
    /// apply.
    pub fn new(front_end: FrontEnd, error: &str) -> Self {
        Failure {
            front_end,
            tool: None,
            backend: None,
            sandbox: None,
            argv: None,
            path: None,
            error: shorten(error, MAX_MESSAGE_CHARS),
            exit_code: None,
        }
    }
}

impl Failure {
    /// Its record: a [`Refusal`](Record::Refusal) when a policy refused
    /// (`refused`), an [`Error`](Record::Error) otherwise.
    pub fn record(self, refused: bool) -> Record {
        if refused {
            Record::Refusal(self)
        } else {
            Record::Error(self)
        }
    }
}

/// Whether `err` is a policy's refusal (a path the fence refused, a
/// boundary weaker than required) rather than a failure: what makes a
/// [`Failure`] a `refusal` record rather than an `error`.
pub fn is_refusal(err: &hako_core::Error) -> bool {
    match err {
        hako_core::Error::Fence(f) => f.is_refusal(),
        hako_core::Error::IsolationTooWeak { .. } => true,
        _ => false,
    }
}

/// `s` cut to `max` characters, with `...` when it was cut.
fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((at, _)) => format!("{}...", &s[..at]),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys(r: &Record) -> Vec<String> {
        r.fields().keys().cloned().collect()
    }

    #[test]
    fn an_exec_record_has_the_same_fields_whichever_front_end_wrote_it() {
        let out = Output {
            status: ExitStatus::Signal(9),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_total: 0,
            stderr_total: 0,
            duration: Duration::from_millis(7),
            timed_out: false,
            oom_killed: false,
        };
        let argv = Command::new(["echo", "hi"]);
        let run = Record::Exec(Exec::new(FrontEnd::Run, "linux", &argv).output(&out));
        let mut shell = Command::new(["true"]);
        shell.program = hako_core::Program::Shell("echo hi".into());
        let mut mcp = Exec::new(FrontEnd::Mcp, "host", &shell).in_session(Some(3));
        mcp.tool = Some("run_command".into());
        let mcp = Record::Exec(mcp);
        let serve = Record::Exec(Exec::new(FrontEnd::Serve, "docker", &shell).still_running(
            4,
            Duration::from_millis(5),
            1,
            2,
        ));
        assert_eq!(keys(&run), keys(&mcp));
        assert_eq!(keys(&run), keys(&serve));
        let fields = run.fields();
        assert_eq!(fields["front_end"], "run");
        assert_eq!(fields["signal"], 9);
        assert_eq!(fields["exit_code"], Value::Null);
        assert_eq!(fields["argv"], serde_json::json!(["echo", "hi"]));
        let fields = mcp.fields();
        assert_eq!(fields["command"], "echo hi");
        // The session's shell ran the line: no argv of its own.
        assert_eq!(fields["argv"], Value::Null);
        assert_eq!(serve.fields()["argv"][0], "/bin/sh");
        assert_eq!(serve.fields()["running"], true);
    }

    #[test]
    fn a_lost_sandbox_is_recorded_from_its_typed_error_and_no_other_error_is() {
        let err = hako_core::Error::SandboxLost {
            backend: "gvisor".into(),
            op: "open a session",
            reason: "the sandbox's guest ended: runsc was killed".into(),
        };
        let lost = SandboxLost::from_error(FrontEnd::Serve, Some(4), &err).unwrap();
        let fields = Record::SandboxLost(lost).fields();
        assert_eq!(fields["op"], "lost");
        assert_eq!(fields["sandbox"], 4);
        assert_eq!(fields["backend"], "gvisor");
        assert_eq!(fields["during"], "open a session");
        assert_eq!(
            fields["reason"],
            "the sandbox's guest ended: runsc was killed"
        );
        assert!(SandboxLost::from_error(FrontEnd::Run, None, &hako_core::Error::Closed).is_none());
    }

    #[test]
    fn each_record_has_its_kind_and_op() {
        let opened = SandboxOpened {
            front_end: FrontEnd::Mcp,
            sandbox: None,
            backend: "host".into(),
            isolation: Isolation::None,
            network: NetworkAccess::Host,
            workdir: None,
        };
        let cases = [
            (Record::SandboxOpened(opened), "sandbox", Some("open")),
            (
                Record::SandboxClosed(SandboxClosed {
                    front_end: FrontEnd::Serve,
                    sandbox: Some(1),
                }),
                "sandbox",
                Some("close"),
            ),
            (
                Record::SandboxLost(SandboxLost {
                    front_end: FrontEnd::Run,
                    sandbox: None,
                    backend: "docker".into(),
                    during: "run command".into(),
                    reason: "the sandbox's guest ended".into(),
                }),
                "sandbox",
                Some("lost"),
            ),
            (
                Record::File(File::new(
                    FrontEnd::Serve,
                    Some(1),
                    Path::new("a"),
                    FileOp::Remove,
                )),
                "file",
                Some("remove"),
            ),
            (
                Record::Process(Process {
                    process: 2,
                    sandbox: None,
                    op: ProcessOp::KilledAtClose { argv: vec![] },
                }),
                "process",
                Some("killed_at_close"),
            ),
            (
                Record::Session(Session {
                    op: SessionOp::Open,
                    session: 1,
                    sandbox: None,
                }),
                "session",
                Some("open"),
            ),
            (Record::NetDropped { dropped: 3 }, "net", None),
            (
                Record::Refusal(Failure::new(FrontEnd::Run, "no")),
                "refusal",
                None,
            ),
            (
                Record::Error(Failure::new(FrontEnd::Mcp, "no")),
                "error",
                None,
            ),
            (
                Record::Review(Review {
                    front_end: FrontEnd::Review,
                    name: Some("fix-1".into()),
                    sandbox: None,
                    op: ReviewOp::Commit {
                        diff_hash: "ab".into(),
                        changes: vec![Committed {
                            path: "a".into(),
                            status: "modified".into(),
                            sha256: Some(sha256_hex(b"x")),
                        }],
                        complete: true,
                    },
                }),
                "review",
                Some("commit"),
            ),
            (
                Record::Review(Review {
                    front_end: FrontEnd::Review,
                    name: Some("fix-1".into()),
                    sandbox: None,
                    op: ReviewOp::Remove,
                }),
                "review",
                Some("remove"),
            ),
        ];
        for (record, kind, op) in cases {
            assert_eq!(record.kind(), kind);
            let fields = record.fields();
            assert_eq!(fields.get("op").and_then(Value::as_str), op, "{fields:?}");
        }
    }

    #[test]
    fn a_file_record_carries_the_hash_never_the_content() {
        let r = Record::File(File::new(
            FrontEnd::Mcp,
            None,
            Path::new("a.txt"),
            FileOp::edit(b"secret one", b"secret two", 1),
        ));
        let fields = r.fields();
        assert_eq!(fields["sha256"], sha256_hex(b"secret two"));
        assert_eq!(fields["sha256_before"], sha256_hex(b"secret one"));
        assert!(!Value::Object(fields).to_string().contains("secret"));
    }

    #[test]
    fn a_failure_keeps_a_short_message() {
        let long = "é".repeat(MAX_MESSAGE_CHARS * 3);
        let f = Failure::new(FrontEnd::Mcp, &long);
        assert_eq!(f.error.chars().count(), MAX_MESSAGE_CHARS + 3);
        assert!(f.error.ends_with("..."));
        assert_eq!(Failure::new(FrontEnd::Mcp, "short").error, "short");
    }
}
