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
//!
//! The sandboxes are opened by the runtime ([`ServeConfig::with_opener`]:
//! the backend `hako-runtime` chose for the server's spec), or by a
//! factory of the caller's own ([`ServeConfig::new`]).
//!
//! Files, one thing each: `conn` (accepting connections), `auth` (the
//! token), `routes` (routing, bounded bodies), `state` (the sandboxes'
//! table and the slot pools), `sandboxes`, `exec`, `files`, `processes`
//! (the handlers) and `reply` (the JSON shapes answered); `swerex` answers
//! SWE-ReX's remote runtime protocol instead ([`ServeConfig::swerex`]),
//! `e2b` E2B's API ([`ServeConfig::e2b`]).

mod auth;
mod conn;
mod e2b;
mod exec;
mod files;
mod gate;
mod multipart;
mod processes;
mod reply;
mod review;
mod routes;
mod sandboxes;
mod state;
mod swerex;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hako_core::Sandbox;
use hako_runtime::CowHold;

pub use e2b::{E2bConfig, OpenIn};

use conn::accept_loop;
use state::{close_all, Slots, State, Table};

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
    ("post", "/v1/sandboxes/{id}/dir"),
    ("get", "/v1/sandboxes/{id}/stat"),
    ("get", "/v1/sandboxes/{id}/processes"),
    ("post", "/v1/sandboxes/{id}/processes"),
    ("get", "/v1/sandboxes/{id}/processes/{process}"),
    ("get", "/v1/sandboxes/{id}/processes/{process}/output"),
    ("post", "/v1/sandboxes/{id}/processes/{process}/stdin"),
    ("post", "/v1/sandboxes/{id}/processes/{process}/kill"),
    ("post", "/v1/sandboxes/{id}/processes/{process}/wait"),
    ("post", "/v1/sandboxes/{id}/sessions"),
    ("delete", "/v1/sandboxes/{id}/sessions/{session}"),
    ("get", "/v1/sandboxes/{id}/changes"),
    ("get", "/v1/sandboxes/{id}/checkpoints"),
    ("post", "/v1/sandboxes/{id}/checkpoints"),
    ("post", "/v1/sandboxes/{id}/rollback"),
    ("post", "/v1/sandboxes/{id}/commit"),
    ("post", "/v1/sandboxes/{id}/discard"),
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

/// The most requests at once that may block waiting on a long-lived
/// process (a wait, a read of output that waits for more): counted apart,
/// so that clients polling their processes never lock others out.
const MAX_WAITS: usize = 32;

/// The longest one request may wait on a long-lived process (its end, or
/// more output); a longer wait asked for ends here, the process still
/// running, and the client asks again.
pub const MAX_PROCESS_WAIT: Duration = Duration::from_secs(60);

/// The most bytes of each stream one read of a process's output returns.
pub const MAX_READ_OUTPUT: usize = 4 << 20;

/// The most file reads and writes at once: each holds up to [`MAX_BODY`]
/// bytes in memory.
const MAX_TRANSFERS: usize = 8;

/// The most sandboxes open at once by default
/// ([`ServeConfig::max_sandboxes`]); past it a create is answered `429`.
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

/// How long a write of an answer may make no progress (a client that
/// never reads it) before its connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// How long writing an answer may make no progress (a client that
    /// never reads) before the connection is dropped ([`WRITE_TIMEOUT`]
    /// by default).
    pub write_timeout: Duration,
    /// The most connections open at once ([`MAX_CONNECTIONS`] by default).
    pub max_connections: usize,
    /// The most sandboxes open (or being opened) at once
    /// ([`MAX_SANDBOXES`] by default); one more create is answered `429`
    /// `too_many_sandboxes`, naming this bound.
    pub max_sandboxes: usize,
    /// Whether SIGINT and SIGTERM stop the server (closing every sandbox
    /// and the audit log). Off by default: a library must not take a
    /// process's signals unasked.
    pub stop_on_signals: bool,
    /// A copy-on-write workspace for every sandbox (`--cow`): how its
    /// layers are made and a sandbox opened on them. `None`: sandboxes
    /// are opened by `make_sandbox`, and the review routes answer
    /// `not_cow`.
    pub cow: Option<CowConfig>,
    /// `--allow-agent-commit`: clients may commit and discard; without
    /// it those routes answer `403` `agent_commit_refused`.
    pub allow_agent_commit: bool,
    /// Whether the end of this process's standard input stops the server
    /// (closing every sandbox and the audit log), as a signal does: the
    /// lifeline of a server started by a client library, which keeps a
    /// pipe to it open while it lives. Off by default: a library must not
    /// read a process's stdin unasked.
    pub stop_on_stdin_eof: bool,
    /// `--swerex`: answer SWE-ReX's remote runtime protocol (for its
    /// `RemoteRuntime` client, as SWE-agent uses it) instead of this API:
    /// one sandbox, named sessions, absolute paths under its working
    /// directory (see the `swerex` module).
    pub swerex: bool,
    /// `--e2b`: answer E2B's API (for the unmodified `e2b` SDK) instead
    /// of this API: each sandbox in a workspace of its own under the
    /// configuration's root, killed when its timeout passes (see the
    /// `e2b` module).
    pub e2b: Option<E2bConfig>,
}

