use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default cap on each of stdout and stderr kept in an [`Output`]: 1 MiB.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;

/// What to run: an argument vector, or a string for `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Program {
    /// `argv[0]` is looked up in the sandbox's `PATH` when it has no `/`.
    Argv(Vec<String>),
    /// Run by `/bin/sh -c` inside the sandbox.
    Shell(String),
}

impl Program {
    /// The argument vector that is executed.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Program::Argv(argv) => argv.clone(),
            Program::Shell(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
        }
    }
}

/// One execution request.
///
/// Serialisable so that a backend can ship it across a boundary (a container,
/// a VM) unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// What to run.
    pub program: Program,
    /// Working directory, sandbox-relative and fenced like every other path.
    /// `None` means the sandbox root.
    pub cwd: Option<PathBuf>,
    /// Extra environment, merged over the sandbox's sanitised base.
    pub env: Vec<(String, String)>,
    /// Bytes fed to the command's standard input; `None` gives it an empty
    /// stdin (end of file at once).
    pub stdin: Option<Vec<u8>>,
    /// Process deadline: when it passes, every process the command started is
    /// killed and the output says `timed_out`.
    pub timeout: Option<Duration>,
    /// Cap on each of stdout and stderr kept in the [`Output`]; the rest is
    /// drained and counted, never buffered. `None` means the sandbox default.
    pub max_output: Option<usize>,
}

impl Command {
    /// A command from an argument vector.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::from_program(Program::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// A command run by `/bin/sh -c`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::from_program(Program::Shell(script.into()))
    }

    fn from_program(program: Program) -> Self {
        Command {
            program,
            cwd: None,
            env: Vec::new(),
            stdin: None,
            timeout: None,
            max_output: None,
        }
    }

    /// Sets the sandbox-relative working directory.
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds one environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the bytes given on stdin.
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Sets the process deadline.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the per-stream output cap.
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output = Some(bytes);
        self
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal number.
    Signal(i32),
}

impl ExitStatus {
    /// The exit code, if it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            ExitStatus::Code(code) => Some(code),
            ExitStatus::Signal(_) => None,
        }
    }

    /// The signal, if it was killed by one.
    pub fn signal(self) -> Option<i32> {
        match self {
            ExitStatus::Code(_) => None,
            ExitStatus::Signal(sig) => Some(sig),
        }
    }

    /// Whether it exited with code 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }

    /// The code a shell would report: the exit code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(code) => code,
            ExitStatus::Signal(sig) => 128 + sig,
        }
    }
}

/// The result of a command that ran. A non-zero exit is data, not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// How it ended.
    pub status: ExitStatus,
    /// Standard output, at most the cap.
    pub stdout: Vec<u8>,
    /// Standard error, at most the cap.
    pub stderr: Vec<u8>,
    /// Whether stdout produced more than the cap.
    pub stdout_truncated: bool,
    /// Whether stderr produced more than the cap.
    pub stderr_truncated: bool,
    /// Bytes the command wrote to stdout in all, kept or not.
    pub stdout_total: u64,
    /// Bytes the command wrote to stderr in all, kept or not.
    pub stderr_total: u64,
    /// Wall-clock time from start to the end of the last process.
    pub duration: Duration,
    /// Whether the process deadline killed it.
    pub timed_out: bool,
    /// Whether the sandbox's memory limit (`--memory`) killed it: the
    /// limit's kill count rose while it ran and it ended by `SIGKILL`
    /// (or with status 137 from a shell whose child was killed) that hako
    /// did not send. Absent from older peers' results: `false`.
    #[serde(default)]
    pub oom_killed: bool,
}
