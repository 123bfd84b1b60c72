//! Running a command: its request, its deadline, and its output as one
//! JSON object or streamed as JSON lines.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hako_audit::{Exec, FrontEnd, Record};
use hako_core::{
    Command, Error, LimitKind, Output, Program, Sandbox, SessionId, Stream, DEFAULT_MAX_OUTPUT,
};
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::reply::{
    error, from_base64, from_error, output_json, reply, response, with_body, Body, Encoding, Reply,
};
use crate::routes::blocking;
use crate::state::{audit, audit_failure, Slot, State};
use crate::{DEFAULT_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT, STREAM_BUFFER};

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecBody {
    argv: Option<Vec<String>>,
    command: Option<String>,
    cwd: Option<PathBuf>,
    env: Option<BTreeMap<String, String>>,
    timeout_ms: Option<u64>,
    stdin: Option<String>,
    stdin_base64: Option<String>,
    #[serde(default)]
    encoding: Encoding,
    max_output: Option<u64>,
    session: Option<u64>,
    #[serde(default)]
    stream: bool,
}

/// What to run: exactly one of `argv` (not empty) and `command`.
pub(crate) fn program(
    argv: Option<Vec<String>>,
    command: Option<String>,
) -> Result<Program, Reply> {
    match (argv, command) {
        (Some(argv), None) if !argv.is_empty() => Ok(Program::Argv(argv)),
        (None, Some(cmd)) => Ok(Program::Shell(cmd)),
        _ => Err(error(
            400,
            "bad_request",
            "give exactly one of argv (non-empty) and command",
        )),
    }
}

/// A request's `env`, checked: a name is not empty and holds no `=` or
/// NUL, a value no NUL (the command would otherwise get a variable other
/// than the one asked for, or none).
pub(crate) fn env_vars(
    env: Option<BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, Reply> {
    let env = env.unwrap_or_default();
    for (name, value) in &env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(error(
                400,
                "bad_request",
                format!("env {name:?}: a name must be non-empty without '=' or NUL, a value without NUL"),
            ));
        }
    }
    Ok(env.into_iter().collect())
}

/// A request's stdin: `stdin` (text) or `stdin_base64` (bytes), not both.
fn stdin_bytes(
    stdin: Option<String>,
    stdin_base64: Option<String>,
) -> Result<Option<Vec<u8>>, Reply> {
    match (stdin, stdin_base64) {
        (Some(_), Some(_)) => Err(error(
            400,
            "bad_request",
            "give at most one of stdin and stdin_base64",
        )),
        (Some(text), None) => Ok(Some(text.into_bytes())),
        (None, Some(b64)) => from_base64("stdin_base64", &b64).map(Some),
        (None, None) => Ok(None),
    }
}

/// The most output bytes per stream a request may ask `sb` to keep: the
/// cap the server's policy gave it (`--max-output`, reported in its
/// limits), or the core's default where it reports none.
fn output_cap(sb: &dyn Sandbox) -> u64 {
    sb.capabilities()
        .limits
        .iter()
        .find(|l| l.kind == LimitKind::OutputBytes)
        .and_then(|l| l.value)
        .unwrap_or(DEFAULT_MAX_OUTPUT as u64)
}

/// A request's `max_output`: at most `cap` bytes (a client cannot raise
/// the server's policy; more is refused, never cut down silently); `None`
/// leaves the sandbox's own.
fn max_output(max: Option<u64>, cap: u64) -> Result<Option<usize>, Reply> {
    match max {
        None => Ok(None),
        Some(n) => match usize::try_from(n) {
            Ok(size) if n <= cap => Ok(Some(size)),
            _ => Err(error(
                400,
                "bad_request",
                format!(
                    "max_output is {n}; the most this server allows is {cap} bytes per stream (its --max-output)"
                ),
            )),
        },
    }
}

