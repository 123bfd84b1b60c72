//! The host side of the protocol: starting a sandbox's guest, sending it
//! commands, and collecting their output. Every backend launches through
//! this; a backend only decides how the guest is started and what it builds.
//!
//! One [`Connection`] per sandbox. A reader thread takes every frame the
//! guest sends and hands it to the command it belongs to, so any number of
//! threads can run commands at once; each waits only for its own events.
//! A process that mostly runs one command at a time (the CLI, see
//! [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller)) starts no such thread until it needs one:
//! the threads that wait read the frames themselves, taking turns.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::processes::{Proc, Procs};
use crate::proto::{
    self, Cwd, ExecRequest, Frame, FromGuest, Hello, LinuxSpec, SessionExecRequest, SessionRequest,
    SpawnFailure, StreamId, ToGuest, MAX_CHUNK,
};
use hako_core::{
    Command, Error, Output, OutputSink, OutputSlice, ProcessState, Result, SpawnOptions, Stream,
    TermSize,
};
use hako_sys::spawn::{prepare, ChildSetup};

use crate::InProcessGuest;

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

/// What the reader thread hands a waiting command.
enum Event {
    Output { stream: StreamId, data: Vec<u8> },
    Done(FromGuest),
    Gone(String),
}

#[derive(Default)]
struct Table {
    waiting: HashMap<u64, mpsc::Sender<Event>>,
    /// Long-lived processes: their output and end are kept here.
    procs: Procs,
    /// The guest said [`FromGuest::Bye`].
    bye: bool,
    /// Why the guest is gone, once it is.
    gone: Option<String>,
    /// Sessions asked for (a shell may still run in one).
    sessions_opened: u64,
}

/// The table, and a signal for those waiting on a process's output or end.
#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
}

/// The id the guest's first reply ([`FromGuest::Ready`] or
/// [`FromGuest::Refused`]) is delivered under.
const HELLO_ID: u64 = 0;

/// How long [`Connection::start`] waits for the guest to build the sandbox.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The buffer the guest's frames are read through.
const READ_BUF: usize = 64 * 1024;

/// How long closing waits for a container runtime's client to exit after
/// its guest has ended.
const PIPED_EXIT_GRACE: Duration = Duration::from_secs(30);

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
    fn split(self) -> (Cwd, Option<OwnedFd>) {
        match self {
            ExecCwd::Fd(fd) => (Cwd::Fd, Some(fd)),
            ExecCwd::Path(path) => (Cwd::Path(path), None),
        }
    }
}

/// A sandbox's guest, started once and serving every command until
/// [`close`](Connection::close). Dropping it closes it; if this process
/// dies, the guest sees its connection close and kills everything.
pub struct Connection {
    backend: &'static str,
    writer: Mutex<Wire>,
    shared: Arc<Shared>,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Who reads the guest's frames (see [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller)).
    read_by: Mutex<ReadBy>,
    /// Signalled when a waiting thread is done reading a frame.
    turn_over: Condvar,
    child: Mutex<Option<GuestProcess>>,
    next_id: AtomicU64,
    /// The guest's process was waited for and exited with status 0.
    exited_cleanly: std::sync::atomic::AtomicBool,
}

/// hako's sending end of the link to the guest.
enum Wire {
    /// A socket shared with the guest (it can carry descriptors).
    Socket(UnixStream),
    /// The write end of a pipe into the guest's stdin (a guest in a
    /// container); `None` once closed.
    Pipe(Option<std::fs::File>),
}

impl Wire {
    fn send(&self, bytes: &[u8], fd: Option<&OwnedFd>) -> std::io::Result<()> {
        match (self, fd) {
            (Wire::Socket(s), None) => (&*s).write_all(bytes),
            (Wire::Socket(s), Some(fd)) => proto::send_with_fds(s, bytes, &[fd.as_fd()]),
            (Wire::Pipe(Some(p)), None) => (&*p).write_all(bytes),
            (Wire::Pipe(Some(_)), Some(_)) => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "a guest reached through a pipe cannot receive descriptors",
            )),
            (Wire::Pipe(None), _) => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection is closed",
            )),
        }
    }

    /// Tells the guest no more commands come, and stops reading what it
    /// says: the reader thread, blocked on the socket, ends now rather
    /// than when this process exits (which would wait for it).
    fn shut(&mut self) {
        match self {
            Wire::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Wire::Pipe(_) => self.close_write(),
        }
    }

    /// Tells the guest no more commands come: it ends the sandbox.
    fn close_write(&mut self) {
        match self {
            Wire::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            Wire::Pipe(p) => drop(p.take()),
        }
    }
}

/// Threads reaping the guests of closed sandboxes.
static REAPERS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Who reads what the guest sends.
enum ReadBy {
    /// A reader thread, or nobody any more (the guest is gone).
    Thread,
    /// The threads that wait for the guest, one frame at a time each:
    /// `end` is here while none of them reads. `thread_wanted`: a reader
    /// thread is to take over; the thread reading starts it when done.
    Callers {
        end: Option<BufReader<UnixStream>>,
        thread_wanted: bool,
    },
}

