//! Long-lived processes (the core's [`Processes`]): started with live
//! stdin, their output read from any offset still buffered, waited for,
//! killed, listed. A sandbox without them answers `501` `unsupported`.
//!
//! How many run at once in one sandbox is the runtime's bound
//! (`--max-processes`, the server's policy for every sandbox it opens):
//! one more is refused `429` `too_many` and nothing is started. Closing a
//! sandbox kills every process in it (the core's contract for `close`),
//! and each one still running then is recorded `killed_at_close`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hako_audit::{Exec, FrontEnd, Process, ProcessOp, Record};
use hako_core::{
    Command, ExitStatus, OutputSlice, ProcessId, ProcessState, Processes, Sandbox, SpawnOptions,
    Stream, TermSize,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::exec::{env_vars, program};
use crate::reply::{error, from_base64, from_error, no_sandbox, reply, Encoding, Reply};
use crate::state::{audit, audit_failure, lookup, State};
use crate::{MAX_EXEC_TIMEOUT, MAX_PROCESS_WAIT, MAX_READ_OUTPUT};

/// The bytes of each stream one read returns when the request names no
/// `max`.
const DEFAULT_READ: usize = 1 << 20;

/// How long a kill waits for its process to be gone before answering.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    argv: Option<Vec<String>>,
    command: Option<String>,
    cwd: Option<PathBuf>,
    env: Option<BTreeMap<String, String>>,
    tty: Option<Tty>,
    timeout_ms: Option<u64>,
    keep_stdin_open: Option<bool>,
    #[serde(default)]
    tags: Vec<String>,
}

/// A terminal's size.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tty {
    rows: u16,
    cols: u16,
}

/// `POST .../processes/{p}/stdin`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StdinBody {
    data: Option<String>,
    data_base64: Option<String>,
    #[serde(default)]
    close: bool,
}

/// A process's state as the API answers it.
fn state_json(st: &ProcessState) -> Value {
    json!({
        "process": st.id.0,
        "running": !st.finished(),
        "exit_code": st.status.and_then(ExitStatus::code),
        "signal": st.status.and_then(ExitStatus::signal),
        "error": st.error,
        "timed_out": st.timed_out,
        "oom_killed": st.oom_killed,
        "argv": st.argv,
        "tags": st.tags,
        "stdout_bytes": st.stdout_total,
        "stderr_bytes": st.stderr_total,
    })
}

/// Runs `f` on the processes of sandbox `sid`; a sandbox error is
/// recorded (a refusal or an error) and answered, and a sandbox without
/// processes answers `501` `unsupported`.
fn with_processes(
    state: &State,
    sid: &str,
    f: impl FnOnce(u64, &dyn Sandbox, &dyn Processes) -> hako_core::Result<Reply>,
) -> Reply {
    let Some((id, sb)) = sid
        .parse::<u64>()
        .ok()
        .and_then(|n| lookup(state, n).map(|sb| (n, sb)))
    else {
        return no_sandbox(sid);
    };
    let Some(processes) = sb.processes() else {
        return from_error(&hako_core::Error::Unsupported {
            backend: sb.capabilities().backend.clone(),
            capability: "processes",
        });
    };
    f(id, sb.as_ref(), processes).unwrap_or_else(|e| {
        audit_failure(state, id, sb.as_ref(), &e, |_| {});
        from_error(&e)
    })
}

/// A process id from the path, or the answer for one that is not a number.
fn process_id(p: &str) -> Result<ProcessId, Reply> {
    p.parse::<u64>().map(ProcessId).map_err(|_| {
        error(
            400,
            "bad_request",
            format!("a process is a number, not {p:?}"),
        )
    })
}

/// Records `op` on process `process` of sandbox `id`.
fn audit_process(state: &State, id: u64, process: ProcessId, op: ProcessOp) {
    audit(
        state,
        Record::Process(Process {
            process: process.0,
            sandbox: Some(id),
            op,
        }),
    );
}

