//! Shell sessions: a shell started under a supervisor that runs one
//! script after another in itself (so `cd`, `export`, functions and jobs
//! persist), each reported like a command. The shell tells the guest its
//! pid, and each script's status, in lines on its descriptor 3, each line
//! marked with a nonce the script cannot guess.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hako_core::ExitStatus;
use hako_sys::rustix::event::PollFlags;
use hako_sys::rustix::io::Errno;
use hako_sys::rustix::process::{self as rproc, Pid, Signal};

use super::shell::{hello_line, nonce, script_line, shell, status_line};
use super::{pipe, Polled, Server, Slot};
use crate::proto::{self, Frame, FromGuest, RunReply, SessionExecRequest, SessionRequest};
use crate::supervise::{Job, JobFds};
use crate::GuestError;

/// How long a session's shell has to report a killed command before the
/// session is ended.
const SESSION_STOP_GRACE: Duration = Duration::from_secs(2);
/// The most of the status descriptor kept without a whole line: lines are
/// short, and a flood is not a status.
const MAX_STATUS_BUF: usize = 64 * 1024;

/// What of a session a poll slot watches.
#[derive(Clone, Copy)]
pub(super) enum Watch {
    /// The shell's stdout (0) or stderr (1).
    Out(usize),
    /// The shell's status descriptor.
    Status,
    /// Its supervisor's socket, for the shell's end.
    Sup,
    /// The shell's stdin, while script text is queued.
    Stdin,
}

/// A shell session.
pub(super) struct Session {
    pub(super) id: u64,
    pub(super) supervisor: Pid,
    pub(super) supervisor_reaped: bool,
    /// Our end of the supervisor's socket, until it reports the shell's end.
    pub(super) sup: Option<UnixStream>,
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
    pub(super) ended: Option<String>,
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
    /// The memory limit's kills when it started.
    oom_before: Option<u64>,
}

impl SessionRun {
    /// Counts a chunk of stream `s` and returns the frame forwarding what is
    /// under the cap.
    fn output(&mut self, s: usize, data: &[u8]) -> Option<Frame<FromGuest>> {
        let offset = self.totals[s];
        self.totals[s] += data.len() as u64;
        super::stream::capped(self.id, s, offset, data, self.max_output)
    }
}

impl Session {
    /// Writes queued script text into the shell without blocking.
    fn feed(&mut self) {
        super::stream::feed(&mut self.stdin, &mut self.pending);
    }

    /// Ends the session: the supervisor kills the shell and everything
    /// started in it, then reports.
    pub(super) fn kill(&mut self, why: &str) {
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
    pub(super) fn shell_ended(&mut self, reply: Option<RunReply>) {
        let (status, why) = shell_end(reply);
        self.shell_status = status;
        if self.ended.is_none() {
            self.ended = Some(why);
        }
        self.stdin = None;
        self.pending.clear();
    }

    /// Reported, and its supervisor reaped: nothing of it is left.
    pub(super) fn gone(&self) -> bool {
        self.reported && self.supervisor_reaped
    }

    fn close_fds(&mut self) {
        self.stdin = None;
        self.out = [None, None];
        self.status = None;
    }

    /// Whether the session, or the command running in it, is `id`.
    pub(super) fn uses_id(&self, id: u64) -> bool {
        self.id == id || self.current.as_ref().is_some_and(|r| r.id == id)
    }

    /// Whether a command runs in it with a deadline to watch.
    pub(super) fn has_deadline(&self) -> bool {
        self.current.as_ref().is_some_and(|r| r.deadline.is_some())
    }

    /// Adds what to poll for this session, the one at `i`.
    pub(super) fn watch<'a>(&'a self, i: usize, polled: &mut Polled<'a>) {
        for (s, out) in self.out.iter().enumerate() {
            if let Some(fd) = out {
                polled.add(Slot::Session(i, Watch::Out(s)), fd, PollFlags::IN);
            }
        }
        if let Some(fd) = &self.status {
            polled.add(Slot::Session(i, Watch::Status), fd, PollFlags::IN);
        }
        if let Some(sup) = &self.sup {
            polled.add(Slot::Session(i, Watch::Sup), sup, PollFlags::IN);
        }
        if let (Some(fd), false) = (&self.stdin, self.pending.is_empty()) {
            polled.add(Slot::Session(i, Watch::Stdin), fd, PollFlags::OUT);
        }
    }
}

