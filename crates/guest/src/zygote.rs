//! The zygote: the one process the guest forks supervisors from.
//!
//! A fork holds every descriptor of the process it was forked from until
//! it closes them, and any process of its uid can stop it in that window
//! (`SIGSTOP`) and open them through `/proc/PID/fd`: under gVisor, which
//! honours neither "not dumpable" nor capabilities there, a command that
//! kills the idle supervisors and catches their replacements as they are
//! forked from the guest would hold the guest's link to hako (and other
//! commands' pipes). So the guest forks only when no command's process can
//! be alive: the zygote, before the first command, which keeps nothing but
//! its socket to the guest (and the Landlock ruleset a `linux` supervisor
//! enforces); the first supervisor, before the first request is read; and
//! a new zygote once every command has ended. Everything else the guest
//! needs forked, the zygote forks: each supervisor, on request, through
//! an intermediate that exits at once, so that it becomes the guest's
//! child (the guest reaps it, and is the parent a supervisor that cannot
//! be a subreaper relies on), its end of a new socket pair sent to the
//! guest with its pid; and the process that finds out how the kernel
//! treats a terminal's Ctrl-C.
//!
//! A zygote killed from inside is replaced only once no command runs;
//! until then a command that needs a new supervisor is refused, saying
//! so.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use hako_sys::ns::{self, Forked, SingleThreaded};
use hako_sys::rustix::process::{self as rproc, Pid, Signal};

use crate::error::failed;
use crate::lockdown::Confinement;
use crate::proto;
use crate::server::{dev_null, Mode};
use crate::supervise::spare;
use crate::{GuestError, GuestExit};

/// How long the guest waits for the zygote to answer before it counts it
/// as gone (a zygote a command stopped is continued first).
const REPLY_WITHIN: Duration = Duration::from_secs(5);

/// A request: fork a supervisor (answered with its pid and a socket).
const FORK_SUPERVISOR: u8 = 1;
/// A request: does the kernel signal a terminal's foreground group for
/// Ctrl-C? (Answered with one byte, 1 or 0.) Finding out forks a process
/// that holds a terminal; forked from the zygote, it holds nothing else.
const ASK_TTY_SIGNALS: u8 = 2;

/// The guest's handle on its zygote.
pub(crate) struct Zygote {
    pid: Pid,
    sock: UnixStream,
}

impl Zygote {
    /// Forks the zygote. Call only when no command's process is alive:
    /// until it has closed them, it holds every descriptor of the guest.
    pub(crate) fn start(proof: &SingleThreaded, mode: &Mode) -> Result<Zygote, GuestError> {
        let (mine, theirs) = UnixStream::pair().map_err(failed("create a socket pair"))?;
        let null = dev_null()?;
        match ns::fork_single_threaded(proof) {
            Err(err) => Err(failed("fork the supervisors' zygote")(err)),
            Ok(Forked::Child) => {
                let landlock = mode.confinement.as_ref().and_then(Confinement::landlock_fd);
                let code = match keep_only(&null, &theirs, landlock) {
                    Ok(()) => serve(proof, mode),
                    Err(_) => GuestExit::SupervisorDescriptors,
                };
                std::process::exit(code.into())
            }
            Ok(Forked::Parent(pid)) => {
                let pid = Pid::from_raw(pid).ok_or(GuestError::ZeroPid)?;
                mine.set_read_timeout(Some(REPLY_WITHIN))
                    .map_err(failed("set the zygote's reply timeout"))?;
                Ok(Zygote { pid, sock: mine })
            }
        }
    }

    /// The zygote's pid (a child of the guest).
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// A new supervisor, the guest's child: its pid and the guest's end of
    /// its socket. An error means the zygote is gone (or stuck, and now
    /// killed).
    pub(crate) fn fork_supervisor(&self) -> Result<(Pid, UnixStream), GuestError> {
        let (payload, mut fds) = self.ask(FORK_SUPERVISOR, "take a supervisor from the zygote")?;
        let pid = <[u8; 4]>::try_from(payload.as_slice())
            .ok()
            .and_then(|b| Pid::from_raw(i32::from_be_bytes(b)));
        if let [NO_SUPERVISOR, errno @ ..] = payload.as_slice() {
            // The zygote could not fork one (the sandbox or the machine is
            // out of processes or descriptors); it is still there.
            if let (Ok(errno), true) = (<[u8; 4]>::try_from(errno), fds.is_empty()) {
                return Err(GuestError::NoSupervisor {
                    source: std::io::Error::from_raw_os_error(i32::from_be_bytes(errno)),
                });
            }
        }
        match (pid, fds.pop(), fds.is_empty()) {
            (Some(pid), Some(sock), true) => Ok((pid, UnixStream::from(sock))),
            _ => {
                let _ = rproc::kill_process(self.pid, Signal::KILL);
                Err(GuestError::BadHandoff {
                    what: "the zygote's answer",
                    source: None,
                })
            }
        }
    }
}

