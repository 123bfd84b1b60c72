//! The long-lived guest: one connection, many commands.
//!
//! After the handshake the guest serves [`ToGuest`] requests until hako
//! closes the connection. Each command gets a **supervisor**: a fork of the
//! guest (no exec, so it costs a fork) that becomes the child subreaper of
//! the command's tree, enforces its deadline, and kills and reaps the whole
//! tree before it reports how the command ended (see
//! [`supervise`](crate::supervise)). A supervisor whose command has ended
//! has no child left and is kept, idle, for a later command: most commands
//! cost no fork but their own. The guest itself stays single-threaded
//! and never blocks on one command: it polls the connection, every
//! command's output pipes and supervisor sockets, and forwards output as
//! numbered frames, all of a command's output before its exit event.
//!
//! Closing the connection (or hako dying) stops every command the same way
//! [`ToGuest::Kill`] stops one, reports each, and ends the guest.
//!
//! This file is the loop: the [`Server`], what it polls, and which request
//! goes where. Each part of the work is a file of its own:
//!
//! - [`link`]: the connection to hako (a socket, or a pair of pipes);
//! - [`exec`]: one command, its stdin and its output, and its report;
//! - [`session`]: shell sessions and the commands run in them, and
//!   [`shell`], the lines the guest and a session's shell exchange;
//! - [`stream`]: output forwarded up to a cap, input written as it is read;
//! - [`terminal`]: pseudo-terminals, and Ctrl-C where the kernel does not
//!   signal it;
//! - [`pool`]: the supervisors as pid 1 sees them: idle ones, spares forked
//!   through the zygote, handing each its job;
//! - [`reap`]: the guest's children that end, and orphans of commands;
//! - [`memory`]: the memory limit's kills, which tell a command killed for
//!   memory (and, under gVisor, the watch that kills past the limit).

mod exec;
mod link;
pub(crate) mod memory;
mod pool;
mod reap;
mod session;
mod shell;
mod stream;
mod terminal;

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_sys::ns::SingleThreaded;
use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use hako_sys::rustix::pipe::{pipe_with, PipeFlags};
use hako_sys::rustix::process::{self as rproc, Pid, Signal};
use hako_sys::signal::{signum, SignalFd};

use crate::error::failed;
use crate::lockdown::Confinement;
use crate::proto::{self, Cwd, Decoded, Decoder, Frame, FromGuest, ToGuest, MAX_CHUNK};
use crate::zygote::Zygote;
use crate::{GuestError, GuestExit};

use exec::Exec;
pub use link::Link;
use session::Session;

/// How long the guest waits for its supervisors when it shuts down before
/// killing them outright.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often, while commands run, every supervisor is continued in case a
/// command stopped it and the notice was missed.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// How long a poll waits while output drains, a deadline is watched or
/// the guest closes.
const TICK: Duration = Duration::from_millis(20);
/// How often, while commands run, a guest that watches the memory limit
/// itself (gVisor, see [`memory`]) looks at the sandbox's memory.
const MEMORY_WATCH_EVERY: Duration = Duration::from_millis(5);
/// The most descriptors kept that came from hako and no request claimed.
const MAX_UNCLAIMED_FDS: usize = 8;

/// What differs between the guest of a `host` sandbox and pid 1 of a
/// `linux` one.
pub(crate) struct Mode {
    /// Applied to every command just before exec (`linux`).
    pub confinement: Option<Confinement>,
    /// Treat SIGINT, SIGTERM and SIGHUP as "stop everything" (not for pid 1,
    /// which the kernel shields from its namespace's signals anyway).
    pub stop_signals: bool,
    /// Accept a working directory passed as a descriptor. Never inside a
    /// `linux` sandbox: a host descriptor would lead out of its view.
    pub accept_fds: bool,
    /// The network forwarder (see [`forward`](crate::forward)): a child
    /// that is not a command's orphan.
    pub forwarder: Option<Pid>,
    /// How the memory limit's kills are counted (see [`memory`]); `None`
    /// with no memory limit.
    pub oom: Option<memory::Oom>,
}

/// What one poll slot watches.
#[derive(Clone, Copy)]
enum Slot {
    Ctl,
    Signals,
    /// Something of the command at this index in `execs`.
    Exec(usize, exec::Watch),
    /// Something of the session at this index in `sessions`.
    Session(usize, session::Watch),
}

