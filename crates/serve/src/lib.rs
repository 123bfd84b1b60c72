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
use std::convert::Infallible;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hako_core::{Command, Error, Output, Program, Sandbox, SessionId, SessionOptions, Stream};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use serde_json::{json, Value};

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

/// How long a client gets to send a request's headers, and how long a
/// kept-alive connection may wait for its next request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request body may stall (no bytes arriving) before the
/// request is answered `408` and its connection closed.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The most connections held open at once; one more is accepted and
/// closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long to wait before accepting again after `accept` failed (out of
/// file descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long work still running at shutdown gets to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// How the server runs.
pub struct ServeConfig {
    /// Makes each sandbox a client asks for.
    pub make_sandbox: Box<Factory>,
    /// The bearer token every request must carry.
    pub token: String,
    /// Where each effect is recorded, if anywhere.
    pub audit: Option<Arc<hako_audit::AuditLog>>,
    /// How long a request body may stall before it gets `408`
    /// ([`BODY_TIMEOUT`] by default).
    pub body_timeout: Duration,
    /// How long a client gets to send a request's headers, and how long an
    /// idle kept-alive connection stays open ([`HEADER_TIMEOUT`] by default).
    pub header_timeout: Duration,
    /// The most connections open at once ([`MAX_CONNECTIONS`] by default).
    pub max_connections: usize,
    /// Whether SIGINT and SIGTERM stop the server (closing every sandbox
    /// and the audit log). Off by default: a library must not take a
    /// process's signals unasked.
    pub stop_on_signals: bool,
}

impl ServeConfig {
    /// A configuration with the default bounds and timeouts.
    pub fn new(
        make_sandbox: Box<Factory>,
        token: String,
        audit: Option<Arc<hako_audit::AuditLog>>,
    ) -> Self {
        ServeConfig {
            make_sandbox,
            token,
            audit,
            body_timeout: BODY_TIMEOUT,
            header_timeout: HEADER_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            stop_on_signals: false,
        }
    }
}

struct State {
    config: ServeConfig,
    /// SHA-256 of the token: requests are compared digest to digest, so
    /// the comparison takes the same time whatever the length of what a
    /// client sends.
    token_digest: String,
    sandboxes: Mutex<Table>,
    next: AtomicU64,
    requests: Arc<Slots>,
    execs: Arc<Slots>,
    transfers: Arc<Slots>,
    connections: Arc<Slots>,
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
struct Slot(Arc<Slots>);

impl Slots {
    const fn new(max: usize) -> Self {
        Slots {
            used: AtomicUsize::new(0),
            max,
        }
    }

    fn try_take(self: &Arc<Self>) -> Option<Slot> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(self)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::SeqCst);
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

/// Whether a bearer token a client `given` is `token`: their SHA-256
/// digests compared in constant time, so that neither the token nor its
/// length shows in the time the answer takes.
pub fn token_matches(given: &[u8], token: &[u8]) -> bool {
    let given = hako_audit::sha256_hex(given);
    let token = hako_audit::sha256_hex(token);
    constant_time_eq(given.as_bytes(), token.as_bytes())
}

/// Serves on `listener` until it fails or, with
/// [`ServeConfig::stop_on_signals`], until SIGINT or SIGTERM; then closes
/// every sandbox and the audit log. Builds its own tokio runtime: call it
/// from a thread that is not running one.
///
/// Connections are served by hyper (HTTP/1) on tokio: at most
/// [`ServeConfig::max_connections`] at once (more are closed at once), each
/// with a deadline for its headers and its idle time, and every body with a
/// deadline for its next bytes. Accept errors (out of descriptors, say) are
/// logged and the loop goes on. The token is checked before anything else,
/// and a request without it holds no slot and has no body read.
/// Authorized requests take a slot of a bounded pool or are answered `503`
/// at once. Sandbox calls run on tokio's blocking threads.
///
/// Refuses an empty token: it would let every client in.
pub fn serve(listener: std::net::TcpListener, config: ServeConfig) -> std::io::Result<()> {
    if config.token.trim().is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the bearer token is empty; every client would be let in",
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("hako-serve")
        .build()?;
    let state = Arc::new(State {
        token_digest: hako_audit::sha256_hex(config.token.as_bytes()),
        connections: Arc::new(Slots::new(config.max_connections)),
        config,
        sandboxes: Mutex::new(Table::default()),
        next: AtomicU64::new(1),
        requests: Arc::new(Slots::new(MAX_REQUESTS)),
        execs: Arc::new(Slots::new(MAX_EXECS)),
        transfers: Arc::new(Slots::new(MAX_TRANSFERS)),
    });
    let result = runtime.block_on(accept_loop(listener, Arc::clone(&state)));
    // Closing the sandboxes first kills what still runs in them, so the
    // blocking tasks waiting on them end.
    close_all(&state);
    runtime.shutdown_timeout(DRAIN);
    close_all(&state);
    if let Some(log) = &state.config.audit {
        if let Err(e) = log.close() {
            tracing::warn!("hako serve: cannot close the audit log: {e}");
        }
    }
    result
}

/// Resolves on SIGINT or SIGTERM (or never, when not asked to).
async fn stop_signal(enabled: bool) -> std::io::Result<()> {
    if !enabled {
        std::future::pending::<()>().await;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

async fn accept_loop(listener: std::net::TcpListener, state: Arc<State>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // Before the first connection, so a signal is never missed.
    let stop = stop_signal(state.config.stop_on_signals);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("hako serve: cannot accept a connection: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            stopped = &mut stop => {
                stopped?;
                tracing::info!("hako serve: signalled, shutting down");
                return Ok(());
            }
        };
        let Some(slot) = state.connections.try_take() else {
            tracing::warn!(
                %peer,
                "hako serve: {} connections are open; closed a new one",
                state.connections.max
            );
            drop(stream);
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(state, stream, peer).await;
        });
    }
}

