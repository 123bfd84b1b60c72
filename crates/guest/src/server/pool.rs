//! The supervisors as pid 1 sees them: the idle ones kept for the commands
//! to come, a spare forked (through the zygote) once the guest is quiet,
//! and handing each command to one. Pid 1 itself forks only when no
//! command's process can be alive: a zygote that is gone is replaced only
//! then (see [`zygote`](crate::zygote)).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_sys::rustix::process::{self as rproc, Pid, Signal};

use super::Server;
use crate::error::failed;
use crate::proto;
use crate::supervise::{self, Job, JobFds};
use crate::zygote::Zygote;
use crate::GuestError;

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
/// How long the guest waits after a spare supervisor could not be had
/// before it tries again.
const SPARE_RETRY: Duration = Duration::from_millis(100);
/// The most supervisors kept idle, for the commands to come, once their
/// command has ended (more run at once when as many commands do).
const MAX_IDLE_SUPERVISORS: usize = 4;

/// What decides when a spare supervisor is due.
#[derive(Debug, Clone, Copy)]
struct SpareState {
    /// Supervisors idle now.
    idle: usize,
    /// hako's link is open.
    open: bool,
    /// The zygote is there.
    zygote: bool,
    /// A command or session runs.
    busy: bool,
    /// Commands handed to supervisors so far.
    handoffs: u64,
    /// How long since the last event.
    quiet_for: Duration,
    /// How long since a spare last could not be had.
    failed_ago: Option<Duration>,
}

/// How long until a spare supervisor is due: once the guest has been
/// quiet for [`SPARE_AFTER`] ([`SPARE_WHILE_RUNNING_AFTER`] while something
/// runs; at once after [`EAGER_SPARE_AFTER_HANDOFFS`] handoffs), and not
/// within [`SPARE_RETRY`] of a spare that could not be had. `None` while
/// one is not wanted (one is idle, hako has closed) or cannot be had: the
/// zygote is gone and commands run (it is replaced once they end), and
/// trying would only spin.
fn spare_in(state: SpareState) -> Option<Duration> {
    let can_fork = state.zygote || !state.busy;
    if !(state.idle == 0 && state.open && can_fork) {
        return None;
    }
    let quiet = if state.handoffs >= EAGER_SPARE_AFTER_HANDOFFS {
        Duration::ZERO
    } else {
        let needed = if state.busy {
            SPARE_WHILE_RUNNING_AFTER
        } else {
            SPARE_AFTER
        };
        needed.saturating_sub(state.quiet_for)
    };
    let retry = state
        .failed_ago
        .map_or(Duration::ZERO, |ago| SPARE_RETRY.saturating_sub(ago));
    Some(quiet.max(retry))
}

