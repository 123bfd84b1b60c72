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
use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};
use hako_sys::signal::{signum, SignalFd};

use crate::confine::Confinement;
use crate::error::failed;
use crate::{GuestError, GuestExit};
use hako_core::ExitStatus;

use crate::proto::{
    self, Cwd, Decoded, Decoder, ExecRequest, Frame, FromGuest, RunReply, SessionExecRequest,
    SessionRequest, StreamId, ToGuest, MAX_CHUNK,
};
use crate::supervise::{self, CwdChoice, Job, RunOptions};
use crate::zygote::Zygote;

/// How long output may keep flowing after a command's tree is gone (only a
/// descriptor passed to a process outside the tree can keep a pipe open).
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long the guest waits for its supervisors when it shuts down before
/// killing them outright.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long the guest must have been quiet, with no idle supervisor, before
/// it forks a spare one: back-to-back requests (and a one-command sandbox)
/// never pay for one they do not use; a command after a pause finds one
/// ready.
const SPARE_AFTER: Duration = Duration::from_millis(2);
/// The same quiet spell while a command or session still runs: a spare
/// forked then competes for the CPU with the command's own start, which
/// under gVisor takes milliseconds of fork and exec (and a one-command
/// sandbox never uses the spare); a long-running command still gets one
/// for the commands that come while it runs.
const SPARE_WHILE_RUNNING_AFTER: Duration = Duration::from_millis(50);
/// Once this many commands have been handed out, the sandbox is one that
/// is used again and again: a spare is forked as soon as the last idle
/// supervisor is taken (while its command runs), not after a quiet spell.
const EAGER_SPARE_AFTER_HANDOFFS: u64 = 2;
/// How often, while commands run, every supervisor is continued in case a
/// command stopped it and the notice was missed.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// How long the guest waits after a spare supervisor could not be had
/// before it tries again.
const SPARE_RETRY: Duration = Duration::from_millis(100);
/// The most supervisors kept idle, for the commands to come, once their
/// command has ended (more run at once when as many commands do).
const MAX_IDLE_SUPERVISORS: usize = 4;
/// The most stdin a command may have queued in the guest.
const MAX_PENDING_STDIN: usize = 256 << 20;

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
}

/// One command in flight.
struct Exec {
    id: u64,
    supervisor: Pid,
    /// Our end of the supervisor's socket, until its reply is read.
    sup: Option<UnixStream>,
    /// Our end of the supervisor's socket once it has replied: it may be
    /// given the next command.
    reusable: Option<UnixStream>,
    killed: bool,
    stdin: Option<OwnedFd>,
    pending: VecDeque<u8>,
    close_stdin: bool,
    out: [Option<OwnedFd>; 2],
    /// The terminal's master side, for resizing.
    pty: Option<OwnedFd>,
    totals: [u64; 2],
    max_output: u64,
    reply: Option<RunReply>,
    supervisor_gone: bool,
    done_at: Option<Instant>,
}

impl Exec {
    fn finished(&self) -> bool {
        self.reply.is_some() || self.supervisor_gone
    }

    fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            if let Some(sup) = &self.sup {
                // End of file on its socket: the supervisor kills the tree
                // and replies.
                let _ = sup.shutdown(std::net::Shutdown::Write);
            }
        }
        self.stdin = None;
        self.pending.clear();
    }
}

/// The connection to hako: a socket (descriptors may travel with frames),
/// or a pair of pipes, the stdin and stdout of a guest started where no
/// socket reaches (a container's entrypoint, a VM's console).
pub struct Link {
    input: OwnedFd,
    output: OwnedFd,
    socket: bool,
}

impl Link {
    /// Over a connected socket.
    pub fn socket(stream: UnixStream) -> io::Result<Link> {
        let output = OwnedFd::from(stream.try_clone()?);
        Ok(Link {
            input: OwnedFd::from(stream),
            output,
            socket: true,
        })
    }

    /// Over two pipes (frames are read from `input`, written to `output`).
    pub fn pipes(input: OwnedFd, output: OwnedFd) -> Link {
        Link {
            input,
            output,
            socket: false,
        }
    }

    /// Writes all of `bytes`, blocking.
    pub fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match hako_sys::rustix::io::write(&self.output, bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads one whole control message, blocking (the handshake).
    pub fn read_frame<T: serde::de::DeserializeOwned>(&self) -> io::Result<T> {
        proto::read_frame(std::fs::File::from(self.input.try_clone()?))
    }

    /// Writes one control message.
    pub fn write_frame<T: serde::Serialize>(&self, msg: &T) -> io::Result<()> {
        self.write_all(&proto::encode(&Frame::Message(msg))?)
    }

    /// Whether this is a socket (descriptors can travel on it).
    pub fn is_socket(&self) -> bool {
        self.socket
    }

    /// The socket, for a guest that hands it to a sandbox's pid 1.
    pub fn into_socket(self) -> Option<UnixStream> {
        self.socket.then(|| UnixStream::from(self.input))
    }
}

/// What one poll slot watches.
#[derive(Clone, Copy)]
enum Slot {
    Ctl,
    Signals,
    Out(usize, usize),
    Sup(usize),
    Stdin(usize),
    SessionOut(usize, usize),
    SessionStatus(usize),
    SessionSup(usize),
    SessionStdin(usize),
}

struct Server<'a> {
    ctl: Link,
    ctl_open: bool,
    decoder: Decoder,
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
            let _ = ctl.write_frame(&FromGuest::Refused {
                message: failed("open signalfd")(err).to_string(),
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
            self.finish_execs();
            self.tend_sessions();
            if self.last_sweep.elapsed() >= SWEEP_EVERY {
                self.continue_supervisors();
            }
        }
        // Whatever is left (a stuck supervisor, the idle ones, an orphan)
        // goes now; then hako need not wait for this process's own exit.
        let helpers: Vec<Pid> = self
            .idle
            .drain(..)
            .map(|(pid, _)| pid)
            .chain(self.mode.forwarder)
            .chain(self.zygote.as_ref().map(Zygote::pid))
            .collect();
        if !self.kill_helpers_if_all_that_is_left(&helpers) {
            let mut status = None;
            supervise::kill_tree(None, &mut status);
        }
        if let Ok(bytes) = proto::encode(&Frame::Message(FromGuest::Bye {})) {
            let _ = self.ctl.write_all(&bytes);
        }
        GuestExit::Success
    }