/// A command from an exec request's body, for a sandbox whose output cap
/// is `cap`.
fn prepare(req: ExecBody, cap: u64) -> Result<Command, Reply> {
    let mut command = Command {
        program: program(req.argv, req.command)?,
        ..Command::new(["true"])
    };
    command.timeout = Some(exec_timeout(req.timeout_ms)?);
    command.max_output = max_output(req.max_output, cap)?;
    let stdin = stdin_bytes(req.stdin, req.stdin_base64)?;
    let env = env_vars(req.env)?;
    if req.session.is_none() {
        command.cwd = req.cwd;
        command.stdin = stdin;
        command.env = env;
    } else if req.cwd.is_some() || stdin.is_some() || !env.is_empty() {
        return Err(error(
            400,
            "bad_request",
            "a session command takes no cwd, env or stdin (cd and export inside the session)",
        ));
    }
    Ok(command)
}

/// A command's deadline: the request's, at most [`MAX_EXEC_TIMEOUT`], or
/// [`DEFAULT_EXEC_TIMEOUT`]. Never none: a command without one would hold
/// its thread and slot for ever.
fn exec_timeout(timeout_ms: Option<u64>) -> Result<Duration, Reply> {
    let Some(ms) = timeout_ms else {
        return Ok(DEFAULT_EXEC_TIMEOUT);
    };
    let timeout = Duration::from_millis(ms);
    if timeout > MAX_EXEC_TIMEOUT {
        return Err(error(
            400,
            "bad_request",
            format!(
                "timeout_ms is {ms}; the most allowed is {}",
                MAX_EXEC_TIMEOUT.as_millis()
            ),
        ));
    }
    Ok(timeout)
}

/// A command ready to run.
struct Prepared {
    command: Command,
    /// The sandbox's id.
    sandbox: u64,
    session: Option<u64>,
    /// How its output is put in JSON.
    encoding: Encoding,
}

/// `POST /v1/sandboxes/{id}/exec` on sandbox `id`, its body read: the
/// result as one JSON object, or streamed as JSON lines.
pub(crate) async fn exec(
    state: Arc<State>,
    id: u64,
    sb: Arc<dyn Sandbox>,
    body: &[u8],
    slot: Option<Slot>,
) -> Response<Body> {
    let req: ExecBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return response(error(400, "bad_request", format!("bad exec request: {e}"))),
    };
    let session = req.session;
    let stream = req.stream;
    let encoding = req.encoding;
    let command = match prepare(req, output_cap(sb.as_ref())) {
        Ok(command) => command,
        Err(r) => return response(r),
    };
    let prepared = Prepared {
        command,
        sandbox: id,
        session,
        encoding,
    };
    let turn = state.starts.enter().await;
    if !stream {
        return response(
            blocking(move || {
                let _slot = slot;
                let _turn = turn;
                let result = run_command(&state, sb.as_ref(), &prepared, None);
                match result {
                    Ok(out) => reply(200, output_json(&out, prepared.encoding)),
                    Err(e) => from_error(&e),
                }
            })
            .await,
        );
    }
    // Streamed: JSON lines, written as the output comes (a chunked
    // response fed through a channel). A client that reads slower than the
    // command writes never slows the command and never makes the server
    // buffer more than STREAM_BUFFER bytes: past it, chunks are dropped and
    // a `dropped` line says how many bytes were.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let queued = Arc::new(AtomicUsize::new(0));
    let stream_body = ChannelBody {
        rx,
        queued: Arc::clone(&queued),
    };
    let spawned = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let _turn = turn;
        stream_command(&state, sb.as_ref(), &prepared, &tx, &queued);
    });
    drop(spawned);
    with_body(200, "application/x-ndjson", stream_body.boxed())
}

/// Runs a command (in its session, if it names one), feeding `sink` the
/// output as it comes when given one, and records the result.
fn run_command(
    state: &State,
    sb: &dyn Sandbox,
    prepared: &Prepared,
    sink: Option<&mut hako_core::OutputSink<'_>>,
) -> hako_core::Result<Output> {
    let command = &prepared.command;
    let result = match (prepared.session, sink) {
        (Some(s), sink) => match sb.sessions() {
            Some(sessions) => sessions.session_exec(SessionId(s), command, sink),
            None => Err(Error::Unsupported {
                backend: sb.capabilities().backend.clone(),
                capability: "sessions",
            }),
        },
        (None, Some(sink)) => match sb.exec_stream() {
            Some(streamer) => streamer.exec_stream(command, sink),
            None => sb.exec(command),
        },
        (None, None) => sb.exec(command),
    };
    match &result {
        Ok(out) => {
            let mut exec = Exec::new(FrontEnd::Serve, &sb.capabilities().backend, command)
                .in_session(prepared.session)
                .output(out);
            exec.sandbox = Some(prepared.sandbox);
            audit(state, Record::Exec(exec));
        }
        Err(e) => audit_failure(state, prepared.sandbox, sb, e, |f| {
            f.argv = Some(command.program.argv());
        }),
    }
    result
}

