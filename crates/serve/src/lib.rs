//! `hako serve`: an HTTP/JSON API for remote clients.
//!
//! Every request must carry `Authorization: Bearer TOKEN`; one without it
//! (or with another token, compared in constant time) gets `401` and
//! touches nothing. Sandboxes are made by the server's own factory (the
//! policy is the server's, set by its flags, never the client's): a client
//! creates one, runs commands in it (the result as one JSON object, or
//! streamed as JSON lines as the output comes), reads, writes, lists and
//! removes files through its fence, opens sessions, and closes it. The API
//! is described by `openapi.json` beside this crate (served at
//! `/v1/openapi.json`), and [`ROUTES`] lists what the server answers; a
//! test keeps the two the same.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hako_core::{Command, Error, Output, Program, Sandbox, SessionId, SessionOptions, Stream};
use serde::Deserialize;
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server, StatusCode};

/// The OpenAPI description of this API.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Every route the server answers: method and path template.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/health"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/sandboxes"),
    ("post", "/v1/sandboxes"),
    ("get", "/v1/sandboxes/{id}"),
    ("delete", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/exec"),
    ("get", "/v1/sandboxes/{id}/files"),
    ("put", "/v1/sandboxes/{id}/files"),
    ("delete", "/v1/sandboxes/{id}/files"),
    ("get", "/v1/sandboxes/{id}/dir"),
    ("post", "/v1/sandboxes/{id}/sessions"),
    ("delete", "/v1/sandboxes/{id}/sessions/{session}"),
];

/// The most bytes a request body may carry (a file written, a command's
/// stdin).
pub const MAX_BODY: u64 = 64 << 20;
/// The most requests served at once; more wait in the listen queue.
const MAX_IN_FLIGHT: usize = 64;
/// The most sandboxes open at once.
pub const MAX_SANDBOXES: usize = 32;

/// Makes a sandbox with the server's policy.
pub type Factory = dyn Fn() -> hako_core::Result<Box<dyn Sandbox>> + Send + Sync;

/// How the server runs.
pub struct ServeConfig {
    /// Makes each sandbox a client asks for.
    pub make_sandbox: Box<Factory>,
    /// The bearer token every request must carry.
    pub token: String,
    /// Where each effect is recorded, if anywhere.
    pub audit: Option<Arc<hako_audit::AuditLog>>,
}

struct State {
    config: ServeConfig,
    sandboxes: Mutex<HashMap<u64, Arc<dyn Sandbox>>>,
    next: AtomicU64,
    in_flight: AtomicUsize,
}

/// A fresh random token: 32 bytes from the kernel, in hex.
pub fn generate_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `a` equals `b`, in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// Serves on `server` until it fails; closes every sandbox when it ends.
pub fn serve(server: Server, config: ServeConfig) -> std::io::Result<()> {
    let state = Arc::new(State {
        config,
        sandboxes: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        in_flight: AtomicUsize::new(0),
    });
    for request in server.incoming_requests() {
        while state.in_flight.load(Ordering::SeqCst) >= MAX_IN_FLIGHT {
            std::thread::sleep(Duration::from_millis(5));
        }
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        let state = Arc::clone(&state);
        let spawned = std::thread::Builder::new()
            .name("hako-serve".into())
            .spawn(move || {
                handle(&state, request);
                state.in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::warn!("hako serve: cannot start a request thread: {e}");
        }
    }
    Ok(())
}

/// Closes every sandbox a server opened (at shutdown).
fn close_all(state: &State) {
    if let Ok(mut all) = state.sandboxes.lock() {
        for (_, sb) in all.drain() {
            let _ = sb.close();
        }
    }
}

/// An answer: status and JSON body.
struct Reply {
    status: u16,
    body: Value,
}

fn reply(status: u16, body: Value) -> Reply {
    Reply { status, body }
}

fn error(status: u16, kind: &str, message: impl Into<String>) -> Reply {
    reply(status, json!({"error": message.into(), "kind": kind}))
}

/// The status and kind a sandbox error answers with.
fn from_error(e: &Error) -> Reply {
    let (status, kind) = match e {
        Error::Fence(f) => match f {
            hako_core::FenceError::NotFound { .. } => (404, "not_found"),
            hako_core::FenceError::FileTooLarge { .. } => (413, "too_large"),
            hako_core::FenceError::Io { .. } => (500, "io"),
            _ => (403, "refused"),
        },
        Error::CommandNotFound { .. } => (422, "command_not_found"),
        Error::CannotExecute { .. } => (422, "cannot_execute"),
        Error::InvalidCommand { .. } => (400, "invalid_command"),
        Error::SessionNotOpen { .. } => (404, "no_such_session"),
        Error::SessionBusy { .. } => (409, "session_busy"),
        Error::Closed => (410, "closed"),
        Error::Unsupported { .. } => (501, "unsupported"),
        Error::IsolationTooWeak { .. }
        | Error::NetworkUnavailable { .. }
        | Error::BadNetworkPolicy { .. } => (403, "policy"),
        _ => (502, "sandbox_failed"),
    };
    error(status, kind, e.to_string())
}

/// A request path split from its query, with the query's `path=` value.
fn split(url: &str) -> (&str, Option<String>) {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let value = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "path")
        .map(|(_, v)| percent_decode(v));
    (path, value)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn authorized(state: &State, request: &Request) -> bool {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
        .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), state.config.token.as_bytes()))
}

