//! The host side of the protocol: starting the guest for one command,
//! feeding it, and collecting its output. Every backend launches through
//! this; a backend only decides how the guest is started and what it builds.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::proto::{self, LinuxSpec, RunReply, RunRequest, SpawnFailure};
use hako_core::{Command, Error, Output, OutputSink, Result, Stream};
use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
use hako_sys::rustix::io::Errno;
use hako_sys::spawn::{prepare, ChildSetup};

/// How long output may keep flowing after the guest has replied (it killed
/// the whole tree first, so this is only a guard against a broken guest).
const DRAIN_GRACE: Duration = Duration::from_secs(5);

fn backend_err(backend: &str, op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: backend.into(),
        op,
        message: message.into(),
    }
}

/// Finds `hako-guest`: `$HAKO_GUEST`, else beside the running executable,
/// else one directory up (where Cargo puts binaries relative to tests).
pub fn locate_guest() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("HAKO_GUEST") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        op: "find the running executable",
        source,
    })?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join("hako-guest");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    Err(backend_err(
        "any",
        "find hako-guest",
        format!(
            "no hako-guest binary beside {}; hint: install hako-guest next to hako, set HAKO_GUEST, or run `cargo build --workspace` first",
            exe.display()
        ),
    ))
}

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

/// The control sockets of commands in flight, so that closing the sandbox
/// can cancel them.
#[derive(Debug, Default)]
pub struct Running {
    next: AtomicU64,
    sockets: Mutex<Vec<(u64, UnixStream)>>,
}

impl Running {
    fn add(&self, ctl: &UnixStream) -> Option<u64> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let clone = ctl.try_clone().ok()?;
        self.sockets.lock().ok()?.push((id, clone));
        Some(id)
    }

    fn remove(&self, id: Option<u64>) {
        if let (Some(id), Ok(mut sockets)) = (id, self.sockets.lock()) {
            sockets.retain(|(i, _)| *i != id);
        }
    }

    /// Cancels every command in flight: the guest sees end of file on its
    /// control socket and kills its whole tree.
    pub fn cancel_all(&self) {
        if let Ok(sockets) = self.sockets.lock() {
            for (_, sock) in sockets.iter() {
                let _ = sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

/// Everything one launch needs.
pub struct Launch<'a> {
    /// The backend's name, for errors.
    pub backend: &'static str,
    /// The `hako-guest` binary.
    pub guest: &'a Path,
    /// The checked argument vector (see [`validate`]).
    pub argv: Vec<String>,
    /// The complete environment of the command.
    pub env: Vec<(String, String)>,
    /// The directory the guest starts in (opened through the fence).
    pub cwd: OwnedFd,
    /// The command (stdin, timeout).
    pub command: &'a Command,
    /// Cap on each output stream.
    pub max_output: usize,
    /// Where in-flight commands are registered for cancellation.
    pub running: &'a Running,
    /// The sandbox the guest builds around the command, if any.
    pub linux: Option<LinuxSpec>,
}

/// One output stream, kept up to a cap and counted in full.
struct Capture {
    kept: Vec<u8>,
    cap: usize,
    total: u64,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Capture {
            kept: Vec::new(),
            cap,
            total: 0,
        }
    }

    /// Keeps what fits under the cap and returns that part.
    fn push<'b>(&mut self, chunk: &'b [u8]) -> &'b [u8] {
        self.total += chunk.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        let keep = &chunk[..chunk.len().min(room)];
        self.kept.extend_from_slice(keep);
        keep
    }

    fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