/// What one poll watches: each slot beside its descriptor.
#[derive(Default)]
struct Polled<'a> {
    slots: Vec<Slot>,
    fds: Vec<PollFd<'a>>,
}

impl<'a> Polled<'a> {
    fn add(&mut self, slot: Slot, fd: &'a impl AsFd, flags: PollFlags) {
        self.slots.push(slot);
        self.fds.push(PollFd::new(fd, flags));
    }
}

struct Server<'a> {
    ctl: Link,
    ctl_open: bool,
    decoder: Decoder,
    /// Descriptors that came from hako, for the requests that name them.
    fds: VecDeque<OwnedFd>,
    execs: Vec<Exec>,
    sessions: Vec<Session>,
    proof: &'a SingleThreaded,
    mode: Mode,
    orphans: bool,
    buf: Vec<u8>,
    /// Supervisors waiting for a job: forked ahead of need (the fork is then
    /// off the path of the next command), or done with their last one.
    idle: Vec<(Pid, UnixStream)>,
    /// Where supervisors are forked from (see [`zygote`](crate::zygote));
    /// `None` once it is gone, until it is replaced.
    zygote: Option<Zygote>,
    /// When a spare last could not be had (see `spare_due`).
    spare_failed_at: Option<Instant>,
    /// When the last event was handled.
    last_event: Instant,
    /// Commands handed to supervisors so far.
    handoffs: u64,
    /// When supervisors were last continued (see `continue_supervisors`).
    last_sweep: Instant,
    /// Supervisors here cannot be subreapers (old gVisor): a command's
    /// orphans come to this process, pid 1, instead.
    orphans_come_here: bool,
    /// Whether the kernel signals a terminal's foreground group when
    /// Ctrl-C is typed (asked once, at the first input to a terminal).
    kernel_tty_signals: Option<bool>,
}

/// Serves requests on `ctl` until it closes and every command has ended.
/// Returns the guest's exit code.
pub(crate) fn serve(ctl: Link, proof: &SingleThreaded, mode: Mode) -> GuestExit {
    let _ = hako_sys::set_child_subreaper();
    let watched: &[i32] = if mode.stop_signals {
        &[
            signum::SIGCHLD,
            signum::SIGINT,
            signum::SIGTERM,
            signum::SIGHUP,
        ]
    } else {
        &[signum::SIGCHLD]
    };
    let signals = match SignalFd::new(watched) {
        Ok(s) => s,
        Err(err) => {
            let err = failed("open signalfd")(err);
            let _ = ctl.write_frame(&FromGuest::Refused {
                message: err.to_string(),
                errno: err.errno(),
            });
            return GuestExit::Failed;
        }
    };
    // Before any command exists: the only fork of the guest while it
    // serves, besides a replacement once no command runs.
    let zygote = match Zygote::start(proof, &mode) {
        Ok(zygote) => zygote,
        Err(err) => {
            let _ = ctl.write_frame(&FromGuest::Refused {
                message: err.to_string(),
                errno: err.errno(),
            });
            return GuestExit::Failed;
        }
    };
    let mut server = Server {
        ctl,
        ctl_open: true,
        decoder: Decoder::default(),
        fds: VecDeque::new(),
        execs: Vec::new(),
        sessions: Vec::new(),
        proof,
        mode,
        orphans: false,
        buf: vec![0u8; MAX_CHUNK],
        idle: Vec::new(),
        zygote: Some(zygote),
        spare_failed_at: None,
        last_event: Instant::now(),
        handoffs: 0,
        last_sweep: Instant::now(),
        orphans_come_here: false,
        kernel_tty_signals: None,
    };
    server.send(&FromGuest::Ready {
        version: proto::VERSION,
    });
    // The first command comes right after Ready: have its supervisor
    // forked while hako reads Ready and sends it.
    // Forked here (no command exists before the first request is read),
    // which spares the zygote's forks on the way to the first command.
    let spare = crate::zygote::fork_first_supervisor(server.proof, &server.mode).ok();
    server.idle.extend(spare);
    server.run(&signals)
}