fn respond(request: Request, r: Reply) {
    let body = r.body.to_string();
    let mut response = Response::from_string(body).with_status_code(StatusCode(r.status));
    if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
        response.add_header(h);
    }
    if r.status == 401 {
        if let Ok(h) = Header::from_bytes(&b"WWW-Authenticate"[..], &b"Bearer"[..]) {
            response.add_header(h);
        }
    }
    let _ = request.respond(response);
}

fn handle(state: &State, mut request: Request) {
    if !authorized(state, &request) {
        return respond(
            request,
            error(
                401,
                "unauthorized",
                "a bearer token is required (Authorization: Bearer TOKEN)",
            ),
        );
    }
    let method = request.method().clone();
    let url = request.url().to_string();
    let (path, file) = split(&url);
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let id = |s: &str| s.parse::<u64>().ok();
    match (&method, parts.as_slice()) {
        (Method::Get, ["v1", "health"]) => respond(request, reply(200, json!({"ok": true}))),
        (Method::Get, ["v1", "openapi.json"]) => {
            let body: Value = serde_json::from_str(OPENAPI).unwrap_or(Value::Null);
            respond(request, reply(200, body))
        }
        (Method::Get, ["v1", "sandboxes"]) => {
            let list: Vec<Value> = state
                .sandboxes
                .lock()
                .map(|all| {
                    let mut ids: Vec<_> = all.iter().collect();
                    ids.sort_by_key(|(id, _)| **id);
                    ids.into_iter()
                        .map(|(id, sb)| json!({"id": id, "capabilities": sb.capabilities()}))
                        .collect()
                })
                .unwrap_or_default();
            respond(request, reply(200, json!({"sandboxes": list})))
        }
        (Method::Post, ["v1", "sandboxes"]) => {
            let r = create(state);
            respond(request, r)
        }
        (Method::Get, ["v1", "sandboxes", sid]) => {
            let r = with_sandbox(state, id(sid), |id, sb| {
                reply(200, json!({"id": id, "capabilities": sb.capabilities()}))
            });
            respond(request, r)
        }
        (Method::Delete, ["v1", "sandboxes", sid]) => {
            let removed = id(sid).and_then(|n| state.sandboxes.lock().ok()?.remove(&n));
            let r = match removed {
                Some(sb) => match sb.close() {
                    Ok(()) => reply(200, json!({"closed": true})),
                    Err(e) => from_error(&e),
                },
                None => no_sandbox(sid),
            };
            respond(request, r)
        }
        (Method::Post, ["v1", "sandboxes", sid, "exec"]) => {
            let body = match read_body(&mut request) {
                Ok(b) => b,
                Err(r) => return respond(request, r),
            };
            let Some(sb) = id(sid).and_then(|n| lookup(state, n)) else {
                return respond(request, no_sandbox(sid));
            };
            exec(state, request, &sb, &body)
        }
        (Method::Get, ["v1", "sandboxes", sid, "files"]) => {
            let r = with_file(state, sid, file, |sb, p| {
                let max = MAX_BODY;
                let read = match sb.read_limit() {
                    Some(rl) => rl.read_file_limit(p, max).map(|o| (o.data, o.truncated)),
                    None => sb.read_file(p).map(|d| (d, false)),
                };
                match read {
                    Ok((data, truncated)) => {
                        audit(
                            state,
                            "read",
                            json!({"path": p, "size": data.len(), "sha256": hako_audit::sha256_hex(&data)}),
                        );
                        Ok((data, truncated))
                    }
                    Err(e) => Err(e),
                }
            });
            match r {
                Ok((data, truncated)) => {
                    let mut response = Response::from_data(data).with_status_code(StatusCode(200));
                    if let Ok(h) =
                        Header::from_bytes(&b"Content-Type"[..], &b"application/octet-stream"[..])
                    {
                        response.add_header(h);
                    }
                    if let Ok(h) = Header::from_bytes(
                        &b"X-Hako-Truncated"[..],
                        if truncated {
                            &b"true"[..]
                        } else {
                            &b"false"[..]
                        },
                    ) {
                        response.add_header(h);
                    }
                    let _ = request.respond(response);
                }
                Err(r) => respond(request, r),
            }
        }
        (Method::Put, ["v1", "sandboxes", sid, "files"]) => {
            let body = match read_body(&mut request) {
                Ok(b) => b,
                Err(r) => return respond(request, r),
            };
            let r = with_file(state, sid, file, |sb, p| {
                sb.write_file(p, &body)?;
                audit(
                    state,
                    "write",
                    json!({"path": p, "size": body.len(), "sha256": hako_audit::sha256_hex(&body)}),
                );
                Ok(())
            });
            respond(
                request,
                r.map(|()| reply(200, json!({"written": body.len()})))
                    .unwrap_or_else(|r| r),
            )
        }
        (Method::Delete, ["v1", "sandboxes", sid, "files"]) => {
            let r = with_file(state, sid, file, |sb, p| {
                sb.remove(p)?;
                audit(state, "remove", json!({"path": p}));
                Ok(())
            });
            respond(
                request,
                r.map(|()| reply(200, json!({"removed": true})))
                    .unwrap_or_else(|r| r),
            )
        }
        (Method::Get, ["v1", "sandboxes", sid, "dir"]) => {
            let file = file.or_else(|| Some(".".into()));
            let r = with_file(state, sid, file, |sb, p| sb.list_dir(p));
            let r = r.map(|listing| {
                let entries: Vec<Value> = listing
                    .entries
                    .iter()
                    .map(|e| json!({"name": e.name.to_string_lossy(), "kind": e.kind, "size": e.size, "mode": e.mode, "mtime": e.mtime}))
                    .collect();
                reply(200, json!({"entries": entries, "truncated": listing.truncated}))
            });
            respond(request, r.unwrap_or_else(|r| r))
        }
        (Method::Post, ["v1", "sandboxes", sid, "sessions"]) => {
            let r = with_sandbox(state, id(sid), |_, sb| match sb.sessions() {
                Some(s) => match s.open_session(&SessionOptions::default()) {
                    Ok(session) => reply(200, json!({"session": session.0})),
                    Err(e) => from_error(&e),
                },
                None => error(501, "unsupported", "this sandbox has no sessions"),
            });
            respond(request, r)
        }
        (Method::Delete, ["v1", "sandboxes", sid, "sessions", session]) => {
            let Some(session) = id(session) else {
                return respond(request, error(400, "bad_request", "a session is a number"));
            };
            let r = with_sandbox(state, id(sid), |_, sb| match sb.sessions() {
                Some(s) => match s.close_session(SessionId(session)) {
                    Ok(()) => reply(200, json!({"closed": true})),
                    Err(e) => from_error(&e),
                },
                None => error(501, "unsupported", "this sandbox has no sessions"),
            });
            respond(request, r)
        }
        _ => respond(
            request,
            error(
                404,
                "no_such_route",
                format!("no route {} {path}", method.as_str()),
            ),
        ),
    }
}

