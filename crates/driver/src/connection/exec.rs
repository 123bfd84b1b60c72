//! One command: checking it, sending it (with its input), and collecting
//! its output and end into a `core::Output`.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use hako_core::{Command, Error, Output, OutputSink, Result, Stream};

use super::reader::Event;
use super::{backend_err, guest_could_not, lost, Connection};
use crate::proto::{
    Cwd, ExecRequest, Frame, FromGuest, SpawnFailure, StreamId, ToGuest, MAX_CHUNK,
};

/// Checks a command and returns its argument vector.
pub fn validate(command: &Command) -> Result<Vec<String>> {
    let argv = command.program.argv();
    let invalid = |reason: String| Err(Error::InvalidCommand { reason });
    match argv.first() {
        None => return invalid("the argument vector is empty".into()),
        Some(p) if p.is_empty() => return invalid("the program name is empty".into()),
        _ => {}
    }
    if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
        return invalid(format!("argument {i} contains a NUL byte"));
    }
    for (k, v) in &command.env {
        if !hako_core::env::valid_name(k) {
            return invalid(format!("environment variable name {k:?} is not valid"));
        }
        if v.contains('\0') {
            return invalid(format!("environment variable {k} contains a NUL byte"));
        }
    }
    Ok(argv)
}

/// One output stream, kept up to a cap (the caller counts the total).
#[derive(Debug)]
pub struct Capture {
    /// What was kept.
    pub kept: Vec<u8>,
    cap: usize,
}

impl Capture {
    /// An empty capture that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Capture {
            kept: Vec::new(),
            cap,
        }
    }

    /// Keeps what fits under the cap and returns that part.
    pub fn push<'b>(&mut self, chunk: &'b [u8]) -> &'b [u8] {
        let room = self.cap.saturating_sub(self.kept.len());
        let keep = &chunk[..chunk.len().min(room)];
        self.kept.extend_from_slice(keep);
        keep
    }
}

/// One command for [`Connection::exec`].
pub struct Exec<'a> {
    /// The checked argument vector (see [`validate`]).
    pub argv: Vec<String>,
    /// The complete environment.
    pub env: Vec<(String, String)>,
    /// Where it starts: a directory opened through the fence (`host`), or a
    /// path inside the sandbox.
    pub cwd: ExecCwd,
    /// The command (stdin, timeout).
    pub command: &'a Command,
    /// Cap on each output stream.
    pub max_output: usize,
}

/// Where a command starts; see [`Exec::cwd`].
pub enum ExecCwd {
    /// This directory, passed to the guest as a descriptor.
    Fd(OwnedFd),
    /// This absolute path inside the sandbox.
    Path(PathBuf),
}

impl ExecCwd {
    /// What the request says, and the descriptor to send with it.
    pub(super) fn split(self) -> (Cwd, Option<OwnedFd>) {
        match self {
            ExecCwd::Fd(fd) => (Cwd::Fd, Some(fd)),
            ExecCwd::Path(path) => (Cwd::Path(path), None),
        }
    }
}

impl Connection {
    /// Runs one command and returns its output once every process of it is
    /// gone. `sink` sees each kept chunk as it arrives.
    pub fn exec(&self, exec: Exec<'_>, sink: Option<&mut OutputSink<'_>>) -> Result<Output> {
        let Exec {
            argv,
            env,
            cwd,
            command,
            max_output,
        } = exec;
        if command.stdin.is_some() {
            // The guest may answer with output before it has taken all of
            // the input: something must read while this thread writes.
            self.start_reader_thread();
        }
        let (id, rx) = self.register("run command")?;
        let (cwd, fd) = cwd.split();
        let start = Instant::now();
        let request = ExecRequest {
            id,
            argv,
            env,
            cwd,
            timeout_ms: timeout_ms(command),
            stdin: command.stdin.is_some(),
            max_output: max_output as u64,
            pty: None,
        };
        let sent = self
            .send(&Frame::Message(ToGuest::Exec(request)), fd.as_ref())
            .and_then(|()| {
                let Some(data) = command.stdin.as_deref() else {
                    return Ok(());
                };
                for chunk in data.chunks(MAX_CHUNK) {
                    let frame = Frame::Stdin {
                        id,
                        data: chunk.to_vec(),
                    };
                    self.send(&frame, None)?;
                }
                self.send(&Frame::Message(ToGuest::CloseStdin { id }), None)
            });
        drop(fd);
        if let Err(err) = sent {
            self.unregister(id);
            return Err(err);
        }
        self.output(&rx, command, max_output, sink, start)
    }