impl Zygote {
    /// Whether the kernel signals a terminal's foreground group for the
    /// Ctrl-C typed at it (gVisor before 2023 does not), found out by the
    /// zygote.
    pub(crate) fn kernel_sends_tty_signals(&self) -> Result<bool, GuestError> {
        let (payload, _) = self.ask(ASK_TTY_SIGNALS, "ask the zygote about terminals")?;
        Ok(payload.first() == Some(&1))
    }

    /// Sends `request` and reads the one frame that answers it; a zygote
    /// that does not answer in time is killed.
    fn ask(&self, request: u8, op: &'static str) -> Result<(Vec<u8>, Vec<OwnedFd>), GuestError> {
        // Stopped by a command, it would never answer.
        let _ = rproc::kill_process(self.pid, Signal::CONT);
        let answer = (&self.sock)
            .write_all(&[request])
            .map_err(failed(op))
            .and_then(|()| proto::recv_with_fds(&self.sock).map_err(failed(op)));
        if answer.is_err() {
            let _ = rproc::kill_process(self.pid, Signal::KILL);
        }
        answer
    }
}

/// The first supervisor, forked by the guest itself, which saves the
/// zygote's two forks on the way to the first command. Call only before
/// the guest has read its first request: no command can exist yet, and the
/// supervisor closes what it inherited before it takes a job.
pub(crate) fn fork_first_supervisor(
    proof: &SingleThreaded,
    mode: &Mode,
) -> Result<(Pid, UnixStream), GuestError> {
    let (mine, theirs) = UnixStream::pair().map_err(failed("create a socket pair"))?;
    let null = dev_null()?;
    match ns::fork_single_threaded(proof) {
        Err(err) => Err(failed("fork a supervisor")(err)),
        Ok(Forked::Child) => {
            let landlock = mode.confinement.as_ref().and_then(Confinement::landlock_fd);
            std::process::exit(become_supervisor(&null, &theirs, landlock, mode).into())
        }
        Ok(Forked::Parent(pid)) => {
            let pid = Pid::from_raw(pid).ok_or(GuestError::ZeroPid)?;
            Ok((pid, mine))
        }
    }
}

/// In a fresh fork: keeps only `/dev/null` as stdio, `socket` at 3 and the
/// Landlock ruleset at 4 (a `linux` supervisor enforces it on itself);
/// every other descriptor it inherited is closed.
fn keep_only(
    null: &OwnedFd,
    socket: &UnixStream,
    landlock: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let mut fds = vec![null.as_fd(), null.as_fd(), null.as_fd(), socket.as_fd()];
    fds.extend(landlock);
    hako_sys::spawn::install_fds_close_rest(&fds)
}

/// In a fresh fork: [`keep_only`], then serves as a supervisor.
fn become_supervisor(
    null: &OwnedFd,
    socket: &UnixStream,
    landlock: Option<std::os::fd::BorrowedFd<'_>>,
    mode: &Mode,
) -> GuestExit {
    match keep_only(null, socket, landlock) {
        Ok(()) => spare(mode),
        Err(_) => GuestExit::SupervisorDescriptors,
    }
}