fn no_sandbox(sid: &str) -> Reply {
    error(404, "no_such_sandbox", format!("no sandbox {sid}"))
}

fn lookup(state: &State, id: u64) -> Option<Arc<dyn Sandbox>> {
    state.sandboxes.lock().ok()?.get(&id).cloned()
}

fn with_sandbox(
    state: &State,
    id: Option<u64>,
    f: impl FnOnce(u64, &dyn Sandbox) -> Reply,
) -> Reply {
    match id.and_then(|n| lookup(state, n).map(|sb| (n, sb))) {
        Some((n, sb)) => f(n, sb.as_ref()),
        None => error(404, "no_such_sandbox", "no such sandbox"),
    }
}

fn with_file<T>(
    state: &State,
    sid: &str,
    file: Option<String>,
    f: impl FnOnce(&dyn Sandbox, &Path) -> hako_core::Result<T>,
) -> Result<T, Reply> {
    let Some(sb) = sid.parse::<u64>().ok().and_then(|n| lookup(state, n)) else {
        return Err(no_sandbox(sid));
    };
    let Some(path) = file else {
        return Err(error(400, "bad_request", "the query must name ?path="));
    };
    let path = PathBuf::from(path);
    f(sb.as_ref(), &path).map_err(|e| {
        audit(
            state,
            "refusal",
            json!({"path": path, "error": e.to_string()}),
        );
        from_error(&e)
    })
}