/// Starts `hako-guest` in `cwd` with an empty environment, the given stdio,
/// the control socket at fd 3 and nothing else open, in a process group of
/// its own (Ctrl-C at the terminal goes to hako's group; the guest learns of
/// hako's end through its control socket instead).
fn spawn_guest(
    backend: &'static str,
    guest: &Path,
    cwd: OwnedFd,
    ctl_guest: UnixStream,
    [stdin, stdout, stderr]: [Stdio; 3],
) -> Result<std::process::Child> {
    let mut command = std::process::Command::new(guest);
    command
        .env_clear()
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr);
    prepare(
        &mut command,
        ChildSetup {
            cwd: Some(cwd),
            fd3: Some(OwnedFd::from(ctl_guest)),
            new_process_group: true,
            ..ChildSetup::default()
        },
    );
    // The command is dropped on return, which closes the parent's copies of
    // the guest's ends.
    command.spawn().map_err(|e| {
        backend_err(
            backend,
            "start hako-guest",
            format!(
                "{}: {e}; hint: set HAKO_GUEST to the hako-guest binary",
                guest.display()
            ),
        )
    })
}

/// Runs one command under a fresh guest.
pub fn run(launch: Launch<'_>, mut sink: Option<&mut OutputSink<'_>>) -> Result<Output> {
    let Launch {
        backend,
        guest,
        argv,
        env,
        cwd,
        command,
        max_output,
        running,
        linux,
    } = launch;
    let (ctl, ctl_guest) = UnixStream::pair().map_err(|source| Error::Io {
        op: "create control socket",
        source,
    })?;
    let stdin = if command.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    let start = Instant::now();
    let mut child = spawn_guest(
        backend,
        guest,
        cwd,
        ctl_guest,
        [stdin, Stdio::piped(), Stdio::piped()],
    )?;
    let id = running.add(&ctl);
    let result = (|| {
        let request = RunRequest {
            version: proto::VERSION,
            argv,
            env,
            timeout_ms: command
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            linux,
        };
        proto::write_frame(&ctl, &proto::Request::Run(request))
            .map_err(|e| backend_err(backend, "send request to hako-guest", e.to_string()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        std::thread::scope(|scope| {
            if let (Some(mut pipe), Some(data)) = (stdin, command.stdin.as_deref()) {
                scope.spawn(move || {
                    // A command that exits without reading its input closes
                    // the pipe; that is not an error.
                    let _ = pipe.write_all(data);
                });
            }
            pump(
                stdout.map(OwnedFd::from),
                stderr.map(OwnedFd::from),
                &ctl,
                max_output,
                &mut sink,
            )
        })
    })();
    running.remove(id);
    // On an error the guest must not outlive us: closing its control socket
    // makes it kill the command's tree.
    drop(ctl);
    let waited = child.wait();
    let (out, err, reply) = result?;
    let reply = match reply {
        Some(reply) => reply,
        None => {
            return Err(backend_err(
                backend,
                "run command",
                format!("hako-guest ended without a reply ({waited:?})"),
            ))
        }
    };
    match reply {
        RunReply::Finished { status, timed_out } => Ok(Output {
            status,
            stdout_truncated: out.truncated(),
            stderr_truncated: err.truncated(),
            stdout_total: out.total,
            stderr_total: err.total,
            stdout: out.kept,
            stderr: err.kept,
            duration: start.elapsed(),
            timed_out,
        }),
        RunReply::SpawnFailed {
            kind,
            errno,
            message,
        } => {
            let program = command.program.argv().first().cloned().unwrap_or_default();
            Err(match kind {
                SpawnFailure::NotFound => Error::CommandNotFound { program },
                SpawnFailure::CannotExecute => Error::CannotExecute {
                    program,
                    source: errno.map_or_else(
                        || std::io::Error::other(message),
                        std::io::Error::from_raw_os_error,
                    ),
                },
                SpawnFailure::Other => backend_err(backend, "start command", message),
            })
        }
        RunReply::Refused { message } => Err(backend_err(backend, "run command", message)),
    }
}

/// Reads both output streams until they close, and the guest's reply.
fn pump(
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    ctl: &UnixStream,
    cap: usize,
    sink: &mut Option<&mut OutputSink<'_>>,
) -> Result<(Capture, Capture, Option<RunReply>)> {
    let mut streams = [
        (Stream::Stdout, stdout, Capture::new(cap)),
        (Stream::Stderr, stderr, Capture::new(cap)),
    ];
    let mut reply: Option<RunReply> = None;
    let mut ctl_open = true;
    let mut replied_at: Option<Instant> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let open: Vec<usize> = (0..2).filter(|&i| streams[i].1.is_some()).collect();
        if open.is_empty() && !ctl_open {
            break;
        }
        if let Some(at) = replied_at {
            if at.elapsed() > DRAIN_GRACE {
                tracing::warn!(
                    "output still open {DRAIN_GRACE:?} after the guest replied; giving up on it"
                );
                break;
            }
        }
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(3);
        for &i in &open {
            if let Some(fd) = streams[i].1.as_ref() {
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
        }
        if ctl_open {
            fds.push(PollFd::new(ctl, PollFlags::IN));
        }
        let timeout = replied_at.map(|_| Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        });
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => {
                return Err(Error::Io {
                    op: "poll command output",
                    source: e.into(),
                })
            }
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        for (slot, &i) in open.iter().enumerate() {
            if !ready[slot] {
                continue;
            }
            let (stream, fd, capture) = &mut streams[i];
            let Some(handle) = fd.as_ref() else { continue };
            match hako_sys::rustix::io::read(handle.as_fd(), &mut buf[..]) {
                Ok(0) => *fd = None,
                Ok(n) => {
                    let kept = capture.push(&buf[..n]);
                    if let Some(sink) = sink.as_mut() {
                        if !kept.is_empty() {
                            sink(*stream, kept);
                        }
                    }
                }
                Err(Errno::INTR) | Err(Errno::AGAIN) => {}
                Err(_) => *fd = None,
            }
        }
        if ctl_open && ready.last().copied().unwrap_or(false) {
            reply = proto::read_frame(ctl).ok();
            ctl_open = false;
            replied_at = Some(Instant::now());
        }
    }
    let [(_, _, out), (_, _, err)] = streams;
    Ok((out, err, reply))
}

/// A sandbox held open by a guest (see [`proto::Request::Hold`]): closing
/// it, dropping it or the death of this process tears the sandbox down.
#[derive(Debug)]
pub struct Held {
    child: std::process::Child,
    ctl: Option<UnixStream>,
    pid: i32,
}

impl Held {
    /// Pid of the sandbox's pid 1, for [`LinuxSpec::enter`].
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Tears the sandbox down: pid 1 sees its control socket close and
    /// exits, and the kernel kills everything left in its namespaces.
    pub fn close(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            let _ = ctl.shutdown(std::net::Shutdown::Both);
            drop(ctl);
            let _ = self.child.wait();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long [`hold`] waits for the guest to build the sandbox.
const HOLD_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts a guest that builds the sandbox `spec` describes and holds it.
pub fn hold(backend: &'static str, guest: &Path, cwd: OwnedFd, spec: LinuxSpec) -> Result<Held> {
    let (ctl, ctl_guest) = UnixStream::pair().map_err(|source| Error::Io {
        op: "create control socket",
        source,
    })?;
    let child = spawn_guest(
        backend,
        guest,
        cwd,
        ctl_guest,
        [Stdio::null(), Stdio::null(), Stdio::null()],
    )?;
    let mut held = Held {
        child,
        ctl: Some(ctl),
        pid: 0,
    };
    let reply: std::io::Result<proto::HoldReply> = (|| {
        let ctl = held
            .ctl
            .as_ref()
            .ok_or_else(|| std::io::Error::other("closed"))?;
        proto::write_frame(ctl, &proto::Request::Hold(spec))?;
        // Building a sandbox takes milliseconds; a guest that says nothing
        // for this long is stuck, and the caller must not hang with it.
        ctl.set_read_timeout(Some(HOLD_TIMEOUT))?;
        let reply = proto::read_frame(ctl);
        ctl.set_read_timeout(None)?;
        reply
    })();
    match reply {
        Ok(proto::HoldReply::Holding { pid }) => {
            held.pid = pid;
            Ok(held)
        }
        Ok(proto::HoldReply::Refused { message }) => {
            Err(backend_err(backend, "create the sandbox", message))
        }
        Err(e) => Err(backend_err(
            backend,
            "create the sandbox",
            format!("hako-guest ended without a reply: {e}"),
        )),
    }
}