/// Runs a streamed command: its output, numbered JSON lines, goes to `tx`
/// (at most [`STREAM_BUFFER`] bytes waiting; past it, a `dropped` line),
/// then its exit or error.
fn stream_command(
    state: &State,
    sb: &dyn Sandbox,
    prepared: &Prepared,
    tx: &tokio::sync::mpsc::UnboundedSender<Bytes>,
    queued: &AtomicUsize,
) {
    let mut seq: u64 = 0;
    let mut dropped: u64 = 0;
    // Sends one line; `bounded` lines are dropped (false) when the client
    // is that far behind; the last line always goes.
    let send = |v: Value, bounded: bool| -> bool {
        let mut bytes = v.to_string().into_bytes();
        bytes.push(b'\n');
        let n = bytes.len();
        if bounded && queued.load(Ordering::SeqCst) + n > STREAM_BUFFER {
            return false;
        }
        queued.fetch_add(n, Ordering::SeqCst);
        if tx.send(Bytes::from(bytes)).is_err() {
            // The client is gone; nothing more is read.
            queued.fetch_sub(n, Ordering::SeqCst);
        }
        true
    };
    let result = {
        let mut sink = |stream: Stream, chunk: &[u8]| {
            if dropped > 0 && send(json!({"seq": seq + 1, "dropped": dropped}), true) {
                seq += 1;
                dropped = 0;
            }
            let name = match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            let line =
                json!({"seq": seq + 1, "stream": name, "data": prepared.encoding.text(chunk)});
            if dropped == 0 && send(line, true) {
                seq += 1;
            } else {
                dropped += chunk.len() as u64;
            }
        };
        run_command(state, sb, prepared, Some(&mut sink))
    };
    if dropped > 0 {
        seq += 1;
        send(json!({"seq": seq, "dropped": dropped}), false);
    }
    seq += 1;
    match &result {
        Ok(out) => send(
            json!({"seq": seq, "exit": output_json(out, prepared.encoding)}),
            false,
        ),
        Err(e) => {
            // The same kind an error answer would carry.
            let kind = from_error(e).body["kind"].clone();
            send(
                json!({"seq": seq, "error": e.to_string(), "kind": kind}),
                false,
            )
        }
    };
}

/// The body of a streamed response: the lines the command's sink sends,
/// ending when the command's task drops its sender.
struct ChannelBody {
    rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    /// Bytes sent and not yet taken from the channel.
    queued: Arc<AtomicUsize>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(bytes)) => {
                self.queued.fetch_sub(bytes.len(), Ordering::SeqCst);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn max_output_is_at_most_the_servers_cap() {
        assert_eq!(max_output(None, 10).ok(), Some(None));
        assert_eq!(max_output(Some(10), 10).ok(), Some(Some(10)));
        assert_eq!(max_output(Some(0), 10).ok(), Some(Some(0)));
        assert_eq!(max_output(Some(11), 10).err().map(|r| r.status), Some(400));
        assert_eq!(
            max_output(Some(u64::MAX), u64::MAX - 1)
                .err()
                .map(|r| r.status),
            Some(400)
        );
    }

    #[test]
    fn every_command_gets_a_deadline_and_none_past_the_maximum() {
        assert_eq!(exec_timeout(None).ok(), Some(DEFAULT_EXEC_TIMEOUT));
        assert_eq!(exec_timeout(Some(0)).ok(), Some(Duration::ZERO));
        let max = u64::try_from(MAX_EXEC_TIMEOUT.as_millis()).unwrap();
        assert_eq!(exec_timeout(Some(max)).ok(), Some(MAX_EXEC_TIMEOUT));
        assert_eq!(
            exec_timeout(Some(max + 1)).err().map(|r| r.status),
            Some(400)
        );
        assert_eq!(
            exec_timeout(Some(u64::MAX)).err().map(|r| r.status),
            Some(400)
        );
    }
}
