//! The three ways a guest starts (an executed `hako-guest`, a fork of
//! this process, a container runtime's client), the handshake, and the
//! wait for the guest's first reply.

use std::io::BufReader;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use hako_core::{Error, Result};

use super::guest_process::{fork_guest, join_reapers, locate_guest, spawn_guest, GuestProcess};
use super::reader::{read_events, Event, ReadBy, ReaderEnd, Shared};
use super::wire::Wire;
use super::{backend_err, unless_exhausted, Connection, HELLO_ID, READ_BUF};
use crate::proto::{self, ConfineSpec, Frame, FromGuest, Hello, LinuxSpec, MemoryWatch, ToGuest};
use crate::InProcessGuest;

/// How long [`Connection::start`] waits for the guest to build the sandbox.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What a guest that hako starts itself builds or applies before it
/// serves: a `linux` sandbox around itself, or (serving where it is) the
/// confinement of its commands and how it tells a memory kill.
#[derive(Debug, Default)]
pub struct LocalPlan {
    /// Build this `linux` sandbox and serve from its pid 1.
    pub linux: Option<LinuxSpec>,
    /// Confine every command so (the `landlock` backend).
    pub confine: Option<ConfineSpec>,
    /// How the memory limit's kills are counted, for a guest that serves
    /// where it is.
    pub memory: Option<MemoryWatch>,
}

impl Connection {
    /// Starts the guest in `cwd`, has it build or apply what `plan` says
    /// (a `linux` sandbox, or the confinement of a guest that serves where
    /// it is), and returns once it is ready to serve commands.
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
        plan: LocalPlan,
        in_process: Option<&InProcessGuest>,
        read_on_caller: bool,
    ) -> Result<Connection> {
        let LocalPlan {
            linux,
            confine,
            memory,
        } = plan;
        let (ctl, ctl_guest) = UnixStream::pair().map_err(|source| {
            unless_exhausted("create control socket", source, |source| Error::Io {
                op: "create control socket",
                source,
            })
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
                    let pid =
                        (in_process.spawn_linux_pid1)(spec, &ctl_guest, &proof).map_err(|e| {
                            // Pid 1 short of descriptors ends before it is
                            // released: say what it was short of.
                            let why = format!("{e}{}", descriptors_hint());
                            backend_err(backend, "start the sandbox", why)
                        })?;
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
                GuestProcess::Forked(spawn_guest(backend, &path, cwd, ctl_guest)?)
            }
        };
        let hello = hello.then_some(Hello {
            version: proto::VERSION,
            linux,
            network: None,
            seal: None,
            memory,
            confine,
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
        memory: Option<proto::MemoryWatch>,
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
            memory,
            confine: None,
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
    pub(super) fn establish(
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
                // The runtime's client may have failed before reading
                // anything (gVisor's host view that cannot mount what it
                // was asked to): what it said is the reason.
                let said = describe
                    .as_ref()
                    .map(|describe| format!("; {}", describe()))
                    .unwrap_or_default();
                return failed(
                    wire,
                    child,
                    format!(
                        "hako-guest ended without a reply: {e}{said}{}",
                        descriptors_hint()
                    ),
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
                        let why = format!("cannot start the guest reader: {e}");
                        return failed(wire, child, why)
                            .map_err(|other| unless_exhausted("start the sandbox", e, |_| other));
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
            exited_cleanly: AtomicBool::new(false),
        };
        // Building a sandbox takes milliseconds (a container, under a
        // second); a guest that says nothing for this long is stuck, and
        // the caller must not hang with it.
        let mut errno = None;
        let why = match connection.next_event(&rx, Some(START_TIMEOUT)) {
            Ok(Event::Done(FromGuest::Ready { .. })) => return Ok(connection),
            Ok(Event::Done(FromGuest::Refused { message, errno: e })) => {
                errno = e;
                message
            }
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
        // The guest could not make a process, a namespace's or a
        // descriptor: when the machine is out of one, say which limit.
        let failure = || {
            backend_err(
                backend,
                "start the sandbox",
                format!("{why}{}", descriptors_hint()),
            )
        };
        match errno.map(std::io::Error::from_raw_os_error) {
            Some(err) => Err(unless_exhausted("start the sandbox", err, |_| failure())),
            None => Err(failure()),
        }
    }
}

/// How many more descriptors than it has open this process needs to start
/// a sandbox: the guest's channel and pipes, its pool of supervisors, a
/// command's stdio.
const DESCRIPTORS_TO_START: u64 = 32;

/// When this process has fewer descriptors left than a sandbox needs to
/// start, the likely reason a start failed, to add to its error: the
/// guest, which inherits the limit, cannot open what it must and ends
/// without a word.
pub(crate) fn descriptors_hint() -> String {
    match hako_sys::rlimit::open_files() {
        Some((open, limit)) if limit.saturating_sub(open) < DESCRIPTORS_TO_START => format!(
            "; hako has too few file descriptors left to start a sandbox ({open} open, its limit is {limit}, RLIMIT_NOFILE): raise the limit (ulimit -n) or run fewer sandboxes in this process"
        ),
        _ => String::new(),
    }
}
