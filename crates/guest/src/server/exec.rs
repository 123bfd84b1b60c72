//! One command: starting it under a supervisor, feeding its stdin,
//! forwarding its output as numbered frames (up to its cap), and reporting
//! how it ended once its tree is gone and its output drained.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_sys::rustix::event::PollFlags;
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::process::Pid;

use super::stream::{capped, feed};
use super::{dev_null, memory, pipe, Polled, Server, Slot};
use crate::error::failed;
use crate::proto::{self, ExecRequest, Frame, FromGuest, RunReply};
use crate::supervise::{Job, JobFds};
use crate::GuestError;

/// How long output may keep flowing after a command's tree is gone (only a
/// descriptor passed to a process outside the tree can keep a pipe open).
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// The most stdin a command may have queued in the guest.
const MAX_PENDING_STDIN: usize = 256 << 20;

/// What of a command a poll slot watches.
#[derive(Clone, Copy)]
pub(super) enum Watch {
    /// Its stdout (0) or stderr (1).
    Out(usize),
    /// Its supervisor's socket, for the reply.
    Sup,
    /// Its stdin, while input is queued.
    Stdin,
}

/// One command in flight.
pub(super) struct Exec {
    pub(super) id: u64,
    pub(super) supervisor: Pid,
    /// Our end of the supervisor's socket, until its reply is read.
    pub(super) sup: Option<UnixStream>,
    /// Our end of the supervisor's socket once it has replied: it may be
    /// given the next command.
    pub(super) reusable: Option<UnixStream>,
    killed: bool,
    stdin: Option<OwnedFd>,
    pending: VecDeque<u8>,
    close_stdin: bool,
    out: [Option<OwnedFd>; 2],
    /// The terminal's master side, for resizing.
    pub(super) pty: Option<OwnedFd>,
    totals: [u64; 2],
    max_output: u64,
    pub(super) reply: Option<RunReply>,
    pub(super) supervisor_gone: bool,
    done_at: Option<Instant>,
    /// The memory limit's kills when it started (see [`memory`]).
    oom_before: Option<u64>,
}

/// What became of input sent to a command.
#[derive(Debug, PartialEq, Eq)]
enum Input {
    /// Queued, to be written as the command reads.
    Queued,
    /// Dropped: its stdin is closed, or closing.
    Dropped,
    /// Over the most that may be queued: dropped, and its stdin closed.
    Overflow,
}

