//! `hako serve --swerex`: SWE-ReX's remote runtime protocol, so that the
//! `RemoteRuntime` client of the `swe-rex` package (what SWE-agent's
//! remote deployment drives) runs commands and moves files in a hako
//! sandbox, unmodified.
//!
//! What the client sees:
//! - One sandbox, opened with the server's policy (its flags; the client
//!   chooses nothing) when the server starts (a server whose sandbox
//!   cannot open does not start), closed by `POST /close` (the next
//!   request opens a new one) or when the server stops.
//! - Sessions are named, as SWE-ReX names them: each is a hako session, a
//!   shell whose directory, variables and functions last from one command
//!   to the next. Its output is stdout and stderr as they came.
//! - Paths are absolute, as SWE-ReX gives them, and resolve inside the
//!   sandbox: a path under the sandbox's working directory (what `pwd`
//!   prints in a new session; on `linux` and `landlock` the workspace's
//!   own path) is accepted, a relative one starts there, and anything else
//!   is refused by the fence (`PermissionError` on the client, naming the
//!   path and why).
//! - Errors travel as SWE-ReX's own server sends them: status 511 with
//!   the exception's class and message, which the client raises again
//!   (`CommandTimeoutError`, `NonZeroExitCodeError`, `SessionExistsError`,
//!   `SessionDoesNotExistError`, `FileNotFoundError`, `PermissionError`,
//!   ...), hako's error kind in its `extra_info`. What is wrong with the
//!   request itself (bad JSON, a body too large, a busy server, a missing
//!   token) is a plain HTTP error with a `detail`.
//! - Every request carries the server's token: as `X-API-Key` (how the
//!   client sends its `auth_token`) or as `Authorization: Bearer`.
//! - The API's bounds hold: bodies up to [`MAX_BODY`](crate::MAX_BODY),
//!   the pools of requests, commands and transfers, every command with a
//!   deadline (a request without one gets
//!   [`DEFAULT_EXEC_TIMEOUT`](crate::DEFAULT_EXEC_TIMEOUT)), output capped.
//!
//! The `/v1` API is not served in this mode. `ops` holds the operations,
//! `session` those of sessions,
//! `upload` the multipart body and the zip of a directory, `text` the
//! decoding and quoting SWE-ReX's Python side does.

mod ops;
mod session;
mod text;
pub(crate) mod upload;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use hako_core::SessionId;
use hako_runtime::http::TokenRefusal;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::{Method, Request, Response};
use serde_json::{json, Value};

use crate::auth::{authorized, same_origin};
use crate::reply::{busy, closing, reply, response, Body, Reply};
use crate::routes::{blocking, declared_length, read_body};
use crate::state::State;
use crate::MAX_BODY;

/// The header SWE-ReX's client sends its token in (lower case, as
/// `HeaderMap` keys are).
pub(crate) const API_KEY: &str = "x-api-key";

/// The header SWE-ReX's client names each request with, so that a retry
/// of a request whose answer was lost gets that answer again.
const REQUEST_ID: &str = "x-request-id";

/// The longest request id remembered; a longer one is not.
const MAX_REQUEST_ID: usize = 256;

/// What the server holds in SWE-ReX mode.
#[derive(Default)]
pub(crate) struct Rex {
    open: Mutex<Open>,
    /// The last request id answered, and its answer (SWE-ReX's own server
    /// keeps the same one).
    last: Mutex<Option<(String, u16, Value)>>,
}

/// The sandbox and its named sessions.
#[derive(Default)]
struct Open {
    /// The sandbox's id in the server's table, once opened.
    sandbox: Option<u64>,
    /// Each SWE-ReX session's hako session.
    sessions: HashMap<String, SessionId>,
}

impl Rex {
    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn replay(&self, id: &str) -> Option<Reply> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match &*last {
            Some((seen, status, body)) if seen == id => Some(reply(*status, body.clone())),
            _ => None,
        }
    }

    fn remember(&self, id: String, r: &Reply) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((id, r.status, r.body.clone()));
    }
}

/// The token as SWE-ReX sends it: `None` without an `X-API-Key` header
/// (the bearer token is checked then), else whether it is the server's
/// (exactly one header, compared by digest in constant time).
pub(crate) fn api_key(state: &State, headers: &HeaderMap) -> Option<Result<(), TokenRefusal>> {
    let mut values = headers.get_all(API_KEY).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Err(TokenRefusal::Doubled));
    }
    let given = first.as_bytes().trim_ascii();
    if given.is_empty() {
        return Some(Err(TokenRefusal::Missing));
    }
    Some(if state.token.matches(given) {
        Ok(())
    } else {
        Err(TokenRefusal::Wrong)
    })
}