    /// Collects one command's output and end from `rx`.
    pub(super) fn output(
        &self,
        rx: &mpsc::Receiver<Event>,
        command: &Command,
        max_output: usize,
        mut sink: Option<&mut OutputSink<'_>>,
        start: Instant,
    ) -> Result<Output> {
        let mut out = Capture::new(max_output);
        let mut err = Capture::new(max_output);
        let done = loop {
            match self.next_event(rx, None) {
                Ok(Event::Output { stream, data }) => {
                    let (capture, which) = match stream {
                        StreamId::Stdout => (&mut out, Stream::Stdout),
                        StreamId::Stderr => (&mut err, Stream::Stderr),
                    };
                    let kept = capture.push(&data);
                    if let Some(sink) = sink.as_mut() {
                        if !kept.is_empty() {
                            sink(which, kept);
                        }
                    }
                }
                Ok(Event::Done(msg)) => break msg,
                Ok(Event::Gone(why)) => {
                    return Err(lost(self.backend, "run command", why));
                }
                Err(_) => {
                    return Err(lost(
                        self.backend,
                        "run command",
                        "the connection to hako-guest ended",
                    ))
                }
            }
        };
        let program = || command.program.argv().first().cloned().unwrap_or_default();
        match done {
            FromGuest::Exited {
                status,
                timed_out,
                oom_killed,
                stdout_total,
                stderr_total,
                ..
            } => Ok(Output {
                status,
                stdout_truncated: stdout_total > out.kept.len() as u64,
                stderr_truncated: stderr_total > err.kept.len() as u64,
                stdout_total,
                stderr_total,
                stdout: out.kept,
                stderr: err.kept,
                duration: start.elapsed(),
                timed_out,
                oom_killed,
            }),
            FromGuest::SpawnFailed {
                kind,
                errno,
                message,
                ..
            } => Err(match kind {
                SpawnFailure::NotFound => Error::CommandNotFound { program: program() },
                SpawnFailure::CannotExecute => Error::CannotExecute {
                    program: program(),
                    source: errno.map_or_else(
                        || std::io::Error::other(message),
                        std::io::Error::from_raw_os_error,
                    ),
                },
                SpawnFailure::Other => guest_could_not("start command", errno, || {
                    backend_err(self.backend, "start command", message)
                }),
            }),
            FromGuest::Failed { message, errno, .. } | FromGuest::Refused { message, errno } => {
                Err(guest_could_not("run command", errno, || {
                    backend_err(self.backend, "run command", message)
                }))
            }
            other => Err(backend_err(
                self.backend,
                "run command",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }

    /// Waits for the one reply to a request.
    pub(super) fn reply(&self, rx: &mpsc::Receiver<Event>, op: &'static str) -> Result<FromGuest> {
        loop {
            match self.next_event(rx, None) {
                Ok(Event::Done(msg)) => return Ok(msg),
                Ok(Event::Output { .. }) => {}
                Ok(Event::Gone(why)) => return Err(lost(self.backend, op, why)),
                Err(_) => return Err(lost(self.backend, op, "the connection to hako-guest ended")),
            }
        }
    }
}

pub(super) fn timeout_ms(command: &Command) -> Option<u64> {
    command
        .timeout
        .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use super::*;

    fn refused(command: &Command) -> String {
        match validate(command) {
            Err(Error::InvalidCommand { reason }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_command_without_a_program_or_with_a_nul_byte_is_refused() {
        assert!(refused(&Command::new(Vec::<String>::new())).contains("empty"));
        assert!(refused(&Command::new([""])).contains("program name is empty"));
        assert!(refused(&Command::new(["echo", "a\0b"])).contains("argument 1"));
    }

    #[test]
    fn a_bad_environment_name_or_value_is_refused() {
        let mut bad_name = Command::new(["true"]);
        bad_name.env.push(("A=B".into(), "x".into()));
        assert!(refused(&bad_name).contains("not valid"));
        let mut bad_value = Command::new(["true"]);
        bad_value.env.push(("A".into(), "x\0".into()));
        assert!(refused(&bad_value).contains("NUL"));
    }

    #[test]
    fn a_good_command_gives_its_argument_vector() {
        let mut command = Command::new(["echo", "hi"]);
        command.env.push(("LANG".into(), "C".into()));
        assert_eq!(validate(&command).unwrap(), ["echo", "hi"]);
    }

    #[test]
    fn a_capture_keeps_up_to_its_cap_and_says_what_it_kept() {
        let mut capture = Capture::new(5);
        assert_eq!(capture.push(b"abc"), b"abc");
        assert_eq!(capture.push(b"defg"), b"de");
        assert_eq!(capture.push(b"h"), b"");
        assert_eq!(capture.kept, b"abcde");
    }

    #[test]
    fn the_timeout_is_sent_in_milliseconds_and_saturates() {
        let mut command = Command::new(["true"]);
        assert_eq!(timeout_ms(&command), None);
        command.timeout = Some(Duration::from_millis(1500));
        assert_eq!(timeout_ms(&command), Some(1500));
        command.timeout = Some(Duration::MAX);
        assert_eq!(timeout_ms(&command), Some(u64::MAX));
    }

    #[test]
    fn a_cwd_path_goes_in_the_request_and_a_descriptor_beside_it() {
        let (cwd, fd) = ExecCwd::Path("/w/src".into()).split();
        assert!(matches!(cwd, Cwd::Path(p) if p == std::path::Path::new("/w/src")));
        assert!(fd.is_none());
        let dir = std::fs::File::open(".").unwrap();
        let (cwd, fd) = ExecCwd::Fd(OwnedFd::from(dir)).split();
        assert!(matches!(cwd, Cwd::Fd));
        assert!(fd.is_some());
    }
}