impl Exec {
    fn new(id: u64, supervisor: Pid, sup: UnixStream, max_output: u64) -> Exec {
        Exec {
            id,
            supervisor,
            sup: Some(sup),
            reusable: None,
            killed: false,
            oom_before: None,
            stdin: None,
            pending: VecDeque::new(),
            close_stdin: false,
            out: [None, None],
            pty: None,
            totals: [0, 0],
            max_output,
            reply: None,
            supervisor_gone: false,
            done_at: None,
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.reply.is_some() || self.supervisor_gone
    }

    pub(super) fn kill(&mut self) {
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

    /// Adds what to poll for this command, the one at `i`.
    pub(super) fn watch<'a>(&'a self, i: usize, polled: &mut Polled<'a>) {
        for (s, out) in self.out.iter().enumerate() {
            if let Some(fd) = out {
                polled.add(Slot::Exec(i, Watch::Out(s)), fd, PollFlags::IN);
            }
        }
        if let Some(sup) = &self.sup {
            polled.add(Slot::Exec(i, Watch::Sup), sup, PollFlags::IN);
        }
        if let (Some(fd), false) = (&self.stdin, self.pending.is_empty()) {
            polled.add(Slot::Exec(i, Watch::Stdin), fd, PollFlags::OUT);
        }
    }

    /// Queues `data` for the command's stdin, unless it would make more
    /// than `most` bytes queued.
    fn queue_stdin(&mut self, data: &[u8], most: usize) -> Input {
        if self.stdin.is_none() || self.close_stdin {
            return Input::Dropped;
        }
        if self.pending.len() + data.len() > most {
            self.stdin = None;
            self.pending.clear();
            return Input::Overflow;
        }
        self.pending.extend(data);
        Input::Queued
    }

    /// Writes queued input into the command's stdin without blocking; once
    /// all is written after hako closed it, closes it.
    fn feed_stdin(&mut self) {
        feed(&mut self.stdin, &mut self.pending);
        if self.close_stdin && self.pending.is_empty() {
            self.stdin = None;
        }
    }

    /// Counts a chunk of stream `s` and returns the frame forwarding what is
    /// under the cap.
    fn output(&mut self, s: usize, data: &[u8]) -> Option<Frame<FromGuest>> {
        let offset = self.totals[s];
        self.totals[s] += data.len() as u64;
        capped(self.id, s, offset, data, self.max_output)
    }

    /// What hako is told of the command's end, the memory limit's kills
    /// being `oom_after` now.
    fn report(&self, oom_after: Option<u64>) -> FromGuest {
        match &self.reply {
            Some(RunReply::Finished {
                status, timed_out, ..
            }) => FromGuest::Exited {
                id: self.id,
                status: *status,
                timed_out: *timed_out,
                oom_killed: memory::killed_for_memory(
                    self.oom_before,
                    oom_after,
                    *status,
                    self.killed || *timed_out,
                ),
                stdout_total: self.totals[0],
                stderr_total: self.totals[1],
            },
            Some(RunReply::SpawnFailed {
                kind,
                errno,
                message,
            }) => FromGuest::SpawnFailed {
                id: self.id,
                kind: *kind,
                errno: *errno,
                message: message.clone(),
            },
            Some(RunReply::Refused { message }) => FromGuest::Failed {
                id: Some(self.id),
                message: message.clone(),
                errno: None,
            },
            None => FromGuest::Failed {
                id: Some(self.id),
                message: "the command's supervisor was killed before it reported; its processes were killed".into(),
                errno: None,
            },
        }
    }
}

impl Server<'_> {
    /// Where the command `id` is in `execs`.
    pub(super) fn position(&self, id: u64) -> Option<usize> {
        self.execs.iter().position(|e| e.id == id)
    }

    /// Starts a command under a supervisor.
    pub(super) fn start(&mut self, request: ExecRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        if request.argv.first().is_none_or(String::is_empty) {
            return Err(GuestError::EmptyArgv);
        }
        let oom_before = self.oom_count();
        let cwd = self.take_cwd(&request.cwd)?;
        let job = Job {
            argv: request.argv,
            env: request.env,
            cwd: request.cwd,
            timeout_ms: request.timeout_ms,
            tty: request.pty.is_some(),
            fd3: false,
        };
        let mut exec = match request.pty {
            Some((rows, cols)) => {
                let (master, slave) = super::terminal::open_pty(rows, cols)?;
                let dup = |fd: &OwnedFd| {
                    fd.try_clone()
                        .map_err(failed("duplicate a terminal descriptor"))
                };
                let stdio = [dup(&slave)?, dup(&slave)?, slave];
                let (supervisor, sup) = self.hand_off(
                    &job,
                    JobFds {
                        stdio,
                        cwd,
                        fd3: None,
                    },
                )?;
                // One open file for reading, writing and resizing; never
                // blocking (a command that does not read its terminal must
                // not stall the guest).
                let _ = hako_sys::rustix::io::ioctl_fionbio(&master, true);
                let writer = dup(&master)?;
                let resizer = dup(&master)?;
                let mut exec = Exec::new(request.id, supervisor, sup, request.max_output);
                exec.stdin = Some(writer);
                exec.out = [Some(master), None];
                exec.pty = Some(resizer);
                exec
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
                let (supervisor, sup) = self.hand_off(
                    &job,
                    JobFds {
                        stdio: [in_r, out_w, err_w],
                        cwd,
                        fd3: None,
                    },
                )?;
                if let Some(w) = &in_w {
                    let _ = hako_sys::rustix::io::ioctl_fionbio(w, true);
                }
                let mut exec = Exec::new(request.id, supervisor, sup, request.max_output);
                exec.stdin = in_w;
                exec.out = [Some(out_r), Some(err_r)];
                exec
            }
        };
        exec.oom_before = oom_before;
        self.execs.push(exec);
        Ok(())
    }