/// How hako reads what the guest sends.
enum ReaderEnd {
    /// A thread of its own reads it from the start.
    Thread(Box<dyn Read + Send>),
    /// Whichever thread waits reads it, until a thread of its own is
    /// needed (see [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller)).
    Caller(UnixStream),
}

/// Reaps `child` on a thread of its own, off the caller's path.
fn reap_later(child: GuestProcess) {
    let spawned = std::thread::Builder::new()
        .name("hako-reap".into())
        .spawn(move || {
            let mut child = child;
            child.wait();
        });
    if let (Ok(handle), Ok(mut reapers)) = (spawned, REAPERS.lock()) {
        reapers.push(handle);
    }
}

/// Waits for every reaping thread (each waits only for a guest that is
/// already exiting).
fn join_reapers() {
    let handles: Vec<_> = REAPERS
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    for handle in handles {
        let _ = handle.join();
    }
}

/// The guest's process (for `linux`, the launcher outside the namespaces).
enum GuestProcess {
    /// `hako-guest`, executed.
    Spawned(std::process::Child),
    /// A fork of this process running the guest's code.
    Forked(hako_sys::rustix::process::Pid),
    /// A container runtime's client attached to the guest's stdio: it
    /// exits once the container is gone, so closing waits for it.
    Piped(std::process::Child),
}

impl GuestProcess {
    fn kill(&mut self) {
        match self {
            GuestProcess::Spawned(child) | GuestProcess::Piped(child) => {
                let _ = child.kill();
            }
            GuestProcess::Forked(pid) => {
                let _ = hako_sys::rustix::process::kill_process(
                    *pid,
                    hako_sys::rustix::process::Signal::KILL,
                );
            }
        }
    }

    /// Reaps the process if it has ended; whether it had.
    fn try_reap(&mut self) -> bool {
        match self {
            GuestProcess::Spawned(child) | GuestProcess::Piped(child) => {
                matches!(child.try_wait(), Ok(Some(_)))
            }
            GuestProcess::Forked(pid) => matches!(
                hako_sys::rustix::process::waitpid(
                    Some(*pid),
                    hako_sys::rustix::process::WaitOptions::NOHANG,
                ),
                Ok(Some(_))
            ),
        }
    }

    /// Waits for the process; whether it exited with status 0.
    fn wait(&mut self) -> bool {
        match self {
            GuestProcess::Spawned(child) => child.wait().is_ok_and(|s| s.success()),
            GuestProcess::Piped(child) => {
                // A runtime's client waits on its daemon, which may be
                // wedged: bounded, then killed (the launcher then removes
                // the container itself).
                let start = Instant::now();
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break status.success(),
                        Ok(None) if start.elapsed() < PIPED_EXIT_GRACE => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break false;
                        }
                    }
                }
            }
            GuestProcess::Forked(pid) => loop {
                match hako_sys::rustix::process::waitpid(
                    Some(*pid),
                    hako_sys::rustix::process::WaitOptions::empty(),
                ) {
                    Err(hako_sys::rustix::io::Errno::INTR) => {}
                    Ok(Some((_, status))) => break status.exit_status() == Some(0),
                    _ => break false,
                }
            },
        }
    }
}

