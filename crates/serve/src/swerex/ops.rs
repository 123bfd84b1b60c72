//! The operations of SWE-ReX's protocol on the server's one sandbox: the
//! request models as SWE-ReX's pydantic models define them (unknown
//! fields ignored, defaults the same), each answered with its response
//! model or a [`Fail`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hako_audit::{Exec, FileOp, FrontEnd, Record, Session, SessionOp};
use hako_core::{Command, Output, Program, Sandbox, SessionId};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::text::{backslashreplace, py_repr, Decoding};
use super::{class, detail, from_hako, session, upload, Fail, Route};
use crate::reply::{reply, Reply};
use crate::state::{audit, audit_failure, lookup, table, State};
use crate::{sandboxes, DEFAULT_EXEC_TIMEOUT, MAX_BODY, MAX_EXEC_TIMEOUT};

/// Answers `route` with `body` (its JSON, or for an upload its multipart
/// form of `content_type`).
pub(super) fn answer(state: &State, route: Route, body: &[u8], content_type: &str) -> Reply {
    let result = match route {
        Route::IsAlive => return is_alive(state),
        Route::CreateSession => parse(body).and_then(|r| session::create(state, r)),
        Route::RunInSession => parse(body).and_then(|r| session::run(state, r)),
        Route::CloseSession => parse(body).and_then(|r| session::close(state, r)),
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
pub(super) fn deadline(seconds: Option<f64>) -> Result<Duration, Fail> {
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
pub(super) fn seconds(s: Option<f64>, fallback: Duration) -> String {
    let s = s.unwrap_or(fallback.as_secs_f64());
    if s.fract() == 0.0 && s.abs() < 1e15 {
        format!("{s:.1}")
    } else {
        format!("{s}")
    }
}

/// A note after output that was cut at the cap, so the reader knows.
pub(super) fn cut_note(out: &Output) -> String {
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
pub(super) fn audit_exec(
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

pub(super) fn audit_session(state: &State, op: SessionOp, sandbox: u64, session: SessionId) {
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
    file_op(state, id, sb, dir, || mk.make_dir_all(dir))?;
    audit_file(state, id, dir, FileOp::MakeDir);
    Ok(())
}

/// Writes `data` to `path`, its missing parents made first (as SWE-ReX's
/// own server does; through the core's `write_file_creating_parents`, as
/// every front end writes), recorded.
pub(super) fn write(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    path: &Path,
    data: &[u8],
) -> Result<(), Fail> {
    let made = file_op(state, id, sb, path, || {
        hako_core::write_file_creating_parents(sb, path, data)
    })?;
    if let Some(parent) = &made {
        audit_file(state, id, parent, FileOp::MakeDir);
    }
    audit_file(state, id, path, FileOp::write(data));
    Ok(())
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
        _ => Err(Fail::invalid("command: a string or a list of strings")),
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