    /// Something polled of the command at `i`.
    pub(super) fn exec_event(&mut self, i: usize, watch: Watch, events: PollFlags) {
        match watch {
            Watch::Out(s) => self.forward(i, s),
            Watch::Sup => {
                let exec = &mut self.execs[i];
                if let Some(sup) = exec.sup.take() {
                    exec.reply = proto::read_frame(&sup).ok();
                    match exec.reply {
                        None => {
                            // Killed before it replied: its command's tree
                            // comes here, to be killed.
                            exec.supervisor_gone = true;
                            self.orphans = true;
                        }
                        Some(RunReply::Finished { .. } | RunReply::SpawnFailed { .. }) => {
                            exec.reusable = Some(sup);
                        }
                        Some(RunReply::Refused { .. }) => {}
                    }
                }
            }
            Watch::Stdin => {
                let exec = &mut self.execs[i];
                if events.intersects(PollFlags::ERR | PollFlags::HUP) {
                    exec.stdin = None;
                    exec.pending.clear();
                    return;
                }
                exec.feed_stdin();
            }
        }
    }

    /// Input for command `id` (typed input, for one on a terminal).
    pub(super) fn stdin(&mut self, id: u64, data: &[u8]) {
        let Some(i) = self.position(id) else { return };
        let (data, signals) = self.typed(i, data);
        match self.execs[i].queue_stdin(&data, MAX_PENDING_STDIN) {
            Input::Dropped => {}
            Input::Overflow => self.send(&FromGuest::Failed {
                id: Some(id),
                message: format!(
                    "more than {MAX_PENDING_STDIN} bytes of stdin queued; stdin closed"
                ),
                errno: None,
            }),
            Input::Queued => self.execs[i].feed_stdin(),
        }
        self.send_tty_signals(i, &signals);
    }

