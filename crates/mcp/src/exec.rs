//! `run_command` and the process tools, as blocking functions over a
//! sandbox.
//!
//! Two clocks stay apart, as in the library: `timeout_secs` is the
//! process deadline (the sandbox kills the command's whole tree and says
//! it timed out), `wait_secs` only bounds how long the call blocks: when it
//! passes, the caller gets a process handle and the output so far, and the
//! command keeps running under its deadline.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hako_audit::{Exec, FrontEnd, Process, ProcessOp, Record, Session, SessionOp};
use hako_core::{
    Command, ExitStatus, OutputSink, ProcessId, ProcessState, Processes, Sandbox, SessionId,
    SpawnOptions, Stream,
};

use crate::state::{Owner, Reply, State, ToolError};
use crate::text::{shorten, HeadTail};

/// Bytes kept from the start of each stream.
pub const HEAD: usize = 8 << 10;
/// Bytes kept from the end of each stream.
pub const TAIL: usize = 8 << 10;
/// Default process deadline, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// Longest process deadline, in seconds (a day).
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;
/// Default caller's wait, in seconds.
pub const DEFAULT_WAIT_SECS: u64 = 30;
/// Longest caller's wait, in seconds.
pub const MAX_WAIT_SECS: u64 = 600;
/// The sandbox's buffer of a detached command's stdout (its stderr keeps a
/// quarter of it).
const RING: usize = 1 << 20;
/// Cap on each stream where output comes only as a whole (sessions, and
/// sandboxes without long-lived processes): beyond it bytes are counted,
/// not kept, so the tail shown is the end of the first this-many bytes.
const WHOLE_CAP: usize = 1 << 20;
/// How often a running command's output is drained while the call waits.
const POLL: Duration = Duration::from_millis(100);
/// Bytes read from the sandbox at once while draining.
const CHUNK: usize = 64 << 10;
/// Most bytes `read_output` returns at once.
pub const READ_OUTPUT_MAX: usize = 64 << 10;

/// What `run_command` was asked.
pub struct RunRequest {
    /// The shell command line.
    pub command: String,
    /// Working directory, relative to the workspace.
    pub cwd: Option<PathBuf>,
    /// Process deadline.
    pub timeout: Duration,
    /// How long the call waits before returning a handle.
    pub wait: Duration,
    /// Run in this session.
    pub session: Option<u64>,
    /// Keep stdin open for `send_input`.
    pub keep_stdin_open: bool,
}

/// The output of one command as far as it has been read.
struct Captured {
    stdout: HeadTail,
    stderr: HeadTail,
    /// Where to read stdout on from (for a detached command).
    stdout_next: u64,
    stderr_next: u64,
    /// Bytes the command wrote that never reached us (past a whole-output
    /// cap), per stream.
    unseen_out: u64,
    unseen_err: u64,
}

impl Captured {
    fn new() -> Self {
        Captured {
            stdout: HeadTail::new(HEAD, TAIL),
            stderr: HeadTail::new(HEAD, TAIL),
            stdout_next: 0,
            stderr_next: 0,
            unseen_out: 0,
            unseen_err: 0,
        }
    }

    /// Reads what the sandbox holds past what was read, without waiting:
    /// at most a buffer's worth per stream, so that a command that never
    /// stops talking cannot keep the call from its deadline.
    fn drain(&mut self, p: &dyn Processes, id: ProcessId) -> hako_core::Result<()> {
        for stream in [Stream::Stdout, Stream::Stderr] {
            for _ in 0..RING / CHUNK + 1 {
                let (buf, next) = match stream {
                    Stream::Stdout => (&mut self.stdout, &mut self.stdout_next),
                    Stream::Stderr => (&mut self.stderr, &mut self.stderr_next),
                };
                let slice = p.read_output(id, stream, *next, CHUNK, None)?;
                buf.lose(slice.lost);
                buf.push(&slice.data);
                *next = slice.next;
                if slice.data.is_empty() {
                    break;
                }
            }
        }
        Ok(())
    }

    fn stdout_bytes(&self) -> u64 {
        self.stdout.total() + self.unseen_out
    }