impl Server<'_> {
    fn run(&mut self, signals: &SignalFd) -> GuestExit {
        let mut closing_since: Option<Instant> = None;
        loop {
            if !self.ctl_open {
                let since = *closing_since.get_or_insert_with(Instant::now);
                for exec in &mut self.execs {
                    exec.kill();
                }
                for session in &mut self.sessions {
                    session.kill("the sandbox closed");
                }
                self.sessions.retain(|s| !s.gone());
                if self.execs.is_empty() && self.sessions.is_empty() {
                    break;
                }
                if since.elapsed() > SHUTDOWN_GRACE {
                    for exec in &self.execs {
                        let _ = rproc::kill_process(exec.supervisor, Signal::KILL);
                    }
                    for session in &self.sessions {
                        let _ = rproc::kill_process(session.supervisor, Signal::KILL);
                    }
                    break;
                }
            }
            if self.spare_due() {
                // Now, while nothing happens, rather than when a request
                // comes.
                let spare = self.fork_spare().ok();
                self.idle.extend(spare);
            }
            let ready = match self.wait(signals, closing_since.is_some()) {
                Ok(ready) => ready,
                Err(_) => break,
            };
            if !ready.is_empty() {
                self.last_event = Instant::now();
            }
            for (slot, events) in ready {
                self.handle(slot, events, signals);
            }
            self.watch_memory();
            self.finish_execs();
            self.tend_sessions();
            if self.last_sweep.elapsed() >= SWEEP_EVERY {
                self.continue_supervisors();
            }
        }
        // Whatever is left (a stuck supervisor, the idle ones, an orphan)
        // goes now; then hako need not wait for this process's own exit.
        self.kill_what_is_left();
        if let Ok(bytes) = proto::encode(&Frame::Message(FromGuest::Bye {})) {
            let _ = self.ctl.write_all(&bytes);
        }
        GuestExit::Success
    }

    /// The memory limit's kills so far (see [`memory`]).
    fn oom_count(&self) -> Option<u64> {
        self.mode.oom.as_ref()?.count()
    }

    /// Where the guest watches the memory limit itself: past it, kills the
    /// process of a command that uses the most (never one of the guest's
    /// own: its zygote, supervisors, forwarder).
    fn watch_memory(&mut self) {
        if !self.mode.oom.as_ref().is_some_and(memory::Oom::watches)
            || (self.execs.is_empty() && self.sessions.is_empty())
        {
            return;
        }
        let mut spared: Vec<Pid> = self.idle.iter().map(|(pid, _)| *pid).collect();
        spared.extend(self.execs.iter().map(|e| e.supervisor));
        spared.extend(self.sessions.iter().map(|s| s.supervisor));
        spared.extend(self.zygote.as_ref().map(Zygote::pid));
        spared.extend(self.mode.forwarder);
        if let Some(oom) = &mut self.mode.oom {
            oom.enforce(&spared);
        }
    }

    /// Polls everything and returns the slots with events.
    fn wait(&self, signals: &SignalFd, closing: bool) -> io::Result<Vec<(Slot, PollFlags)>> {
        let mut polled = Polled::default();
        if self.ctl_open {
            polled.add(Slot::Ctl, self.ctl.input(), PollFlags::IN);
        }
        polled.add(Slot::Signals, signals, PollFlags::IN);
        let mut draining = false;
        for (i, exec) in self.execs.iter().enumerate() {
            exec.watch(i, &mut polled);
            draining |= exec.finished();
        }
        for (i, session) in self.sessions.iter().enumerate() {
            session.watch(i, &mut polled);
            // A deadline to watch.
            draining |= session.has_deadline();
        }
        // Wake up to fork a spare supervisor once things are quiet.
        let spare_in = self.spare_in();
        // While commands run, wake up now and then to continue any of
        // their supervisors a command stopped (see `reap`), should the
        // notice of the stop have been missed.
        let sweep = (!self.execs.is_empty() || !self.sessions.is_empty())
            .then(|| SWEEP_EVERY.saturating_sub(self.last_sweep.elapsed()));
        let watch = (self.mode.oom.as_ref().is_some_and(memory::Oom::watches)
            && (!self.execs.is_empty() || !self.sessions.is_empty()))
        .then_some(MEMORY_WATCH_EVERY);
        let wait_for = if draining || closing {
            Some(TICK).into_iter().chain(watch).min()
        } else {
            spare_in.into_iter().chain(sweep).chain(watch).min()
        };
        let timeout = wait_for.map(|d| {
            Timespec::try_from(d).unwrap_or(Timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            })
        });
        let Polled { slots, mut fds } = polled;
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
        Ok(slots
            .into_iter()
            .zip(fds.iter().map(PollFd::revents))
            .filter(|(_, ev)| !ev.is_empty())
            .collect())
    }

    fn handle(&mut self, slot: Slot, events: PollFlags, signals: &SignalFd) {
        match slot {
            Slot::Ctl => self.receive(),
            Slot::Signals => {
                let stop = signals.drain().iter().any(|&s| s != signum::SIGCHLD);
                if stop {
                    self.ctl_open = false;
                }
                self.reap();
            }
            Slot::Exec(i, watch) => self.exec_event(i, watch, events),
            Slot::Session(i, watch) => self.session_event(i, watch, events),
        }
    }

    /// Sends a control message; a failure means hako is gone.
    fn send(&mut self, msg: &FromGuest) {
        if self.ctl_open || matches!(msg, FromGuest::Exited { .. } | FromGuest::Failed { .. }) {
            if let Ok(frame) = proto::encode(&Frame::Message(msg)) {
                if self.ctl.write_all(&frame).is_err() {
                    self.ctl_open = false;
                }
            }
        }
    }

    /// Sends an output frame; a failure means hako is gone.
    fn write_frame(&mut self, frame: &Frame<FromGuest>) {
        if let Ok(bytes) = proto::encode(frame) {
            if self.ctl.write_all(&bytes).is_err() {
                self.ctl_open = false;
            }
        }
    }

    /// Reads what hako sent (and any descriptors with it) and acts on every
    /// whole frame.
    fn receive(&mut self) {
        let received = if self.ctl.is_socket() {
            let mut space =
                [MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(4))];
            let mut ancillary = RecvAncillaryBuffer::new(&mut space);
            let received = recvmsg(
                self.ctl.input(),
                &mut [IoSliceMut::new(&mut self.buf)],
                &mut ancillary,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            );
            for message in ancillary.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = message {
                    if self.mode.accept_fds {
                        self.fds.extend(rights);
                    }
                }
            }
            // Descriptors nobody claimed are not kept for long.
            while self.fds.len() > MAX_UNCLAIMED_FDS {
                self.fds.pop_front();
            }
            received.map(|msg| msg.bytes)
        } else {
            // After poll said so: this read does not block.
            hako_sys::rustix::io::read(self.ctl.input(), &mut self.buf[..])
        };
        match received {
            Ok(0) => self.ctl_open = false,
            Ok(n) => {
                let bytes = self.buf[..n].to_vec();
                self.decoder.push(&bytes);
            }
            Err(Errno::AGAIN) | Err(Errno::INTR) => {}
            Err(_) => self.ctl_open = false,
        }
        loop {
            match self.decoder.next_frame::<ToGuest>() {
                Decoded::Incomplete => break,
                Decoded::Bad(message) => self.send(&FromGuest::Failed {
                    id: None,
                    message,
                    errno: None,
                }),
                Decoded::Frame(frame) => self.request(frame),
            }
        }
    }

    /// Whether a command or session already goes by `id`.
    fn id_in_use(&self, id: u64) -> bool {
        self.position(id).is_some() || self.sessions.iter().any(|s| s.uses_id(id))
    }

    /// Acts on one frame from hako.
    fn request(&mut self, frame: Frame<ToGuest>) {
        match frame {
            Frame::Message(ToGuest::Exec(request)) => {
                let id = request.id;
                if let Err(err) = self.start(request) {
                    self.report_failure(id, &err);
                }
            }
            Frame::Message(ToGuest::CloseStdin { id }) => self.close_stdin(id),
            Frame::Message(ToGuest::Resize { id, rows, cols }) => self.resize(id, rows, cols),
            Frame::Message(ToGuest::Kill { id }) => {
                if let Some(i) = self.position(id) {
                    self.execs[i].kill();
                }
            }
            Frame::Message(ToGuest::OpenSession(request)) => {
                let id = request.id;
                match self.open_session(request) {
                    Ok(()) => self.send(&FromGuest::SessionOpened { id }),
                    Err(err) => self.report_failure(id, &err),
                }
            }
            Frame::Message(ToGuest::SessionExec(request)) => {
                let id = request.id;
                if let Err(err) = self.session_exec(request) {
                    self.report_failure(id, &err);
                }
            }
            Frame::Message(ToGuest::CloseSession { id }) => self.close_session(id),
            Frame::Message(ToGuest::Hello(_)) => self.send(&FromGuest::Failed {
                id: None,
                message: "the handshake was already done".into(),
                errno: None,
            }),
            Frame::Stdin { id, data } => self.stdin(id, &data),
            Frame::Output { .. } => self.send(&FromGuest::Failed {
                id: None,
                message: "output frames go from the guest to hako, not back".into(),
                errno: None,
            }),
        }
    }

    /// Tells hako that request `id` failed, and why.
    fn report_failure(&mut self, id: u64, err: &GuestError) {
        self.send(&FromGuest::Failed {
            id: Some(id),
            message: err.to_string(),
            errno: err.errno(),
        });
    }

    /// Takes the working directory a request names (see [`take_cwd`]).
    fn take_cwd(&mut self, cwd: &Cwd) -> Result<Option<OwnedFd>, GuestError> {
        take_cwd(cwd, self.mode.accept_fds, &mut self.fds)
    }
}

