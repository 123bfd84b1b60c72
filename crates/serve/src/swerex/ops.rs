//! The operations of SWE-ReX's protocol on the server's one sandbox: the
//! request models as SWE-ReX's pydantic models define them (unknown
//! fields ignored, defaults the same), each answered with its response
//! model or a [`Fail`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hako_audit::{Exec, FileOp, FrontEnd, Record, Session, SessionOp};
use hako_core::{Command, Output, Program, Sandbox, SessionId, SessionOptions};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{class, detail, from_hako, upload, Fail, Route};
use crate::reply::{reply, Reply};
use crate::state::{audit, audit_failure, lookup, table, State};
use crate::{sandboxes, DEFAULT_EXEC_TIMEOUT, MAX_BODY, MAX_EXEC_TIMEOUT};

/// What SWE-ReX's sessions report as the match that ended a command (its
/// shell's prompt): a command run to its end in a hako session says the
/// same.
const PS1: &str = "SHELLPS1PREFIX";

/// The longest session name accepted.
const MAX_SESSION_NAME: usize = 256;

/// Answers `route` with `body` (its JSON, or for an upload its multipart
/// form of `content_type`).
pub(super) fn answer(state: &State, route: Route, body: &[u8], content_type: &str) -> Reply {
    let result = match route {
        Route::IsAlive => return is_alive(state),
        Route::CreateSession => parse(body).and_then(|r| create_session(state, r)),
        Route::RunInSession => parse(body).and_then(|r| run_in_session(state, r)),
        Route::CloseSession => parse(body).and_then(|r| close_session(state, r)),
        Route::Execute => parse(body).and_then(|r| execute(state, r)),
        Route::ReadFile => parse(body).and_then(|r| read_file(state, r)),
        Route::WriteFile => parse(body).and_then(|r| write_file(state, r)),
        Route::Upload => upload::upload(state, body, content_type).map(|()| json!({})),
        Route::Close => close(state),
    };
    match result {
        Ok(v) => reply(200, v),
        Err(f) => f.reply(),
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Fail> {
    serde_json::from_slice(body).map_err(|e| Fail::invalid(format!("the request's JSON: {e}")))
}

/// The server's sandbox, opened (with the server's policy, recorded like
/// any other) if it is not yet.
pub(super) fn sandbox(state: &State) -> Result<(u64, Arc<dyn Sandbox>), Fail> {
    let mut open = state.swerex.open();
    if let Some(id) = open.sandbox {
        if let Some(sb) = lookup(state, id) {
            return Ok((id, sb));
        }
    }
    open.sandbox = None;
    open.sessions.clear();
    let made = sandboxes::create(state, b"");
    let opened = made.body["id"]
        .as_u64()
        .filter(|_| made.status == 201)
        .and_then(|id| lookup(state, id).map(|sb| (id, sb)));
    match opened {
        Some((id, sb)) => {
            open.sandbox = Some(id);
            Ok((id, sb))
        }
        None => Err(Fail::Raise {
            class: class::SWEREX,
            message: format!(
                "cannot open the sandbox: {}",
                made.body["error"].as_str().unwrap_or("")
            ),
            extra: json!({"hako_kind": made.body["kind"]}),
        }),
    }
}

/// `GET /is_alive`: the sandbox opens (or is open, and not lost). When it
/// cannot, the client is told why (its `is_alive` returns false with the
/// message).
fn is_alive(state: &State) -> Reply {
    match sandbox(state) {
        Ok((id, _)) if table(state).lost.contains(&id) => detail(
            503,
            "the sandbox was lost (its processes died); POST /close, and the next request opens a new one",
        ),
        Ok(_) => reply(200, json!({"is_alive": true, "message": ""})),
        Err(Fail::Raise { message, .. }) => detail(503, message),
        Err(f) => f.reply(),
    }
}

/// A deadline from SWE-ReX's seconds: none means the server's default (a
/// command never runs without one), more than the most allowed is
/// refused.
fn deadline(seconds: Option<f64>) -> Result<Duration, Fail> {
    let Some(s) = seconds else {
        return Ok(DEFAULT_EXEC_TIMEOUT);
    };
    if !s.is_finite() || s < 0.0 || s > MAX_EXEC_TIMEOUT.as_secs_f64() {
        return Err(Fail::raise(
            class::VALUE,
            format!(
                "the timeout is {s} seconds; give one from 0 to {} (hako serve's longest)",
                MAX_EXEC_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// `seconds` as Python prints a float (`5.0`, `0.5`).
fn seconds(s: Option<f64>, fallback: Duration) -> String {
    let s = s.unwrap_or(fallback.as_secs_f64());
    if s.fract() == 0.0 && s.abs() < 1e15 {
        format!("{s:.1}")
    } else {
        format!("{s}")
    }
}

/// A string as Python's `repr` shows it (for the messages SWE-ReX's own
/// server words with `!r`).
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Bytes as text the way SWE-ReX decodes a command's output
/// (`errors="backslashreplace"`): invalid bytes become `\xNN`.
fn backslashreplace(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A note after output that was cut at the cap, so the reader knows.
fn cut_note(out: &Output) -> String {
    let mut note = String::new();
    if out.stdout_truncated {
        note.push_str(&format!(
            "\n[hako: stdout cut at {} of {} bytes]",
            out.stdout.len(),
            out.stdout_total
        ));
    }
    if out.stderr_truncated {
        note.push_str(&format!(
            "\n[hako: stderr cut at {} of {} bytes]",
            out.stderr.len(),
            out.stderr_total
        ));
    }
    note
}

/// Records a command's result, or its failure.
fn audit_exec(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    command: &Command,
    session: Option<SessionId>,
    result: &hako_core::Result<Output>,
) {
    match result {
        Ok(out) => {
            let mut exec = Exec::new(FrontEnd::Serve, &sb.capabilities().backend, command)
                .in_session(session.map(|s| s.0))
                .output(out);
            exec.sandbox = Some(id);
            audit(state, Record::Exec(exec));
        }
        Err(e) => audit_failure(state, id, sb, e, |f| {
            f.argv = Some(command.program.argv());
        }),
    }
}

fn audit_session(state: &State, op: SessionOp, sandbox: u64, session: SessionId) {
    audit(
        state,
        Record::Session(Session {
            op,
            session: session.0,
            sandbox: Some(sandbox),
        }),
    );
}

fn audit_file(state: &State, id: u64, path: &Path, op: FileOp) {
    audit(
        state,
        Record::File(hako_audit::File::new(FrontEnd::Serve, Some(id), path, op)),
    );
}

/// A file operation on the sandbox, its failure recorded and raised.
pub(super) fn file_op<T>(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    path: &Path,
    op: impl FnOnce() -> hako_core::Result<T>,
) -> Result<T, Fail> {
    op().map_err(|e| {
        audit_failure(state, id, sb, &e, |f| f.path = Some(path.to_path_buf()));
        from_hako(&e)
    })
}

/// `mkdir -p` of `dir` through the fence.
pub(super) fn make_dirs(state: &State, id: u64, sb: &dyn Sandbox, dir: &Path) -> Result<(), Fail> {
    let Some(mk) = sb.make_dir_all() else {
        return Err(Fail::raise(
            class::NOT_IMPLEMENTED,
            format!(
                "the {} backend cannot create directories through its fence",
                sb.capabilities().backend
            ),
        ));
    };
    file_op(state, id, sb, dir, || mk.make_dir_all(dir))
}

/// Writes `data` to `path` (its missing parents made first, as SWE-ReX
/// does), recorded.
pub(super) fn write(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    path: &Path,
    data: &[u8],
) -> Result<(), Fail> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_dirs(state, id, sb, parent)?;
    }
    file_op(state, id, sb, path, || sb.write_file(path, data))?;
    audit_file(state, id, path, FileOp::write(data));
    Ok(())
}

/// `CreateBashSessionRequest`.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct CreateSession {
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
fn create_session(state: &State, request: CreateSession) -> Result<Value, Fail> {
    bash_type(&request.session_type)?;
    session_name(&request.session)?;
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
        let timeout = deadline(Some(request.startup_timeout))?;
        let script: Vec<String> = request
            .startup_source
            .iter()
            .map(|path| format!(". {}", shell_quote(path)))
            .collect();
        let mut command = Command::shell(script.join(" ; "));
        command.timeout = Some(timeout);
        let (out, merged) = in_session(state, id, sb.as_ref(), session, &command)?;
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
    session: SessionId,
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
                state
                    .swerex
                    .open()
                    .sessions
                    .retain(|_, s| *s != session);
            }
            Err(from_hako(&e))
        }
    }
}

/// `BashAction` and `BashInterruptAction`, told apart by `action_type`.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct Action {
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
fn run_in_session(state: &State, action: Action) -> Result<Value, Fail> {
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
    let (out, output) = in_session(state, id, sb.as_ref(), session, &command)?;
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
struct CloseSession {
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
fn close_session(state: &State, request: CloseSession) -> Result<Value, Fail> {
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

/// `Command`: a one-off command, as `subprocess.run` takes it.
#[derive(Debug, Deserialize)]
struct Execute {
    command: Value,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    shell: bool,
    #[serde(default)]
    check: bool,
    #[serde(default)]
    error_msg: String,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    merge_output_streams: bool,
}

/// The program `subprocess.run(command, shell=shell)` runs.
fn program(command: &Value, shell: bool) -> Result<Program, Fail> {
    let list = |l: &Vec<Value>| -> Result<Vec<String>, Fail> {
        l.iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Fail::invalid("command: each argument is a string"))
            })
            .collect()
    };
    match (command, shell) {
        (Value::String(s), true) => Ok(Program::Shell(s.clone())),
        (Value::String(s), false) => Ok(Program::Argv(vec![s.clone()])),
        (Value::Array(l), _) if l.is_empty() => Err(Fail::raise(
            class::VALUE,
            "the command is an empty list: nothing to run",
        )),
        (Value::Array(l), false) => Ok(Program::Argv(list(l)?)),
        // As Python does: the first item is the script, the rest its
        // positional parameters.
        (Value::Array(l), true) => {
            let mut argv = vec!["/bin/sh".to_string(), "-c".to_string()];
            argv.extend(list(l)?);
            Ok(Program::Argv(argv))
        }
        _ => Err(Fail::invalid(
            "command: a string or a list of strings",
        )),
    }
}

/// `POST /execute`: a command on its own (not in a session). `env` is
/// added over the sandbox's sanitised environment (the host's never comes
/// in); `cwd` is a path like any other.
fn execute(state: &State, request: Execute) -> Result<Value, Fail> {
    let program = program(&request.command, request.shell)?;
    let timeout = deadline(request.timeout)?;
    let (id, sb) = sandbox(state)?;
    let mut command = Command {
        program,
        ..Command::new(["true"])
    };
    command.timeout = Some(timeout);
    command.cwd = request.cwd.map(PathBuf::from);
    command.env = request.env.unwrap_or_default().into_iter().collect();
    let mut merged = Vec::new();
    let result = match (request.merge_output_streams, sb.exec_stream()) {
        (true, Some(streamer)) => {
            let mut sink = |_: hako_core::Stream, chunk: &[u8]| merged.extend_from_slice(chunk);
            streamer.exec_stream(&command, &mut sink)
        }
        _ => sb.exec(&command),
    };
    audit_exec(state, id, sb.as_ref(), &command, None, &result);
    let out = result.map_err(|e| from_hako(&e))?;
    if out.timed_out {
        return Err(Fail::raise(
            class::TIMEOUT,
            format!(
                "Timeout ({}s) exceeded while running command",
                seconds(request.timeout, timeout)
            ),
        ));
    }
    let (stdout, stderr) = if request.merge_output_streams {
        let merged = if sb.exec_stream().is_some() {
            merged
        } else {
            [out.stdout.as_slice(), out.stderr.as_slice()].concat()
        };
        (backslashreplace(&merged) + &cut_note(&out), String::new())
    } else {
        let mut stdout = backslashreplace(&out.stdout);
        let mut stderr = backslashreplace(&out.stderr);
        if out.stdout_truncated {
            stdout.push_str(&format!(
                "\n[hako: stdout cut at {} of {} bytes]",
                out.stdout.len(),
                out.stdout_total
            ));
        }
        if out.stderr_truncated {
            stderr.push_str(&format!(
                "\n[hako: stderr cut at {} of {} bytes]",
                out.stderr.len(),
                out.stderr_total
            ));
        }
        (stdout, stderr)
    };
    // As `subprocess` reports it: the code, or minus the signal.
    let code = out
        .status
        .code()
        .or_else(|| out.status.signal().map(|s| -s));
    if request.check && code != Some(0) {
        let mut message = format!(
            "Command {} failed with exit code {}. Stdout:\n{}\nStderr:\n{}",
            command_repr(&request.command),
            code.map_or("None".to_string(), |c| c.to_string()),
            py_repr(&stdout),
            py_repr(&stderr)
        );
        if !request.error_msg.is_empty() {
            message = format!("{}: {message}", request.error_msg);
        }
        return Err(Fail::raise(class::NON_ZERO, message));
    }
    Ok(json!({"stdout": stdout, "stderr": stderr, "exit_code": code}))
}

fn command_repr(command: &Value) -> String {
    match command {
        Value::String(s) => py_repr(s),
        Value::Array(l) => {
            let items: Vec<String> = l
                .iter()
                .map(|v| py_repr(v.as_str().unwrap_or_default()))
                .collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// `ReadFileRequest`.
#[derive(Debug, Deserialize)]
struct ReadFile {
    path: String,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    errors: Option<String>,
}

/// `POST /read_file`: the whole file as text (at most [`MAX_BODY`]
/// bytes; a larger one is refused, never cut), decoded as asked.
fn read_file(state: &State, request: ReadFile) -> Result<Value, Fail> {
    let decode = Decoding::new(request.encoding.as_deref(), request.errors.as_deref())?;
    let (id, sb) = sandbox(state)?;
    let path = PathBuf::from(&request.path);
    let (data, truncated) = file_op(state, id, sb.as_ref(), &path, || match sb.read_limit() {
        Some(rl) => rl
            .read_file_limit(&path, MAX_BODY)
            .map(|o| (o.data, o.truncated)),
        None => sb.read_file(&path).map(|d| (d, false)),
    })?;
    if truncated {
        return Err(Fail::raise(
            class::OS,
            format!(
                "{} is over {MAX_BODY} bytes, the most hako serve reads at once",
                request.path
            ),
        ));
    }
    audit_file(state, id, &path, FileOp::read(&data, false));
    let content = decode.text(&data).map_err(|(byte, at)| {
        Fail::raise(
            class::VALUE,
            format!(
                "'{}' codec can't decode byte 0x{byte:02x} in position {at} of {}",
                decode.name(),
                request.path
            ),
        )
    })?;
    Ok(json!({"content": content}))
}

/// How a file's bytes become text: `Path.read_text`'s `encoding` and
/// `errors`, for the encodings agents' files are in.
struct Decoding {
    encoding: Encoding,
    errors: Errors,
}

#[derive(Clone, Copy)]
enum Encoding {
    Utf8,
    Ascii,
    Latin1,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Errors {
    Strict,
    Replace,
    Ignore,
    BackslashReplace,
}

impl Decoding {
    fn new(encoding: Option<&str>, errors: Option<&str>) -> Result<Self, Fail> {
        let name = encoding
            .unwrap_or("utf-8")
            .to_ascii_lowercase()
            .replace('_', "-");
        let encoding = match name.as_str() {
            "utf-8" | "utf8" | "u8" => Encoding::Utf8,
            "ascii" | "us-ascii" => Encoding::Ascii,
            "latin-1" | "latin1" | "iso-8859-1" | "iso8859-1" | "l1" => Encoding::Latin1,
            _ => {
                return Err(Fail::raise(
                    class::LOOKUP,
                    format!(
                        "encoding {name:?}: hako serve --swerex reads utf-8, ascii and latin-1"
                    ),
                ))
            }
        };
        let errors = match errors.unwrap_or("strict") {
            "strict" => Errors::Strict,
            "replace" => Errors::Replace,
            "ignore" => Errors::Ignore,
            "backslashreplace" => Errors::BackslashReplace,
            other => {
                return Err(Fail::raise(
                    class::LOOKUP,
                    format!(
                        "errors {other:?}: hako serve --swerex takes strict, replace, ignore and backslashreplace"
                    ),
                ))
            }
        };
        Ok(Decoding { encoding, errors })
    }

    fn name(&self) -> &'static str {
        match self.encoding {
            Encoding::Utf8 => "utf-8",
            Encoding::Ascii => "ascii",
            Encoding::Latin1 => "latin-1",
        }
    }

    /// The text, or the first byte that cannot be decoded and its offset
    /// (`strict`).
    fn text(&self, data: &[u8]) -> Result<String, (u8, usize)> {
        let mut out = String::with_capacity(data.len());
        let bad = |out: &mut String, b: u8, at: usize| -> Result<(), (u8, usize)> {
            match self.errors {
                Errors::Strict => return Err((b, at)),
                Errors::Replace => out.push('\u{fffd}'),
                Errors::Ignore => {}
                Errors::BackslashReplace => out.push_str(&format!("\\x{b:02x}")),
            }
            Ok(())
        };
        match self.encoding {
            Encoding::Latin1 => out.extend(data.iter().map(|&b| char::from(b))),
            Encoding::Ascii => {
                for (at, &b) in data.iter().enumerate() {
                    if b.is_ascii() {
                        out.push(char::from(b));
                    } else {
                        bad(&mut out, b, at)?;
                    }
                }
            }
            Encoding::Utf8 => {
                let mut at = 0;
                for chunk in data.utf8_chunks() {
                    out.push_str(chunk.valid());
                    at += chunk.valid().len();
                    let invalid = chunk.invalid();
                    if !invalid.is_empty() {
                        if self.errors == Errors::Replace {
                            // One replacement per invalid sequence, as Python.
                            out.push('\u{fffd}');
                        } else {
                            for (i, &b) in invalid.iter().enumerate() {
                                bad(&mut out, b, at + i)?;
                            }
                        }
                        at += invalid.len();
                    }
                }
            }
        }
        Ok(out)
    }
}

/// `WriteFileRequest`.
#[derive(Debug, Deserialize)]
struct WriteFile {
    content: String,
    path: String,
}

/// `POST /write_file`: the file replaced (its missing parents made).
fn write_file(state: &State, request: WriteFile) -> Result<Value, Fail> {
    let (id, sb) = sandbox(state)?;
    write(
        state,
        id,
        sb.as_ref(),
        Path::new(&request.path),
        request.content.as_bytes(),
    )?;
    Ok(json!({}))
}

/// `POST /close`: every session and the sandbox closed (what ran in it
/// killed); the next request opens a new one.
fn close(state: &State) -> Result<Value, Fail> {
    let id = {
        let mut open = state.swerex.open();
        open.sessions.clear();
        open.sandbox.take()
    };
    if let Some(id) = id {
        let closed = sandboxes::close(state, &id.to_string());
        if closed.status != 200 && closed.status != 404 {
            return Err(Fail::Raise {
                class: class::SWEREX,
                message: format!(
                    "the sandbox did not close cleanly: {}",
                    closed.body["error"].as_str().unwrap_or("")
                ),
                extra: json!({"hako_kind": closed.body["kind"]}),
            });
        }
    }
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn python_repr_quotes_as_python_does() {
        assert_eq!(py_repr("ls -l"), "'ls -l'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_repr("x\ny\\"), "'x\\ny\\\\'");
    }

    #[test]
    fn a_deadline_is_always_set_and_never_past_the_longest() {
        assert_eq!(deadline(None).unwrap(), DEFAULT_EXEC_TIMEOUT);
        assert_eq!(deadline(Some(0.5)).unwrap(), Duration::from_millis(500));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e12] {
            assert!(deadline(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(seconds(Some(5.0), DEFAULT_EXEC_TIMEOUT), "5.0");
        assert_eq!(seconds(Some(0.25), DEFAULT_EXEC_TIMEOUT), "0.25");
    }

    #[test]
    fn text_is_decoded_as_read_text_would_or_the_bad_byte_is_named() {
        let strict = Decoding::new(None, None).unwrap();
        assert_eq!(strict.text("café".as_bytes()).unwrap(), "café");
        assert_eq!(strict.text(b"ab\xffc").unwrap_err(), (0xff, 2));
        let replace = Decoding::new(Some("UTF-8"), Some("replace")).unwrap();
        assert_eq!(replace.text(b"ab\xffc").unwrap(), "ab\u{fffd}c");
        let ignore = Decoding::new(Some("utf_8"), Some("ignore")).unwrap();
        assert_eq!(ignore.text(b"ab\xffc").unwrap(), "abc");
        let bs = Decoding::new(None, Some("backslashreplace")).unwrap();
        assert_eq!(bs.text(b"ab\xffc").unwrap(), "ab\\xffc");
        let latin = Decoding::new(Some("latin-1"), None).unwrap();
        assert_eq!(latin.text(b"caf\xe9").unwrap(), "café");
        assert!(Decoding::new(Some("ebcdic"), None).is_err());
        assert!(Decoding::new(None, Some("surrogateescape")).is_err());
    }

    #[test]
    fn a_command_is_run_as_subprocess_would_run_it() {
        let p = |v: Value, shell| program(&v, shell).ok();
        assert_eq!(
            p(json!("echo hi"), true),
            Some(Program::Shell("echo hi".into()))
        );
        assert_eq!(
            p(json!("ls"), false),
            Some(Program::Argv(vec!["ls".into()]))
        );
        assert_eq!(
            p(json!(["ls", "-l"]), false),
            Some(Program::Argv(vec!["ls".into(), "-l".into()]))
        );
        assert_eq!(
            p(json!(["echo $0", "x"]), true),
            Some(Program::Argv(vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $0".into(),
                "x".into()
            ]))
        );
        assert!(p(json!([]), false).is_none());
        assert!(p(json!([1]), false).is_none());
        assert!(p(json!(3), false).is_none());
    }
}
