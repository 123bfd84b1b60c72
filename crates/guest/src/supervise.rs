//! A supervisor's work: running commands, one at a time, each as the child
//! subreaper of its tree, enforcing its deadline, and killing and reaping
//! everything it left before reporting how it ended. Each command's process
//! starts with `clone(CLONE_VM | CLONE_VFORK)` (see [`vfork`]): no page
//! table is copied for it.

use std::cell::RefCell;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_core::ExitStatus;
use hako_sys::confine::Rlimit;
use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};
use hako_sys::signal::{signum as libc_sig, SignalFd};
use hako_sys::vfork::{self, ChildStack, SpawnCwd, SpawnSpec, SpawnStep};

use crate::error::failed;
use crate::proto::{RunReply, SpawnFailure};
use crate::GuestError;

/// One command for a supervisor.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Job {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    /// stdin is a terminal: make it the controlling one.
    pub tty: bool,
}

pub(crate) fn refuse(message: impl Into<String>) -> RunReply {
    RunReply::Refused {
        message: message.into(),
    }
}

/// How [`Supervisor::run`] starts and watches the command.
pub(crate) struct RunOptions {
    /// The command's stdin, stdout and stderr.
    pub stdio: [OwnedFd; 3],
    /// Applied in the command's process just before exec.
    pub rlimits: Option<std::sync::Arc<Vec<Rlimit>>>,
    /// Working directory of the command.
    pub cwd: CwdChoice,
    /// Given to the command as its descriptor 3.
    pub fd3: Option<OwnedFd>,
    /// The command's stdin is a terminal to make its controlling one.
    pub controlling_tty: bool,
}

/// Where the supervisor starts the command.
pub(crate) enum CwdChoice {
    /// This directory (a descriptor hako opened through the fence).
    Fd(OwnedFd),
    /// This path inside the sandbox.
    Path(std::path::PathBuf),
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
        let watched: &[i32] = if stop_signals {
            &[
                libc_sig::SIGCHLD,
                libc_sig::SIGINT,
                libc_sig::SIGTERM,
                libc_sig::SIGHUP,
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

    /// Runs `request` as this process's child and returns the outcome once
    /// every process of the command is gone. Anything on `ctl` (data or end
    /// of file) means "stop": the whole tree is killed.
    pub(crate) fn run(&self, request: &Job, ctl: &UnixStream, options: RunOptions) -> RunReply {
        if request.argv.is_empty() {
            return refuse("empty argv");
        }
        // Exits of an earlier command's processes, all reaped already.
        let _ = self.signals.drain();
        let orphans_to_guest = self.orphans_to_guest;
        let RunOptions {
            stdio,
            rlimits,
            cwd,
            fd3,
            controlling_tty,
        } = options;
        let spawn_cwd = match &cwd {
            CwdChoice::Fd(fd) => SpawnCwd::Fd(fd.as_fd()),
            CwdChoice::Path(path) => SpawnCwd::Path(path),
        };
        let start = Instant::now();
        let spawned = {
            let mut stack = self.stack.borrow_mut();
            vfork::spawn(
                SpawnSpec {
                    argv: &request.argv,
                    env: &request.env,
                    stdio: [stdio[0].as_fd(), stdio[1].as_fd(), stdio[2].as_fd()],
                    cwd: Some(spawn_cwd),
                    fd3: fd3.as_ref().map(AsFd::as_fd),
                    new_session: true,
                    // If the supervisor is killed outright, its direct
                    // child goes with it.
                    parent_death_kill: true,
                    controlling_tty,
                    rlimits: rlimits.as_deref().map_or(&[], Vec::as_slice),
                },
                &mut stack,
            )
        };
        // The command holds the stdio now (hako sees end of file only when
        // every process of the command has closed it): let go of ours, and
        // of the working directory and descriptor 3.
        drop((stdio, fd3, cwd));
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
        let deadline = request
            .timeout_ms
            .map(|ms| start + Duration::from_millis(ms));
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
            let stop = self
                .signals
                .drain()
                .into_iter()
                .any(|sig| sig != libc_sig::SIGCHLD);
            if stop || !ctl_event.is_empty() {
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