/// An answer in FastAPI's shape, which SWE-ReX's client reads:
/// `{"detail": message}`.
fn detail(status: u16, message: impl Into<String>) -> Reply {
    reply(status, json!({"detail": message.into()}))
}

/// The answer to a request without the server's token.
fn refused(why: TokenRefusal) -> Reply {
    detail(
        401,
        match why {
            TokenRefusal::Missing => {
                "a token is required: give the server's token as the client's auth_token (sent as X-API-Key), or as Authorization: Bearer TOKEN"
            }
            TokenRefusal::Wrong => {
                "the token is wrong: it is not this server's (check --token-file, or the token printed when the server started)"
            }
            TokenRefusal::Doubled => "the token was sent more than once; send it once",
        },
    )
}

/// The routes of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    IsAlive,
    CreateSession,
    RunInSession,
    CloseSession,
    Execute,
    ReadFile,
    WriteFile,
    Upload,
    Close,
}

impl Route {
    fn find(method: &Method, path: &str) -> Result<Route, Reply> {
        let route = match path.trim_end_matches('/') {
            "/is_alive" => Route::IsAlive,
            "/create_session" => Route::CreateSession,
            "/run_in_session" => Route::RunInSession,
            "/close_session" => Route::CloseSession,
            "/execute" => Route::Execute,
            "/read_file" => Route::ReadFile,
            "/write_file" => Route::WriteFile,
            "/upload" => Route::Upload,
            "/close" => Route::Close,
            _ => {
                return Err(detail(
                    404,
                    format!("no route {path}: this server answers SWE-ReX's remote runtime protocol (hako serve --swerex)"),
                ))
            }
        };
        let wanted = if route == Route::IsAlive {
            Method::GET
        } else {
            Method::POST
        };
        if *method != wanted {
            return Err(detail(405, format!("{path} takes {wanted}")));
        }
        Ok(route)
    }

    /// Whether it runs a command (a slot of the commands' pool, and a turn
    /// to start).
    fn runs(self) -> bool {
        matches!(self, Route::RunInSession | Route::Execute)
    }

    /// Whether it moves a file's bytes (a slot of the transfers' pool).
    fn moves(self) -> bool {
        matches!(self, Route::ReadFile | Route::WriteFile | Route::Upload)
    }
}

/// Answers one request of SWE-ReX's protocol: the token and the declared
/// length first, then a slot, then the route.
pub(crate) async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let authorized = authorized(&state, request.headers());
    let declared = declared_length(request.headers());
    if declared.is_ok_and(|n| n.is_some_and(|n| n > MAX_BODY)) {
        return closing(match authorized {
            Ok(()) => detail(413, format!("the body is over {MAX_BODY} bytes")),
            Err(why) => refused(why),
        });
    }
    if let Err(why) = authorized {
        return closing(refused(why));
    }
    if let Err(r) = same_origin(&state, request.headers()) {
        return closing(detail(r.status, r.body["error"].as_str().unwrap_or("")));
    }
    let Ok(declared) = declared else {
        return closing(detail(400, "the Content-Length is not a number"));
    };
    let (head, body) = request.into_parts();
    let route = match Route::find(&head.method, head.uri.path()) {
        Ok(route) => route,
        Err(r) => return response(r),
    };
    let slot = if route.runs() {
        state.execs.try_take().ok_or("commands")
    } else if route.moves() {
        state.transfers.try_take().ok_or("file transfers")
    } else {
        state.requests.try_take().ok_or("requests")
    };
    let slot = match slot {
        Ok(slot) => slot,
        Err(what) => {
            let r = busy(what);
            return response(detail(r.status, r.body["error"].as_str().unwrap_or("")));
        }
    };
    let body = if head.method == Method::POST {
        let chunked = head.headers.contains_key(TRANSFER_ENCODING);
        // An upload cut short must not be written: its length has to be
        // known to tell.
        match read_body(&state, body, declared, chunked, route == Route::Upload).await {
            Ok(b) => b,
            Err(r) => return r,
        }
    } else {
        drop(body);
        Vec::new()
    };
    let content_type = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    // Answers that change something are kept for a retry; a read or an
    // alive check is answered anew (and a file read is not held twice).
    let request_id = head
        .headers
        .get(REQUEST_ID)
        .filter(|_| !matches!(route, Route::IsAlive | Route::ReadFile))
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= MAX_REQUEST_ID)
        .map(str::to_string);
    if let Some(answered) = request_id.as_deref().and_then(|id| state.swerex.replay(id)) {
        return response(answered);
    }
    let turn = if route.runs() {
        Some(state.starts.enter().await)
    } else {
        None
    };
    let worker = Arc::clone(&state);
    let answer = blocking(move || {
        let _slot = slot;
        let _turn = turn;
        ops::answer(&worker, route, &body, &content_type)
    })
    .await;
    if let Some(id) = request_id {
        state.swerex.remember(id, &answer);
    }
    response(answer)
}

