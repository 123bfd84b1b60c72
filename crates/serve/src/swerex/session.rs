//! SWE-ReX's sessions: each name a hako session, a shell whose state
//! lasts from one command to the next; a command's output is its stdout
//! and stderr as they came, and its exit status is checked as SWE-ReX's
//! own server checks it.

use hako_audit::SessionOp;
use hako_core::{Command, Output, Sandbox, SessionId, SessionOptions};
use serde::Deserialize;
use serde_json::{json, Value};

use super::ops::{audit_exec, audit_session, cut_note, deadline, sandbox, seconds};
use super::text::{backslashreplace, py_repr};
use super::{class, from_hako, Fail};
use crate::state::{lookup, State};

/// What SWE-ReX's sessions report as the match that ended a command (its
/// shell's prompt): a command run to its end in a hako session says the
/// same.
const PS1: &str = "SHELLPS1PREFIX";

/// The longest session name accepted.
const MAX_SESSION_NAME: usize = 256;

/// How long the syntax check of a command may take.
const SYNTAX_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `CreateBashSessionRequest`.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct CreateSession {
    startup_source: Vec<String>,
    session: String,
    session_type: String,
    startup_timeout: f64,
}

impl Default for CreateSession {
    fn default() -> Self {
        CreateSession {
            startup_source: Vec::new(),
            session: "default".into(),
            session_type: "bash".into(),
            startup_timeout: 1.0,
        }
    }
}

fn bash_type(session_type: &str) -> Result<(), Fail> {
    if session_type == "bash" {
        Ok(())
    } else {
        Err(Fail::invalid(format!(
            "session_type {session_type:?}: the only session type is \"bash\""
        )))
    }
}