/// `POST /v1/sandboxes/{id}/processes`: starts a process and answers its
/// handle at once (`201`). Its stdin stays open for `.../stdin` unless
/// `keep_stdin_open` is false; with `tty` it runs on a terminal of that
/// size. No deadline unless `timeout_ms` gives one (closing the sandbox
/// kills it).
pub(crate) fn spawn(state: &State, sid: &str, body: &[u8]) -> Reply {
    let req: SpawnBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(400, "bad_request", format!("bad process request: {e}")),
    };
    let mut command = Command {
        program: match program(req.argv, req.command) {
            Ok(p) => p,
            Err(r) => return r,
        },
        ..Command::new(["true"])
    };
    command.cwd = req.cwd;
    command.env = match env_vars(req.env) {
        Ok(env) => env,
        Err(r) => return r,
    };
    if let Some(ms) = req.timeout_ms {
        let timeout = Duration::from_millis(ms);
        if timeout > MAX_EXEC_TIMEOUT {
            return error(
                400,
                "bad_request",
                format!(
                    "timeout_ms is {ms}; the most allowed is {}",
                    MAX_EXEC_TIMEOUT.as_millis()
                ),
            );
        }
        command.timeout = Some(timeout);
    }
    let pty = match req.tty {
        Some(Tty { rows, cols }) if rows == 0 || cols == 0 => {
            return error(400, "bad_request", "a tty has at least one row and column")
        }
        Some(Tty { rows, cols }) => Some(TermSize { rows, cols }),
        None => None,
    };
    let options = SpawnOptions {
        tags: req.tags,
        live_stdin: req.keep_stdin_open.unwrap_or(true),
        ring_bytes: None,
        pty,
    };
    with_processes(state, sid, |id, sb, p| {
        let process = p.spawn(&command, &options)?;
        let mut exec = Exec::new(FrontEnd::Serve, &sb.capabilities().backend, &command)
            .still_running(process.0, Duration::ZERO, 0, 0);
        exec.sandbox = Some(id);
        audit(state, Record::Exec(exec));
        Ok(reply(201, json!({"process": process.0})))
    })
}

/// `GET /v1/sandboxes/{id}/processes`: every process not yet forgotten,
/// oldest first.
pub(crate) fn list(state: &State, sid: &str) -> Reply {
    with_processes(state, sid, |_, _, p| {
        let all: Vec<Value> = p.list()?.iter().map(state_json).collect();
        Ok(reply(200, json!({"processes": all})))
    })
}

/// `GET /v1/sandboxes/{id}/processes/{p}`.
pub(crate) fn get(state: &State, sid: &str, process: &str) -> Reply {
    let process = match process_id(process) {
        Ok(p) => p,
        Err(r) => return r,
    };
    with_processes(state, sid, |_, _, p| {
        Ok(reply(
            200,
            state_json(&p.wait(process, Some(Duration::ZERO))?),
        ))
    })
}

/// A query's value of `key` as a number, `default` without one.
fn number(query: &[(String, String)], key: &str, default: u64) -> Result<u64, Reply> {
    match query.iter().find(|(k, _)| k == key) {
        None => Ok(default),
        Some((_, v)) => v
            .parse()
            .map_err(|_| error(400, "bad_request", format!("{key} is {v:?}, not a number"))),
    }
}

/// A wait asked for in milliseconds, at most [`MAX_PROCESS_WAIT`].
fn bounded_wait(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_PROCESS_WAIT)
}

/// What a read of a process's output asks for.
struct OutputQuery {
    /// Where to read stdout from.
    offset: u64,
    /// Where to read stderr from.
    stderr_offset: u64,
    /// How long to wait for more (at most [`MAX_PROCESS_WAIT`]).
    wait: Duration,
    /// The most bytes of each stream returned.
    max: usize,
    encoding: Encoding,
}