    fn stderr_bytes(&self) -> u64 {
        self.stderr.total() + self.unseen_err
    }

    /// The streams as text, with their sizes.
    fn render(&self, out: &mut String, so_far: bool) {
        let label = if so_far { " so far" } else { "" };
        for (name, buf, unseen) in [
            ("stdout", &self.stdout, self.unseen_out),
            ("stderr", &self.stderr, self.unseen_err),
        ] {
            if buf.total() == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "--- {name}{label} ({} bytes) ---",
                buf.total() + unseen
            );
            let text = buf.render();
            out.push_str(&text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        if self.stdout.total() == 0 && self.stderr.total() == 0 {
            let _ = writeln!(out, "(no output{label})");
        }
    }
}

fn status_line(status: ExitStatus) -> String {
    match status {
        ExitStatus::Code(code) => format!("exit code: {code}"),
        ExitStatus::Signal(sig) => format!("killed by signal {sig} (exit code {})", 128 + sig),
    }
}

/// What a tool says of a command the sandbox's memory limit killed.
const OOM_KILLED: &str = "killed by the sandbox's memory limit (exit code 137): the command used more memory than the sandbox's --memory allows; only this command was killed and the sandbox goes on. Do not retry it unchanged: make it use less memory (smaller inputs, fewer parallel jobs), or ask for a sandbox with a larger --memory.";

fn timeout_message(timeout: Duration) -> String {
    format!(
        "timed out after {} s: the command and every process it started were killed. Do not retry the same call unchanged: it will time out again. Give it a larger timeout_secs, make it do less (a narrower test, fewer files), or start it with a short wait_secs and follow it with read_output.",
        timeout.as_secs()
    )
}

/// `run_command`.
pub fn run_command(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
    req: RunRequest,
) -> Result<Reply, ToolError> {
    if req.command.trim().is_empty() {
        return Err(ToolError::new("command is empty"));
    }
    if let Some(session) = req.session {
        owner.check_session(session)?;
    }
    let mut command = Command::shell(req.command.clone()).timeout(req.timeout);
    let start = Instant::now();
    let result = match req.session {
        Some(session) => {
            if req.cwd.is_some() {
                return Err(ToolError::new(
                    "cwd cannot be combined with session: a session keeps its own working directory; run `cd DIR` in the session instead",
                ));
            }
            if req.keep_stdin_open {
                return Err(ToolError::new(
                    "keep_stdin_open cannot be combined with session: a session's commands have an empty stdin; run the command without a session to get a process handle",
                ));
            }
            run_whole(sandbox, command.max_output(WHOLE_CAP), Some(session))
        }
        None => {
            command.cwd = req.cwd.clone();
            match sandbox.processes() {
                Some(p) => run_detachable(p, owner, &command, req.wait, req.keep_stdin_open),
                None if req.keep_stdin_open => Err(ToolError::new(format!(
                    "keep_stdin_open needs long-lived processes, which the {} backend does not offer",
                    sandbox.capabilities().backend
                ))),
                None => run_whole(sandbox, command.max_output(WHOLE_CAP), None),
            }
        }
    };
    let refused_net = state.drain_network(sandbox);
    // A command that could not run is recorded as the call's failure.
    let outcome = result?;
    // What the record says of every command: the line, where it ran.
    let mut shape = Command::shell(req.command.clone());
    shape.cwd = req.cwd.clone();
    let mut exec =
        Exec::new(FrontEnd::Mcp, &sandbox.capabilities().backend, &shape).in_session(req.session);
    exec.tool = Some("run_command".into());
    let mut text = String::new();
    let mut is_error = false;
    match &outcome {
        Outcome::Ended {
            status,
            timed_out,
            oom_killed,
            duration,
            captured,
            kept_whole,
        } => {
            state.record(Record::Exec(
                exec.ended(
                    *status,
                    *timed_out,
                    *duration,
                    captured.stdout_bytes(),
                    captured.stderr_bytes(),
                )
                .oom_killed(*oom_killed),
            ));
            if *timed_out {
                is_error = true;
                let _ = writeln!(text, "{}", timeout_message(req.timeout));
            } else if *oom_killed {
                is_error = true;
                let _ = writeln!(text, "{OOM_KILLED}");
            } else {
                let _ = writeln!(text, "{}", status_line(*status));
            }
            let _ = writeln!(text, "duration: {:.3} s", duration.as_secs_f64());
            captured.render(&mut text, false);
            if let Some(kept) = kept_whole {
                let _ = writeln!(text, "{kept}");
            }
        }
        Outcome::Running { id, captured } => {
            owner.hand_out(*id);
            state.record(Record::Exec(exec.still_running(
                id.0,
                start.elapsed(),
                captured.stdout.total(),
                captured.stderr.total(),
            )));
            let _ = writeln!(
                text,
                "still running after {} s; process handle: {id} (it is killed {} s after it started unless it ends first).",
                req.wait.as_secs(),
                req.timeout.as_secs()
            );
            let _ = writeln!(
                text,
                "Next: read_output {{\"process\": {id}, \"offset\": {}}} for more of its stdout, kill_process {{\"process\": {id}}} to stop it{}.",
                captured.stdout_next,
                if req.keep_stdin_open {
                    ", send_input to write to its stdin"
                } else {
                    ""
                }
            );
            captured.render(&mut text, true);
        }
    }
    for line in refused_net {
        let _ = writeln!(text, "note: {line}");
    }
    Ok(Reply { text, is_error })
}

enum Outcome {
    Ended {
        status: ExitStatus,
        timed_out: bool,
        /// The sandbox's memory limit killed it.
        oom_killed: bool,
        duration: Duration,
        captured: Captured,
        /// A note when output past the whole-output cap was not kept.
        kept_whole: Option<String>,
    },
    Running {
        id: ProcessId,
        captured: Captured,
    },
}

/// Starts the command as a long-lived process and drains its output while
/// waiting up to `wait` for it.
fn run_detachable(
    p: &dyn Processes,
    owner: &Owner,
    command: &Command,
    wait: Duration,
    keep_stdin_open: bool,
) -> Result<Outcome, ToolError> {
    let start = Instant::now();
    let id = p.spawn(
        command,
        &SpawnOptions {
            tags: vec!["run_command".into()],
            live_stdin: keep_stdin_open,
            ring_bytes: Some(RING),
            pty: None,
        },
    )?;
    owner.started(id);
    let deadline = start + wait;
    let mut captured = Captured::new();
    // Drained often at first: the sandbox keeps only the last RING bytes,
    // and the head of a fast talker is what would be lost.
    let mut poll = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let st = p.wait(id, Some(left.min(poll)))?;
        poll = (poll * 2).min(POLL);
        captured.drain(p, id)?;
        if st.finished() {
            let status = ended_status(&st)?;
            return Ok(Outcome::Ended {
                status,
                timed_out: st.timed_out,
                oom_killed: st.oom_killed,
                duration: start.elapsed(),
                captured,
                kept_whole: None,
            });
        }
        if left.is_zero() {
            return Ok(Outcome::Running { id, captured });
        }
    }
}