fn session_name(name: &str) -> Result<(), Fail> {
    if name.len() > MAX_SESSION_NAME {
        return Err(Fail::raise(
            class::VALUE,
            format!(
                "a session name of {} bytes; the longest accepted is {MAX_SESSION_NAME}",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// `POST /create_session`: a hako session under the name, then each
/// startup file sourced in it (within `startup_timeout`), their output
/// answered.
pub(super) fn create(state: &State, request: CreateSession) -> Result<Value, Fail> {
    bash_type(&request.session_type)?;
    session_name(&request.session)?;
    let timeout = deadline(Some(request.startup_timeout))?;
    let (id, sb) = sandbox(state)?;
    let Some(sessions) = sb.sessions() else {
        return Err(Fail::raise(
            class::NOT_IMPLEMENTED,
            format!("the {} backend has no sessions", sb.capabilities().backend),
        ));
    };
    let session = {
        let mut open = state.swerex.open();
        if open.sandbox != Some(id) {
            return Err(Fail::raise(
                class::SWEREX,
                "the sandbox was closed while the session was being made",
            ));
        }
        if open.sessions.contains_key(&request.session) {
            return Err(Fail::raise(
                class::SESSION_EXISTS,
                format!("session {} already exists", request.session),
            ));
        }
        let session = sessions
            .open_session(&SessionOptions::default())
            .map_err(|e| {
                crate::state::note_lost(state, id, &e);
                from_hako(&e)
            })?;
        open.sessions.insert(request.session.clone(), session);
        session
    };
    audit_session(state, SessionOp::Open, id, session);
    let mut output = String::new();
    if !request.startup_source.is_empty() {
        let script: Vec<String> = request
            .startup_source
            .iter()
            .map(|path| format!(". {}", shell_quote(path)))
            .collect();
        let mut command = Command::shell(script.join(" ; "));
        command.timeout = Some(timeout);
        let (out, merged) = in_session(
            state,
            id,
            sb.as_ref(),
            (&request.session, session),
            &command,
        )?;
        if out.timed_out {
            return Err(Fail::raise(
                class::TIMEOUT,
                format!(
                    "timeout after {} seconds while sourcing the startup files {:?}",
                    seconds(Some(request.startup_timeout), timeout),
                    request.startup_source
                ),
            ));
        }
        output = merged;
    }
    Ok(json!({"output": output, "session_type": "bash"}))
}

/// `s` quoted for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Runs `command` in `session`: its output as it came (stdout and stderr
/// merged, as in SWE-ReX's terminal), with a note when it was cut.
fn in_session(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    (name, session): (&str, SessionId),
    command: &Command,
) -> Result<(Output, String), Fail> {
    let Some(sessions) = sb.sessions() else {
        return Err(Fail::raise(
            class::NOT_IMPLEMENTED,
            format!("the {} backend has no sessions", sb.capabilities().backend),
        ));
    };
    let mut merged = Vec::new();
    let result = {
        // The sink gets at most the cap of each stream: bounded.
        let mut sink = |_: hako_core::Stream, chunk: &[u8]| merged.extend_from_slice(chunk);
        sessions.session_exec(session, command, Some(&mut sink))
    };
    audit_exec(state, id, sb, command, Some(session), &result);
    match result {
        Ok(out) => {
            let text = backslashreplace(&merged) + &cut_note(&out);
            Ok((out, text))
        }
        Err(e) => {
            if matches!(e, hako_core::Error::SessionNotOpen { .. }) {
                // Its shell ended (an `exit`): the name is free again.
                state.swerex.open().sessions.retain(|_, s| *s != session);
                return Err(Fail::Raise {
                    class: class::NO_SESSION,
                    message: format!("session {} does not exist: {e}", py_repr(name)),
                    extra: json!({"hako_kind": "no_such_session"}),
                });
            }
            Err(from_hako(&e))
        }
    }
}

/// `BashAction` and `BashInterruptAction`, told apart by `action_type`.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct Action {
    command: Option<String>,
    session: String,
    timeout: Option<f64>,
    is_interactive_command: bool,
    is_interactive_quit: bool,
    check: String,
    error_msg: String,
    expect: Vec<String>,
    action_type: String,
}

impl Default for Action {
    fn default() -> Self {
        Action {
            command: None,
            session: "default".into(),
            timeout: None,
            is_interactive_command: false,
            is_interactive_quit: false,
            check: "raise".into(),
            error_msg: String::new(),
            expect: Vec::new(),
            action_type: "bash".into(),
        }
    }
}

/// The hako session a SWE-ReX session name stands for.
fn named(state: &State, name: &str) -> Result<SessionId, Fail> {
    state
        .swerex
        .open()
        .sessions
        .get(name)
        .copied()
        .ok_or_else(|| {
            Fail::raise(
                class::NO_SESSION,
                format!("session {} does not exist", py_repr(name)),
            )
        })
}

/// `POST /run_in_session`: the command run to its end in the session
/// (its deadline kills what it started and the session goes on); with
/// `check="raise"` a non-zero exit raises, as SWE-ReX's own server does.
pub(super) fn run(state: &State, action: Action) -> Result<Value, Fail> {
    let session = named(state, &action.session)?;
    match action.action_type.as_str() {
        "bash" => {}
        // Every command has ended (or was killed at its deadline) before
        // its answer: nothing is left in the foreground to interrupt.
        "bash_interrupt" => {
            return Ok(observation("", Some(0), PS1));
        }
        other => {
            return Err(Fail::invalid(format!(
                "action_type {other:?}: the actions are \"bash\" and \"bash_interrupt\""
            )))
        }
    }
    let Some(command_line) = action.command else {
        return Err(Fail::invalid("a bash action needs its command"));
    };
    if !matches!(action.check.as_str(), "raise" | "silent" | "ignore") {
        return Err(Fail::invalid(format!(
            "check {:?}: give \"raise\", \"silent\" or \"ignore\"",
            action.check
        )));
    }
    if action.is_interactive_command || action.is_interactive_quit || !action.expect.is_empty() {
        return Err(Fail::raise(
            class::NOT_IMPLEMENTED,
            "hako runs each session command to its end with an empty stdin: interactive commands (is_interactive_command, is_interactive_quit) and expect strings are not supported",
        ));
    }
    let timeout = deadline(action.timeout)?;
    let (id, sb) = sandbox(state)?;
    let mut command = Command::shell(command_line.clone());
    command.timeout = Some(timeout);
    check_syntax(state, id, sb.as_ref(), &command_line)?;
    let (out, output) = in_session(state, id, sb.as_ref(), (&action.session, session), &command)?;
    if out.timed_out {
        return Err(Fail::Raise {
            class: class::TIMEOUT,
            message: format!(
                "timeout after {} seconds while running command {}",
                seconds(action.timeout, timeout),
                py_repr(&command_line)
            ),
            extra: json!({"output": output, "hako_kind": "timeout"}),
        });
    }
    // What a shell reports: the code, or 128 and the signal.
    let code = out
        .status
        .code()
        .or_else(|| out.status.signal().map(|s| 128 + s));
    if action.check == "ignore" {
        return Ok(observation(&output, None, PS1));
    }
    if action.check == "raise" && code != Some(0) {
        let mut message = format!(
            "Command {} failed with exit code {}. Here is the output:\n{}",
            py_repr(&command_line),
            code.map_or("None".to_string(), |c| c.to_string()),
            py_repr(&output)
        );
        if !action.error_msg.is_empty() {
            message = format!("{}: {message}", action.error_msg);
        }
        return Err(Fail::raise(class::NON_ZERO, message));
    }
    Ok(observation(&output, code, PS1))
}

fn observation(output: &str, exit_code: Option<i32>, expect: &str) -> Value {
    json!({
        "output": output,
        "exit_code": exit_code,
        "failure_reason": "",
        "expect_string": expect,
        "session_type": "bash",
    })
}

/// `CloseBashSessionRequest`.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(super) struct CloseSession {
    session: String,
    session_type: String,
}

impl Default for CloseSession {
    fn default() -> Self {
        CloseSession {
            session: "default".into(),
            session_type: "bash".into(),
        }
    }
}

/// `POST /close_session`: the session's shell and what it started are
/// killed.
pub(super) fn close(state: &State, request: CloseSession) -> Result<Value, Fail> {
    bash_type(&request.session_type)?;
    let (session, id) = {
        let mut open = state.swerex.open();
        let session = open.sessions.remove(&request.session).ok_or_else(|| {
            Fail::raise(
                class::NO_SESSION,
                format!("session {} does not exist", py_repr(&request.session)),
            )
        })?;
        (session, open.sandbox)
    };
    if let Some((id, sb)) = id.and_then(|id| lookup(state, id).map(|sb| (id, sb))) {
        if let Some(sessions) = sb.sessions() {
            sessions.close_session(session).map_err(|e| {
                crate::state::note_lost(state, id, &e);
                from_hako(&e)
            })?;
            audit_session(state, SessionOp::Close, id, session);
        }
    }
    Ok(json!({"session_type": "bash"}))
}

/// Checks a session command's syntax with `bash -n` in the sandbox before
/// it runs, as SWE-ReX's own server does: a command that does not parse
/// raises `BashIncorrectSyntaxError` and runs nothing. (A sandbox without
/// bash skips the check; its shell then reports the error itself.)
fn check_syntax(state: &State, id: u64, sb: &dyn Sandbox, command_line: &str) -> Result<(), Fail> {
    let mut check = Command::new(["/bin/bash", "-n"]);
    check.stdin = Some(format!("{command_line}\n").into_bytes());
    check.timeout = Some(SYNTAX_CHECK_TIMEOUT);
    let result = sb.exec(&check);
    audit_exec(state, id, sb, &check, None, &result);
    let out = match result {
        Ok(out) => out,
        Err(hako_core::Error::CommandNotFound { .. } | hako_core::Error::CannotExecute { .. }) => {
            return Ok(())
        }
        Err(e) => return Err(from_hako(&e)),
    };
    if out.status.code() == Some(0) || out.timed_out {
        return Ok(());
    }
    let code = out
        .status
        .code()
        .map_or("None".to_string(), |c| c.to_string());
    let stdout = backslashreplace(&out.stdout);
    let stderr = backslashreplace(&out.stderr);
    Err(Fail::Raise {
        class: class::SYNTAX,
        message: format!(
            "Error (exit code {code}) while checking bash command \n{}\n---- Stderr ----\n{stderr}\n---- Stdout ----\n{stdout}",
            py_repr(command_line)
        ),
        extra: json!({"bash_stdout": stdout, "bash_stderr": stderr}),
    })
}