impl OutputQuery {
    fn parse(query: &[(String, String)]) -> Result<Self, Reply> {
        let max = number(query, "max", DEFAULT_READ as u64)?;
        let max = match usize::try_from(max) {
            Ok(max) if max <= MAX_READ_OUTPUT => max,
            _ => {
                return Err(error(
                    400,
                    "bad_request",
                    format!("max is {max}; the most one read returns is {MAX_READ_OUTPUT} bytes"),
                ))
            }
        };
        Ok(OutputQuery {
            offset: number(query, "offset", 0)?,
            stderr_offset: number(query, "stderr_offset", 0)?,
            wait: bounded_wait(number(query, "wait_ms", 0)?),
            max,
            encoding: match query.iter().find(|(k, _)| k == "encoding") {
                Some((_, v)) => Encoding::parse(v)?,
                None => Encoding::Utf8,
            },
        })
    }
}

/// `GET /v1/sandboxes/{id}/processes/{p}/output?offset=&stderr_offset=&wait_ms=&max=&encoding=`:
/// up to `max` bytes of each stream from its offset. With `wait_ms`, waits
/// (at most [`MAX_PROCESS_WAIT`]) for stdout bytes past `offset` or the
/// end, unless stderr already has some.
pub(crate) fn output(state: &State, sid: &str, process: &str, query: &[(String, String)]) -> Reply {
    let process = match process_id(process) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let OutputQuery {
        offset,
        stderr_offset,
        wait,
        max,
        encoding,
    } = match OutputQuery::parse(query) {
        Ok(q) => q,
        Err(r) => return r,
    };
    with_processes(state, sid, |id, _, p| {
        let early = p.read_output(process, Stream::Stderr, stderr_offset, max, None)?;
        let wait = (early.data.is_empty() && !wait.is_zero()).then_some(wait);
        let stdout = p.read_output(process, Stream::Stdout, offset, max, wait)?;
        let stderr = if wait.is_some() {
            p.read_output(process, Stream::Stderr, stderr_offset, max, None)?
        } else {
            early
        };
        let st = p.wait(process, Some(Duration::ZERO))?;
        for (name, slice) in [("stdout", &stdout), ("stderr", &stderr)] {
            if !slice.data.is_empty() {
                audit_process(
                    state,
                    id,
                    process,
                    ProcessOp::ReadOutput {
                        stream: name.into(),
                        offset: slice.offset,
                        bytes: slice.data.len() as u64,
                        sha256: hako_audit::sha256_hex(&slice.data),
                        ended: st.finished(),
                        exit_code: st.status.and_then(ExitStatus::code),
                    },
                );
            }
        }
        let side = |s: &OutputSlice| (encoding.text(&s.data), s.offset, s.lost, s.next, s.ended);
        let (out, out_from, out_lost, out_next, out_ended) = side(&stdout);
        let (err, err_from, err_lost, err_next, err_ended) = side(&stderr);
        Ok(reply(
            200,
            json!({
                "process": process.0,
                "stdout": out,
                "stderr": err,
                "offset": out_next,
                "stderr_offset": err_next,
                "stdout_from": out_from,
                "stderr_from": err_from,
                "stdout_lost": out_lost,
                "stderr_lost": err_lost,
                "ended": out_ended && err_ended,
                "running": !st.finished(),
                "exit_code": st.status.and_then(ExitStatus::code),
                "signal": st.status.and_then(ExitStatus::signal),
                "encoding": match encoding { Encoding::Utf8 => "utf8", Encoding::Base64 => "base64" },
            }),
        ))
    })
}

