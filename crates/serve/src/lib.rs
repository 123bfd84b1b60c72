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
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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
/// stdin), and the most bytes of a file one read returns.
pub const MAX_BODY: u64 = 64 << 20;
/// The most authorized requests (other than exec) served at once; more are
/// answered `503` at once.
const MAX_REQUESTS: usize = 64;
/// The most commands run at once (each holds a thread for up to its
/// deadline); more are answered `503`. Counted apart from other requests,
/// so that running commands never lock a client out of closing them.
const MAX_EXECS: usize = 32;
/// The most file reads and writes at once: each holds up to [`MAX_BODY`]
/// bytes in memory.
const MAX_TRANSFERS: usize = 8;
/// The most sandboxes open at once.
pub const MAX_SANDBOXES: usize = 32;
/// A command's deadline when the request gives none.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest deadline a request may give a command (a day).
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The most bytes of streamed output waiting for a client that reads
/// slower than the command writes; output past it is dropped (and the
/// stream says how much), never buffered.
const STREAM_BUFFER: usize = 4 << 20;

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
    /// SHA-256 of the token: requests are compared digest to digest, so
    /// the comparison takes the same time whatever the length of what a
    /// client sends.
    token_digest: String,
    sandboxes: Mutex<Table>,
    next: AtomicU64,
    requests: Slots,
    execs: Slots,
    transfers: Slots,
    /// Connections given up on (see [`reject_unread`]).
    abandoned: AtomicUsize,
}

/// The open sandboxes, and how many are being opened (they count against
/// [`MAX_SANDBOXES`] already, so that concurrent creates cannot pass it).
#[derive(Default)]
struct Table {
    open: HashMap<u64, Arc<dyn Sandbox>>,
    opening: usize,
}

/// A counted resource: at most `max` taken at once, each given back when
/// its [`Slot`] drops (also when a handler panics).
struct Slots {
    used: AtomicUsize,
    max: usize,
}

/// One taken slot.
struct Slot<'a>(&'a AtomicUsize);

impl Slots {
    const fn new(max: usize) -> Self {
        Slots {
            used: AtomicUsize::new(0),
            max,
        }
    }

    fn try_take(&self) -> Option<Slot<'_>> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(&self.used))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fresh random token: 32 bytes from the kernel, in hex.
pub fn generate_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `a` equals `b`, in time that depends only on their lengths.
/// (The server compares SHA-256 digests with it, so that not even the
/// token's length shows.)
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
///
/// Each request gets a thread (tiny_http already holds one per
/// connection); the token is checked before anything else, and a request
/// without it holds no slot. Authorized requests take a slot of a bounded
/// pool or are answered `503` at once: the loop that accepts requests
/// never waits, so no client can stall the others.
///
/// Refuses an empty token: it would let every client in.
pub fn serve(server: Server, config: ServeConfig) -> std::io::Result<()> {
    if config.token.trim().is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the bearer token is empty; every client would be let in",
        ));
    }
    let state = Arc::new(State {
        token_digest: hako_audit::sha256_hex(config.token.as_bytes()),
        config,
        sandboxes: Mutex::new(Table::default()),
        next: AtomicU64::new(1),
        requests: Slots::new(MAX_REQUESTS),
        execs: Slots::new(MAX_EXECS),
        transfers: Slots::new(MAX_TRANSFERS),
        abandoned: AtomicUsize::new(0),
    });
    for request in server.incoming_requests() {
        let state = Arc::clone(&state);
        let spawned = std::thread::Builder::new()
            .name("hako-serve".into())
            .spawn(move || handle(&state, request));
        if let Err(e) = spawned {
            // The request went with the closure: tiny_http answers 500.
            tracing::warn!("hako serve: cannot start a request thread: {e}");
        }
    }
    Ok(())
}

/// The table of sandboxes, even if a thread panicked holding its lock
/// (every change to it is a single map operation, never left half done).
fn table(state: &State) -> MutexGuard<'_, Table> {
    state
        .sandboxes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Closes every sandbox a server opened (at shutdown).