    /// No more input for command `id`: its stdin closes once what is queued
    /// is written.
    pub(super) fn close_stdin(&mut self, id: u64) {
        if let Some(i) = self.position(id) {
            let exec = &mut self.execs[i];
            exec.close_stdin = true;
            if exec.pending.is_empty() {
                exec.stdin = None;
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
                if let Some(frame) = exec.output(s, &self.buf[..n]) {
                    self.write_frame(&frame);
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(_) => exec.out[s] = None,
        }
    }

    /// Reports every command whose tree is gone and whose output is drained.
    pub(super) fn finish_execs(&mut self) {
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
            // next command (a killed one's socket is shut, so it ends; one
            // that led a terminal's session ends on its own).
            if let (Some(sock), false, None) = (exec.reusable.take(), exec.killed, &exec.pty) {
                self.keep_idle(exec.supervisor, sock);
            }
            if let Some(RunReply::Finished {
                orphans_to_guest: true,
                ..
            }) = exec.reply
            {
                self.orphans_come_here = true;
            }
            self.kill_orphans_if_idle();
            let oom_after = self.oom_count();
            self.send(&exec.report(oom_after));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_core::ExitStatus;
    use proto::{SpawnFailure, StreamId};

    fn output(frame: Option<Frame<FromGuest>>) -> Option<(u64, StreamId, u64, Vec<u8>)> {
        match frame? {
            Frame::Output {
                id,
                stream,
                offset,
                data,
            } => Some((id, stream, offset, data)),
            _ => panic!("not an output frame"),
        }
    }

    fn an_exec() -> (Exec, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let pid = Pid::from_raw(1).unwrap();
        (Exec::new(3, pid, ours, 4), theirs)
    }

    #[test]
    fn output_counts_every_byte_and_forwards_up_to_the_cap() {
        let (mut exec, _sup) = an_exec();
        let first = output(exec.output(0, b"abc"));
        let second = output(exec.output(0, b"defg"));
        let third = exec.output(0, b"hij");
        let err = output(exec.output(1, b"e"));
        assert_eq!(first, Some((3, StreamId::Stdout, 0, b"abc".to_vec())));
        assert_eq!(second, Some((3, StreamId::Stdout, 3, b"d".to_vec())));
        assert!(third.is_none());
        assert_eq!(err, Some((3, StreamId::Stderr, 0, b"e".to_vec())));
        assert_eq!(exec.totals, [10, 1], "what is over the cap is counted");
    }

    #[test]
    fn killing_a_command_shuts_its_supervisors_socket_and_drops_its_input() {
        use std::io::Read;
        let (mut exec, mut sup) = an_exec();
        let (_r, w) = pipe().unwrap();
        exec.stdin = Some(w);
        exec.pending.extend(b"queued");
        exec.kill();
        assert!(exec.stdin.is_none() && exec.pending.is_empty());
        let mut byte = [0u8; 1];
        assert_eq!(sup.read(&mut byte).unwrap(), 0, "end of file: stop");
        exec.kill();
        assert!(exec.killed, "killing twice is fine");
    }

    #[test]
    fn a_command_is_finished_by_its_reply_or_its_supervisors_death() {
        let (mut exec, _sup) = an_exec();
        assert!(!exec.finished());
        exec.supervisor_gone = true;
        assert!(exec.finished());
        let (mut exec, _sup) = an_exec();
        exec.reply = Some(RunReply::Refused {
            message: "no".into(),
        });
        assert!(exec.finished());
    }

    #[test]
    fn input_is_queued_until_too_much_is_and_then_stdin_closes() {
        let (mut exec, _sup) = an_exec();
        assert_eq!(exec.queue_stdin(b"x", 8), Input::Dropped, "no stdin");
        let (_r, w) = pipe().unwrap();
        exec.stdin = Some(w);
        assert_eq!(exec.queue_stdin(b"12345", 8), Input::Queued);
        assert_eq!(exec.queue_stdin(b"678", 8), Input::Queued);
        assert_eq!(exec.queue_stdin(b"9", 8), Input::Overflow);
        assert!(exec.stdin.is_none() && exec.pending.is_empty());
        assert_eq!(exec.queue_stdin(b"x", 8), Input::Dropped);
    }

    #[test]
    fn input_after_hako_closed_stdin_is_dropped() {
        let (mut exec, _sup) = an_exec();
        let (_r, w) = pipe().unwrap();
        exec.stdin = Some(w);
        exec.close_stdin = true;
        assert_eq!(exec.queue_stdin(b"late", 8), Input::Dropped);
    }

    #[test]
    fn queued_input_reaches_the_command_and_closing_waits_for_it() {
        use std::io::Read;
        let (mut exec, _sup) = an_exec();
        let (r, w) = pipe().unwrap();
        exec.stdin = Some(w);
        assert_eq!(exec.queue_stdin(b"input", 64), Input::Queued);
        exec.close_stdin = true;
        exec.feed_stdin();
        assert!(exec.stdin.is_none(), "closed once all is written");
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "input");
    }

    #[test]
    fn each_reply_is_reported_as_its_event() {
        let (mut exec, _sup) = an_exec();
        exec.totals = [5, 6];
        exec.reply = Some(RunReply::Finished {
            status: ExitStatus::Code(3),
            timed_out: true,
            orphans_to_guest: false,
        });
        assert_eq!(
            exec.report(None),
            FromGuest::Exited {
                id: 3,
                status: ExitStatus::Code(3),
                timed_out: true,
                oom_killed: false,
                stdout_total: 5,
                stderr_total: 6,
            }
        );
        exec.reply = Some(RunReply::SpawnFailed {
            kind: SpawnFailure::NotFound,
            errno: Some(2),
            message: "nope".into(),
        });
        assert_eq!(
            exec.report(None),
            FromGuest::SpawnFailed {
                id: 3,
                kind: SpawnFailure::NotFound,
                errno: Some(2),
                message: "nope".into(),
            }
        );
        exec.reply = Some(RunReply::Refused {
            message: "refused".into(),
        });
        assert_eq!(
            exec.report(None),
            FromGuest::Failed {
                id: Some(3),
                message: "refused".into(),
                errno: None,
            }
        );
        exec.reply = None;
        match exec.report(None) {
            FromGuest::Failed { id, message, .. } => {
                assert_eq!(id, Some(3));
                assert!(message.contains("supervisor was killed"), "{message}");
            }
            other => panic!("reported {other:?}"),
        }
    }
}
