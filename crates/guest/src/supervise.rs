//! A supervisor: a fork of the guest that runs commands, one at a time,
//! each as the child subreaper of its tree, enforcing its deadline, and
//! killing and reaping everything it left before reporting how it ended.
//!
//! Pid 1 hands each command over as a [`Job`] (the guest's one shape of a
//! request, a command's or a session's shell) with its descriptors, over
//! the supervisor's socket ([`handoff`] builds that frame, [`take_handoff`]
//! reads it); [`spare`] is the supervisor's loop. Each command's process
//! starts with `clone(CLONE_VM | CLONE_VFORK)` (see [`vfork`]): no page
//! table is copied for it.
//!
//! A command on a terminal runs in a session its supervisor leads, with
//! the terminal as the supervisor's controlling terminal, in a group of
//! its own that is the foreground one ([`lead_terminal`]): where the
//! kernel sends no terminal signal (gVisor before 2023), the guest asks
//! the supervisor to ([`terminal_signal_byte`]), the one process such a
//! kernel tells which group is in the foreground. That supervisor ends
//! with its command.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_core::ExitStatus;
use hako_sys::confine::Rlimit;
use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};
use hako_sys::signal::{signum as libc_sig, SignalFd};
use hako_sys::tty::TtySignal;
use hako_sys::vfork::{self, ChildStack, SpawnCwd, SpawnSpec, SpawnStep};

use crate::error::failed;
use crate::lockdown::Confinement;
use crate::proto::{self, Cwd, Frame, RunReply, SpawnFailure};
use crate::server::Mode;
use crate::{GuestError, GuestExit};

/// One command for a supervisor: what pid 1 hands over, for a command or a
/// session's shell. Its descriptors travel with it (see [`JobFds`]).
///
/// The working directory is the protocol's [`Cwd`], as hako sent it: for
/// [`Cwd::Fd`] the directory's descriptor travels beside the job, as it
/// travelled beside hako's request. (It becomes `vfork`'s borrowed
/// [`SpawnCwd`] only at the spawn: `hako-sys` sits below the protocol.)
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Job {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Cwd,
    pub timeout_ms: Option<u64>,
    /// stdin is a terminal: make it the controlling one.
    pub tty: bool,
    /// A descriptor 3 comes with the job (a session's status pipe).
    pub fd3: bool,
}

/// The descriptors of a [`Job`], in the order they travel: stdin, stdout,
/// stderr, the working directory's (for [`Cwd::Fd`]), descriptor 3 (when
/// [`Job::fd3`]).
pub(crate) struct JobFds {
    /// The command's stdin, stdout and stderr.
    pub stdio: [OwnedFd; 3],
    /// The working directory, for [`Cwd::Fd`].
    pub cwd: Option<OwnedFd>,
    /// Given to the command as its descriptor 3.
    pub fd3: Option<OwnedFd>,
}

impl JobFds {
    /// How many descriptors come with `job`.
    fn due(job: &Job) -> usize {
        3 + usize::from(job.cwd == Cwd::Fd) + usize::from(job.fd3)
    }

    /// Whether these are the descriptors `job` says come with it.
    pub(crate) fn fit(&self, job: &Job) -> bool {
        self.cwd.is_some() == (job.cwd == Cwd::Fd) && self.fd3.is_some() == job.fd3
    }

    /// Sorts the descriptors that came with `job`.
    fn take(job: &Job, fds: Vec<OwnedFd>) -> Result<JobFds, GuestError> {
        let bad = |what: &'static str| GuestError::BadHandoff { what, source: None };
        let due = JobFds::due(job);
        if fds.len() != due {
            return Err(GuestError::HandoffDescriptors {
                handed: fds.len(),
                due,
            });
        }
        let mut fds = fds.into_iter();
        let (Some(stdin), Some(stdout), Some(stderr)) = (fds.next(), fds.next(), fds.next()) else {
            return Err(bad("the job's stdio did not come with it"));
        };
        let cwd = match job.cwd {
            Cwd::Path(_) => None,
            Cwd::Fd => match fds.next() {
                Some(fd) => Some(fd),
                None => return Err(bad("the working directory did not come with the job")),
            },
        };
        let fd3 = if job.fd3 { fds.next() } else { None };
        Ok(JobFds {
            stdio: [stdin, stdout, stderr],
            cwd,
            fd3,
        })
    }