/// Makes the copy-on-write layers of a new sandbox: the named sandbox the
/// create request names (locked while held), or a temporary layer.
pub type MakeLayers =
    dyn Fn(Option<&str>) -> Result<Arc<CowHold>, hako_runtime::cow::StateError> + Send + Sync;

/// Opens a sandbox on copy-on-write layers, which it holds.
pub type OpenOn = dyn Fn(Arc<CowHold>) -> hako_core::Result<Box<dyn Sandbox>> + Send + Sync;

/// How a server with a copy-on-write workspace makes each sandbox.
pub struct CowConfig {
    /// Makes a sandbox's layers.
    pub layers: Box<MakeLayers>,
    /// Opens a sandbox on them (at create, and again after a rollback,
    /// commit or discard, which close it first).
    pub open_on: Box<OpenOn>,
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
            write_timeout: WRITE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            max_sandboxes: MAX_SANDBOXES,
            stop_on_signals: false,
            cow: None,
            allow_agent_commit: false,
            stop_on_stdin_eof: false,
            swerex: false,
            e2b: None,
        }
    }

    /// A configuration whose sandboxes the runtime opens: each one a
    /// client asks for is `opener`'s (the backend chosen for the server's
    /// spec, gated by the isolation it requires).
    pub fn with_opener(
        opener: hako_runtime::Opener,
        token: String,
        audit: Option<Arc<hako_audit::AuditLog>>,
    ) -> Self {
        let opener = Arc::new(opener);
        let cow = opener.cow().is_some().then(|| {
            let (a, b) = (Arc::clone(&opener), Arc::clone(&opener));
            CowConfig {
                layers: Box::new(move |name| {
                    a.hold_layers(name)
                        .and_then(|held| held.ok_or(hako_runtime::cow::StateError::NoStateHome))
                }),
                open_on: Box::new(move |layers| {
                    b.open_on(Some(layers), &hako_runtime::DriverOptions::default())
                }),
            }
        });
        let mut config = ServeConfig::new(Box::new(move || opener.open()), token, audit);
        config.cow = cow;
        config
    }
}

/// Serves on `listener` until it fails or, with
/// [`ServeConfig::stop_on_signals`], until SIGINT or SIGTERM (with
/// [`ServeConfig::stop_on_stdin_eof`], until stdin ends); then closes
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
        token: hako_runtime::token::Digested::new(config.token.trim().as_bytes()),
        local: listener.local_addr().ok(),
        connections: Arc::new(Slots::new(config.max_connections)),
        config,
        sandboxes: Mutex::new(Table::default()),
        next: AtomicU64::new(1),
        requests: Arc::new(Slots::new(MAX_REQUESTS)),
        execs: Arc::new(Slots::new(MAX_EXECS)),
        starts: gate::StartGate::new(gate::width(), gate::WINDOW),
        transfers: Arc::new(Slots::new(MAX_TRANSFERS)),
        waits: Arc::new(Slots::new(MAX_WAITS)),
        swerex: swerex::Rex::default(),
        e2b: e2b::E2b::default(),
    });
    // In SWE-ReX mode the sandbox is there before the first request: the
    // client's alive check waits a fraction of a second, not for a start.
    if state.config.swerex {
        swerex::start(&state)?;
    }
    if state.config.e2b.is_some() {
        e2b::start_leases(&state)?;
    }
    let result = runtime.block_on(accept_loop(listener, Arc::clone(&state)));
    // E2B's sandboxes go with their workspaces.
    e2b::kill_all(&state);
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