async fn serve_connection(
    state: Arc<State>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) {
    // hyper refuses a Content-Length past u64::MAX - 2 itself (431) before
    // any handler sees it: such a request is answered here like any other
    // too large one, the token checked first.
    match refuse_unparseable_length(&state, &stream).await {
        Peeked::Serve => {}
        Peeked::Refuse(r) => {
            let _ = answer_raw(stream, r).await;
            return;
        }
        Peeked::Silent => {
            tracing::debug!(%peer, "hako serve: closed a connection that sent nothing");
            return;
        }
    }
    let header_timeout = state.config.header_timeout;
    let handler = hyper::service::service_fn(move |request| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(state, request).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // A client may shut its side down once it has sent its request,
        // and still read the answer.
        .half_close(true)
        .serve_connection(TokioIo::new(stream), handler)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, "hako serve: connection ended: {e}");
    }
}

/// What the first bytes of a connection call for.
enum Peeked {
    /// Hand it to hyper.
    Serve,
    /// Answer this, then close.
    Refuse(Reply),
    /// Close it: nothing came within the header timeout.
    Silent,
}

/// The answer to a connection whose first request declares a
/// Content-Length hyper cannot take (past `u64::MAX - 2`): `401` without
/// the token, else `413`. Looks at what has arrived without consuming it.
async fn refuse_unparseable_length(state: &State, stream: &tokio::net::TcpStream) -> Peeked {
    let mut buf = vec![0u8; 16 << 10];
    let n = match tokio::time::timeout(state.config.header_timeout, stream.peek(&mut buf)).await {
        Err(_) => return Peeked::Silent,
        Ok(Err(_)) => return Peeked::Serve,
        Ok(Ok(n)) => n,
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    if request.parse(&buf[..n]).is_err() {
        return Peeked::Serve;
    }
    let huge = request.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-length")
            && std::str::from_utf8(h.value)
                .ok()
                .map(str::trim)
                .is_some_and(|v| {
                    !v.is_empty()
                        && v.bytes().all(|b| b.is_ascii_digit())
                        && v.parse::<u64>().map_or(true, |n| n > u64::MAX - 2)
                })
    });
    if !huge {
        return Peeked::Serve;
    }
    let mut map = HeaderMap::new();
    for h in request.headers.iter() {
        if h.name.eq_ignore_ascii_case("authorization") {
            if let Ok(v) = HeaderValue::from_bytes(h.value) {
                map.append(AUTHORIZATION, v);
            }
        }
    }
    Peeked::Refuse(if authorized(state, &map) {
        too_large()
    } else {
        unauthorized()
    })
}

