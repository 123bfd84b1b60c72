//! The long-lived guest: one connection, many commands.
//!
//! After the handshake the guest serves [`ToGuest`] requests until hako
//! closes the connection. Each command gets a **supervisor**: a fork of the
//! guest (no exec, so it costs a fork) that becomes the child subreaper of
//! the command's tree, enforces its deadline, and kills and reaps the whole
//! tree before it reports how the command ended (see
//! [`supervise`](crate::supervise)). The guest itself stays single-threaded
//! and never blocks on one command: it polls the connection, every
//! command's output pipes and supervisor sockets, and forwards output as
//! numbered frames, all of a command's output before its exit event.
//!
//! Closing the connection (or hako dying) stops every command the same way
//! [`ToGuest::Kill`] stops one, reports each, and ends the guest.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_sys::ns::{self, Forked, SingleThreaded};
use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use hako_sys::rustix::pipe::{pipe_with, PipeFlags};
use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};
use hako_sys::signal::{signum, SignalFd};

use crate::confine::Confinement;
use crate::proto::{
    self, Cwd, Decoded, Decoder, ExecRequest, Frame, FromGuest, RunReply, StreamId, ToGuest,
    MAX_CHUNK,
};
use crate::supervise::{self, CwdChoice, Job, RunOptions};

/// How long output may keep flowing after a command's tree is gone (only a
/// descriptor passed to a process outside the tree can keep a pipe open).
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long the guest waits for its supervisors when it shuts down before
/// killing them outright.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
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
}

/// One command in flight.
struct Exec {
    id: u64,
    supervisor: Pid,
    /// Our end of the supervisor's socket, until its reply is read.
    sup: Option<UnixStream>,
    killed: bool,
    stdin: Option<OwnedFd>,
    pending: VecDeque<u8>,
    close_stdin: bool,
    out: [Option<OwnedFd>; 2],
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

/// What one poll slot watches.
#[derive(Clone, Copy)]
enum Slot {
    Ctl,
    Signals,
    Out(usize, usize),
    Sup(usize),
    Stdin(usize),
}

struct Server<'a> {
    ctl: UnixStream,
    ctl_open: bool,
    decoder: Decoder,
    fds: VecDeque<OwnedFd>,
    execs: Vec<Exec>,
    proof: &'a SingleThreaded,
    mode: Mode,
    orphans: bool,
    buf: Vec<u8>,
}

/// Serves requests on `ctl` until it closes and every command has ended.
/// Returns the guest's exit code.
pub(crate) fn serve(ctl: UnixStream, proof: &SingleThreaded, mode: Mode) -> u8 {
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
            let _ = proto::write_frame(
                &ctl,
                &FromGuest::Refused {
                    message: format!("cannot open signalfd: {err}"),
                },
            );
            return 1;
        }
    };
    let mut server = Server {
        ctl,
        ctl_open: true,
        decoder: Decoder::default(),
        fds: VecDeque::new(),
        execs: Vec::new(),
        proof,
        mode,
        orphans: false,
        buf: vec![0u8; MAX_CHUNK],
    };
    server.send(&FromGuest::Ready {
        version: proto::VERSION,
    });
    server.run(&signals)
}