fn ended_status(st: &ProcessState) -> Result<ExitStatus, ToolError> {
    match (st.status, &st.error) {
        (Some(status), _) => Ok(status),
        (None, Some(err)) => Err(ToolError::new(format!("the command could not run: {err}"))),
        (None, None) => Err(ToolError::new("the command ended without a status")),
    }
}

/// Runs the command to completion where output only comes whole (a
/// session, or a sandbox without long-lived processes).
fn run_whole(
    sandbox: &dyn Sandbox,
    command: Command,
    session: Option<u64>,
) -> Result<Outcome, ToolError> {
    let mut captured = Captured::new();
    let output = {
        let mut sink = |stream: Stream, chunk: &[u8]| match stream {
            Stream::Stdout => captured.stdout.push(chunk),
            Stream::Stderr => captured.stderr.push(chunk),
        };
        let sink: &mut OutputSink<'_> = &mut sink;
        match session {
            Some(id) => {
                let sessions = sandbox.sessions().ok_or_else(|| {
                    ToolError::new(format!(
                        "the {} backend does not offer sessions",
                        sandbox.capabilities().backend
                    ))
                })?;
                sessions.session_exec(SessionId(id), &command, Some(sink))?
            }
            None => match sandbox.exec_stream() {
                Some(streamer) => streamer.exec_stream(&command, sink)?,
                None => {
                    let out = sandbox.exec(&command)?;
                    sink(Stream::Stdout, &out.stdout);
                    sink(Stream::Stderr, &out.stderr);
                    out
                }
            },
        }
    };
    // Bytes produced past the cap were counted by the sandbox, not shown.
    let mut kept_whole = None;
    let unseen_out = output.stdout_total.saturating_sub(captured.stdout.total());
    let unseen_err = output.stderr_total.saturating_sub(captured.stderr.total());
    if unseen_out > 0 || unseen_err > 0 {
        kept_whole = Some(format!(
            "note: only the first {WHOLE_CAP} bytes of each stream were kept here (stdout: {unseen_out} more bytes, stderr: {unseen_err} more); the tail shown is the end of those. Redirect the output to a file and read it, or run without a session."
        ));
    }
    Ok(Outcome::Ended {
        status: output.status,
        timed_out: output.timed_out,
        oom_killed: output.oom_killed,
        duration: output.duration,
        captured: Captured {
            stdout_next: output.stdout_total,
            stderr_next: output.stderr_total,
            unseen_out,
            unseen_err,
            ..captured
        },
        kept_whole,
    })
}