fn audit(state: &State, kind: &str, fields: Value) {
    if let Some(log) = &state.config.audit {
        if let Err(e) = log.record(kind, fields) {
            tracing::warn!("hako serve: {e}");
        }
    }
}

fn create(state: &State) -> Reply {
    let open = state
        .sandboxes
        .lock()
        .map(|s| s.len())
        .unwrap_or(MAX_SANDBOXES);
    if open >= MAX_SANDBOXES {
        return error(
            429,
            "too_many_sandboxes",
            format!("{MAX_SANDBOXES} sandboxes are open; close one first"),
        );
    }
    match (state.config.make_sandbox)() {
        Ok(sb) => {
            let id = state.next.fetch_add(1, Ordering::SeqCst);
            let caps = sb.capabilities().clone();
            let sb: Arc<dyn Sandbox> = Arc::from(sb);
            if let Ok(mut all) = state.sandboxes.lock() {
                all.insert(id, sb);
            }
            audit(state, "sandbox", json!({"id": id, "backend": caps.backend}));
            reply(201, json!({"id": id, "capabilities": caps}))
        }
        Err(e) => from_error(&e),
    }
}

fn read_body(request: &mut Request) -> Result<Vec<u8>, Reply> {
    let mut body = Vec::new();
    request
        .as_reader()
        .take(MAX_BODY + 1)
        .read_to_end(&mut body)
        .map_err(|e| error(400, "bad_request", format!("cannot read the body: {e}")))?;
    if body.len() as u64 > MAX_BODY {
        return Err(error(
            413,
            "too_large",
            format!("the body is over {MAX_BODY} bytes"),
        ));
    }
    Ok(body)
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecRequest {
    argv: Option<Vec<String>>,
    command: Option<String>,
    cwd: Option<PathBuf>,
    timeout_ms: Option<u64>,
    stdin: Option<String>,
    session: Option<u64>,
    #[serde(default)]
    stream: bool,
}

fn output_json(out: &Output) -> Value {
    json!({
        "exit_code": out.status.code(),
        "signal": out.status.signal(),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "stdout_bytes": out.stdout_total,
        "stderr_bytes": out.stderr_total,
        "duration_ms": u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
        "timed_out": out.timed_out,
    })
}

fn exec(state: &State, request: Request, sb: &Arc<dyn Sandbox>, body: &[u8]) {
    let req: ExecRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return respond(
                request,
                error(400, "bad_request", format!("bad exec request: {e}")),
            )
        }
    };
    let program = match (req.argv, req.command) {
        (Some(argv), None) if !argv.is_empty() => Program::Argv(argv),
        (None, Some(cmd)) => Program::Shell(cmd),
        _ => {
            return respond(
                request,
                error(
                    400,
                    "bad_request",
                    "give exactly one of argv (non-empty) and command",
                ),
            )
        }
    };
    let mut command = Command {
        program,
        ..Command::new(["true"])
    };
    command.timeout = req.timeout_ms.map(Duration::from_millis);
    if req.session.is_none() {
        command.cwd = req.cwd;
        command.stdin = req.stdin.map(String::into_bytes);
    } else if req.cwd.is_some() || req.stdin.is_some() {
        return respond(
            request,
            error(
                400,
                "bad_request",
                "a session command takes no cwd or stdin (cd inside the session)",
            ),
        );
    }
    let argv = command.program.argv();
    let run = |sink: Option<&mut hako_core::OutputSink<'_>>| -> hako_core::Result<Output> {
        match (req.session, sink) {
            (Some(s), sink) => match sb.sessions() {
                Some(sessions) => sessions.session_exec(SessionId(s), &command, sink),
                None => Err(Error::Unsupported {
                    backend: sb.capabilities().backend.clone(),
                    capability: "sessions",
                }),
            },
            (None, Some(sink)) => match sb.exec_stream() {
                Some(streamer) => streamer.exec_stream(&command, sink),
                None => sb.exec(&command),
            },
            (None, None) => sb.exec(&command),
        }
    };
    let record = |result: &hako_core::Result<Output>| match result {
        Ok(out) => audit(
            state,
            "exec",
            json!({"argv": argv, "cwd": command.cwd, "session": req.session, "exit_code": out.status.code(),
                   "timed_out": out.timed_out, "duration_ms": u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
                   "stdout_bytes": out.stdout_total, "stderr_bytes": out.stderr_total}),
        ),
        Err(e) => audit(
            state,
            "refusal",
            json!({"argv": argv, "error": e.to_string()}),
        ),
    };
    if !req.stream {
        let result = run(None);
        record(&result);
        let r = match result {
            Ok(out) => reply(200, output_json(&out)),
            Err(e) => from_error(&e),
        };
        return respond(request, r);
    }
    // Streamed: JSON lines, written as the output comes (a chunked
    // response fed through a channel; what it holds is bounded by the
    // command's output cap).
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = ChannelReader {
        rx,
        buf: Vec::new(),
        pos: 0,
    };
    let responder = std::thread::spawn(move || {
        let mut response = Response::new(StatusCode(200), Vec::new(), reader, None, None);
        if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/x-ndjson"[..]) {
            response.add_header(h);
        }
        let _ = request.respond(response);
    });
    let mut seq: u64 = 0;
    let line = |v: Value, w: &std::sync::mpsc::Sender<Vec<u8>>| {
        let mut bytes = v.to_string().into_bytes();
        bytes.push(b'\n');
        let _ = w.send(bytes);
    };
    let result = {
        let mut sink = |stream: Stream, chunk: &[u8]| {
            seq += 1;
            let name = match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            line(
                json!({"seq": seq, "stream": name, "data": String::from_utf8_lossy(chunk)}),
                &tx,
            );
        };
        run(Some(&mut sink))
    };
    record(&result);
    seq += 1;
    match &result {
        Ok(out) => line(json!({"seq": seq, "exit": output_json(out)}), &tx),
        Err(e) => line(json!({"seq": seq, "error": e.to_string()}), &tx),
    }
    drop(tx);
    let _ = responder.join();
}

/// The body of a streamed response: the lines the command's sink sends.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.buf.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.buf = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        close_all(self);
    }
}