fn close_all(state: &State) {
    let all: Vec<_> = table(state).open.drain().collect();
    for (_, sb) in all {
        let _ = sb.close();
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

/// A request path split from its query, with the query's `path=` value
/// percent-decoded (or the answer for a value that cannot be a path).
fn split(url: &str) -> (&str, Result<Option<String>, Reply>) {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let value = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "path")
        .map(|(_, v)| percent_decode(v))
        .transpose()
        .map_err(|why| error(400, "bad_path", format!("the query's path {why}")));
    (path, value)
}

/// Decodes `%XX` escapes (and `+`, a space in a query). Strict: a `%` not
/// followed by two hex digits, a NUL byte or bytes that are not UTF-8 are
/// an error, never replaced, so that the path used is always the path
/// sent.
fn percent_decode(s: &str) -> Result<String, &'static str> {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => match (bytes.next().and_then(hex), bytes.next().and_then(hex)) {
                (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                _ => return Err("has a % not followed by two hex digits"),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    if out.contains(&0) {
        return Err("contains a NUL byte");
    }
    String::from_utf8(out).map_err(|_| "is not UTF-8 once decoded")
}

/// Whether the request carries the server's bearer token. The scheme is
/// matched without regard to case (RFC 9110); the token is compared by
/// its SHA-256 digest, in constant time.
fn authorized(state: &State, request: &Request) -> bool {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| {
            let (scheme, token) = h.value.as_str().trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .is_some_and(|t| {
            let given = hako_audit::sha256_hex(t.trim().as_bytes());
            constant_time_eq(given.as_bytes(), state.token_digest.as_bytes())
        })
}

fn unauthorized() -> Reply {
    error(
        401,
        "unauthorized",
        "a bearer token is required (Authorization: Bearer TOKEN)",
    )
}

fn response(r: &Reply) -> Response<std::io::Cursor<Vec<u8>>> {
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
    response
}

fn respond(request: Request, r: Reply) {
    let _ = request.respond(response(&r));
}

/// Answers a request whose declared body is larger than the server reads,
/// without reading it and without dropping the request.
///
/// tiny_http 0.12 drains an unread body when its request is dropped, with
/// one buffer the size of the whole declared `Content-Length`
/// (tiny-http#252): a client that declares a terabyte and closes early
/// makes that allocation fail and aborts the whole server, before any
/// token is checked. So such a request is answered over the raw stream and
/// its connection is abandoned: it costs one descriptor and tiny_http's
/// thread for the connection, never the process. The answer has no
/// length, so the client sees the status and body and then waits for an
/// end that does not come; it should close.
fn reject_unread(state: &State, request: Request, r: Reply) {
    let mut body = r.body.to_string().into_bytes();
    body.push(b'\n');
    let mut stream = request.upgrade(
        "hako-refused",
        response(&Reply {
            body: Value::Null,
            ..r
        }),
    );
    let _ = stream.write_all(&body);
    let _ = stream.flush();
    std::mem::forget(stream);
    let n = state.abandoned.fetch_add(1, Ordering::SeqCst) + 1;
    tracing::warn!(
        "hako serve: abandoned a connection whose declared body was over {MAX_BODY} bytes ({n} so far)"
    );
}

/// What a route costs: the pool its slot comes from, if any.
enum Cost {
    /// Answered from memory (health, the API description).
    Free,
    /// Runs a command.
    Exec,
    /// Moves a file (up to [`MAX_BODY`] bytes in memory).
    Transfer,
    /// Anything else.
    Request,
}

fn cost(method: &Method, parts: &[&str]) -> Cost {
    match (method, parts) {
        (Method::Get, ["v1", "health" | "openapi.json"]) => Cost::Free,
        (Method::Post, ["v1", "sandboxes", _, "exec"]) => Cost::Exec,
        (Method::Get | Method::Put, ["v1", "sandboxes", _, "files"]) => Cost::Transfer,
        _ => Cost::Request,
    }
}

fn busy(what: &str) -> Reply {
    error(
        503,
        "busy",
        format!("the server is serving as many {what} as it allows; retry shortly"),
    )
}

fn handle(state: &State, mut request: Request) {
    let authorized = authorized(state, &request);
    // Before anything else: a body that would be refused unread must not
    // reach tiny_http's drain (see `reject_unread`).
    if request.body_length().is_some_and(|n| n as u64 > MAX_BODY) {
        let r = if authorized {
            error(
                413,
                "too_large",
                format!("the body is over {MAX_BODY} bytes"),
            )
        } else {
            unauthorized()
        };
        return reject_unread(state, request, r);
    }
    if !authorized {
        return respond(request, unauthorized());
    }
    let method = request.method().clone();
    let url = request.url().to_string();
    let (path, file) = split(&url);
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    // A slot for the whole request, answer included (a client that does
    // not read its answer keeps its slot; the pools bound what they hold).
    let _slot = match cost(&method, &parts) {
        Cost::Free => None,
        Cost::Exec => match state.execs.try_take() {
            Some(slot) => Some(slot),
            None => return respond(request, busy("commands")),
        },
        Cost::Request => match state.requests.try_take() {
            Some(slot) => Some(slot),
            None => return respond(request, busy("requests")),
        },
        Cost::Transfer => match state.transfers.try_take() {
            Some(slot) => Some(slot),
            None => return respond(request, busy("file transfers")),
        },
    };
    let file = match file {
        Ok(file) => file,
        Err(r) => return respond(request, r),
    };
    let id = |s: &str| s.parse::<u64>().ok();
    match (&method, parts.as_slice()) {
        (Method::Get, ["v1", "health"]) => respond(request, reply(200, json!({"ok": true}))),
        (Method::Get, ["v1", "openapi.json"]) => {
            let body: Value = serde_json::from_str(OPENAPI).unwrap_or(Value::Null);
            respond(request, reply(200, body))
        }
        (Method::Get, ["v1", "sandboxes"]) => {
            let mut all: Vec<(u64, Arc<dyn Sandbox>)> = table(state)
                .open
                .iter()
                .map(|(id, sb)| (*id, Arc::clone(sb)))
                .collect();
            all.sort_by_key(|(id, _)| *id);
            let list: Vec<Value> = all
                .into_iter()
                .map(|(id, sb)| json!({"id": id, "capabilities": sb.capabilities()}))
                .collect();
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
            let removed = id(sid).and_then(|n| table(state).open.remove(&n));
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
            let Some(sb) = id(sid).and_then(|n| lookup(state, n)) else {
                return respond(request, no_sandbox(sid));
            };
            let body = match read_body(&mut request, false) {
                Ok(b) => b,
                Err(r) => return respond(request, r),
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
            // The sandbox and the path first: a body is read only for a
            // write that can happen.
            if let Err(r) = with_file(state, sid, file.clone(), |_, _| Ok(())) {
                return respond(request, r);
            }
            // A body cut short must not replace the file: its length has
            // to be known to tell (a chunked body that ends early looks
            // complete).
            let body = match read_body(&mut request, true) {
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
    table(state).open.get(&id).cloned()
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
    // The place is taken under the lock, before the (slow) factory runs:
    // concurrent creates cannot pass the limit between check and insert.
    {
        let mut t = table(state);
        if t.open.len() + t.opening >= MAX_SANDBOXES {
            return error(
                429,
                "too_many_sandboxes",
                format!("{MAX_SANDBOXES} sandboxes are open; close one first"),
            );
        }
        t.opening += 1;
    }
    // Given back if the factory panics, too.
    let mut place = Opening { state, taken: true };
    let made = (state.config.make_sandbox)();
    let mut t = table(state);
    t.opening -= 1;
    place.taken = false;
    match made {
        Ok(sb) => {
            let id = state.next.fetch_add(1, Ordering::SeqCst);
            let caps = sb.capabilities().clone();
            t.open.insert(id, Arc::from(sb));
            drop(t);
            audit(state, "sandbox", json!({"id": id, "backend": caps.backend}));
            reply(201, json!({"id": id, "capabilities": caps}))
        }
        Err(e) => from_error(&e),
    }
}

/// A place in the table taken by a sandbox being opened.
struct Opening<'a> {
    state: &'a State,
    taken: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.taken {
            table(self.state).opening -= 1;
        }
    }
}

/// Reads a request's body: at most [`MAX_BODY`] bytes (a larger declared
/// length never gets here, see `reject_unread`), and, when the request
/// declared its length, exactly that many: a body cut short is an error,
/// not a shorter body. With `need_length`, a body of unknown length
/// (chunked) is refused.
fn read_body(request: &mut Request, need_length: bool) -> Result<Vec<u8>, Reply> {
    let declared = request.body_length();
    let chunked = request
        .headers()
        .iter()
        .any(|h| h.field.equiv("Transfer-Encoding"));
    if need_length && declared.is_none() && chunked {
        return Err(error(
            411,
            "length_required",
            "give the body's Content-Length (a chunked body that ends early could not be told from a whole one)",
        ));
    }
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
    if let Some(n) = declared {
        if body.len() != n {
            return Err(error(
                400,
                "body_cut_short",
                format!(
                    "the body ended after {} of the {n} bytes its Content-Length declared; nothing was done",
                    body.len()
                ),
            ));
        }
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
    command.timeout = match exec_timeout(req.timeout_ms) {
        Ok(t) => Some(t),
        Err(r) => return respond(request, r),
    };
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
    // response fed through a channel). A client that reads slower than the
    // command writes never slows the command and never makes the server
    // buffer more than STREAM_BUFFER bytes: past it, chunks are dropped and
    // a `dropped` line says how many bytes were.
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let queued = Arc::new(AtomicUsize::new(0));
    let reader = ChannelReader {
        rx,
        buf: Vec::new(),
        pos: 0,
        queued: Arc::clone(&queued),
    };
    let responder = std::thread::spawn(move || {
        let mut response = Response::new(StatusCode(200), Vec::new(), reader, None, None);
        if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/x-ndjson"[..]) {
            response.add_header(h);
        }
        let _ = request.respond(response);
    });
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
        if tx.send(bytes).is_err() {
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
                json!({"seq": seq + 1, "stream": name, "data": String::from_utf8_lossy(chunk)});
            if dropped == 0 && send(line, true) {
                seq += 1;
            } else {
                dropped += chunk.len() as u64;
            }
        };
        run(Some(&mut sink))
    };
    record(&result);
    if dropped > 0 {
        seq += 1;
        send(json!({"seq": seq, "dropped": dropped}), false);
    }
    seq += 1;
    match &result {
        Ok(out) => send(json!({"seq": seq, "exit": output_json(out)}), false),
        Err(e) => send(json!({"seq": seq, "error": e.to_string()}), false),
    };
    drop(tx);
    let _ = responder.join();
}

/// The body of a streamed response: the lines the command's sink sends.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
    /// Bytes sent and not yet taken from the channel.
    queued: Arc<AtomicUsize>,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.buf.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.queued.fetch_sub(next.len(), Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn percent_decoding_is_strict_and_never_replaces_bytes() {
        assert_eq!(percent_decode("%2e%2E%2fx").unwrap(), "../x");
        assert_eq!(percent_decode("caf%C3%A9+au+lait").unwrap(), "café au lait");
        assert_eq!(percent_decode("100%25").unwrap(), "100%");
        for bad in [
            "%", "%2", "a%2", "%zz", "%+1", "%-1", "%\u{e9}1", "%ff", "a%c3", "x%00y",
        ] {
            assert!(percent_decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_query_path_is_found_among_other_keys_and_a_bad_one_is_an_answer() {
        let (path, file) = split("/v1/sandboxes/1/files?x=1&path=a%2Fb&path=c");
        assert_eq!(path, "/v1/sandboxes/1/files");
        assert_eq!(file.ok().flatten().as_deref(), Some("a/b"));
        let (_, file) = split("/v1/x?path=a%ff");
        assert_eq!(file.err().map(|r| r.status), Some(400));
        let (_, file) = split("/v1/x");
        assert!(matches!(file, Ok(None)));
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

    #[test]
    fn slots_are_bounded_and_given_back_even_when_their_holder_panics() {
        let slots = Arc::new(Slots::new(2));
        let a = slots.try_take();
        let b = slots.try_take();
        assert!(a.is_some() && b.is_some());
        assert!(slots.try_take().is_none());
        drop(a);
        assert!(slots.try_take().is_some());
        drop(b);
        let s = slots.clone();
        let panicked = std::thread::spawn(move || {
            let _slot = s.try_take();
            panic!("a handler failed");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(slots.used.load(Ordering::SeqCst), 0);
    }
}