    /// All of them, in the order they travel.
    pub(crate) fn borrowed(&self) -> Vec<BorrowedFd<'_>> {
        let [a, b, c] = &self.stdio;
        let mut fds = vec![a.as_fd(), b.as_fd(), c.as_fd()];
        fds.extend(self.cwd.as_ref().map(AsFd::as_fd));
        fds.extend(self.fd3.as_ref().map(AsFd::as_fd));
        fds
    }

    /// Where `job` starts, for `vfork`.
    fn spawn_cwd<'a>(&'a self, job: &'a Job) -> Option<SpawnCwd<'a>> {
        match (&job.cwd, &self.cwd) {
            (Cwd::Path(path), _) => Some(SpawnCwd::Path(path)),
            (Cwd::Fd, Some(fd)) => Some(SpawnCwd::Fd(fd.as_fd())),
            (Cwd::Fd, None) => None,
        }
    }
}

/// What the guest sends a supervisor: the job itself, or (`None`) word
/// that it is in the first descriptor that comes with this frame, a memfd
/// holding its whole frame.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handing<J> {
    handoff: Option<J>,
}

/// Handoffs up to this size travel in the frame itself: a supervisor's
/// socket takes that much unread (at most one frame is ever waiting there).
const INLINE_HANDOFF: usize = 16 << 10;

/// The frame that hands `job` to a supervisor, and the memfd to send first
/// among its descriptors when the job is too large for the frame itself
/// (so that handing it over never blocks the guest: a supervisor may have
/// been stopped, and a socket takes only so much unread).
pub(crate) fn handoff(job: &Job) -> Result<(Vec<u8>, Option<OwnedFd>), GuestError> {
    let encode = |handing: &Handing<&Job>| {
        proto::encode(&Frame::Message(handing))
            .map_err(failed("encode a command for its supervisor"))
    };
    let inline = encode(&Handing { handoff: Some(job) })?;
    if inline.len() <= INLINE_HANDOFF {
        Ok((inline, None))
    } else {
        Ok((
            encode(&Handing { handoff: None })?,
            Some(job_memfd(&inline)?),
        ))
    }
}

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