/// `POST /v1/sandboxes/{id}/processes/{p}/stdin`: `data` (text) or
/// `data_base64` (bytes) written, and/or `close` ending stdin.
pub(crate) fn stdin(state: &State, sid: &str, process: &str, body: &[u8]) -> Reply {
    let process = match process_id(process) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let req: StdinBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(400, "bad_request", format!("bad stdin request: {e}")),
    };
    let data = match (req.data, req.data_base64) {
        (Some(_), Some(_)) => {
            return error(
                400,
                "bad_request",
                "give at most one of data and data_base64",
            )
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => match from_base64("data_base64", &b64) {
            Ok(bytes) => bytes,
            Err(r) => return r,
        },
        (None, None) if req.close => Vec::new(),
        (None, None) => return error(400, "bad_request", "give data, data_base64 or close: true"),
    };
    with_processes(state, sid, |id, _, p| {
        if !data.is_empty() {
            p.write_stdin(process, &data)?;
        }
        if req.close {
            p.close_stdin(process)?;
        }
        audit_process(
            state,
            id,
            process,
            ProcessOp::SendInput {
                bytes: data.len() as u64,
                sha256: hako_audit::sha256_hex(&data),
                closed_stdin: req.close,
            },
        );
        Ok(reply(200, json!({"ok": true, "written": data.len()})))
    })
}

/// `POST /v1/sandboxes/{id}/processes/{p}/kill`: the process and
/// everything it started (nothing for one that has ended); answers once
/// it is gone, or after a few seconds with its state as it is.
pub(crate) fn kill(state: &State, sid: &str, process: &str) -> Reply {
    let process = match process_id(process) {
        Ok(p) => p,
        Err(r) => return r,
    };
    with_processes(state, sid, |id, _, p| {
        p.kill(process)?;
        let st = p.wait(process, Some(KILL_WAIT))?;
        audit_process(
            state,
            id,
            process,
            ProcessOp::Kill {
                ended: st.finished(),
                exit_code: st.status.and_then(ExitStatus::code),
                signal: st.status.and_then(ExitStatus::signal),
            },
        );
        Ok(reply(200, json!({"ok": true, "state": state_json(&st)})))
    })
}

/// `POST /v1/sandboxes/{id}/processes/{p}/wait?timeout_ms=`: the state
/// once the process ends or the wait does (at most
/// [`MAX_PROCESS_WAIT`], the default), `running` true then.
pub(crate) fn wait(state: &State, sid: &str, process: &str, query: &[(String, String)]) -> Reply {
    let process = match process_id(process) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let max = u64::try_from(MAX_PROCESS_WAIT.as_millis()).unwrap_or(u64::MAX);
    let wait = match number(query, "timeout_ms", max) {
        Ok(ms) => bounded_wait(ms),
        Err(r) => return r,
    };
    with_processes(state, sid, |_, _, p| {
        Ok(reply(200, state_json(&p.wait(process, Some(wait))?)))
    })
}

/// Records each process of `sb` (sandbox `id`) still running, about to be
/// killed by its close.
pub(crate) fn record_killed_at_close(state: &State, id: u64, sb: &dyn Sandbox) {
    if state.config.audit.is_none() {
        return;
    }
    if let Some(Ok(list)) = sb.processes().map(Processes::list) {
        for st in list.iter().filter(|st| !st.finished()) {
            audit_process(
                state,
                id,
                st.id,
                ProcessOp::KilledAtClose {
                    argv: st.argv.clone(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_wait_is_never_longer_than_the_maximum() {
        assert_eq!(bounded_wait(0), Duration::ZERO);
        assert_eq!(bounded_wait(1500), Duration::from_millis(1500));
        assert_eq!(bounded_wait(u64::MAX), MAX_PROCESS_WAIT);
    }

    #[test]
    fn query_numbers_default_and_refuse_what_is_not_one() {
        let q = vec![("offset".to_string(), "12".to_string())];
        assert_eq!(number(&q, "offset", 0).ok(), Some(12));
        assert_eq!(number(&q, "wait_ms", 7).ok(), Some(7));
        let bad = vec![("offset".to_string(), "-1".to_string())];
        assert_eq!(number(&bad, "offset", 0).err().map(|r| r.status), Some(400));
    }
}