/// Writes `r` as a whole HTTP/1.1 answer on a connection hyper never saw,
/// then drains (briefly) what the client sent, so that closing does not
/// reset the connection under the answer.
async fn answer_raw(mut stream: tokio::net::TcpStream, r: Reply) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = format!("{}\n", r.body);
    let reason = StatusCode::from_u16(r.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let auth = if r.status == 401 {
        "WWW-Authenticate: Bearer\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 8192];
    let mut left: usize = 1 << 20;
    while left > 0 {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => break,
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
fn authorized(state: &State, headers: &HeaderMap) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
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

fn too_large() -> Reply {
    error(
        413,
        "too_large",
        format!("the body is over {MAX_BODY} bytes"),
    )
}

/// A response body: whole, or streamed.
type Body = BoxBody<Bytes, Infallible>;

fn with_body(status: u16, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

fn response(r: Reply) -> Response<Body> {
    let body = Full::new(Bytes::from(r.body.to_string())).boxed();
    let mut response = with_body(r.status, "application/json", body);
    if r.status == 401 {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// An answer after which the connection is closed: its body was not (all)
/// read, and is not read.
fn closing(r: Reply) -> Response<Body> {
    let mut response = response(r);
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    response
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
        (&Method::GET, ["v1", "health" | "openapi.json"]) => Cost::Free,
        (&Method::POST, ["v1", "sandboxes", _, "exec"]) => Cost::Exec,
        (&Method::GET | &Method::PUT, ["v1", "sandboxes", _, "files"]) => Cost::Transfer,
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

/// The request's declared body length: `Ok(None)` without one, `Err` for
/// one that is not a number.
fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    match headers.get(CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// Runs blocking sandbox work on tokio's blocking threads; a panic in it
/// is a `500`.
async fn blocking(f: impl FnOnce() -> Reply + Send + 'static) -> Reply {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        tracing::warn!("hako serve: a request handler failed: {e}");
        error(500, "internal", "the request failed inside the server")
    })
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    // Before anything else, the body included.
    let authorized = authorized(&state, request.headers());
    let declared = declared_length(request.headers());
    if declared.is_ok_and(|n| n.is_some_and(|n| n > MAX_BODY)) {
        return closing(if authorized {
            too_large()
        } else {
            unauthorized()
        });
    }
    if !authorized {
        return closing(unauthorized());
    }
    let Ok(declared) = declared else {
        return closing(error(
            400,
            "bad_request",
            "the Content-Length is not a number",
        ));
    };
    let (head, body) = request.into_parts();
    let method = head.method;
    let url = head
        .uri
        .path_and_query()
        .map_or_else(|| head.uri.path().to_string(), |p| p.as_str().to_string());
    let (path, file) = split(&url);
    let path = path.to_string();
    let parts: Vec<String> = path
        .trim_end_matches('/')
        .split('/')
        .skip(1)
        .map(str::to_string)
        .collect();
    let parts_ref: Vec<&str> = parts.iter().map(String::as_str).collect();
    // A slot for the whole request (for a streamed command, until it ends).
    let slot = match cost(&method, &parts_ref) {
        Cost::Free => None,
        Cost::Exec => match state.execs.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("commands")),
        },
        Cost::Request => match state.requests.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("requests")),
        },
        Cost::Transfer => match state.transfers.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("file transfers")),
        },
    };
    let file = match file {
        Ok(file) => file,
        Err(r) => return response(r),
    };
    let chunked = head.headers.contains_key(TRANSFER_ENCODING);
    let id = |s: &str| s.parse::<u64>().ok();
    match (&method, parts_ref.as_slice()) {
        (&Method::GET, ["v1", "health"]) => response(reply(200, json!({"ok": true}))),
        (&Method::GET, ["v1", "openapi.json"]) => {
            let body: Value = serde_json::from_str(OPENAPI).unwrap_or(Value::Null);
            response(reply(200, body))
        }
        (&Method::POST, ["v1", "sandboxes", sid, "exec"]) => {
            let Some(sb) = id(sid).and_then(|n| lookup(&state, n)) else {
                return response(no_sandbox(sid));
            };
            let body = match read_body(&state, body, declared, chunked, false).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            exec(state, sb, &body, slot).await
        }
        (&Method::GET, ["v1", "sandboxes", sid, "files"]) => {
            let sid = sid.to_string();
            let read = tokio::task::spawn_blocking(move || {
                with_file(&state, &sid, file, |sb, p| {
                    let read = match sb.read_limit() {
                        Some(rl) => rl
                            .read_file_limit(p, MAX_BODY)
                            .map(|o| (o.data, o.truncated)),
                        None => sb.read_file(p).map(|d| (d, false)),
                    };
                    if let Ok((data, _)) = &read {
                        audit(
                            &state,
                            "read",
                            json!({"path": p, "size": data.len(), "sha256": hako_audit::sha256_hex(data)}),
                        );
                    }
                    read
                })
            })
            .await;
            match read {
                Ok(Ok((data, truncated))) => {
                    let mut r = with_body(
                        200,
                        "application/octet-stream",
                        Full::new(Bytes::from(data)).boxed(),
                    );
                    r.headers_mut().insert(
                        "x-hako-truncated",
                        HeaderValue::from_static(if truncated { "true" } else { "false" }),
                    );
                    r
                }
                Ok(Err(r)) => response(r),
                Err(e) => {
                    tracing::warn!("hako serve: a request handler failed: {e}");
                    response(error(
                        500,
                        "internal",
                        "the request failed inside the server",
                    ))
                }
            }
        }
        (&Method::PUT, ["v1", "sandboxes", sid, "files"]) => {
            // The sandbox and the path first: a body is read only for a
            // write that can happen.
            if let Err(r) = with_file(&state, sid, file.clone(), |_, _| Ok(())) {
                return response(r);
            }
            // A body cut short must not replace the file: its length has
            // to be known to tell (a chunked body that ends early looks
            // complete).
            let body = match read_body(&state, body, declared, chunked, true).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let sid = sid.to_string();
            response(
                blocking(move || {
                    let _slot = slot;
                    let r = with_file(&state, &sid, file, |sb, p| {
                        sb.write_file(p, &body)?;
                        audit(
                            &state,
                            "write",
                            json!({"path": p, "size": body.len(), "sha256": hako_audit::sha256_hex(&body)}),
                        );
                        Ok(())
                    });
                    r.map(|()| reply(200, json!({"written": body.len()})))
                        .unwrap_or_else(|r| r)
                })
                .await,
            )
        }
        _ => {
            drop(body);
            response(
                blocking(move || {
                    let _slot = slot;
                    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                    route(&state, &method, &parts, &path, file)
                })
                .await,
            )
        }
    }
}