/// The job in `payload` (or in the memfd that came first among `fds`),
/// and its own descriptors.
fn take_handoff(payload: &[u8], mut fds: Vec<OwnedFd>) -> Result<(Job, Vec<OwnedFd>), GuestError> {
    use std::io::{Read as _, Seek as _};
    const NOT_A_JOB: &str = "the supervisor was handed something that is not a job";
    let bad = |what: &'static str| GuestError::BadHandoff { what, source: None };
    let not_a_job = |e: std::io::Error| GuestError::BadHandoff {
        what: NOT_A_JOB,
        source: Some(e),
    };
    let handing = match proto::decode::<Handing<Job>>(payload).map_err(not_a_job)? {
        Frame::Message(handing) => handing,
        _ => return Err(bad(NOT_A_JOB)),
    };
    if let Some(job) = handing.handoff {
        return Ok((job, fds));
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
    match proto::decode::<Handing<Job>>(body).map_err(not_a_job)? {
        Frame::Message(Handing { handoff: Some(job) }) => Ok((job, fds)),
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
        unfit = mode.confinement.as_ref().and_then(|c| {
            c.confine_supervisor(landlock.as_ref().map(AsFd::as_fd))
                .err()
        });
    }
    let supervisor = match Supervisor::new(true) {
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
        // A supervisor that ran a command on a terminal leads that
        // terminal's session for good: it ends once it has replied (the
        // guest does not keep it).
        let mut retire = false;
        let reply = match (&supervisor, &unfit) {
            (Some(supervisor), None) => match take_handoff(&payload, fds) {
                Ok((job, fds)) => {
                    retire = job.tty;
                    supervise_one(supervisor, &job, fds, &sock, mode)
                }
                Err(why) => refuse(why.to_string()),
            },
            (_, Some(why)) => refuse(why.to_string()),
            (None, None) => refuse("the supervisor could not start"),
        };
        if proto::write_frame(&sock, &reply).is_err() {
            return GuestExit::ReportLost;
        }
        if retire {
            return GuestExit::Success;
        }
    }
}

/// What the guest may write on a supervisor's socket while its command
/// runs, one byte each: a signal for the foreground group of the
/// command's terminal, typed at it where the kernel does not send it
/// (gVisor before 2023). Any other byte, and end of file, mean "stop".
pub(crate) fn terminal_signal_byte(signal: TtySignal) -> u8 {
    match signal {
        TtySignal::Interrupt => b'I',
        TtySignal::Quit => b'Q',
        TtySignal::Suspend => b'Z',
    }
}

/// The signal a byte of [`terminal_signal_byte`] stands for.
fn terminal_signal(byte: u8) -> Option<TtySignal> {
    match byte {
        b'I' => Some(TtySignal::Interrupt),
        b'Q' => Some(TtySignal::Quit),
        b'Z' => Some(TtySignal::Suspend),
        _ => None,
    }
}

/// Makes the terminal `tty` (a command's stdin) this supervisor's
/// controlling terminal, in a session it leads, and returns a descriptor
/// of it to ask its foreground group by. The command then runs in that
/// session, not leading it, in a group of its own that is the
/// terminal's foreground (see [`SpawnSpec::foreground_group`]): a
/// job-control shell works as on any terminal, and the supervisor, whose
/// terminal it is, can ask which group is in the foreground (gVisor
/// answers `TIOCGPGRP` only to a process whose controlling terminal it
/// is).
fn lead_terminal(tty: &OwnedFd) -> Result<OwnedFd, GuestError> {
    // Never a session leader before: one that led a terminal's session
    // retires with it (see `spare`). (No `getsid`: in a `linux` sandbox
    // the guest's own session lies outside its pid namespace, numbered 0.)
    rproc::setsid().map_err(failed("start a session for the terminal"))?;
    rproc::ioctl_tiocsctty(tty).map_err(failed("take the command's terminal"))?;
    tty.try_clone()
        .map_err(failed("duplicate the command's terminal"))
}

/// Sends `signal` to the foreground group of `tty`, this supervisor's
/// controlling terminal: never to the supervisor's own group (a command
/// that put it in the foreground must not stop or kill it).
fn signal_foreground(tty: &OwnedFd, signal: TtySignal) {
    if let Ok(group) = hako_sys::rustix::termios::tcgetpgrp(tty) {
        if group != rproc::getpgrp() {
            let _ = rproc::kill_process_group(group, signal.signal());
        }
    }
}

/// Reads what the guest wrote on `ctl` while a command runs: signals for
/// the foreground group of `tty` are sent; `false` means "stop" (end of
/// file, an error, or anything else).
fn take_requests(ctl: &UnixStream, tty: Option<&OwnedFd>) -> bool {
    use hako_sys::rustix::net::{recv, RecvFlags};
    let mut buf = [0u8; 64];
    match recv(ctl, &mut buf, RecvFlags::DONTWAIT) {
        Ok((0, _)) => false,
        Ok((n, _)) => buf[..n.min(buf.len())]
            .iter()
            .all(|&b| match (terminal_signal(b), tty) {
                (Some(signal), Some(tty)) => {
                    signal_foreground(tty, signal);
                    true
                }
                _ => false,
            }),
        Err(Errno::AGAIN | Errno::INTR) => true,
        Err(_) => false,
    }
}

/// Runs one handed-off job with the descriptors `fds` that came with it.
fn supervise_one(
    supervisor: &Supervisor,
    job: &Job,
    fds: Vec<OwnedFd>,
    sock: &UnixStream,
    mode: &Mode,
) -> RunReply {
    match JobFds::take(job, fds) {
        Ok(fds) => supervisor.run(
            job,
            sock,
            fds,
            mode.confinement.as_ref().map(Confinement::rlimits),
        ),
        Err(why) => refuse(why.to_string()),
    }
}

pub(crate) fn refuse(message: impl Into<String>) -> RunReply {
    RunReply::Refused {
        message: message.into(),
    }
}

/// A process that supervises commands, one at a time: the child subreaper
/// of each command's tree, watching its deadline. Between commands it has
/// no child at all, so it can be given the next one.
pub(crate) struct Supervisor {
    signals: SignalFd,
    /// This kernel allows no subreaper but init (gVisor before 2023): a
    /// command's orphans go to the guest, pid 1, which kills them.
    orphans_to_guest: bool,
    /// The stack each command's process starts on (see [`vfork`]).
    stack: RefCell<ChildStack>,
}

/// The errno values a failed exec is told apart by.
mod libc_errno {
    use hako_sys::rustix::io::Errno;
    pub const ENOENT: i32 = Errno::NOENT.raw_os_error();
    pub const EACCES: i32 = Errno::ACCESS.raw_os_error();
    pub const ENOEXEC: i32 = Errno::NOEXEC.raw_os_error();
}

impl Supervisor {
    /// Becomes the subreaper of whatever this process starts and blocks the
    /// signals it watches. `stop_signals`: treat SIGINT, SIGTERM and SIGHUP
    /// as "stop": kill the running command's tree. (Not for pid 1 of a
    /// sandbox, where the command itself could send them.)
    pub(crate) fn new(stop_signals: bool) -> Result<Supervisor, GuestError> {
        let orphans_to_guest = match hako_sys::set_child_subreaper() {
            Ok(()) => false,
            // A kernel that allows no subreaper but init (gVisor before 2023
            // answers EINVAL): orphans go to the guest, pid 1 of the
            // sandbox, which kills them (told so by the reply). Under any
            // other parent they could escape: refuse.
            Err(err)
                if err.raw_os_error() == Some(Errno::INVAL.raw_os_error())
                    && rproc::getppid().is_some_and(|p| p.as_raw_nonzero().get() == 1) =>
            {
                true
            }
            Err(err) => return Err(failed("become child subreaper")(err)),
        };
        // Blocked before the first fork so no exit is missed, and so that a
        // signal meant to stop the guest makes it clean up instead of dying
        // and leaving the command's tree behind.
        // The terminal's stop signals are taken too, and ignored: a
        // supervisor that leads a command's terminal must not be stopped
        // (or killed, by SIGQUIT) should a command put its group in the
        // foreground. (Blocked, not ignored: an ignored signal would stay
        // ignored in the commands it starts.)
        let watched: &[i32] = if stop_signals {
            &[
                libc_sig::SIGCHLD,
                libc_sig::SIGINT,
                libc_sig::SIGTERM,
                libc_sig::SIGHUP,
                libc_sig::SIGQUIT,
                libc_sig::SIGTSTP,
                libc_sig::SIGTTIN,
                libc_sig::SIGTTOU,
            ]
        } else {
            &[libc_sig::SIGCHLD]
        };
        let signals = SignalFd::new(watched).map_err(failed("open signalfd"))?;
        let stack = ChildStack::new().map_err(failed("map a stack"))?;
        Ok(Supervisor {
            signals,
            orphans_to_guest,
            stack: RefCell::new(stack),
        })
    }

    /// Runs `job` as this process's child, with the descriptors `fds` (and
    /// `rlimits` applied just before exec), and returns the outcome once
    /// every process of the command is gone. End of file on `ctl`, or
    /// anything on it but a terminal's signal (see
    /// [`terminal_signal_byte`]), means "stop": the whole tree is killed.
    pub(crate) fn run(
        &self,
        job: &Job,
        ctl: &UnixStream,
        fds: JobFds,
        rlimits: Option<std::sync::Arc<Vec<Rlimit>>>,
    ) -> RunReply {
        if job.argv.is_empty() {
            return refuse("empty argv");
        }
        let Some(spawn_cwd) = fds.spawn_cwd(job) else {
            return refuse("the working directory did not come with the job");
        };
        // A command on a terminal: the supervisor leads the terminal's
        // session (see `lead_terminal`).
        let tty = if job.tty {
            match lead_terminal(&fds.stdio[0]) {
                Ok(tty) => Some(tty),
                Err(why) => return refuse(why.to_string()),
            }
        } else {
            None
        };
        // Exits of an earlier command's processes, all reaped already.
        let _ = self.signals.drain();
        let orphans_to_guest = self.orphans_to_guest;
        let start = Instant::now();
        let spawned = {
            let mut stack = self.stack.borrow_mut();
            let [stdin, stdout, stderr] = &fds.stdio;
            vfork::spawn(
                SpawnSpec {
                    argv: &job.argv,
                    program: None,
                    env: &job.env,
                    stdio: [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
                    cwd: Some(spawn_cwd),
                    fd3: fds.fd3.as_ref().map(AsFd::as_fd),
                    new_session: tty.is_none(),
                    // If the supervisor is killed outright, its direct
                    // child goes with it.
                    parent_death_kill: true,
                    foreground_group: tty.is_some(),
                    rlimits: rlimits.as_deref().map_or(&[], Vec::as_slice),
                },
                &mut stack,
            )
        };
        // The command holds the stdio now (hako sees end of file only when
        // every process of the command has closed it): let go of ours, and
        // of the working directory and descriptor 3.
        drop(fds);
        let main = match spawned {
            Ok(pid) => Pid::from_raw(pid),
            Err(err) => {
                let errno = err.error.raw_os_error();
                let kind = match (err.step, errno) {
                    (SpawnStep::Exec, Some(libc_errno::ENOENT)) => SpawnFailure::NotFound,
                    (SpawnStep::Exec, Some(libc_errno::EACCES | libc_errno::ENOEXEC)) => {
                        SpawnFailure::CannotExecute
                    }
                    _ => SpawnFailure::Other,
                };
                return RunReply::SpawnFailed {
                    kind,
                    errno,
                    message: err.to_string(),
                };
            }
        };
        let deadline = job.timeout_ms.map(|ms| start + Duration::from_millis(ms));
        let mut status: Option<ExitStatus> = None;
        let mut timed_out = false;
        loop {
            reap(main, &mut status);
            if status.is_some() {
                break;
            }
            let timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        timed_out = true;
                        break;
                    }
                    Some(Timespec::try_from(left).unwrap_or(Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    }))
                }
                None => None,
            };
            let mut fds = [
                PollFd::new(&self.signals, PollFlags::IN),
                PollFd::new(ctl, PollFlags::IN),
            ];
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(err) => {
                    kill_tree(main, &mut status);
                    return refuse(format!("poll failed: {err}"));
                }
            }
            let ctl_event = fds[1].revents();
            let stop =
                self.signals.drain().into_iter().any(|sig| {
                    [libc_sig::SIGINT, libc_sig::SIGTERM, libc_sig::SIGHUP].contains(&sig)
                });
            let asked_to_stop = !ctl_event.is_empty() && !take_requests(ctl, tty.as_ref());
            if stop || asked_to_stop {
                // hako closed the socket, asked to cancel, or someone
                // signalled the supervisor to stop: kill everything.
                kill_tree(main, &mut status);
                return RunReply::Finished {
                    status: status.unwrap_or(ExitStatus::Signal(9)),
                    timed_out: false,
                    orphans_to_guest,
                };
            }
        }
        kill_tree(main, &mut status);
        RunReply::Finished {
            status: status.unwrap_or(ExitStatus::Signal(9)),
            timed_out,
            orphans_to_guest,
        }
    }
}