/// `read_output`.
pub fn read_output(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
    process: u64,
    offset: Option<u64>,
    stream: Stream,
    wait: Duration,
) -> Result<Reply, ToolError> {
    let id = owner.check_process(process)?;
    let p = processes(sandbox)?;
    let slice = p.read_output(id, stream, offset.unwrap_or(0), READ_OUTPUT_MAX, Some(wait))?;
    let st = p.wait(id, Some(Duration::ZERO))?;
    let mut text = String::new();
    let name = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    let _ = writeln!(text, "{}", process_line(&st));
    if slice.lost > 0 {
        let _ = writeln!(
            text,
            "note: {} bytes before offset {} were dropped from the buffer before this read",
            slice.lost, slice.offset
        );
    }
    let _ = writeln!(
        text,
        "--- {name} bytes {}..{} ---",
        slice.offset,
        slice.offset.saturating_add(slice.data.len() as u64)
    );
    text.push_str(&String::from_utf8_lossy(&slice.data));
    if !slice.data.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if slice.ended {
        let _ = writeln!(text, "--- end of {name} ---");
    } else {
        let _ = writeln!(
            text,
            "--- next offset: {} (pass it as offset to read on) ---",
            slice.next
        );
    }
    let refused = state.drain_network(sandbox);
    for line in refused {
        let _ = writeln!(text, "note: {line}");
    }
    state.record(Record::Process(Process {
        process,
        sandbox: None,
        op: ProcessOp::ReadOutput {
            stream: name.to_string(),
            offset: slice.offset,
            bytes: slice.data.len() as u64,
            sha256: hako_audit::sha256_hex(&slice.data),
            ended: st.finished(),
            exit_code: st.status.and_then(ExitStatus::code),
        },
    }));
    Ok(text.into())
}

/// `send_input`.
pub fn send_input(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
    process: u64,
    data: &str,
    close: bool,
) -> Result<Reply, ToolError> {
    let id = owner.check_process(process)?;
    let p = processes(sandbox)?;
    if !data.is_empty() {
        p.write_stdin(id, data.as_bytes())?;
    }
    if close {
        p.close_stdin(id)?;
    }
    state.record(Record::Process(Process {
        process,
        sandbox: None,
        op: ProcessOp::SendInput {
            bytes: data.len() as u64,
            sha256: hako_audit::sha256_hex(data.as_bytes()),
            closed_stdin: close,
        },
    }));
    Ok(format!(
        "wrote {} bytes to the stdin of process {process}{}",
        data.len(),
        if close { " and closed it" } else { "" }
    )
    .into())
}