/// Forks this (single-threaded) process; the child becomes the guest: in
/// `cwd`, in a process group of its own, with the control socket at fd 3,
/// stdio on `/dev/null` and no other descriptor.
fn fork_guest(
    backend: &'static str,
    guest: &InProcessGuest,
    proof: &hako_sys::ns::SingleThreaded,
    cwd: OwnedFd,
    ctl_guest: UnixStream,
) -> Result<GuestProcess> {
    use hako_sys::ns::Forked;
    match hako_sys::ns::fork_single_threaded(proof) {
        Err(e) => Err(backend_err(
            backend,
            "start the guest",
            format!("fork: {e}"),
        )),
        Ok(Forked::Child) => {
            let code = (guest.serve_forked)(cwd, ctl_guest);
            hako_sys::spawn::exit_now(code.into())
        }
        Ok(Forked::Parent(pid)) => hako_sys::rustix::process::Pid::from_raw(pid)
            .map(GuestProcess::Forked)
            .ok_or_else(|| backend_err(backend, "start the guest", "fork returned pid 0")),
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Starts the guest in `cwd`, has it build `linux` (if given), and
    /// returns once it is ready to serve commands.
    ///
    /// With `guest` given (or `HAKO_GUEST` set) that binary is executed.
    /// Otherwise a single-threaded caller (the `hako` CLI) given the
    /// guest's code (`in_process`) forks and runs it in the child, which
    /// saves starting a second program; any other executes `hako-guest`
    /// found by [`locate_guest`]. `read_on_caller`: see
    /// [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller).
    pub fn start(
        backend: &'static str,
        guest: Option<&Path>,
        cwd: OwnedFd,
        linux: Option<LinuxSpec>,
        in_process: Option<&InProcessGuest>,
        read_on_caller: bool,
    ) -> Result<Connection> {
        let (ctl, ctl_guest) = UnixStream::pair().map_err(|source| Error::Io {
            op: "create control socket",
            source,
        })?;
        // A closed sandbox's guest still being reaped is a thread of ours:
        // let it finish, so that a single-threaded caller can fork again.
        join_reapers();
        let explicit = guest
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("HAKO_GUEST").map(PathBuf::from));
        let proof = hako_sys::ns::single_threaded();
        // Whether the guest still needs the handshake to learn what to do.
        let mut hello = true;
        let child = match (explicit, proof, in_process) {
            (None, Ok(proof), Some(in_process)) => match &linux {
                None => fork_guest(backend, in_process, &proof, cwd, ctl_guest)?,
                Some(spec) => {
                    // This process is the launcher: its child is pid 1.
                    drop(cwd);
                    let pid = (in_process.spawn_linux_pid1)(spec, &ctl_guest, &proof)
                        .map_err(|e| backend_err(backend, "start the sandbox", e.to_string()))?;
                    // Only pid 1 may hold the guest's end: its exit must
                    // show here as the connection closing.
                    drop(ctl_guest);
                    hello = false;
                    hako_sys::rustix::process::Pid::from_raw(pid)
                        .map(GuestProcess::Forked)
                        .ok_or_else(|| {
                            backend_err(backend, "start the sandbox", "clone returned pid 0")
                        })?
                }
            },
            (explicit, _, _) => {
                let path = match explicit {
                    Some(path) => path,
                    None => locate_guest()?,
                };
                GuestProcess::Spawned(spawn_guest(
                    backend,
                    &path,
                    cwd,
                    ctl_guest,
                    [Stdio::null(), Stdio::null(), Stdio::null()],
                )?)
            }
        };
        let hello = hello.then_some(Hello {
            version: proto::VERSION,
            linux,
            network: None,
            seal: None,
        });
        let reader = match ctl.try_clone() {
            Ok(reader) => reader,
            Err(e) => {
                let _ = ctl.shutdown(std::net::Shutdown::Both);
                let mut child = child;
                child.kill();
                child.wait();
                return Err(backend_err(
                    backend,
                    "start the sandbox",
                    format!("cannot clone the control socket: {e}"),
                ));
            }
        };
        let reader = if read_on_caller {
            ReaderEnd::Caller(reader)
        } else {
            ReaderEnd::Thread(Box::new(reader))
        };
        Connection::establish(backend, Wire::Socket(ctl), reader, child, hello, None)
    }

    /// Speaks to a guest already started by `child` (for example `docker
    /// run -i` of a container whose entrypoint is `hako-guest --stdio`):
    /// frames go to the child's stdin and come from its stdout. Returns once
    /// the guest is ready. Killing `child` must end the guest's link (a
    /// container runtime's client closes the container's stdin).
    pub fn over_pipes(
        backend: &'static str,
        mut child: std::process::Child,
        describe: Box<dyn Fn() -> String + Send + Sync>,
        network: Option<proto::NetSpec>,
        seal: Option<proto::Seal>,
    ) -> Result<Connection> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(backend_err(
                backend,
                "start the sandbox",
                "the guest's process was started without piped stdin and stdout",
            ));
        };
        let wire = Wire::Pipe(Some(std::fs::File::from(OwnedFd::from(stdin))));
        let hello = Hello {
            version: proto::VERSION,
            linux: None,
            network,
            seal,
        };
        Connection::establish(
            backend,
            wire,
            ReaderEnd::Thread(Box::new(stdout)),
            GuestProcess::Piped(child),
            Some(hello),
            Some(describe),
        )
    }

    /// The handshake (when the guest still needs it) and the wait for its
    /// first reply, with the reader thread (if any) running from the start.
    fn establish(
        backend: &'static str,
        wire: Wire,
        reader_end: ReaderEnd,
        child: GuestProcess,
        hello: Option<Hello>,
        describe: Option<Box<dyn Fn() -> String + Send + Sync>>,
    ) -> Result<Connection> {
        let failed = |mut wire: Wire, mut child: GuestProcess, message: String| {
            wire.close_write();
            child.kill();
            child.wait();
            Err(backend_err(backend, "start the sandbox", message))
        };
        if let Some(hello) = hello {
            let sent = proto::encode(&Frame::Message(ToGuest::Hello(Box::new(hello))))
                .and_then(|bytes| wire.send(&bytes, None));
            if let Err(e) = sent {
                return failed(
                    wire,
                    child,
                    format!("hako-guest ended without a reply: {e}"),
                );
            }
        }
        // The reader starts now, while the guest builds the sandbox; the
        // guest's first reply comes to this waiter.
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        if let Ok(mut table) = shared.table.lock() {
            table.waiting.insert(HELLO_ID, tx);
        }
        let (reader, read_by) = match reader_end {
            ReaderEnd::Thread(end) => {
                let shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("hako-{backend}-guest"))
                    .spawn(move || {
                        let end = BufReader::with_capacity(READ_BUF, end);
                        read_events(end, &shared, describe.as_deref());
                    });
                match spawned {
                    Ok(reader) => (Some(reader), ReadBy::Thread),
                    Err(e) => {
                        return failed(wire, child, format!("cannot start the guest reader: {e}"))
                    }
                }
            }
            ReaderEnd::Caller(end) => (
                None,
                ReadBy::Callers {
                    end: Some(BufReader::with_capacity(READ_BUF, end)),
                    thread_wanted: false,
                },
            ),
        };
        let connection = Connection {
            backend,
            writer: Mutex::new(wire),
            shared,
            reader: Mutex::new(reader),
            read_by: Mutex::new(read_by),
            turn_over: Condvar::new(),
            child: Mutex::new(Some(child)),
            next_id: AtomicU64::new(HELLO_ID + 1),
            exited_cleanly: std::sync::atomic::AtomicBool::new(false),
        };
        // Building a sandbox takes milliseconds (a container, under a
        // second); a guest that says nothing for this long is stuck, and
        // the caller must not hang with it.
        let why = match connection.next_event(&rx, Some(START_TIMEOUT)) {
            Ok(Event::Done(FromGuest::Ready { .. })) => return Ok(connection),
            Ok(Event::Done(FromGuest::Refused { message })) => message,
            Ok(Event::Done(other)) => format!("unexpected first reply {other:?}"),
            Ok(Event::Gone(why)) => format!("hako-guest ended without a reply: {why}"),
            Ok(Event::Output { .. }) => "unexpected output before the sandbox was ready".into(),
            Err(_) => format!("hako-guest said nothing for {START_TIMEOUT:?}"),
        };
        if let Some(child) = connection
            .child
            .lock()
            .ok()
            .as_mut()
            .and_then(|c| c.as_mut())
        {
            child.kill();
        }
        drop(connection);
        Err(backend_err(backend, "start the sandbox", why))
    }

    fn send(&self, frame: &Frame<ToGuest>, fd: Option<&OwnedFd>) -> Result<()> {
        let bytes = proto::encode(frame)
            .map_err(|e| backend_err(self.backend, "send to hako-guest", e.to_string()))?;
        let writer = self
            .writer
            .lock()
            .map_err(|_| backend_err(self.backend, "send to hako-guest", "lock poisoned"))?;
        writer
            .send(&bytes, fd)
            .map_err(|e| backend_err(self.backend, "send to hako-guest", e.to_string()))
    }

    /// Takes a new id and registers a waiter for what the guest says about
    /// it.
    fn register(&self, op: &'static str) -> Result<(u64, mpsc::Receiver<Event>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let mut table = self.lock(op)?;
        if let Some(why) = &table.gone {
            return Err(backend_err(self.backend, op, why.clone()));
        }
        table.waiting.insert(id, tx);
        Ok((id, rx))
    }

    fn unregister(&self, id: u64) {
        if let Ok(mut table) = self.shared.table.lock() {
            table.waiting.remove(&id);
        }
    }

    /// The next event for the waiter of `rx`, waiting at most `timeout`
    /// (`None`: until one comes). Where no reader thread runs, the waiting
    /// threads take turns reading the guest's frames, one frame per turn,
    /// each handing on what belongs to the others, until one for `rx`
    /// comes.
    fn next_event(
        &self,
        rx: &mpsc::Receiver<Event>,
        timeout: Option<Duration>,
    ) -> std::result::Result<Event, RecvTimeoutError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        fn gone<E>(_: E) -> RecvTimeoutError {
            RecvTimeoutError::Disconnected
        }
        let mut read_by = self.read_by.lock().map_err(gone)?;
        loop {
            // Frames are handed on under `read_by`: what came is here.
            match rx.try_recv() {
                Ok(event) => return Ok(event),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let ReadBy::Callers { end, .. } = &mut *read_by else {
                drop(read_by);
                return match deadline {
                    None => rx.recv().map_err(gone),
                    Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
                };
            };
            let Some(mut taken) = end.take() else {
                // Another waiter is reading: its frame may be this one's.
                read_by = match deadline {
                    None => self.turn_over.wait(read_by).map_err(gone)?,
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(RecvTimeoutError::Timeout);
                        }
                        self.turn_over.wait_timeout(read_by, left).map_err(gone)?.0
                    }
                };
                continue;
            };
            drop(read_by);
            let read = match deadline {
                Some(d) if taken.buffer().is_empty() && !readable_by(taken.get_ref(), d) => None,
                _ => Some(read_one(&mut taken, &self.shared)),
            };
            read_by = self.read_by.lock().map_err(gone)?;
            let timed_out = read.is_none();
            match read {
                Some(Err(why)) => {
                    // The guest is gone (or said goodbye): every waiter hears.
                    *read_by = ReadBy::Thread;
                    finish(&self.shared, why.to_string(), None);
                }
                Some(Ok(())) | None => self.end_turn(&mut read_by, taken),
            }
            self.turn_over.notify_all();
            if timed_out {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }

    /// Puts the guest's end back for the next waiter, or gives it to a
    /// reader thread if one is wanted.
    fn end_turn(&self, read_by: &mut ReadBy, end: BufReader<UnixStream>) {
        match read_by {
            ReadBy::Callers {
                thread_wanted: true,
                ..
            } => {
                *read_by = ReadBy::Thread;
                self.spawn_reader(end);
            }
            ReadBy::Callers { end: slot, .. } => *slot = Some(end),
            ReadBy::Thread => {}
        }
    }

    /// Starts the reader thread on `end`. If it cannot start, nothing can
    /// read the guest any more, and every waiter is told so.
    fn spawn_reader(&self, end: BufReader<UnixStream>) {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("hako-{}-guest", self.backend))
            .spawn(move || read_events(end, &shared, None));
        match spawned {
            Ok(handle) => {
                if let Ok(mut reader) = self.reader.lock() {
                    *reader = Some(handle);
                }
            }
            Err(e) => finish(
                &self.shared,
                format!("cannot start the guest reader: {e}"),
                None,
            ),
        }
    }

    /// Has a reader thread take over from the waiting threads: from here
    /// on frames arrive while nobody waits (a long-lived process's output,
    /// a session's end). If a waiting thread is reading, it starts the
    /// thread when its frame is in.
    fn start_reader_thread(&self) {
        let Ok(mut read_by) = self.read_by.lock() else {
            return;
        };
        if let ReadBy::Callers { end, thread_wanted } = &mut *read_by {
            match end.take() {
                Some(end) => {
                    *read_by = ReadBy::Thread;
                    self.spawn_reader(end);
                }
                None => *thread_wanted = true,
            }
        }
    }

    /// The guest's end, taken from the waiting threads for good once none
    /// of them reads it; `None` where a reader thread has it.
    fn take_end(&self) -> Option<BufReader<UnixStream>> {
        let mut read_by = self.read_by.lock().ok()?;
        loop {
            match &mut *read_by {
                ReadBy::Thread => return None,
                ReadBy::Callers { end, .. } => {
                    if let Some(end) = end.take() {
                        *read_by = ReadBy::Thread;
                        return Some(end);
                    }
                }
            }
            read_by = self.turn_over.wait(read_by).ok()?;
        }
    }

    fn lock(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Table>> {
        self.shared
            .table
            .lock()
            .map_err(|_| backend_err(self.backend, op, "lock poisoned"))
    }

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
    fn output(
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
                    return Err(backend_err(self.backend, "run command", why));
                }
                Err(_) => {
                    return Err(backend_err(
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
                SpawnFailure::Other => backend_err(self.backend, "start command", message),
            }),
            FromGuest::Failed { message, .. } | FromGuest::Refused { message } => {
                Err(backend_err(self.backend, "run command", message))
            }
            other => Err(backend_err(
                self.backend,
                "run command",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }

    /// Waits for the one reply to a request.
    fn reply(&self, rx: &mpsc::Receiver<Event>, op: &'static str) -> Result<FromGuest> {
        loop {
            match self.next_event(rx, None) {
                Ok(Event::Done(msg)) => return Ok(msg),
                Ok(Event::Output { .. }) => {}
                Ok(Event::Gone(why)) => return Err(backend_err(self.backend, op, why)),
                Err(_) => {
                    return Err(backend_err(
                        self.backend,
                        op,
                        "the connection to hako-guest ended",
                    ))
                }
            }
        }
    }

    /// Starts a shell session in `cwd` with the complete environment `env`;
    /// returns its id.
    pub fn open_session(&self, env: Vec<(String, String)>, cwd: ExecCwd) -> Result<u64> {
        // A session may end on its own, with nobody waiting.
        self.start_reader_thread();
        let (id, rx) = self.register("open a session")?;
        if let Ok(mut table) = self.shared.table.lock() {
            table.sessions_opened += 1;
        }
        let (cwd, fd) = cwd.split();
        let request = SessionRequest {
            id,
            shell: None,
            env,
            cwd,
        };
        if let Err(err) = self.send(&Frame::Message(ToGuest::OpenSession(request)), fd.as_ref()) {
            self.unregister(id);
            return Err(err);
        }
        drop(fd);
        match self.reply(&rx, "open a session")? {
            FromGuest::SessionOpened { .. } => Ok(id),
            FromGuest::Failed { message, .. } => {
                Err(backend_err(self.backend, "open a session", message))
            }
            other => Err(backend_err(
                self.backend,
                "open a session",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }

    /// Runs `script` in session `session`.
    pub fn session_exec(
        &self,
        session: u64,
        script: String,
        command: &Command,
        max_output: usize,
        sink: Option<&mut OutputSink<'_>>,
    ) -> Result<Output> {
        let (id, rx) = self.register("run command")?;
        let start = Instant::now();
        let request = SessionExecRequest {
            id,
            session,
            script,
            timeout_ms: timeout_ms(command),
            max_output: max_output as u64,
        };
        if let Err(err) = self.send(&Frame::Message(ToGuest::SessionExec(request)), None) {
            self.unregister(id);
            return Err(err);
        }
        self.output(&rx, command, max_output, sink, start)
            .map_err(|err| session_error(session, err))
    }

    /// Ends session `session`; fine for one that has ended.
    pub fn close_session(&self, session: u64) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        {
            let mut table = self.lock("close a session")?;
            if table.gone.is_some() {
                // The guest, and every session with it, is gone.
                return Ok(());
            }
            table.waiting.insert(session, tx);
        }
        if let Err(err) = self.send(&Frame::Message(ToGuest::CloseSession { id: session }), None) {
            self.unregister(session);
            return Err(err);
        }
        match self.reply(&rx, "close a session")? {
            FromGuest::SessionEnded { .. } => Ok(()),
            other => Err(backend_err(
                self.backend,
                "close a session",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }

    /// Starts a long-lived process and returns its id at once; its output
    /// and end are kept (see [`crate::processes`]).
    pub fn spawn(&self, exec: Exec<'_>, options: &SpawnOptions) -> Result<u64> {
        let Exec {
            argv,
            env,
            cwd,
            command,
            ..
        } = exec;
        // Its output and end come while nobody waits.
        self.start_reader_thread();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut table = self.lock("start a process")?;
            if let Some(why) = &table.gone {
                return Err(backend_err(self.backend, "start a process", why.clone()));
            }
            table.procs.map.insert(
                id,
                Proc::new(
                    argv.clone(),
                    options.tags.clone(),
                    options.ring_bytes,
                    options.live_stdin || options.pty.is_some(),
                    options.pty.is_some(),
                ),
            );
        }
        let (cwd, fd) = cwd.split();
        let request = ExecRequest {
            id,
            argv,
            env,
            cwd,
            timeout_ms: timeout_ms(command),
            stdin: command.stdin.is_some() || options.live_stdin || options.pty.is_some(),
            // Everything is forwarded; the rings bound what is kept.
            max_output: u64::MAX,
            pty: options.pty.map(|size| (size.rows, size.cols)),
        };
        let sent = self
            .send(&Frame::Message(ToGuest::Exec(request)), fd.as_ref())
            .and_then(|()| {
                if let Some(data) = command.stdin.as_deref() {
                    self.send_stdin(id, data)?;
                }
                if command.stdin.is_some() && !options.live_stdin && options.pty.is_none() {
                    self.send(&Frame::Message(ToGuest::CloseStdin { id }), None)?;
                }
                Ok(())
            });
        if let Err(err) = sent {
            if let Ok(mut table) = self.shared.table.lock() {
                table.procs.map.remove(&id);
            }
            return Err(err);
        }
        Ok(id)
    }

    fn send_stdin(&self, id: u64, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            self.send(
                &Frame::Stdin {
                    id,
                    data: chunk.to_vec(),
                },
                None,
            )?;
        }
        Ok(())
    }

    /// Waits, up to `deadline`, until `ready` holds for process `id`, and
    /// returns what `then` makes of it.
    fn with_proc<T>(
        &self,
        id: u64,
        op: &'static str,
        deadline: Option<Instant>,
        ready: impl Fn(&Proc) -> bool,
        then: impl FnOnce(&mut Proc) -> T,
    ) -> Result<T> {
        let mut table = self.lock(op)?;
        loop {
            let proc = table
                .procs
                .map
                .get_mut(&id)
                .ok_or(Error::NoSuchProcess { process: id })?;
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if ready(proc) || timed_out {
                return Ok(then(proc));
            }
            table = match deadline {
                None => self
                    .shared
                    .changed
                    .wait(table)
                    .map_err(|_| backend_err(self.backend, op, "lock poisoned"))?,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    self.shared
                        .changed
                        .wait_timeout(table, left)
                        .map_err(|_| backend_err(self.backend, op, "lock poisoned"))?
                        .0
                }
            };
        }
    }

    /// Up to `max` bytes of a process's stream from `offset`, waiting up to
    /// `wait` for bytes past `offset` or the end.
    pub fn read_output(
        &self,
        id: u64,
        stream: Stream,
        offset: u64,
        max: usize,
        wait: Option<Duration>,
    ) -> Result<OutputSlice> {
        let s = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        let deadline = Some(Instant::now() + wait.unwrap_or(Duration::ZERO));
        self.with_proc(
            id,
            "read process output",
            deadline,
            |p| p.rings[s].end() > offset || p.finished(),
            |p| p.slice(s, offset, max),
        )
    }

    /// Writes to a process's live stdin.
    pub fn write_stdin(&self, id: u64, data: &[u8]) -> Result<()> {
        let open = self.with_proc(id, "write stdin", None, |_| true, |p| p.stdin_open)?;
        if !open {
            return Err(backend_err(
                self.backend,
                "write stdin",
                format!("process {id} has no open stdin (it ended, its stdin was closed, or it was not started with a live stdin)"),
            ));
        }
        self.send_stdin(id, data)
    }

    /// Ends a process's stdin.
    pub fn close_stdin(&self, id: u64) -> Result<()> {
        let was_open = self.with_proc(
            id,
            "close stdin",
            None,
            |_| true,
            |p| std::mem::replace(&mut p.stdin_open, false),
        )?;
        if was_open {
            self.send(&Frame::Message(ToGuest::CloseStdin { id }), None)?;
        }
        Ok(())
    }

    /// Sets the size of a process's terminal.
    pub fn resize(&self, id: u64, size: TermSize) -> Result<()> {
        let tty = self.with_proc(id, "resize a terminal", None, |_| true, |p| p.tty)?;
        if !tty {
            return Err(backend_err(
                self.backend,
                "resize a terminal",
                format!("process {id} has no terminal"),
            ));
        }
        self.send(
            &Frame::Message(ToGuest::Resize {
                id,
                rows: size.rows,
                cols: size.cols,
            }),
            None,
        )
    }

    /// Waits up to `wait` (forever with `None`) for a process to end.
    pub fn wait(&self, id: u64, wait: Option<Duration>) -> Result<ProcessState> {
        let deadline = wait.map(|w| Instant::now() + w);
        self.with_proc(id, "wait for a process", deadline, Proc::finished, |p| {
            p.state(id)
        })
    }

    /// Kills a process's tree; nothing for one that has ended.
    pub fn kill(&self, id: u64) -> Result<()> {
        let running = self.with_proc(id, "kill a process", None, |_| true, |p| !p.finished())?;
        if running {
            self.send(&Frame::Message(ToGuest::Kill { id }), None)?;
        }
        Ok(())
    }

    /// Every process remembered, oldest first.
    pub fn list(&self) -> Result<Vec<ProcessState>> {
        let table = self.lock("list processes")?;
        Ok(table.procs.map.iter().map(|(id, p)| p.state(*id)).collect())
    }

    /// Whether a process of this sandbox is still running.
    pub fn any_process_running(&self) -> bool {
        self.shared
            .table
            .lock()
            .map(|t| t.procs.any_running())
            .unwrap_or(false)
    }

    /// Ends the sandbox: the guest kills every command (each still gets its
    /// result, killed), then exits; with it, a `linux` sandbox's pid 1 and
    /// so everything in its namespaces. Idempotent.
    pub fn close(&self) {
        if let Ok(mut writer) = self.writer.lock() {
            writer.close_write();
        }
        // Read by waiting threads until now: this one takes the guest's
        // last words, to its end (after the turn of any reading now).
        if let Some(end) = self.take_end() {
            read_events(end, &self.shared, None);
        }
        let reader = self.reader.lock().ok().and_then(|mut r| r.take());
        if let Some(reader) = reader {
            // A container's guest ends within moments of its stdin closing;
            // one that does not (a wedged runtime) is cut off by killing
            // its client, whose end of the pipe then closes.
            let piped = self
                .child
                .lock()
                .is_ok_and(|c| matches!(*c, Some(GuestProcess::Piped(_))));
            if piped {
                let start = Instant::now();
                while !reader.is_finished() && start.elapsed() < PIPED_EXIT_GRACE {
                    std::thread::sleep(Duration::from_millis(2));
                }
                if !reader.is_finished() {
                    if let Some(child) = self.child.lock().ok().as_mut().and_then(|c| c.as_mut()) {
                        child.kill();
                    }
                }
            }
            let _ = reader.join();
        }
        let child = self.child.lock().ok().and_then(|mut c| c.take());
        if let Some(mut child) = child {
            if self.said_bye() && !matches!(child, GuestProcess::Piped(_)) {
                // Everything of the sandbox is gone but the guest's own
                // exit (and, for linux, the kernel's teardown of the
                // namespaces): reap it off the caller's path.
                if !child.try_reap() {
                    reap_later(child);
                }
            } else if child.wait() {
                self.exited_cleanly.store(true, Ordering::Release);
            }
        }
    }

    /// Ends the sandbox as [`close`](Self::close) does, for a process that
    /// exits next (see [`ExitFollowsClose`](crate::ExitFollowsClose)) and has nothing to tear down
    /// after the guest: tells the guest to end the sandbox and returns at
    /// once, leaving the guest's goodbye unread and its process to be
    /// adopted when this process exits. Every command this connection ran
    /// has been reported, and a command is reported only once its
    /// supervisor has killed and reaped its whole tree, so what is left
    /// runs no command's code: the guest itself and its idle helpers, which
    /// end on the closed connection (and a `linux` sandbox's pid 1 also
    /// when this process, its parent, exits). A guest reached through a
    /// runtime's client (a container) is closed and waited for as usual,
    /// unless `piped_too`: what the client leaves is removed by a process
    /// of its own (see `Launcher::cleans_up_after_itself`), and the closed
    /// stdin ends the container. Returns whether it left the guest so
    /// (`false`: it was closed and waited for).
    pub fn close_before_exit(&self, piped_too: bool) -> bool {
        let piped = self
            .child
            .lock()
            .is_ok_and(|c| matches!(*c, Some(GuestProcess::Piped(_))));
        let quiet = self.shared.table.lock().is_ok_and(|t| {
            t.waiting.is_empty() && !t.procs.any_running() && t.sessions_opened == 0
        });
        if (piped && !piped_too) || !quiet {
            self.close();
            return false;
        }
        if let Ok(mut writer) = self.writer.lock() {
            writer.shut();
        }
        // Not joined, not reaped: a later `close` has nothing to wait for.
        drop(self.reader.lock().ok().and_then(|mut r| r.take()));
        if let Ok(mut read_by) = self.read_by.lock() {
            *read_by = ReadBy::Thread;
        }
        drop(self.child.lock().ok().and_then(|mut c| c.take()));
        true
    }

    /// Whether the guest's process has been waited for (by `close`) and
    /// exited with status 0.
    pub fn exited_cleanly(&self) -> bool {
        self.exited_cleanly.load(Ordering::Acquire)
    }

    fn said_bye(&self) -> bool {
        self.shared.table.lock().is_ok_and(|t| t.bye)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// The reader thread: hands every frame to the command it belongs to, and
/// tells every waiting command when the guest is gone.
fn read_events(
    mut ctl: BufReader<impl Read>,
    shared: &Shared,
    describe: Option<&(dyn Fn() -> String + Send + Sync)>,
) {
    let why = loop {
        if let Err(why) = read_one(&mut ctl, shared) {
            break why;
        }
    };
    finish(shared, why.to_string(), describe);
}

/// Why no more frames come from the guest (see [`read_one`]); told to
/// every command still waiting.
#[derive(Debug, thiserror::Error)]
enum LinkEnded {
    /// The guest said goodbye, or its end of the connection closed.
    #[error("the sandbox's guest ended")]
    GuestEnded,
    /// The guest sent what is not a frame of the protocol: nothing after
    /// it can be trusted to be one.
    #[error("the connection to the sandbox's guest failed: {0}")]
    Protocol(#[source] std::io::Error),
    /// Reading from the connection failed.
    #[error("the connection to the sandbox's guest failed: {0}")]
    Read(#[source] std::io::Error),
    /// A thread panicked while it held the connection's state.
    #[error("the connection's state is poisoned")]
    Poisoned,
}

/// Reads one frame from the guest and hands it to the command it belongs
/// to. `Err`: why no more come (the guest said goodbye, or is gone).
fn read_one(ctl: &mut impl BufRead, shared: &Shared) -> std::result::Result<(), LinkEnded> {
    let frame = match proto::read_any::<FromGuest>(ctl) {
        Ok(frame) => frame,
        Err(e) => {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => LinkEnded::GuestEnded,
                std::io::ErrorKind::InvalidData => LinkEnded::Protocol(e),
                _ => LinkEnded::Read(e),
            })
        }
    };
    let Ok(mut table) = shared.table.lock() else {
        return Err(LinkEnded::Poisoned);
    };
    if matches!(frame, Frame::Message(FromGuest::Bye {})) {
        table.bye = true;
        return Err(LinkEnded::GuestEnded);
    }
    match frame {
        Frame::Output {
            id, stream, data, ..
        } => {
            if let Some(tx) = table.waiting.get(&id) {
                let _ = tx.send(Event::Output { stream, data });
            } else if let Some(proc) = table.procs.map.get_mut(&id) {
                proc.output(stream_index(stream), &data);
                shared.changed.notify_all();
            }
        }
        Frame::Message(msg) => {
            let id = match &msg {
                FromGuest::Exited { id, .. }
                | FromGuest::SpawnFailed { id, .. }
                | FromGuest::SessionOpened { id }
                | FromGuest::SessionEnded { id, .. } => Some(*id),
                FromGuest::Failed { id, .. } => *id,
                FromGuest::Ready { .. } | FromGuest::Refused { .. } => Some(HELLO_ID),
                FromGuest::Bye {} => None,
            };
            if let Some(tx) = id.and_then(|id| table.waiting.remove(&id)) {
                let _ = tx.send(Event::Done(msg));
            } else if let Some(id) = id.filter(|id| table.procs.map.contains_key(id)) {
                if let Some(proc) = table.procs.map.get_mut(&id) {
                    match msg {
                        FromGuest::Exited {
                            status, timed_out, ..
                        } => {
                            proc.status = Some(status);
                            proc.timed_out = timed_out;
                        }
                        FromGuest::SpawnFailed { message, .. }
                        | FromGuest::Failed { message, .. } => proc.error = Some(message),
                        _ => {}
                    }
                    proc.stdin_open = false;
                }
                table.procs.ended(id);
                shared.changed.notify_all();
            } else {
                // A session whose shell ended on its own, or a stray.
                tracing::debug!("hako-guest: {msg:?}");
            }
        }
        Frame::Stdin { .. } => tracing::warn!("hako-guest sent a stdin frame"),
    }
    Ok(())
}

/// Tells every waiting command, and every long-lived process still
/// running, that the guest is gone and why.
fn finish(shared: &Shared, why: String, describe: Option<&(dyn Fn() -> String + Send + Sync)>) {
    // A guest that ended without saying goodbye: say what became of it.
    let bye = shared.table.lock().is_ok_and(|t| t.bye);
    let why = match describe {
        Some(describe) if !bye => format!("{why}: {}", describe()),
        _ => why,
    };
    if let Ok(mut table) = shared.table.lock() {
        for (_, tx) in table.waiting.drain() {
            let _ = tx.send(Event::Gone(why.clone()));
        }
        for proc in table.procs.map.values_mut() {
            if !proc.finished() {
                proc.error = Some(why.clone());
                proc.stdin_open = false;
            }
        }
        table.gone = Some(why);
    }
    shared.changed.notify_all();
}

/// Whether `socket` has something to read (or has ended) before
/// `deadline`.
fn readable_by(socket: &UnixStream, deadline: Instant) -> bool {
    use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(socket, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(hako_sys::rustix::io::Errno::INTR) => {}
            // Let the read say what is wrong.
            Err(_) => return true,
        }
    }
}

fn stream_index(stream: StreamId) -> usize {
    match stream {
        StreamId::Stdout => 0,
        StreamId::Stderr => 1,
    }
}

fn timeout_ms(command: &Command) -> Option<u64> {
    command
        .timeout
        .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

/// The guest's refusals of a session request as typed errors.
fn session_error(session: u64, err: Error) -> Error {
    if let Error::Backend { message, .. } = &err {
        if let Some(reason) = message
            .strip_prefix(&format!("session {session} is not open: "))
            .map(str::to_string)
        {
            return Error::SessionNotOpen { session, reason };
        }
        if message.starts_with(&format!("session {session} is busy")) {
            return Error::SessionBusy { session };
        }
    }
    err
}