fn convert(status: rproc::WaitStatus) -> Option<ExitStatus> {
    if let Some(code) = status.exit_status() {
        Some(ExitStatus::Code(code))
    } else {
        status.terminating_signal().map(ExitStatus::Signal)
    }
}

/// Reaps every child that has exited, without blocking; records the main
/// command's status when it is among them.
fn reap(main: Option<Pid>, status: &mut Option<ExitStatus>) {
    while let Ok(Some((pid, st))) = rproc::wait(WaitOptions::NOHANG) {
        if Some(pid) == main && status.is_none() {
            *status = convert(st);
        }
    }
}

/// Kills every descendant and reaps them all.
///
/// Orphans are re-parented to the guest (it is their subreaper), so every
/// process the command started is, at some point, a child of the guest.
/// Each round kills all current children; their children become the
/// guest's and are killed in the next round. When `wait` says there are no
/// children left, the tree is empty.
pub(crate) fn kill_tree(main: Option<Pid>, status: &mut Option<ExitStatus>) {
    if let Some(main) = main {
        let _ = rproc::kill_process_group(main, Signal::KILL);
    }
    let me = rproc::getpid();
    loop {
        // Reap what has ended already; with no child left at all, done
        // (the common case, and no /proc scan for it).
        loop {
            match rproc::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) => {
                    if Some(pid) == main && status.is_none() {
                        *status = convert(st);
                    }
                }
                Ok(None) => break,
                Err(Errno::INTR) => {}
                Err(_) => return,
            }
        }
        if let Ok(children) = hako_sys::proc::children_of(me) {
            for pid in children {
                let _ = rproc::kill_process(pid, Signal::KILL);
            }
        }
        match rproc::wait(WaitOptions::empty()) {
            Ok(Some((pid, st))) => {
                if Some(pid) == main && status.is_none() {
                    *status = convert(st);
                }
            }
            Ok(None) | Err(Errno::INTR) => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::dev_null;

    fn job(cwd: Cwd, fd3: bool) -> Job {
        Job {
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("PATH".into(), "/bin".into())],
            cwd,
            timeout_ms: Some(5),
            tty: false,
            fd3,
        }
    }

    fn nulls(n: usize) -> Vec<OwnedFd> {
        (0..n).map(|_| dev_null().unwrap()).collect()
    }

    /// The payload of a frame (its length prefix off).
    fn payload(frame: &[u8]) -> &[u8] {
        &frame[4..]
    }

    #[test]
    fn a_small_job_travels_in_the_frame_itself() {
        let sent = job(Cwd::Path("/w".into()), false);
        let (frame, memfd) = handoff(&sent).unwrap();
        assert!(memfd.is_none());
        let (got, fds) = take_handoff(payload(&frame), nulls(3)).unwrap();
        assert_eq!(got, sent);
        assert_eq!(fds.len(), 3, "the job's own descriptors are left");
    }

    #[test]
    fn a_large_job_travels_in_a_memfd_sent_first() {
        let mut sent = job(Cwd::Fd, true);
        sent.env.push(("BIG".into(), "x".repeat(INLINE_HANDOFF)));
        let (frame, memfd) = handoff(&sent).unwrap();
        assert!(frame.len() < INLINE_HANDOFF, "only word of the memfd");
        let mut fds = vec![memfd.expect("a memfd")];
        fds.extend(nulls(5));
        let (got, fds) = take_handoff(payload(&frame), fds).unwrap();
        assert_eq!(got, sent);
        assert_eq!(fds.len(), 5, "the memfd is taken off the descriptors");
    }

    #[test]
    fn a_large_job_without_its_memfd_is_refused() {
        let mut sent = job(Cwd::Path("/".into()), false);
        sent.env.push(("BIG".into(), "x".repeat(INLINE_HANDOFF)));
        let (frame, _memfd) = handoff(&sent).unwrap();
        let err = take_handoff(payload(&frame), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("without its memfd"), "{err}");
    }

    #[test]
    fn a_memfd_that_holds_no_job_is_refused() {
        // Word that the job is in the memfd, and a memfd holding only that.
        let word: Handing<&Job> = Handing { handoff: None };
        let frame = proto::encode(&Frame::Message(&word)).unwrap();
        let memfd = job_memfd(&frame).unwrap();
        let err = take_handoff(payload(&frame), vec![memfd]).unwrap_err();
        assert!(err.to_string().contains("held no job"), "{err}");
    }

    #[test]
    fn what_is_not_a_job_is_refused() {
        for junk in [&b"{\"argv\":1}"[..], b"not json", b""] {
            let err = take_handoff(junk, Vec::new()).unwrap_err();
            assert!(matches!(err, GuestError::BadHandoff { .. }), "{err}");
        }
    }

    #[test]
    fn a_jobs_descriptors_are_sorted_in_the_order_they_travel() {
        let with_all = job(Cwd::Fd, true);
        let fds = JobFds::take(&with_all, nulls(5)).unwrap();
        assert!(fds.cwd.is_some() && fds.fd3.is_some());
        assert!(fds.fit(&with_all));
        assert_eq!(fds.borrowed().len(), 5);
        assert!(matches!(fds.spawn_cwd(&with_all), Some(SpawnCwd::Fd(_))));

        let bare = job(Cwd::Path("/w".into()), false);
        let fds = JobFds::take(&bare, nulls(3)).unwrap();
        assert!(fds.cwd.is_none() && fds.fd3.is_none());
        assert!(fds.fit(&bare));
        assert!(!fds.fit(&with_all));
        match fds.spawn_cwd(&bare) {
            Some(SpawnCwd::Path(p)) => assert_eq!(p, std::path::Path::new("/w")),
            _ => panic!("not the path"),
        }
    }

    #[test]
    fn a_job_with_too_few_or_too_many_descriptors_is_refused() {
        let session = job(Cwd::Path("/".into()), true);
        for n in [0, 3, 5] {
            let err = JobFds::take(&session, nulls(n)).err().unwrap();
            assert!(
                matches!(err, GuestError::HandoffDescriptors { handed, due: 4 } if handed == n),
                "{err}"
            );
        }
    }

    #[test]
    fn a_working_directory_by_descriptor_needs_its_descriptor() {
        let by_fd = job(Cwd::Fd, false);
        let fds = JobFds {
            stdio: [
                dev_null().unwrap(),
                dev_null().unwrap(),
                dev_null().unwrap(),
            ],
            cwd: None,
            fd3: None,
        };
        assert!(!fds.fit(&by_fd));
        assert!(fds.spawn_cwd(&by_fd).is_none());
    }
}