impl Server<'_> {
    /// Starts a session's shell under a supervisor, with its script on a
    /// stdin pipe, its output on two pipes and its status descriptor (3) on
    /// a third, all read here.
    pub(super) fn open_session(&mut self, request: SessionRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        let cwd = self.take_cwd(&request.cwd)?;
        let shell = shell(request.shell, std::path::Path::new("/bin/bash").exists())?;
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let job = Job {
            argv: shell,
            env: request.env,
            cwd: request.cwd,
            timeout_ms: None,
            tty: false,
            fd3: true,
        };
        let (supervisor, sup) = self.hand_off(
            &job,
            JobFds {
                stdio: [in_r, out_w, err_w],
                cwd,
                fd3: Some(status_w),
            },
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
        session
            .pending
            .extend(hello_line(&session.hello).as_bytes());
        session.feed();
        self.sessions.push(session);
        Ok(())
    }

    /// Hands a script to a session's shell.
    pub(super) fn session_exec(&mut self, request: SessionExecRequest) -> Result<(), GuestError> {
        if self.id_in_use(request.id) {
            return Err(GuestError::IdInUse { id: request.id });
        }
        if request.script.contains('\0') {
            return Err(GuestError::NulInScript);
        }
        let oom_before = self.oom_count();
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
        session
            .pending
            .extend(script_line(&request.script, &nonce).as_bytes());
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
            oom_before,
        });
        session.feed();
        Ok(())
    }

    /// Ends session `id` (answered once it is reported ended).
    pub(super) fn close_session(&mut self, id: u64) {
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

    /// Something polled of the session at `i`.
    pub(super) fn session_event(&mut self, i: usize, watch: Watch, events: PollFlags) {
        match watch {
            Watch::Out(s) => self.session_output(i, s),
            Watch::Status => self.session_status(i),
            Watch::Sup => {
                let session = &mut self.sessions[i];
                if let Some(sup) = session.sup.take() {
                    let reply = proto::read_frame::<RunReply>(&sup).ok();
                    if reply.is_none() {
                        // It died without a word: what its shell started
                        // comes here, to be killed (its reaping no longer
                        // sees a socket to read and would not know).
                        self.orphans = true;
                    }
                    session.shell_ended(reply);
                }
            }
            Watch::Stdin => {
                let session = &mut self.sessions[i];
                if events.intersects(PollFlags::ERR | PollFlags::HUP) {
                    session.stdin = None;
                    session.pending.clear();
                    return;
                }
                session.feed();
            }
        }
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
                if session.status_buf.len() > MAX_STATUS_BUF {
                    session.status_buf.clear();
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => return,
            Err(_) => session.status = None,
        }
        while let Some(end) = session.status_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = session.status_buf.drain(..=end).collect();
            let Some((nonce, value)) = status_line(&line[..end]) else {
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
            let oom_killed = super::memory::killed_for_memory(
                run.oom_before,
                self.oom_count(),
                status,
                run.timed_out || run.killed_at.is_some(),
            );
            self.send(&FromGuest::Exited {
                id: run.id,
                status,
                timed_out: run.timed_out,
                oom_killed,
                stdout_total: run.totals[0],
                stderr_total: run.totals[1],
            });
        }
    }

    /// Deadlines, ended shells, finished closes.
    pub(super) fn tend_sessions(&mut self) {
        let now = Instant::now();
        for i in 0..self.sessions.len() {
            let session = &mut self.sessions[i];
            if let Some(run) = &mut session.current {
                if run.killed_at.is_none() && run.deadline.is_some_and(|d| now >= d) {
                    // Kill what the command started and end its line; the
                    // shell reports the status and the session goes on.
                    run.timed_out = true;
                    run.killed_at = Some(now);
                    if let Some(shell) = session.shell_pid {
                        interrupt_shell(shell);
                    }
                } else if run
                    .killed_at
                    .is_some_and(|at| now.duration_since(at) > SESSION_STOP_GRACE)
                {
                    // The shell itself does not stop (a builtin loop, its
                    // trap replaced): the session must go.
                    session.kill("its shell did not stop at the command's deadline");
                } else if run.killed_at.is_some() {
                    // Until the shell reports: whatever it started since
                    // (a command it had forked, not yet exec'd, when it was
                    // interrupted) is killed too, and its trap then runs.
                    if let Some(shell) = session.shell_pid {
                        kill_descendants(shell);
                    }
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
}

/// How a shell ended, from its supervisor's reply (`None`: it died without
/// one): its status, when it had one, and why the session is over.
fn shell_end(reply: Option<RunReply>) -> (Option<ExitStatus>, String) {
    match reply {
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
    }
}

/// SIGKILLs every descendant of `pid` (not `pid` itself), deepest last
/// found first.
/// Ends the command a session's shell runs, at its deadline: the shell
/// is stopped (it can start nothing more), sent `SIGINT` (its trap
/// returns from the script, `shell::script_line`, so nothing after the
/// command runs), every process it started is killed, and it is
/// continued: it reports the status and reads the next command. The order
/// matters: killed first, the shell would run the script's next command
/// before the signal arrived.
fn interrupt_shell(shell: Pid) {
    let _ = rproc::kill_process(shell, Signal::STOP);
    let _ = rproc::kill_process(shell, Signal::INT);
    kill_descendants(shell);
    let _ = rproc::kill_process(shell, Signal::CONT);
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::StreamId;

    #[test]
    fn a_shells_end_says_why_the_session_is_over() {
        let finished = |status| {
            Some(RunReply::Finished {
                status,
                timed_out: false,
                orphans_to_guest: false,
            })
        };
        assert_eq!(
            shell_end(finished(ExitStatus::Code(2))),
            (
                Some(ExitStatus::Code(2)),
                "its shell exited with status 2".into()
            )
        );
        assert_eq!(
            shell_end(finished(ExitStatus::Signal(9))).1,
            "its shell was killed by signal 9"
        );
        let refused = Some(RunReply::Refused {
            message: "no".into(),
        });
        assert_eq!(
            shell_end(refused),
            (None, "its shell could not start: no".into())
        );
        assert_eq!(shell_end(None), (None, "its supervisor died".into()));
    }

    #[test]
    fn a_session_command_counts_its_output_and_forwards_up_to_its_cap() {
        let mut run = SessionRun {
            id: 9,
            nonce: "n".into(),
            deadline: None,
            killed_at: None,
            timed_out: false,
            totals: [0, 0],
            max_output: 3,
            oom_before: None,
        };
        match run.output(1, b"abcd") {
            Some(Frame::Output {
                id,
                stream,
                offset,
                data,
            }) => {
                assert_eq!((id, stream, offset), (9, StreamId::Stderr, 0));
                assert_eq!(data, b"abc");
            }
            _ => panic!("no output frame"),
        }
        assert!(run.output(1, b"e").is_none());
        assert_eq!(run.totals, [0, 5]);
    }

    #[test]
    fn a_session_answers_for_its_own_id_and_its_commands() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut session = Session {
            id: 1,
            supervisor: Pid::from_raw(1).unwrap(),
            supervisor_reaped: false,
            sup: Some(ours),
            stdin: None,
            pending: VecDeque::new(),
            out: [None, None],
            status: None,
            status_buf: Vec::new(),
            hello: "h".into(),
            shell_pid: None,
            current: None,
            ended: None,
            shell_status: None,
            closing: false,
            reported: false,
        };
        assert!(session.uses_id(1) && !session.uses_id(2));
        assert!(!session.has_deadline());
        session.current = Some(SessionRun {
            id: 2,
            nonce: "n".into(),
            deadline: Some(Instant::now()),
            killed_at: None,
            timed_out: false,
            totals: [0, 0],
            max_output: 0,
            oom_before: None,
        });
        assert!(session.uses_id(2) && session.has_deadline());
        session.kill("closed");
        session.kill("again");
        assert_eq!(session.ended.as_deref(), Some("closed"), "the first why");
        session.shell_ended(None);
        assert_eq!(session.ended.as_deref(), Some("closed"));
        assert!(!session.gone());
        session.reported = true;
        session.supervisor_reaped = true;
        assert!(session.gone());
    }
}