/// `kill_process`.
pub fn kill_process(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
    process: u64,
) -> Result<Reply, ToolError> {
    let id = owner.check_process(process)?;
    let p = processes(sandbox)?;
    p.kill(id)?;
    let st = p.wait(id, Some(Duration::from_secs(5)))?;
    state.drain_network(sandbox);
    state.record(Record::Process(Process {
        process,
        sandbox: None,
        op: ProcessOp::Kill {
            ended: st.finished(),
            exit_code: st.status.and_then(ExitStatus::code),
            signal: st.status.and_then(ExitStatus::signal),
        },
    }));
    Ok(format!(
        "killed process {process} and everything it started; {}",
        process_line(&st)
    )
    .into())
}

/// `list_processes`: this client's processes.
pub fn list_processes(owner: &Owner, sandbox: &dyn Sandbox) -> Result<Reply, ToolError> {
    let p = processes(sandbox)?;
    let all = p.list()?;
    let shown: Vec<&ProcessState> = all
        .iter()
        .filter(|st| owner.owns(st.id) && (!st.finished() || owner.was_handed_out(st.id)))
        .collect();
    if shown.is_empty() {
        return Ok(String::from(
            "no processes (commands that ended within their wait are not listed)",
        )
        .into());
    }
    let mut text = String::new();
    for st in shown.iter().rev().take(200).rev() {
        let _ = writeln!(text, "{}", process_line(st));
    }
    if shown.len() > 200 {
        let _ = writeln!(text, "({} more, older, not shown)", shown.len() - 200);
    }
    Ok(text.into())
}

/// One line about a process: its handle, its state and its command.
fn process_line(st: &ProcessState) -> String {
    let what = match (st.status, &st.error) {
        _ if st.timed_out => "timed out (killed at its deadline)".to_string(),
        _ if st.oom_killed => {
            "killed by the sandbox's memory limit (--memory; exit code 137)".to_string()
        }
        (Some(status), _) => format!("ended, {}", status_line(status)),
        (None, Some(err)) => format!("failed: {err}"),
        (None, None) => "running".to_string(),
    };
    let command = match st.argv.as_slice() {
        [sh, c, script] if sh == "/bin/sh" && c == "-c" => script.clone(),
        argv => argv.join(" "),
    };
    format!(
        "process {}: {what}; stdout {} bytes, stderr {} bytes; command: {}",
        st.id,
        st.stdout_total,
        st.stderr_total,
        shorten(&command, 200)
    )
}

fn processes(sandbox: &dyn Sandbox) -> Result<&dyn Processes, ToolError> {
    sandbox.processes().ok_or_else(|| {
        ToolError::new(format!(
            "the {} backend does not offer long-lived processes",
            sandbox.capabilities().backend
        ))
    })
}

/// `open_session`.
pub fn open_session(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
) -> Result<Reply, ToolError> {
    let sessions = sandbox.sessions().ok_or_else(|| {
        ToolError::new(format!(
            "the {} backend does not offer sessions",
            sandbox.capabilities().backend
        ))
    })?;
    let id = sessions.open_session(&Default::default())?;
    owner.opened_session(id);
    state.record(Record::Session(Session {
        op: SessionOp::Open,
        session: id.0,
        sandbox: None,
    }));
    Ok(format!(
        "session {id} is open: pass \"session\": {id} to run_command to run commands in it; they share its working directory, environment and shell variables. close_session ends it."
    )
    .into())
}