impl Server<'_> {
    fn run(&mut self, signals: &SignalFd) -> u8 {
        let mut closing_since: Option<Instant> = None;
        loop {
            if !self.ctl_open {
                let since = *closing_since.get_or_insert_with(Instant::now);
                for exec in &mut self.execs {
                    exec.kill();
                }
                if self.execs.is_empty() {
                    break;
                }
                if since.elapsed() > SHUTDOWN_GRACE {
                    for exec in &self.execs {
                        let _ = rproc::kill_process(exec.supervisor, Signal::KILL);
                    }
                    break;
                }
            }
            let ready = match self.wait(signals, closing_since.is_some()) {
                Ok(ready) => ready,
                Err(_) => break,
            };
            for (slot, events) in ready {
                self.handle(slot, events, signals);
            }
            self.finish_execs();
        }
        // Whatever is left (a stuck supervisor, an orphan) goes now.
        let mut status = None;
        supervise::kill_tree(None, &mut status);
        0
    }

    /// Polls everything and returns the slots with events.
    fn wait(&self, signals: &SignalFd, closing: bool) -> io::Result<Vec<(Slot, PollFlags)>> {
        let mut slots: Vec<Slot> = Vec::new();
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        if self.ctl_open {
            slots.push(Slot::Ctl);
            fds.push(PollFd::new(&self.ctl, PollFlags::IN));
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
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let timeout = (draining || closing).then_some(&tick);
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
                    if exec.reply.is_none() {
                        exec.supervisor_gone = true;
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
        }
    }

    /// Sends a control message; a failure means hako is gone.
    fn send(&mut self, msg: &FromGuest) {
        if self.ctl_open || matches!(msg, FromGuest::Exited { .. } | FromGuest::Failed { .. }) {
            if let Ok(frame) = proto::encode(&Frame::Message(msg)) {
                if (&self.ctl).write_all(&frame).is_err() {
                    self.ctl_open = false;
                }
            }
        }
    }

    /// Reads what hako sent (and any descriptors with it) and acts on every
    /// whole frame.
    fn receive(&mut self) {
        let mut space = [MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(4))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        let received = recvmsg(
            &self.ctl,
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
        match received {
            Ok(msg) if msg.bytes == 0 => self.ctl_open = false,
            Ok(msg) => {
                let n = msg.bytes;
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

    fn request(&mut self, frame: Frame<ToGuest>) {
        match frame {
            Frame::Message(ToGuest::Exec(request)) => {
                let id = request.id;
                if let Err(message) = self.start(request) {
                    self.send(&FromGuest::Failed {
                        id: Some(id),
                        message,
                    });
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
            Frame::Message(ToGuest::Kill { id }) => {
                if let Some(i) = self.position(id) {
                    self.execs[i].kill();
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
                exec.pending.extend(data);
                self.feed_stdin(i);
            }
            Frame::Output { .. } => self.send(&FromGuest::Failed {
                id: None,
                message: "output frames go from the guest to hako, not back".into(),
            }),
        }
    }

    /// Starts a command under a new supervisor.
    fn start(&mut self, request: ExecRequest) -> Result<(), String> {
        if self.position(request.id).is_some() {
            return Err(format!("command id {} is already running", request.id));
        }
        if request.argv.first().is_none_or(String::is_empty) {
            return Err("the argument vector is empty".into());
        }
        let cwd_fd = match &request.cwd {
            Cwd::Fd if !self.mode.accept_fds => {
                return Err("a working directory descriptor is not accepted here".into())
            }
            Cwd::Fd => Some(
                self.fds
                    .pop_front()
                    .ok_or("no working directory descriptor came with the request")?,
            ),
            Cwd::Path(p) if !p.is_absolute() => {
                return Err(format!("working directory {} is not absolute", p.display()))
            }
            Cwd::Path(_) => None,
        };
        let pipe =
            || pipe_with(PipeFlags::CLOEXEC).map_err(|e| format!("cannot create a pipe: {e}"));
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (in_r, in_w) = if request.stdin {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            let null = std::fs::File::open("/dev/null")
                .map_err(|e| format!("cannot open /dev/null: {e}"))?;
            (OwnedFd::from(null), None)
        };
        let (sup_mine, sup_theirs) =
            UnixStream::pair().map_err(|e| format!("cannot create a socket pair: {e}"))?;
        match ns::fork_single_threaded(self.proof) {
            Err(err) => Err(format!("cannot fork a supervisor: {err}")),
            Ok(Forked::Child) => {
                let mut fds = vec![
                    in_r.as_fd(),
                    out_w.as_fd(),
                    err_w.as_fd(),
                    sup_theirs.as_fd(),
                ];
                if let Some(fd) = &cwd_fd {
                    fds.push(fd.as_fd());
                }
                let code = supervisor(&request, &self.mode, &fds);
                std::process::exit(code)
            }
            Ok(Forked::Parent(pid)) => {
                if let Some(w) = &in_w {
                    let _ = hako_sys::rustix::io::ioctl_fionbio(w, true);
                }
                self.execs.push(Exec {
                    id: request.id,
                    supervisor: Pid::from_raw(pid).ok_or("fork returned pid 0")?,
                    sup: Some(sup_mine),
                    killed: false,
                    stdin: in_w,
                    pending: VecDeque::new(),
                    close_stdin: false,
                    out: [Some(out_r), Some(err_r)],
                    totals: [0, 0],
                    max_output: request.max_output,
                    reply: None,
                    supervisor_gone: false,
                    done_at: None,
                });
                Ok(())
            }
        }
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
                let room = exec.max_output.saturating_sub(offset);
                let keep = n.min(usize::try_from(room).unwrap_or(usize::MAX));
                if keep > 0 {
                    let frame = Frame::<FromGuest>::Output {
                        id: exec.id,
                        stream: if s == 0 {
                            StreamId::Stdout
                        } else {
                            StreamId::Stderr
                        },
                        offset,
                        data: self.buf[..keep].to_vec(),
                    };
                    if let Ok(bytes) = proto::encode(&frame) {
                        if (&self.ctl).write_all(&bytes).is_err() {
                            self.ctl_open = false;
                        }
                    }
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(_) => exec.out[s] = None,
        }
    }

    /// Writes queued input into a command's stdin without blocking.
    fn feed_stdin(&mut self, i: usize) {
        let exec = &mut self.execs[i];
        while let Some(fd) = &exec.stdin {
            let (head, _) = exec.pending.as_slices();
            if head.is_empty() {
                break;
            }
            match hako_sys::rustix::io::write(fd, head) {
                Ok(n) => {
                    exec.pending.drain(..n);
                }
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => {}
                Err(_) => {
                    // The command closed its stdin; that is not an error.
                    exec.stdin = None;
                    exec.pending.clear();
                }
            }
        }
        if exec.close_stdin && exec.pending.is_empty() {
            exec.stdin = None;
        }
    }

    /// Reaps every child that ended: supervisors, and orphans re-parented
    /// to the guest.
    fn reap(&mut self) {
        while let Ok(Some((pid, _))) = rproc::wait(WaitOptions::NOHANG) {
            if let Some(exec) = self.execs.iter_mut().find(|e| e.supervisor == pid) {
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
        let supervisors: Vec<Pid> = self.execs.iter().map(|e| e.supervisor).collect();
        let mut found = false;
        if let Ok(children) = hako_sys::proc::children_of(me) {
            for pid in children.into_iter().filter(|p| !supervisors.contains(p)) {
                found = true;
                let _ = rproc::kill_process(pid, Signal::KILL);
            }
        }
        self.orphans = found;
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
            let exec = self.execs.swap_remove(i);
            let msg = match exec.reply {
                Some(RunReply::Finished { status, timed_out }) => FromGuest::Exited {
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

/// The supervisor process: a fork of the guest that runs one command and
/// writes how it ended on its socket. Never returns to the guest's loop.
fn supervisor(request: &ExecRequest, mode: &Mode, fds: &[std::os::fd::BorrowedFd<'_>]) -> i32 {
    if hako_sys::spawn::install_fds_close_rest(fds).is_err() {
        return 10;
    }
    let Ok(ctl) = hako_sys::take_inherited_fd(3) else {
        return 11;
    };
    let ctl = UnixStream::from(ctl);
    let cwd = match &request.cwd {
        Cwd::Path(path) => CwdChoice::Path(path.clone()),
        Cwd::Fd => match hako_sys::take_inherited_fd(4) {
            Ok(fd) => CwdChoice::Fd(fd),
            Err(_) => return 12,
        },
    };
    if mode.confinement.is_some() {
        // Inside a sandbox the supervisor keeps pid 1's capabilities; no
        // command may read its memory or descriptors.
        let _ = ns::set_not_dumpable();
    }
    let job = Job {
        argv: request.argv.clone(),
        env: request.env.clone(),
        timeout_ms: request.timeout_ms,
    };
    let reply = supervise::run(
        &job,
        &ctl,
        RunOptions {
            stop_signals: true,
            confine: mode.confinement.as_ref().map(Confinement::hook),
            cwd,
        },
    );
    match proto::write_frame(&ctl, &reply) {
        Ok(()) => 0,
        Err(_) => 3,
    }
}