impl Server<'_> {
    /// How long until a spare supervisor is due (see [`spare_in`]).
    pub(super) fn spare_in(&self) -> Option<Duration> {
        spare_in(SpareState {
            idle: self.idle.len(),
            open: self.ctl_open,
            zygote: self.zygote.is_some(),
            busy: !self.execs.is_empty() || !self.sessions.is_empty(),
            handoffs: self.handoffs,
            quiet_for: self.last_event.elapsed(),
            failed_ago: self.spare_failed_at.map(|at| at.elapsed()),
        })
    }

    /// Whether to fork a spare supervisor now.
    pub(super) fn spare_due(&self) -> bool {
        self.spare_in() == Some(Duration::ZERO)
    }

    /// Keeps the supervisor `pid`, whose command has ended, for a later
    /// command (unless enough are kept, or hako has closed: then dropping
    /// our end of its socket ends it).
    pub(super) fn keep_idle(&mut self, pid: Pid, sock: UnixStream) {
        if self.ctl_open && self.idle.len() < MAX_IDLE_SUPERVISORS {
            self.idle.push((pid, sock));
        }
    }

    /// Hands `job` to a supervisor (an idle one, or one forked now) with
    /// its descriptors `fds`; returns its pid and our end of its socket.
    /// Our copies of the descriptors are closed here. An idle supervisor
    /// that cannot take it (killed from inside while it waited) is replaced
    /// by a new one.
    pub(super) fn hand_off(
        &mut self,
        job: &Job,
        fds: JobFds,
    ) -> Result<(Pid, UnixStream), GuestError> {
        if !fds.fit(job) {
            return Err(GuestError::BadHandoff {
                what: "a job and the descriptors handed with it disagree",
                source: None,
            });
        }
        // A large job goes in a memfd, so that handing it over never
        // blocks the guest (a supervisor may have been stopped, see
        // `reap`, and a socket takes only so much unread).
        let (bytes, job_fd) = supervise::handoff(job)?;
        let mut sent: Vec<_> = job_fd.as_ref().map(AsFd::as_fd).into_iter().collect();
        sent.extend(fds.borrowed());
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
            match proto::send_with_fds(&sock, &bytes, &sent) {
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
    pub(super) fn fork_spare(&mut self) -> Result<(Pid, UnixStream), GuestError> {
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
        if let Err(err) = &got {
            // Killed by `fork_supervisor`, or dead already: reaped later;
            // one that could not fork stays.
            if !matches!(err, GuestError::NoSupervisor { .. }) {
                self.zygote = None;
            }
            self.spare_failed_at = Some(Instant::now());
        }
        got
    }

    /// Sends SIGCONT to every supervisor, busy or idle: a no-op for one that
    /// runs; one a command stopped goes on (`reap` does the same when the
    /// kernel reports the stop; this is for a report that never came).
    pub(super) fn continue_supervisors(&mut self) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A guest that has just started: nothing idle, nothing run, quiet.
    fn fresh() -> SpareState {
        SpareState {
            idle: 0,
            open: true,
            zygote: true,
            busy: false,
            handoffs: 0,
            quiet_for: Duration::ZERO,
            failed_ago: None,
        }
    }

    #[test]
    fn no_spare_is_forked_while_one_is_idle_or_hako_has_closed() {
        assert_eq!(spare_in(SpareState { idle: 1, ..fresh() }), None);
        assert_eq!(
            spare_in(SpareState {
                open: false,
                ..fresh()
            }),
            None
        );
    }

    #[test]
    fn without_a_zygote_a_spare_waits_until_nothing_runs() {
        let gone = SpareState {
            zygote: false,
            ..fresh()
        };
        assert_eq!(spare_in(SpareState { busy: true, ..gone }), None);
        assert_eq!(spare_in(gone), Some(SPARE_AFTER), "replaced once idle");
    }

    #[test]
    fn a_spare_comes_after_a_quiet_spell_longer_while_a_command_runs() {
        assert_eq!(spare_in(fresh()), Some(SPARE_AFTER));
        let quiet = SpareState {
            quiet_for: MS,
            ..fresh()
        };
        assert_eq!(spare_in(quiet), Some(SPARE_AFTER - MS));
        let long = SpareState {
            quiet_for: SPARE_AFTER * 3,
            ..fresh()
        };
        assert_eq!(spare_in(long), Some(Duration::ZERO));
        let busy = SpareState {
            busy: true,
            quiet_for: SPARE_AFTER * 3,
            ..fresh()
        };
        assert_eq!(
            spare_in(busy),
            Some(SPARE_WHILE_RUNNING_AFTER - SPARE_AFTER * 3)
        );
    }

    #[test]
    fn a_sandbox_used_again_and_again_gets_its_spare_at_once() {
        let used = SpareState {
            busy: true,
            handoffs: EAGER_SPARE_AFTER_HANDOFFS,
            ..fresh()
        };
        assert_eq!(spare_in(used), Some(Duration::ZERO));
        let once = SpareState {
            handoffs: EAGER_SPARE_AFTER_HANDOFFS - 1,
            ..used
        };
        assert_eq!(spare_in(once), Some(SPARE_WHILE_RUNNING_AFTER));
    }

    #[test]
    fn a_spare_that_could_not_be_had_is_retried_after_a_pause() {
        let failed = SpareState {
            handoffs: EAGER_SPARE_AFTER_HANDOFFS,
            failed_ago: Some(30 * MS),
            ..fresh()
        };
        assert_eq!(spare_in(failed), Some(SPARE_RETRY - 30 * MS));
        let long_ago = SpareState {
            failed_ago: Some(SPARE_RETRY),
            ..failed
        };
        assert_eq!(spare_in(long_ago), Some(Duration::ZERO));
    }
}