/// Checks the working directory a request names, and takes its descriptor
/// from those that came from hako (the oldest first) for [`Cwd::Fd`]
/// (where `accept_fds`); an absolute path needs none.
fn take_cwd(
    cwd: &Cwd,
    accept_fds: bool,
    fds: &mut VecDeque<OwnedFd>,
) -> Result<Option<OwnedFd>, GuestError> {
    match cwd {
        Cwd::Fd if !accept_fds => Err(GuestError::CwdFdNotAccepted),
        Cwd::Fd => fds.pop_front().map(Some).ok_or(GuestError::CwdFdMissing),
        Cwd::Path(p) if !p.is_absolute() => Err(GuestError::CwdNotAbsolute { path: p.clone() }),
        Cwd::Path(_) => Ok(None),
    }
}

/// A pipe whose ends are both close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), GuestError> {
    pipe_with(PipeFlags::CLOEXEC).map_err(failed("create a pipe"))
}

pub(crate) fn dev_null() -> Result<OwnedFd, GuestError> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(failed("open /dev/null"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn some_fds(n: usize) -> VecDeque<OwnedFd> {
        (0..n).map(|_| dev_null().unwrap()).collect()
    }

    #[test]
    fn an_absolute_path_needs_no_descriptor() {
        let mut fds = some_fds(1);
        let got = take_cwd(&Cwd::Path("/work".into()), true, &mut fds).unwrap();
        assert!(got.is_none());
        assert_eq!(fds.len(), 1, "a path takes no descriptor");
    }

    #[test]
    fn a_relative_path_is_refused() {
        let err = take_cwd(&Cwd::Path("work".into()), true, &mut some_fds(0)).unwrap_err();
        assert!(matches!(err, GuestError::CwdNotAbsolute { .. }), "{err}");
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[test]
    fn a_descriptor_is_refused_where_none_is_accepted() {
        let mut fds = some_fds(1);
        let err = take_cwd(&Cwd::Fd, false, &mut fds).unwrap_err();
        assert!(matches!(err, GuestError::CwdFdNotAccepted), "{err}");
        assert_eq!(fds.len(), 1, "nothing is taken on a refusal");
    }

    #[test]
    fn a_descriptor_that_did_not_come_is_missing() {
        let err = take_cwd(&Cwd::Fd, true, &mut some_fds(0)).unwrap_err();
        assert!(matches!(err, GuestError::CwdFdMissing), "{err}");
    }

    #[test]
    fn descriptors_are_taken_oldest_first() {
        let mut fds = some_fds(2);
        let first = fds.front().map(AsRawFd::as_raw_fd);
        let got = take_cwd(&Cwd::Fd, true, &mut fds).unwrap().unwrap();
        assert_eq!(Some(got.as_raw_fd()), first);
        assert_eq!(fds.len(), 1);
    }
}