/// The zygote's loop: one answer per request byte read from the guest,
/// until the guest closes its end.
fn serve(proof: &SingleThreaded, mode: &Mode) -> GuestExit {
    let Ok(sock) = hako_sys::take_inherited_fd(3) else {
        return GuestExit::SupervisorSocket;
    };
    let mut sock = UnixStream::from(sock);
    let landlock: Option<OwnedFd> =
        match mode.confinement.as_ref().and_then(Confinement::landlock_fd) {
            Some(_) => match hako_sys::take_inherited_fd(4) {
                Ok(fd) => Some(fd),
                Err(_) => return GuestExit::SupervisorLandlock,
            },
            None => None,
        };
    let mut byte = [0u8; 1];
    loop {
        match sock.read(&mut byte) {
            Ok(1) => {}
            Ok(_) => return GuestExit::Success,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return GuestExit::Success,
        }
        if byte[0] == ASK_TTY_SIGNALS {
            let yes = hako_sys::tty::kernel_sends_tty_signals(proof).unwrap_or(true);
            let mut frame = 1u32.to_be_bytes().to_vec();
            frame.push(u8::from(yes));
            if (&sock).write_all(&frame).is_err() {
                return GuestExit::Success;
            }
            continue;
        }
        let made = UnixStream::pair().and_then(|pair| {
            std::fs::File::open("/dev/null").map(|null| (pair, OwnedFd::from(null)))
        });
        let ((guests, theirs), null) = match made {
            Ok(made) => made,
            Err(err) => {
                // Out of descriptors, say: the guest is told why, and the
                // zygote stays for the next request.
                if could_not_fork(&sock, &err).is_err() {
                    return GuestExit::Success;
                }
                continue;
            }
        };
        // Through an intermediate that exits at once: the supervisor is
        // then an orphan, and orphans go to the guest (the sandbox's init,
        // or the subreaper it made itself), which reaps it as its child and
        // is the parent a supervisor that cannot be a subreaper relies on.
        // (`CLONE_PARENT` would save the fork, but gVisor ignores it.)
        match ns::fork_single_threaded(proof) {
            Err(err) => {
                // Out of processes, say: as above.
                if could_not_fork(&sock, &err).is_err() {
                    return GuestExit::Success;
                }
            }
            Ok(Forked::Child) => {
                let code = intermediate(
                    proof,
                    mode,
                    &sock,
                    &guests,
                    &theirs,
                    &null,
                    landlock.as_ref(),
                );
                std::process::exit(code.into())
            }
            Ok(Forked::Parent(pid)) => {
                drop((guests, theirs, null));
                let Some(pid) = Pid::from_raw(pid) else {
                    return GuestExit::Failed;
                };
                // It exits once it has answered the guest; stopped by a
                // command, it is continued.
                loop {
                    match rproc::waitpid(Some(pid), rproc::WaitOptions::UNTRACED) {
                        Err(hako_sys::rustix::io::Errno::INTR) => {}
                        Ok(Some((_, status))) if status.stopped() => {
                            let _ = rproc::kill_process(pid, Signal::CONT);
                        }
                        _ => break,
                    }
                }
            }
        }
    }
}

/// The first byte of the answer to a request for a supervisor that could
/// not be forked (a pid's answer is four bytes, this one five).
const NO_SUPERVISOR: u8 = 0xff;

/// Answers a request for a supervisor that could not be forked:
/// [`NO_SUPERVISOR`], then the OS error's number (4 bytes, big-endian),
/// and no descriptor.
fn could_not_fork(sock: &UnixStream, err: &std::io::Error) -> std::io::Result<()> {
    let errno = err
        .raw_os_error()
        .unwrap_or(hako_sys::rustix::io::Errno::AGAIN.raw_os_error());
    let mut frame = 5u32.to_be_bytes().to_vec();
    frame.push(NO_SUPERVISOR);
    frame.extend(errno.to_be_bytes());
    proto::send_with_fds(sock, &frame, &[])
}

/// The intermediate: forks the supervisor, tells the guest its pid (with
/// the guest's end of its socket) and exits.
fn intermediate(
    proof: &SingleThreaded,
    mode: &Mode,
    sock: &UnixStream,
    guests: &UnixStream,
    theirs: &UnixStream,
    null: &OwnedFd,
    landlock: Option<&OwnedFd>,
) -> GuestExit {
    let me = rproc::getpid();
    match ns::fork_single_threaded(proof) {
        Err(err) => {
            let _ = could_not_fork(sock, &err);
            GuestExit::Failed
        }
        Ok(Forked::Child) => {
            // The guest's child once the intermediate is gone.
            let until = std::time::Instant::now() + REPLY_WITHIN;
            while rproc::getppid() == Some(me) {
                if std::time::Instant::now() > until {
                    return GuestExit::Failed;
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            become_supervisor(null, theirs, landlock.map(AsFd::as_fd), mode)
        }
        Ok(Forked::Parent(pid)) => {
            // One frame: the pid (4 bytes, big-endian), with the guest's
            // end of the supervisor's socket.
            let mut frame = 4u32.to_be_bytes().to_vec();
            frame.extend(pid.to_be_bytes());
            match proto::send_with_fds(sock, &frame, &[guests.as_fd()]) {
                Ok(()) => GuestExit::Success,
                Err(_) => {
                    if let Some(pid) = Pid::from_raw(pid) {
                        let _ = rproc::kill_process(pid, Signal::KILL);
                    }
                    GuestExit::Failed
                }
            }
        }
    }
}