    /// Polls everything and returns the slots with events.
    fn wait(&self, signals: &SignalFd, closing: bool) -> io::Result<Vec<(Slot, PollFlags)>> {
        let mut slots: Vec<Slot> = Vec::new();
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        if self.ctl_open {
            slots.push(Slot::Ctl);
            fds.push(PollFd::new(&self.ctl.input, PollFlags::IN));
        }
        slots.push(Slot::Signals);
        fds.push(PollFd::new(signals, PollFlags::IN));
        let mut draining = false;
        for (i, exec) in self.execs.iter().enumerate() {
            for (s, out) in exec.out.iter().enumerate() {
                if let Some(fd) = out {
                    slots.push(Slot::Out(i, s));
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
            }
            if let Some(sup) = &exec.sup {
                slots.push(Slot::Sup(i));
                fds.push(PollFd::new(sup, PollFlags::IN));
            }
            if let (Some(fd), false) = (&exec.stdin, exec.pending.is_empty()) {
                slots.push(Slot::Stdin(i));
                fds.push(PollFd::new(fd, PollFlags::OUT));
            }
            draining |= exec.finished();
        }
        for (i, session) in self.sessions.iter().enumerate() {
            for (s, out) in session.out.iter().enumerate() {
                if let Some(fd) = out {
                    slots.push(Slot::SessionOut(i, s));
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
            }
            if let Some(fd) = &session.status {
                slots.push(Slot::SessionStatus(i));
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
            if let Some(sup) = &session.sup {
                slots.push(Slot::SessionSup(i));
                fds.push(PollFd::new(sup, PollFlags::IN));
            }
            if let (Some(fd), false) = (&session.stdin, session.pending.is_empty()) {
                slots.push(Slot::SessionStdin(i));
                fds.push(PollFd::new(fd, PollFlags::OUT));
            }
            // A deadline to watch.
            draining |= session
                .current
                .as_ref()
                .is_some_and(|r| r.deadline.is_some());
        }
        let tick = Duration::from_millis(20);
        // Wake up to fork a spare supervisor once things are quiet.
        let spare_in = self.spare_in();
        // While commands run, wake up now and then to continue any of
        // their supervisors a command stopped (see `reap`), should the
        // notice of the stop have been missed.
        let sweep = (!self.execs.is_empty() || !self.sessions.is_empty())
            .then(|| SWEEP_EVERY.saturating_sub(self.last_sweep.elapsed()));
        let wait_for = if draining || closing {
            Some(tick)
        } else {
            spare_in.into_iter().chain(sweep).min()
        };
        let timeout = wait_for.map(|d| {
            Timespec::try_from(d).unwrap_or(Timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            })
        });
        let timeout = timeout.as_ref();
        match poll(&mut fds, timeout) {
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
            Slot::Out(i, s) => self.forward(i, s),
            Slot::Sup(i) => {
                let exec = &mut self.execs[i];
                if let Some(sup) = exec.sup.take() {
                    exec.reply = proto::read_frame(&sup).ok();
                    match exec.reply {
                        None => exec.supervisor_gone = true,
                        Some(RunReply::Finished { .. } | RunReply::SpawnFailed { .. }) => {
                            exec.reusable = Some(sup);
                        }
                        Some(RunReply::Refused { .. }) => {}
                    }
                }
            }
            Slot::Stdin(i) => {
                let exec = &mut self.execs[i];
                if events.intersects(PollFlags::ERR | PollFlags::HUP) {
                    exec.stdin = None;
                    exec.pending.clear();
                    return;
                }
                self.feed_stdin(i);
            }
            Slot::SessionOut(i, s) => self.session_output(i, s),
            Slot::SessionStatus(i) => self.session_status(i),
            Slot::SessionSup(i) => {
                let session = &mut self.sessions[i];
                if let Some(sup) = session.sup.take() {
                    let reply = proto::read_frame::<RunReply>(&sup).ok();
                    session.shell_ended(reply);
                }
            }
            Slot::SessionStdin(i) => {
                if events.intersects(PollFlags::ERR | PollFlags::HUP) {
                    let session = &mut self.sessions[i];
                    session.stdin = None;
                    session.pending.clear();
                    return;
                }
                self.sessions[i].feed();
            }
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

    /// Reads what hako sent (and any descriptors with it) and acts on every
    /// whole frame.
    fn receive(&mut self) {
        let received = if self.ctl.socket {
            let mut space =
                [MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(4))];
            let mut ancillary = RecvAncillaryBuffer::new(&mut space);
            let received = recvmsg(
                &self.ctl.input,
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
            while self.fds.len() > 8 {
                self.fds.pop_front();
            }
            received.map(|msg| msg.bytes)
        } else {
            // After poll said so: this read does not block.
            hako_sys::rustix::io::read(&self.ctl.input, &mut self.buf[..])
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
                Decoded::Bad(message) => self.send(&FromGuest::Failed { id: None, message }),
                Decoded::Frame(frame) => self.request(frame),
            }
        }
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.execs.iter().position(|e| e.id == id)
    }

    fn id_in_use(&self, id: u64) -> bool {
        self.position(id).is_some()
            || self
                .sessions
                .iter()
                .any(|s| s.id == id || s.current.as_ref().is_some_and(|r| r.id == id))
    }

    fn request(&mut self, frame: Frame<ToGuest>) {
        match frame {
            Frame::Message(ToGuest::Exec(request)) => {
                let id = request.id;
                if let Err(err) = self.start(request) {
                    self.report_failure(id, &err);
                }
            }
            Frame::Message(ToGuest::CloseStdin { id }) => {
                if let Some(i) = self.position(id) {
                    let exec = &mut self.execs[i];
                    exec.close_stdin = true;
                    if exec.pending.is_empty() {
                        exec.stdin = None;
                    }
                }
            }
            Frame::Message(ToGuest::Resize { id, rows, cols }) => {
                if let Some(fd) = self.position(id).and_then(|i| self.execs[i].pty.as_ref()) {
                    let _ = hako_sys::rustix::termios::tcsetwinsize(fd, winsize(rows, cols));
                }
            }
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
            Frame::Message(ToGuest::CloseSession { id }) => {
                match self.sessions.iter_mut().find(|s| s.id == id) {
                    Some(session) if session.reported => {
                        // It ended on its own earlier: say so again.
                        session.closing = true;
                        let message = session.ended.clone().unwrap_or_default();
                        self.send(&FromGuest::SessionEnded { id, message });
                    }
                    Some(session) => {
                        session.closing = true;
                        session.kill("closed");
                    }
                    // Unknown or long gone: closing it again is fine.
                    None => self.send(&FromGuest::SessionEnded {
                        id,
                        message: "not open".into(),
                    }),
                }
            }
            Frame::Message(ToGuest::Hello(_)) => self.send(&FromGuest::Failed {
                id: None,
                message: "the handshake was already done".into(),
            }),
            Frame::Stdin { id, data } => {
                let Some(i) = self.position(id) else { return };
                let exec = &mut self.execs[i];
                if exec.stdin.is_none() || exec.close_stdin {
                    return;
                }
                if exec.pending.len() + data.len() > MAX_PENDING_STDIN {
                    exec.stdin = None;
                    exec.pending.clear();
                    self.send(&FromGuest::Failed {
                        id: Some(id),
                        message: format!(
                            "more than {MAX_PENDING_STDIN} bytes of stdin queued; stdin closed"
                        ),
                    });
                    return;
                }
                exec.pending.extend(&data);
                self.feed_stdin(i);
                self.tty_signals(i, &data);
            }
            Frame::Output { .. } => self.send(&FromGuest::Failed {
                id: None,
                message: "output frames go from the guest to hako, not back".into(),
            }),
        }
    }

    /// Tells hako that request `id` failed, and why.
    fn report_failure(&mut self, id: u64, err: &GuestError) {
        self.send(&FromGuest::Failed {
            id: Some(id),
            message: err.to_string(),
        });
    }

    /// Takes the working directory a request names: a descriptor that came
    /// with it (where accepted) or an absolute path.
    fn take_cwd(&mut self, cwd: &Cwd) -> Result<Option<OwnedFd>, GuestError> {
        match cwd {
            Cwd::Fd if !self.mode.accept_fds => Err(GuestError::CwdFdNotAccepted),
            Cwd::Fd => self
                .fds
                .pop_front()
                .map(Some)
                .ok_or(GuestError::CwdFdMissing),
            Cwd::Path(p) if !p.is_absolute() => Err(GuestError::CwdNotAbsolute { path: p.clone() }),
            Cwd::Path(_) => Ok(None),
        }
    }

    /// Starts a command under a new supervisor.
    fn start(&mut self, request: ExecRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        if request.argv.first().is_none_or(String::is_empty) {
            return Err(GuestError::EmptyArgv);
        }
        let cwd_fd = self.take_cwd(&request.cwd)?;
        let job = Job {
            argv: request.argv.clone(),
            env: request.env.clone(),
            timeout_ms: request.timeout_ms,
            tty: request.pty.is_some(),
        };
        let (in_w, out, pty) = match request.pty {
            Some((rows, cols)) => {
                let (master, slave) = open_pty(rows, cols)?;
                let dup = |fd: &OwnedFd| {
                    fd.try_clone()
                        .map_err(failed("duplicate a terminal descriptor"))
                };
                let stdio = [dup(&slave)?, dup(&slave)?, slave];
                let (supervisor, sup) =
                    self.fork_supervisor(&job, &request.cwd, stdio, cwd_fd, None)?;
                // One open file for reading, writing and resizing; never
                // blocking (a command that does not read its terminal must
                // not stall the guest).
                let _ = hako_sys::rustix::io::ioctl_fionbio(&master, true);
                let writer = dup(&master)?;
                let resizer = dup(&master)?;
                (
                    Some(writer),
                    ([Some(master), None], supervisor, sup),
                    Some(resizer),
                )
            }
            None => {
                let (in_r, in_w) = if request.stdin {
                    let (r, w) = pipe()?;
                    (r, Some(w))
                } else {
                    (dev_null()?, None)
                };
                let (out_r, out_w) = pipe()?;
                let (err_r, err_w) = pipe()?;
                let (supervisor, sup) =
                    self.fork_supervisor(&job, &request.cwd, [in_r, out_w, err_w], cwd_fd, None)?;
                if let Some(w) = &in_w {
                    let _ = hako_sys::rustix::io::ioctl_fionbio(w, true);
                }
                (in_w, ([Some(out_r), Some(err_r)], supervisor, sup), None)
            }
        };
        let (out, supervisor, sup) = out;
        self.execs.push(Exec {
            id: request.id,
            supervisor,
            sup: Some(sup),
            reusable: None,
            killed: false,
            stdin: in_w,
            pending: VecDeque::new(),
            close_stdin: false,
            out,
            pty,
            totals: [0, 0],
            max_output: request.max_output,
            reply: None,
            supervisor_gone: false,
            done_at: None,
        });
        Ok(())
    }

    /// Sends SIGCONT to every supervisor, busy or idle: a no-op for one that
    /// runs; one a command stopped goes on (`reap` does the same when the
    /// kernel reports the stop; this is for a report that never came).
    fn continue_supervisors(&mut self) {
        self.last_sweep = Instant::now();
        let pids = self
            .execs
            .iter()
            .map(|e| e.supervisor)
            .chain(self.sessions.iter().map(|s| s.supervisor))
            .chain(self.idle.iter().map(|(p, _)| *p))
            .chain(self.zygote.as_ref().map(Zygote::pid));
        for pid in pids {
            let _ = rproc::kill_process(pid, Signal::CONT);
        }
    }

    /// At shutdown, as pid 1 of the sandbox's pid namespace: when the only
    /// children left are `helpers` (idle supervisors and the forwarder,
    /// which never run a command's code), kills them without waiting, and
    /// says whether it did. This process's own exit then waits for them
    /// (the kernel kills and reaps every process of the namespace before
    /// pid 1 is gone), off hako's path. Anything else left (an orphan of a
    /// command, a stuck supervisor) is for `kill_tree`, which waits.
    fn kill_helpers_if_all_that_is_left(&self, helpers: &[Pid]) -> bool {
        let me = rproc::getpid();
        if !me.is_init() {
            return false;
        }
        let only_helpers = hako_sys::proc::children_of(me)
            .is_ok_and(|children| children.iter().all(|c| helpers.contains(c)));
        if !only_helpers {
            return false;
        }
        for &pid in helpers {
            let _ = rproc::kill_process(pid, Signal::KILL);
        }
        true
    }

    /// How long the guest must have been quiet before it forks a spare.
    fn spare_quiet(&self) -> Duration {
        if self.execs.is_empty() && self.sessions.is_empty() {
            SPARE_AFTER
        } else {
            SPARE_WHILE_RUNNING_AFTER
        }
    }

    /// How long until a spare supervisor is due: once the guest has been
    /// quiet for `spare_quiet` (at once after `EAGER_SPARE_AFTER_HANDOFFS`
    /// handoffs), and not within `SPARE_RETRY` of a spare that could not
    /// be had. `None` while one is not wanted (one is idle, hako has
    /// closed) or cannot be had: the zygote is gone and commands run (it is
    /// replaced once they end), and trying would only spin.
    fn spare_in(&self) -> Option<Duration> {
        let can_fork = self.zygote.is_some() || (self.execs.is_empty() && self.sessions.is_empty());
        if !(self.idle.is_empty() && self.ctl_open && can_fork) {
            return None;
        }
        let quiet = if self.handoffs >= EAGER_SPARE_AFTER_HANDOFFS {
            Duration::ZERO
        } else {
            self.spare_quiet().saturating_sub(self.last_event.elapsed())
        };
        let retry = self.spare_failed_at.map_or(Duration::ZERO, |at| {
            SPARE_RETRY.saturating_sub(at.elapsed())
        });
        Some(quiet.max(retry))
    }

    /// Whether to fork a spare supervisor now.
    fn spare_due(&self) -> bool {
        self.spare_in() == Some(Duration::ZERO)
    }

    /// Hands `job` to a supervisor (an idle one, or one forked now) with
    /// `stdio` as the job's stdin, stdout and stderr (and `fd3` as its
    /// descriptor 3); returns its pid and our end of its socket. Our copies
    /// of the descriptors are closed here. An idle supervisor that cannot
    /// take it (killed from inside while it waited) is replaced by a new
    /// one.
    fn fork_supervisor(
        &mut self,
        job: &Job,
        cwd: &Cwd,
        stdio: [OwnedFd; 3],
        cwd_fd: Option<OwnedFd>,
        fd3: Option<OwnedFd>,
    ) -> Result<(Pid, UnixStream), GuestError> {
        let handoff = Handoff {
            job: job.clone(),
            cwd: cwd.clone(),
            cwd_fd: cwd_fd.is_some(),
            fd3: fd3.is_some(),
        };
        let encode = |handing: &Handing<&Handoff>| {
            proto::encode(&Frame::Message(handing))
                .map_err(failed("encode a command for its supervisor"))
        };
        let inline = encode(&Handing {
            handoff: Some(&handoff),
        })?;
        // A large job goes in a memfd, so that handing it over never
        // blocks the guest (a supervisor may have been stopped, see
        // `reap`, and a socket takes only so much unread).
        let (bytes, job_fd) = if inline.len() <= INLINE_HANDOFF {
            (inline, None)
        } else {
            (
                encode(&Handing { handoff: None })?,
                Some(job_memfd(&inline)?),
            )
        };
        let [a, b, c] = &stdio;
        let mut fds: Vec<_> = job_fd.as_ref().map(AsFd::as_fd).into_iter().collect();
        fds.extend([a.as_fd(), b.as_fd(), c.as_fd()]);
        fds.extend(cwd_fd.as_ref().map(AsFd::as_fd));
        fds.extend(fd3.as_ref().map(AsFd::as_fd));
        loop {
            let (pid, sock, forked) = match self.idle.pop() {
                Some((pid, sock)) => {
                    // Stopped while it waited, it would never take the job.
                    let _ = rproc::kill_process(pid, Signal::CONT);
                    (pid, sock, false)
                }
                None => {
                    let (pid, sock) = self.fork_spare()?;
                    (pid, sock, true)
                }
            };
            match proto::send_with_fds(&sock, &bytes, &fds) {
                Ok(()) => {
                    self.handoffs += 1;
                    return Ok((pid, sock));
                }
                Err(err) => {
                    let _ = rproc::kill_process(pid, Signal::KILL);
                    if forked {
                        return Err(failed("hand a command to its supervisor")(err));
                    }
                }
            }
        }
    }

    /// A supervisor that waits for its job on a socket; it holds nothing
    /// else (stdio on `/dev/null`, the socket at 3). Forked by the zygote;
    /// a zygote that is gone is replaced here only when no command's
    /// process is alive (see [`zygote`](crate::zygote)).
    fn fork_spare(&mut self) -> Result<(Pid, UnixStream), GuestError> {
        if self.zygote.is_none() {
            // A zygote that just died is reaped first, or it would count as
            // a process of a command.
            self.reap();
            if !self.no_command_alive() {
                self.spare_failed_at = Some(Instant::now());
                return Err(GuestError::ZygoteGone);
            }
            self.zygote = Some(Zygote::start(self.proof, &self.mode)?);
        }
        let got = match &self.zygote {
            Some(zygote) => zygote.fork_supervisor(),
            None => Err(GuestError::ZygoteGone),
        };
        if got.is_err() {
            // Killed by `fork_supervisor`, or dead already: reaped later.
            self.zygote = None;
            self.spare_failed_at = Some(Instant::now());
        }
        got
    }

    /// Whether no process of any command is alive: no command or session
    /// runs, and every child of the guest is an idle supervisor or the
    /// forwarder (neither runs a command's code nor holds more than its
    /// socket).
    fn no_command_alive(&self) -> bool {
        if !self.execs.is_empty() || !self.sessions.is_empty() {
            return false;
        }
        let known: Vec<Pid> = self
            .idle
            .iter()
            .map(|(p, _)| *p)
            .chain(self.mode.forwarder)
            .collect();
        hako_sys::proc::children_of(rproc::getpid())
            .is_ok_and(|children| children.iter().all(|c| known.contains(c)))
    }

    /// Reads a chunk of a command's output and forwards what is under the
    /// cap.
    fn forward(&mut self, i: usize, s: usize) {
        let exec = &mut self.execs[i];
        let Some(fd) = &exec.out[s] else { return };
        match hako_sys::rustix::io::read(fd, &mut self.buf[..]) {
            Ok(0) => exec.out[s] = None,
            Ok(n) => {
                let offset = exec.totals[s];
                exec.totals[s] += n as u64;
                if let Some(frame) = capped(exec.id, s, offset, &self.buf[..n], exec.max_output) {
                    self.write_frame(&frame);
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(_) => exec.out[s] = None,
        }
    }

    /// Where the kernel does not (gVisor before 2023), signals a terminal's
    /// foreground group for the Ctrl-C (and Ctrl-\\, Ctrl-Z) typed at it.
    fn tty_signals(&mut self, i: usize, typed: &[u8]) {
        if self.execs[i].pty.is_none() || !typed.iter().any(|&b| b < 0x20) {
            return;
        }
        // Found out by the zygote: finding out forks, and no fork of this
        // process may be alive while a command runs (see `zygote`).
        if self.kernel_tty_signals.is_none() {
            self.kernel_tty_signals = self
                .zygote
                .as_ref()
                .and_then(|z| z.kernel_sends_tty_signals().ok());
        }
        let by_kernel = self.kernel_tty_signals.unwrap_or(true);
        if let (false, Some(master)) = (by_kernel, self.execs[i].pty.as_ref()) {
            // The command is the supervisor's child and leads its session.
            let leader = hako_sys::proc::children_of(self.execs[i].supervisor)
                .ok()
                .and_then(|c| c.first().map(|p| p.as_raw_nonzero().get()));
            let _ = hako_sys::tty::send_tty_signals(master.as_fd(), typed, leader);
        }
    }

    /// Writes queued input into a command's stdin without blocking.
    fn feed_stdin(&mut self, i: usize) {
        let exec = &mut self.execs[i];
        feed(&mut exec.stdin, &mut exec.pending);
        if exec.close_stdin && exec.pending.is_empty() {
            exec.stdin = None;
        }
    }

    /// Reaps every child that ended: supervisors, and orphans re-parented
    /// to the guest.
    fn reap(&mut self) {
        while let Ok(Some((pid, status))) = rproc::wait(WaitOptions::NOHANG | WaitOptions::UNTRACED)
        {
            if status.stopped() {
                // A command may stop any process of its uid: a supervisor
                // stopped would enforce no deadline, and an idle one would
                // never take the next command. Whatever stopped it, it goes
                // on (every child of the guest is a supervisor, the
                // forwarder, or an orphan about to be killed).
                let _ = rproc::kill_process(pid, Signal::CONT);
                continue;
            }
            if self.zygote.as_ref().is_some_and(|z| z.pid() == pid) {
                // Killed from inside: replaced once no command runs.
                self.zygote = None;
                continue;
            }
            if let Some(at) = self.idle.iter().position(|(p, _)| *p == pid) {
                self.idle.swap_remove(at);
                continue;
            }
            if self.mode.forwarder == Some(pid) {
                // Killed from inside: the sandbox's proxy ports stop
                // answering; nothing else is affected.
                self.mode.forwarder = None;
                continue;
            }
            if let Some(session) = self.sessions.iter_mut().find(|s| s.supervisor == pid) {
                session.supervisor_reaped = true;
                if let Some(sup) = session.sup.take() {
                    let _ = sup.set_nonblocking(true);
                    let reply = proto::read_frame::<RunReply>(&sup).ok();
                    if reply.is_none() {
                        self.orphans = true;
                    }
                    if let Some(RunReply::Finished {
                        orphans_to_guest: true,
                        ..
                    }) = reply
                    {
                        self.orphans_come_here = true;
                    }
                    session.shell_ended(reply);
                }
                continue;
            }
            if let Some(exec) = self.execs.iter_mut().find(|e| e.supervisor == pid) {
                // Gone: it takes no other command.
                exec.reusable = None;
                if exec.sup.is_some() {
                    // It died before its reply was read; the reply may still
                    // be in the socket.
                    if let Some(sup) = exec.sup.take() {
                        let _ = sup.set_nonblocking(true);
                        exec.reply = proto::read_frame(&sup).ok();
                    }
                }
                if exec.reply.is_none() {
                    exec.supervisor_gone = true;
                    self.orphans = true;
                }
            }
        }
        if self.orphans {
            self.kill_orphans();
        }
    }

    /// A supervisor killed before it cleaned up leaves its command's tree to
    /// the guest (their subreaper): kill every child that is not a
    /// supervisor.
    fn kill_orphans(&mut self) {
        let me = rproc::getpid();
        let supervisors: Vec<Pid> = self
            .execs
            .iter()
            .map(|e| e.supervisor)
            .chain(self.sessions.iter().map(|s| s.supervisor))
            .chain(self.idle.iter().map(|(p, _)| *p))
            .chain(self.mode.forwarder)
            .chain(self.zygote.as_ref().map(Zygote::pid))
            .collect();
        let mut found = false;
        if let Ok(children) = hako_sys::proc::children_of(me) {
            for pid in children.into_iter().filter(|p| !supervisors.contains(p)) {
                found = true;
                let _ = rproc::kill_process(pid, Signal::KILL);
            }
        }
        self.orphans = found;
    }

    /// Where orphans come here (no subreapers): once nothing runs, every
    /// child that is not a supervisor is an orphan of a command that has
    /// ended; kill them (each one's children come here in turn) before
    /// that command is reported, as a subreaper would have. At most a
    /// second.
    fn kill_orphans_if_idle(&mut self) {
        let sessions_done = self
            .sessions
            .iter()
            .all(|s| s.ended.is_some() && s.sup.is_none());
        if !self.orphans_come_here || !self.execs.is_empty() || !sessions_done {
            return;
        }
        for _ in 0..1000 {
            self.kill_orphans();
            if !self.orphans {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
            self.reap();
        }
    }

    /// Reports every command whose tree is gone and whose output is drained.
    fn finish_execs(&mut self) {
        let mut i = 0;
        while i < self.execs.len() {
            let exec = &mut self.execs[i];
            if !exec.finished() {
                i += 1;
                continue;
            }
            let done_at = *exec.done_at.get_or_insert_with(Instant::now);
            let drained = exec.out.iter().all(Option::is_none);
            if !drained && done_at.elapsed() < DRAIN_GRACE {
                i += 1;
                continue;
            }
            let mut exec = self.execs.swap_remove(i);
            // Its supervisor has nothing left to watch: it may take the
            // next command (a killed one's socket is shut, so it ends).
            if let (Some(sock), false) = (exec.reusable.take(), exec.killed) {
                if self.ctl_open && self.idle.len() < MAX_IDLE_SUPERVISORS {
                    self.idle.push((exec.supervisor, sock));
                }
            }
            if let Some(RunReply::Finished {
                orphans_to_guest: true,
                ..
            }) = exec.reply
            {
                self.orphans_come_here = true;
            }
            self.kill_orphans_if_idle();
            let msg = match exec.reply {
                Some(RunReply::Finished {
                    status, timed_out, ..
                }) => FromGuest::Exited {
                    id: exec.id,
                    status,
                    timed_out,
                    stdout_total: exec.totals[0],
                    stderr_total: exec.totals[1],
                },
                Some(RunReply::SpawnFailed {
                    kind,
                    errno,
                    message,
                }) => FromGuest::SpawnFailed {
                    id: exec.id,
                    kind,
                    errno,
                    message,
                },
                Some(RunReply::Refused { message }) => FromGuest::Failed {
                    id: Some(exec.id),
                    message,
                },
                None => FromGuest::Failed {
                    id: Some(exec.id),
                    message: "the command's supervisor was killed before it reported; its processes were killed".into(),
                },
            };
            self.send(&msg);
        }
    }
}

impl Server<'_> {
    /// Starts a session's shell under a supervisor, with its script on a
    /// stdin pipe, its output on two pipes and its status descriptor (3) on
    /// a third, all read here.
    fn open_session(&mut self, request: SessionRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        let cwd_fd = self.take_cwd(&request.cwd)?;
        let shell = match request.shell {
            Some(shell) if shell.first().is_some_and(|p| !p.is_empty()) => shell,
            Some(_) => return Err(GuestError::EmptyShell),
            None if std::path::Path::new("/bin/bash").exists() => {
                vec!["/bin/bash".into(), "--noprofile".into(), "--norc".into()]
            }
            None => vec!["/bin/sh".into()],
        };
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let job = Job {
            argv: shell,
            env: request.env,
            timeout_ms: None,
            tty: false,
        };
        let (supervisor, sup) = self.fork_supervisor(
            &job,
            &request.cwd,
            [in_r, out_w, err_w],
            cwd_fd,
            Some(status_w),
        )?;
        for fd in [&in_w, &out_r, &err_r, &status_r] {
            let _ = hako_sys::rustix::io::ioctl_fionbio(fd, true);
        }
        let mut session = Session {
            id: request.id,
            supervisor,
            supervisor_reaped: false,
            sup: Some(sup),
            stdin: Some(in_w),
            pending: VecDeque::new(),
            out: [Some(out_r), Some(err_r)],
            status: Some(status_r),
            status_buf: Vec::new(),
            hello: nonce(),
            shell_pid: None,
            current: None,
            ended: None,
            shell_status: None,
            closing: false,
            reported: false,
        };
        // The shell says who it is first: the pid its commands descend from.
        let hello = format!("printf '%s %d\\n' {} \"$$\" >&3\n", session.hello);
        session.pending.extend(hello.as_bytes());
        session.feed();
        self.sessions.push(session);
        Ok(())
    }

    /// Hands a script to a session's shell.
    fn session_exec(&mut self, request: SessionExecRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        if request.script.contains('\0') {
            return Err(GuestError::NulInScript);
        }
        let Some(session) = self.sessions.iter_mut().find(|s| s.id == request.session) else {
            return Err(GuestError::SessionNotOpen {
                session: request.session,
                why: "never opened or closed".into(),
            });
        };
        if let Some(why) = &session.ended {
            return Err(GuestError::SessionNotOpen {
                session: request.session,
                why: why.clone(),
            });
        }
        if let Some(run) = &session.current {
            return Err(GuestError::SessionBusy {
                session: request.session,
                running: run.id,
            });
        }
        let nonce = nonce();
        // The script runs in the shell itself (so `cd`, `export`, functions
        // and jobs persist), reading nothing of the shell's own input and
        // without the status descriptor; then the shell reports the status
        // with this command's nonce on descriptor 3.
        let quoted = request.script.replace('\'', "'\\''");
        // `command eval`: a syntax error in the script fails the command,
        // not the shell (POSIX lets a non-interactive shell exit on a
        // syntax error in the special builtin `eval`; busybox ash does).
        let line = format!(
            "command eval '{quoted}' </dev/null 3>&-; printf '%s %d\\n' {nonce} \"$?\" >&3\n"
        );
        session.pending.extend(line.as_bytes());
        session.current = Some(SessionRun {
            id: request.id,
            nonce,
            deadline: request
                .timeout_ms
                .map(|ms| Instant::now() + Duration::from_millis(ms)),
            killed_at: None,
            timed_out: false,
            totals: [0, 0],
            max_output: request.max_output,
        });
        session.feed();
        Ok(())
    }

    /// Forwards a chunk of a session's output to the command running in it
    /// (output while none runs, from a background job, is dropped).
    fn session_output(&mut self, i: usize, s: usize) {
        let session = &mut self.sessions[i];
        let Some(fd) = &session.out[s] else { return };
        match hako_sys::rustix::io::read(fd, &mut self.buf[..]) {
            Ok(0) => session.out[s] = None,
            Ok(n) => {
                if let Some(run) = &mut session.current {
                    let frame = run.output(s, &self.buf[..n]);
                    if let Some(frame) = frame {
                        self.write_frame(&frame);
                    }
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(_) => session.out[s] = None,
        }
    }

    /// Reads status lines; the one with the running command's nonce ends it.
    fn session_status(&mut self, i: usize) {
        let session = &mut self.sessions[i];
        let Some(fd) = &session.status else { return };
        match hako_sys::rustix::io::read(fd, &mut self.buf[..]) {
            Ok(0) => session.status = None,
            Ok(n) => {
                session.status_buf.extend_from_slice(&self.buf[..n]);
                // Lines are short; a flood is not a status.
                if session.status_buf.len() > 64 * 1024 {
                    session.status_buf.clear();
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => return,
            Err(_) => session.status = None,
        }
        while let Some(end) = session.status_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = session.status_buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            let mut words = line.split(' ');
            let (Some(nonce), Some(value), None) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let Ok(value) = value.parse::<i32>() else {
                continue;
            };
            if nonce == session.hello && session.shell_pid.is_none() {
                session.shell_pid = Pid::from_raw(value);
            } else if session.current.as_ref().is_some_and(|r| r.nonce == nonce) {
                self.finish_session_run(i, ExitStatus::Code(value));
                return;
            }
        }
    }

    /// Ends the command running in session `i`: drains the output it wrote
    /// before its status, then reports it.
    fn finish_session_run(&mut self, i: usize, status: ExitStatus) {
        for s in 0..2 {
            loop {
                let session = &mut self.sessions[i];
                let Some(fd) = &session.out[s] else { break };
                match hako_sys::rustix::io::read(fd, &mut self.buf[..]) {
                    Ok(0) => {
                        session.out[s] = None;
                        break;
                    }
                    Ok(n) => {
                        let frame = session
                            .current
                            .as_mut()
                            .and_then(|run| run.output(s, &self.buf[..n]));
                        if let Some(frame) = frame {
                            self.write_frame(&frame);
                        }
                    }
                    Err(Errno::INTR) => {}
                    Err(_) => break,
                }
            }
        }
        if let Some(run) = self.sessions[i].current.take() {
            self.send(&FromGuest::Exited {
                id: run.id,
                status,
                timed_out: run.timed_out,
                stdout_total: run.totals[0],
                stderr_total: run.totals[1],
            });
        }
    }

    /// Deadlines, ended shells, finished closes.
    fn tend_sessions(&mut self) {
        let now = Instant::now();
        for i in 0..self.sessions.len() {
            let session = &mut self.sessions[i];
            if let Some(run) = &mut session.current {
                if run.killed_at.is_none() && run.deadline.is_some_and(|d| now >= d) {
                    // Kill what the command started; the shell reports the
                    // killed command's status and the session goes on.
                    run.timed_out = true;
                    run.killed_at = Some(now);
                    if let Some(shell) = session.shell_pid {
                        kill_descendants(shell);
                    }
                } else if run
                    .killed_at
                    .is_some_and(|at| now.duration_since(at) > SESSION_STOP_GRACE)
                {
                    // The shell itself does not stop (a builtin loop): the
                    // session must go.
                    session.kill("its shell did not stop at the command's deadline");
                }
            }
            if session.ended.is_some() && session.current.is_some() && session.sup.is_none() {
                let status = session.shell_status.unwrap_or(ExitStatus::Signal(9));
                self.finish_session_run(i, status);
            }
        }
        let mut i = 0;
        while i < self.sessions.len() {
            let session = &mut self.sessions[i];
            if session.ended.is_some() && session.sup.is_none() && !session.reported {
                session.reported = true;
                let message = session.ended.clone().unwrap_or_default();
                let id = session.id;
                session.close_fds();
                self.kill_orphans_if_idle();
                self.send(&FromGuest::SessionEnded { id, message });
            }
            let session = &self.sessions[i];
            if session.reported && session.supervisor_reaped && session.closing {
                self.sessions.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn write_frame(&mut self, frame: &Frame<FromGuest>) {
        if let Ok(bytes) = proto::encode(frame) {
            if self.ctl.write_all(&bytes).is_err() {
                self.ctl_open = false;
            }
        }
    }
}

/// How long a session's shell has to report a killed command before the
/// session is ended.
const SESSION_STOP_GRACE: Duration = Duration::from_secs(2);

/// A shell session.
struct Session {
    id: u64,
    supervisor: Pid,
    supervisor_reaped: bool,
    /// Our end of the supervisor's socket, until it reports the shell's end.
    sup: Option<UnixStream>,
    stdin: Option<OwnedFd>,
    pending: VecDeque<u8>,
    out: [Option<OwnedFd>; 2],
    status: Option<OwnedFd>,
    status_buf: Vec<u8>,
    /// The nonce of the shell's first line, which carries its pid.
    hello: String,
    shell_pid: Option<Pid>,
    current: Option<SessionRun>,
    /// Why the session is over, once it is.
    ended: Option<String>,
    shell_status: Option<ExitStatus>,
    /// hako asked to close it: forget it once it is reported.
    closing: bool,
    /// [`FromGuest::SessionEnded`] was sent.
    reported: bool,
}

/// The command running in a session.
struct SessionRun {
    id: u64,
    nonce: String,
    deadline: Option<Instant>,
    killed_at: Option<Instant>,
    timed_out: bool,
    totals: [u64; 2],
    max_output: u64,
}

impl SessionRun {
    /// Counts a chunk of stream `s` and returns the frame forwarding what is
    /// under the cap.
    fn output(&mut self, s: usize, data: &[u8]) -> Option<Frame<FromGuest>> {
        let offset = self.totals[s];
        self.totals[s] += data.len() as u64;
        capped(self.id, s, offset, data, self.max_output)
    }
}

impl Session {
    /// Writes queued script text into the shell without blocking.
    fn feed(&mut self) {
        feed(&mut self.stdin, &mut self.pending);
    }

    /// Ends the session: the supervisor kills the shell and everything
    /// started in it, then reports.
    fn kill(&mut self, why: &str) {
        if self.ended.is_none() {
            self.ended = Some(why.to_string());
        }
        self.stdin = None;
        self.pending.clear();
        if let Some(sup) = &self.sup {
            let _ = sup.shutdown(std::net::Shutdown::Write);
        }
    }

    /// The supervisor reported the shell's end (or died without a word).
    fn shell_ended(&mut self, reply: Option<RunReply>) {
        let (status, why) = match reply {
            Some(RunReply::Finished { status, .. }) => (
                Some(status),
                match status {
                    ExitStatus::Code(c) => format!("its shell exited with status {c}"),
                    ExitStatus::Signal(s) => format!("its shell was killed by signal {s}"),
                },
            ),
            Some(RunReply::SpawnFailed { message, .. }) | Some(RunReply::Refused { message }) => {
                (None, format!("its shell could not start: {message}"))
            }
            None => (None, "its supervisor died".to_string()),
        };
        self.shell_status = status;
        if self.ended.is_none() {
            self.ended = Some(why);
        }
        self.stdin = None;
        self.pending.clear();
    }

    fn gone(&self) -> bool {
        self.reported && self.supervisor_reaped
    }

    fn close_fds(&mut self) {
        self.stdin = None;
        self.out = [None, None];
        self.status = None;
    }
}

/// Writes what is queued into `fd` without blocking; a closed reader (the
/// program stopped reading its input) closes our end and drops the rest,
/// which is not an error.
fn feed(fd: &mut Option<OwnedFd>, pending: &mut VecDeque<u8>) {
    while let Some(out) = fd {
        let (head, _) = pending.as_slices();
        if head.is_empty() {
            break;
        }
        match hako_sys::rustix::io::write(&*out, head) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(Errno::AGAIN) => break,
            Err(Errno::INTR) => {}
            Err(_) => {
                *fd = None;
                pending.clear();
            }
        }
    }
}

/// The frame forwarding the part of `data` (bytes of stream `s` of command
/// `id`, starting at `offset`) under the cap `max`; `None` when all of it
/// is over.
fn capped(id: u64, s: usize, offset: u64, data: &[u8], max: u64) -> Option<Frame<FromGuest>> {
    let room = max.saturating_sub(offset);
    let keep = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
    (keep > 0).then(|| Frame::Output {
        id,
        stream: if s == 0 {
            StreamId::Stdout
        } else {
            StreamId::Stderr
        },
        offset,
        data: data[..keep].to_vec(),
    })
}

/// 128 random bits as hex, from the kernel.
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if filled.is_err() {
        // No /dev/urandom: the clock and the pid still make it unique.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = (t ^ u128::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SIGKILLs every descendant of `pid` (not `pid` itself), deepest last
/// found first.
fn kill_descendants(pid: Pid) {
    let mut found: Vec<Pid> = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        if let Ok(children) = hako_sys::proc::children_of(p) {
            for child in children {
                if !found.contains(&child) {
                    found.push(child);
                    frontier.push(child);
                }
            }
        }
    }
    for p in found {
        let _ = rproc::kill_process(p, Signal::KILL);
    }
}

fn winsize(rows: u16, cols: u16) -> hako_sys::rustix::termios::Winsize {
    hako_sys::rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A new pseudo-terminal of `rows` x `cols`: (master, slave), both
/// close-on-exec; the slave is not made anyone's controlling terminal here.
fn open_pty(rows: u16, cols: u16) -> Result<(OwnedFd, OwnedFd), GuestError> {
    use hako_sys::rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(failed("open a pseudo-terminal"))?;
    grantpt(&master).map_err(failed("grant the pseudo-terminal"))?;
    unlockpt(&master).map_err(failed("unlock the pseudo-terminal"))?;
    let name = ptsname(&master, Vec::new()).map_err(failed("name the pseudo-terminal"))?;
    let slave = hako_sys::rustix::fs::open(
        name.as_c_str(),
        hako_sys::rustix::fs::OFlags::RDWR
            | hako_sys::rustix::fs::OFlags::NOCTTY
            | hako_sys::rustix::fs::OFlags::CLOEXEC,
        hako_sys::rustix::fs::Mode::empty(),
    )
    .map_err(failed("open the terminal"))?;
    hako_sys::rustix::termios::tcsetwinsize(&master, winsize(rows, cols))
        .map_err(failed("size the terminal"))?;
    Ok((master, slave))
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

/// What a spare supervisor is handed with its descriptors (stdin, stdout,
/// stderr, then the working directory's and the job's descriptor 3 when
/// these flags say so).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handoff {
    job: Job,
    cwd: Cwd,
    cwd_fd: bool,
    fd3: bool,
}

/// What the guest sends a supervisor: the handoff itself, or (`None`) word
/// that it is in the first descriptor that comes with this frame, a memfd
/// holding its whole frame.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handing<H> {
    handoff: Option<H>,
}

/// Handoffs up to this size travel in the frame itself: a supervisor's
/// socket takes that much unread (at most one frame is ever waiting there).
const INLINE_HANDOFF: usize = 16 << 10;

/// A memfd holding `bytes`, read from its start.
fn job_memfd(bytes: &[u8]) -> Result<OwnedFd, GuestError> {
    use hako_sys::rustix::fs::{memfd_create, MemfdFlags};
    use std::io::Write as _;
    let fd = memfd_create("hako-job", MemfdFlags::CLOEXEC)
        .map_err(failed("create a memfd for a large command"))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .map_err(failed("write a large command to its memfd"))?;
    Ok(OwnedFd::from(file))
}

/// The handoff in `payload` (or in the memfd that came first among `fds`),
/// and the job's own descriptors.
fn take_handoff(
    payload: &[u8],
    mut fds: Vec<OwnedFd>,
) -> Result<(Handoff, Vec<OwnedFd>), GuestError> {
    use std::io::{Read as _, Seek as _};
    const NOT_A_JOB: &str = "the supervisor was handed something that is not a job";
    let bad = |what: &'static str| GuestError::BadHandoff { what, source: None };
    let not_a_job = |e: std::io::Error| GuestError::BadHandoff {
        what: NOT_A_JOB,
        source: Some(e),
    };
    let handing = match proto::decode::<Handing<Handoff>>(payload).map_err(not_a_job)? {
        Frame::Message(handing) => handing,
        _ => return Err(bad(NOT_A_JOB)),
    };
    if let Some(handoff) = handing.handoff {
        return Ok((handoff, fds));
    }
    if fds.is_empty() {
        return Err(bad("a large job came without its memfd"));
    }
    let mut file = std::fs::File::from(fds.remove(0));
    let mut frame = Vec::new();
    file.seek(std::io::SeekFrom::Start(0))
        .and_then(|_| {
            file.take(u64::from(proto::MAX_FRAME) + 4)
                .read_to_end(&mut frame)
        })
        .map_err(failed("read a large job from its memfd"))?;
    let body = frame.get(4..).unwrap_or_default();
    match proto::decode::<Handing<Handoff>>(body).map_err(not_a_job)? {
        Frame::Message(Handing {
            handoff: Some(handoff),
        }) => Ok((handoff, fds)),
        _ => Err(bad("the memfd of a large job held no job")),
    }
}

/// A supervisor: confines itself (inside a sandbox), then waits on its
/// socket (at 3) for a job, supervises it, reports how it ended and waits
/// for the next. End of file where a job would come means it is no longer
/// needed.
pub(crate) fn spare(mode: &Mode) -> GuestExit {
    let Ok(sock) = hako_sys::take_inherited_fd(3) else {
        return GuestExit::SupervisorSocket;
    };
    let sock = UnixStream::from(sock);
    // Inside a sandbox: what no command may have, the supervisor gives up
    // first (it needs none of it), once; its commands inherit it. A
    // supervisor that cannot refuses every job, saying why.
    let mut unfit: Option<GuestError> = None;
    if mode.confinement.is_some() {
        let landlock = match mode.confinement.as_ref().and_then(Confinement::landlock_fd) {
            Some(_) => match hako_sys::take_inherited_fd(4) {
                Ok(fd) => Some(fd),
                Err(_) => return GuestExit::SupervisorLandlock,
            },
            None => None,
        };
        unfit = Confinement::confine_supervisor(landlock.as_ref().map(AsFd::as_fd)).err();
    }
    let supervisor = match supervise::Supervisor::new(true) {
        Ok(s) => Some(s),
        Err(why) => {
            unfit.get_or_insert(why);
            None
        }
    };
    loop {
        let (payload, fds) = match proto::recv_with_fds(&sock) {
            Ok(got) => got,
            Err(_) => return GuestExit::Success,
        };
        let reply = match (&supervisor, &unfit) {
            (Some(supervisor), None) => match take_handoff(&payload, fds) {
                Ok((handoff, fds)) => supervise_one(supervisor, &handoff, fds, &sock, mode),
                Err(why) => supervise::refuse(why.to_string()),
            },
            (_, Some(why)) => supervise::refuse(why.to_string()),
            (None, None) => supervise::refuse("the supervisor could not start"),
        };
        if proto::write_frame(&sock, &reply).is_err() {
            return GuestExit::ReportLost;
        }
    }
}

/// Runs one handed-off job: `fds` are its stdin, stdout and stderr, then
/// the working directory's descriptor (for [`Cwd::Fd`]) and the job's
/// descriptor 3 (when the handoff says so).
fn supervise_one(
    supervisor: &supervise::Supervisor,
    handoff: &Handoff,
    fds: Vec<OwnedFd>,
    sock: &UnixStream,
    mode: &Mode,
) -> RunReply {
    let expected = 3 + usize::from(handoff.cwd_fd) + usize::from(handoff.fd3);
    if fds.len() != expected {
        return supervise::refuse(format!(
            "the supervisor was handed {} descriptors where {expected} were due",
            fds.len()
        ));
    }
    let mut fds = fds.into_iter();
    let (Some(stdin), Some(stdout), Some(stderr)) = (fds.next(), fds.next(), fds.next()) else {
        return supervise::refuse("the job's stdio did not come with it");
    };
    let cwd = match &handoff.cwd {
        Cwd::Path(path) => CwdChoice::Path(path.clone()),
        Cwd::Fd => match fds.next() {
            Some(fd) => CwdChoice::Fd(fd),
            None => return supervise::refuse("the working directory did not come with the job"),
        },
    };
    let fd3 = if handoff.fd3 { fds.next() } else { None };
    supervisor.run(
        &handoff.job,
        sock,
        RunOptions {
            stdio: [stdin, stdout, stderr],
            rlimits: mode.confinement.as_ref().map(Confinement::rlimits),
            cwd,
            fd3,
            controlling_tty: handoff.job.tty,
        },
    )
}