/// `close_session`.
pub fn close_session(
    state: &State,
    owner: &Owner,
    sandbox: &dyn Sandbox,
    session: u64,
) -> Result<Reply, ToolError> {
    let id = owner.check_session(session)?;
    let sessions = sandbox.sessions().ok_or_else(|| {
        ToolError::new(format!(
            "the {} backend does not offer sessions",
            sandbox.capabilities().backend
        ))
    })?;
    // Still owned after: closing it again does nothing, as documented.
    sessions.close_session(id)?;
    state.record(Record::Session(Session {
        op: SessionOp::Close,
        session,
        sandbox: None,
    }));
    Ok(format!("session {session} is closed; everything started in it was killed").into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use hako_host::{HostConfig, HostSandbox};

    fn handle_in(text: &str) -> u64 {
        let at = text.find("process handle: ").expect(text) + "process handle: ".len();
        text[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn run_command_says_a_command_over_the_memory_limit_was_killed_for_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = hako_linux::LinuxConfig::new(tmp.path());
        config.spec.limits.memory = Some(64 << 20);
        let sb = hako_linux::LinuxSandbox::new(config).unwrap();
        let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), None);
        let owner = Owner::default();
        let run = |command: &str| {
            run_command(
                &state,
                &owner,
                &sb,
                RunRequest {
                    command: command.into(),
                    cwd: None,
                    timeout: Duration::from_secs(60),
                    wait: Duration::from_secs(60),
                    session: None,
                    keep_stdin_open: false,
                },
            )
            .unwrap()
        };
        let reply = run("exec dd if=/dev/zero of=/dev/null bs=256M count=1");
        assert!(reply.is_error, "{}", reply.text);
        assert!(
            reply.text.contains("killed by the sandbox's memory limit"),
            "{}",
            reply.text
        );
        let reply = run("kill -9 $$");
        assert!(!reply.text.contains("memory"), "{}", reply.text);
        let reply = run("echo again");
        assert!(
            !reply.is_error && reply.text.contains("again"),
            "{}",
            reply.text
        );
    }

    #[test]
    fn one_client_cannot_use_the_process_or_shell_handles_of_another() {
        let tmp = tempfile::tempdir().unwrap();
        let sb = HostSandbox::new(HostConfig::new(tmp.path())).unwrap();
        let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), None);
        let (mine, theirs) = (Owner::default(), Owner::default());
        let started = run_command(
            &state,
            &mine,
            &sb,
            RunRequest {
                command: "cat".into(),
                cwd: None,
                timeout: Duration::from_secs(60),
                wait: Duration::ZERO,
                session: None,
                keep_stdin_open: true,
            },
        )
        .unwrap();
        let id = handle_in(&started.text);
        // Another client: every tool that takes the handle refuses it,
        // before touching the process.
        let refusals = [
            read_output(
                &state,
                &theirs,
                &sb,
                id,
                None,
                Stream::Stdout,
                Duration::ZERO,
            )
            .err(),
            send_input(&state, &theirs, &sb, id, "x\n", true).err(),
            kill_process(&state, &theirs, &sb, id).err(),
        ];
        for err in refusals {
            let err = err.expect("another client's handle was accepted");
            assert!(err.message.contains("no process"), "{}", err.message);
        }
        let listed = list_processes(&theirs, &sb).unwrap().text;
        assert!(listed.starts_with("no processes"), "{listed}");
        // Its owner still has it, untouched.
        let listed = list_processes(&mine, &sb).unwrap().text;
        assert!(
            listed.contains(&format!("process {id}: running")),
            "{listed}"
        );
        send_input(&state, &mine, &sb, id, "still mine\n", true).unwrap();
        let out = read_output(
            &state,
            &mine,
            &sb,
            id,
            None,
            Stream::Stdout,
            Duration::from_secs(10),
        );
        assert!(out.unwrap().text.contains("still mine"));
        // Shell sessions likewise.
        let opened = open_session(&state, &mine, &sb).unwrap().text;
        let session: u64 = opened
            .strip_prefix("session ")
            .and_then(|t| t.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        let run_in = |owner: &Owner| {
            run_command(
                &state,
                owner,
                &sb,
                RunRequest {
                    command: "echo hi".into(),
                    cwd: None,
                    timeout: Duration::from_secs(60),
                    wait: Duration::from_secs(60),
                    session: Some(session),
                    keep_stdin_open: false,
                },
            )
        };
        let err = run_in(&theirs).unwrap_err();
        assert!(err.message.contains("no shell session"), "{}", err.message);
        let err = close_session(&state, &theirs, &sb, session).unwrap_err();
        assert!(err.message.contains("no shell session"), "{}", err.message);
        assert!(run_in(&mine).unwrap().text.contains("hi"));
        close_session(&state, &mine, &sb, session).unwrap();
        // Closing again does nothing, as documented.
        close_session(&state, &mine, &sb, session).unwrap();
        sb.close().unwrap();
    }
}