/// Opens the server's sandbox before the first request, or says why it
/// cannot.
pub(crate) fn start(state: &State) -> std::io::Result<()> {
    match ops::sandbox(state) {
        Ok(_) => Ok(()),
        Err(
            Fail::Raise { message, .. }
            | Fail::Http {
                detail: message, ..
            },
        ) => Err(std::io::Error::other(message)),
    }
}

/// Why an operation failed, as the client is told.
#[derive(Debug)]
pub(crate) enum Fail {
    /// An exception the client raises again: its class path (a SWE-ReX
    /// exception or a Python builtin), message and extra information.
    Raise {
        class: &'static str,
        message: String,
        extra: Value,
    },
    /// A request the protocol's models do not accept (FastAPI's `422`),
    /// or another HTTP error.
    Http { status: u16, detail: String },
}

impl Fail {
    fn raise(class: &'static str, message: impl Into<String>) -> Fail {
        Fail::Raise {
            class,
            message: message.into(),
            extra: json!({}),
        }
    }

    fn invalid(message: impl Into<String>) -> Fail {
        Fail::Http {
            status: 422,
            detail: message.into(),
        }
    }

    fn reply(self) -> Reply {
        match self {
            Fail::Raise {
                class,
                message,
                extra,
            } => reply(
                511,
                json!({"swerexception": {
                    "message": message,
                    "class_path": class,
                    "traceback": "",
                    "extra_info": extra,
                }}),
            ),
            Fail::Http { status, detail: d } => detail(status, d),
        }
    }
}

/// SWE-ReX's exceptions, by class path.
mod class {
    pub(super) const SWEREX: &str = "swerex.exceptions.SwerexException";
    pub(super) const TIMEOUT: &str = "swerex.exceptions.CommandTimeoutError";
    pub(super) const NON_ZERO: &str = "swerex.exceptions.NonZeroExitCodeError";
    pub(super) const SESSION_EXISTS: &str = "swerex.exceptions.SessionExistsError";
    pub(super) const NO_SESSION: &str = "swerex.exceptions.SessionDoesNotExistError";
    pub(super) const SYNTAX: &str = "swerex.exceptions.BashIncorrectSyntaxError";
    pub(super) const FILE_NOT_FOUND: &str = "builtins.FileNotFoundError";
    pub(super) const PERMISSION: &str = "builtins.PermissionError";
    pub(super) const IS_A_DIRECTORY: &str = "builtins.IsADirectoryError";
    pub(super) const NOT_A_DIRECTORY: &str = "builtins.NotADirectoryError";
    pub(super) const FILE_EXISTS: &str = "builtins.FileExistsError";
    pub(super) const OS: &str = "builtins.OSError";
    pub(super) const VALUE: &str = "builtins.ValueError";
    pub(super) const LOOKUP: &str = "builtins.LookupError";
    pub(super) const NOT_IMPLEMENTED: &str = "builtins.NotImplementedError";
}

/// The exception a sandbox error is raised as on the client, hako's
/// message and kind kept.
fn from_hako(e: &hako_core::Error) -> Fail {
    use hako_core::{Error, FenceError};
    let class = match e {
        Error::Fence(f) => match f {
            FenceError::NotFound { .. } => class::FILE_NOT_FOUND,
            FenceError::IsADirectory { .. } => class::IS_A_DIRECTORY,
            FenceError::NotADirectory { .. } => class::NOT_A_DIRECTORY,
            FenceError::AlreadyExists { .. } => class::FILE_EXISTS,
            FenceError::FileTooLarge { .. } | FenceError::Io { .. } => class::OS,
            _ => class::PERMISSION,
        },
        Error::CommandNotFound { .. } => class::FILE_NOT_FOUND,
        Error::CannotExecute { .. } => class::PERMISSION,
        Error::InvalidCommand { .. } => class::VALUE,
        Error::SessionNotOpen { .. } => class::NO_SESSION,
        Error::Unsupported { .. } => class::NOT_IMPLEMENTED,
        Error::IsolationTooWeak { .. }
        | Error::NetworkUnavailable { .. }
        | Error::BadNetworkPolicy { .. } => class::PERMISSION,
        _ => class::SWEREX,
    };
    let kind = crate::reply::from_error(e).body["kind"].clone();
    Fail::Raise {
        class,
        message: e.to_string(),
        extra: json!({"hako_kind": kind}),
    }
}