/// The routes answered with JSON after blocking sandbox work, and no body.
fn route(
    state: &State,
    method: &Method,
    parts: &[&str],
    path: &str,
    file: Option<String>,
) -> Reply {
    let id = |s: &str| s.parse::<u64>().ok();
    match (method, parts) {
        (&Method::GET, ["v1", "sandboxes"]) => {
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
            reply(200, json!({"sandboxes": list}))
        }
        (&Method::POST, ["v1", "sandboxes"]) => create(state),
        (&Method::GET, ["v1", "sandboxes", sid]) => with_sandbox(state, id(sid), |id, sb| {
            reply(200, json!({"id": id, "capabilities": sb.capabilities()}))
        }),
        (&Method::DELETE, ["v1", "sandboxes", sid]) => {
            let removed = id(sid).and_then(|n| table(state).open.remove(&n));
            match removed {
                Some(sb) => match sb.close() {
                    Ok(()) => reply(200, json!({"closed": true})),
                    Err(e) => from_error(&e),
                },
                None => no_sandbox(sid),
            }
        }
        (&Method::DELETE, ["v1", "sandboxes", sid, "files"]) => {
            let r = with_file(state, sid, file, |sb, p| {
                sb.remove(p)?;
                audit(state, "remove", json!({"path": p}));
                Ok(())
            });
            r.map(|()| reply(200, json!({"removed": true})))
                .unwrap_or_else(|r| r)
        }
        (&Method::GET, ["v1", "sandboxes", sid, "dir"]) => {
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
            r.unwrap_or_else(|r| r)
        }
        (&Method::POST, ["v1", "sandboxes", sid, "sessions"]) => {
            with_sandbox(state, id(sid), |_, sb| match sb.sessions() {
                Some(s) => match s.open_session(&SessionOptions::default()) {
                    Ok(session) => reply(200, json!({"session": session.0})),
                    Err(e) => from_error(&e),
                },
                None => error(501, "unsupported", "this sandbox has no sessions"),
            })
        }
        (&Method::DELETE, ["v1", "sandboxes", sid, "sessions", session]) => {
            let Some(session) = id(session) else {
                return error(400, "bad_request", "a session is a number");
            };
            with_sandbox(state, id(sid), |_, sb| match sb.sessions() {
                Some(s) => match s.close_session(SessionId(session)) {
                    Ok(()) => reply(200, json!({"closed": true})),
                    Err(e) => from_error(&e),
                },
                None => error(501, "unsupported", "this sandbox has no sessions"),
            })
        }
        _ => error(
            404,
            "no_such_route",
            format!("no route {} {path}", method.as_str()),
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
/// length never gets here), and, when the request declared its length,
/// exactly that many: a body cut short is an error, not a shorter body.
/// With `need_length`, a body of unknown length (chunked) is refused. A
/// body that stalls for the configured body timeout gets `408`. The error
/// is a whole answer, which closes the connection when the body was not
/// all read.
async fn read_body(
    state: &State,
    mut incoming: Incoming,
    declared: Option<u64>,
    chunked: bool,
    need_length: bool,
) -> Result<Vec<u8>, Response<Body>> {
    if need_length && declared.is_none() && chunked {
        return Err(closing(error(
            411,
            "length_required",
            "give the body's Content-Length (a chunked body that ends early could not be told from a whole one)",
        )));
    }
    let mut body = Vec::new();
    loop {
        let frame = match tokio::time::timeout(state.config.body_timeout, incoming.frame()).await {
            Err(_) => {
                return Err(closing(error(
                    408,
                    "timeout",
                    format!(
                        "the body stalled for {} ms; nothing was done",
                        state.config.body_timeout.as_millis()
                    ),
                )))
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => {
                if let Some(n) = declared {
                    return Err(closing(cut_short(body.len(), n)));
                }
                return Err(closing(error(
                    400,
                    "bad_request",
                    format!("cannot read the body: {e}"),
                )));
            }
        };
        if let Ok(data) = frame.into_data() {
            body.extend_from_slice(&data);
            if body.len() as u64 > MAX_BODY {
                return Err(closing(too_large()));
            }
        }
    }
    if let Some(n) = declared {
        if body.len() as u64 != n {
            return Err(closing(cut_short(body.len(), n)));
        }
    }
    Ok(body)
}

fn cut_short(got: usize, declared: u64) -> Reply {
    error(
        400,
        "body_cut_short",
        format!(
            "the body ended after {got} of the {declared} bytes its Content-Length declared; nothing was done"
        ),
    )
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

/// A command ready to run.
struct Prepared {
    command: Command,
    session: Option<u64>,
}

async fn exec(
    state: Arc<State>,
    sb: Arc<dyn Sandbox>,
    body: &[u8],
    slot: Option<Slot>,
) -> Response<Body> {
    let req: ExecRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return response(error(400, "bad_request", format!("bad exec request: {e}"))),
    };
    let program = match (req.argv, req.command) {
        (Some(argv), None) if !argv.is_empty() => Program::Argv(argv),
        (None, Some(cmd)) => Program::Shell(cmd),
        _ => {
            return response(error(
                400,
                "bad_request",
                "give exactly one of argv (non-empty) and command",
            ))
        }
    };
    let mut command = Command {
        program,
        ..Command::new(["true"])
    };
    command.timeout = match exec_timeout(req.timeout_ms) {
        Ok(t) => Some(t),
        Err(r) => return response(r),
    };
    if req.session.is_none() {
        command.cwd = req.cwd;
        command.stdin = req.stdin.map(String::into_bytes);
    } else if req.cwd.is_some() || req.stdin.is_some() {
        return response(error(
            400,
            "bad_request",
            "a session command takes no cwd or stdin (cd inside the session)",
        ));
    }
    let prepared = Prepared {
        command,
        session: req.session,
    };
    if !req.stream {
        return response(
            blocking(move || {
                let _slot = slot;
                let result = run_command(&state, sb.as_ref(), &prepared, None);
                match result {
                    Ok(out) => reply(200, output_json(&out)),
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
    let argv = command.program.argv();
    match &result {
        Ok(out) => audit(
            state,
            "exec",
            json!({"argv": argv, "cwd": command.cwd, "session": prepared.session, "exit_code": out.status.code(),
                   "timed_out": out.timed_out, "duration_ms": u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
                   "stdout_bytes": out.stdout_total, "stderr_bytes": out.stderr_total}),
        ),
        Err(e) => audit(
            state,
            "refusal",
            json!({"argv": argv, "error": e.to_string()}),
        ),
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
                json!({"seq": seq + 1, "stream": name, "data": String::from_utf8_lossy(chunk)});
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
        Ok(out) => send(json!({"seq": seq, "exit": output_json(out)}), false),
        Err(e) => send(json!({"seq": seq, "error": e.to_string()}), false),
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
