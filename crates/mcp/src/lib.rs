//! hako's MCP server: the tools a coding agent needs (read, write and edit
//! files, list, glob and grep, run commands, shell sessions, long-lived
//! processes), served over stdio with the official MCP SDK, each one
//! running behind a hako sandbox boundary.
//!
//! The server holds one sandbox for the connection. It is opened on the
//! first tool call (so a server that cannot open its sandbox still starts
//! and answers every call with the reason) and closed when the client goes
//! away (end of stdin, or SIGTERM/SIGINT): everything started in it is
//! killed, and the audit log, if any, gets its closing record.
//!
//! Invariants:
//! - Every failure, whether bad input, a path outside the workspace, a
//!   fence refusal or a sandbox error, is a tool result with `isError`
//!   set and a readable message; never a protocol error, never a crash
//!   (a panic inside a tool becomes an error result too).
//! - Sandbox calls block: each runs on tokio's blocking pool, so one slow
//!   command never stalls the protocol or other calls.
//! - Everything a tool returns is bounded (lines, bytes, entries,
//!   matches), and says what it left out and how to get it.
//! - Paths only ever go through the sandbox's fence: `glob` and `grep`
//!   walk with `list_dir` and bounded reads, never the host's file system
//!   by name, and never follow symlinks.
//! - One audit record per effect, after the effect: commands (`exec`),
//!   file operations (`file`, with the SHA-256 of what was read or
//!   written), sessions and processes, failures (`refusal` for policy
//!   refusals, `error` otherwise), and the egress proxy's decisions
//!   (`net`) after each command and at the end.
//!
//! A process that uses the library from several threads (as this server
//! does, under tokio) starts the sandbox's guest from the `hako-guest`
//! binary, found beside the running executable or named by `HAKO_GUEST`;
//! opening the sandbox says so when it is missing.

mod exec;
mod files;
#[cfg(test)]
mod fuzz;
mod http;
mod ignores;
mod search;
mod server;
mod state;
#[cfg(test)]
mod testbox;
mod text;

use std::sync::Arc;
use std::time::Duration;

use hako_audit::AuditLog;
use hako_core::Sandbox;
use rmcp::ServiceExt;

pub use http::{serve_http, HttpConfig, MAX_BODY_BYTES, MCP_PATH};
pub use text::{replace_exact, EditError};

/// Opens the sandbox the server acts in.
pub type MakeSandbox = dyn Fn() -> hako_core::Result<Box<dyn Sandbox>> + Send + Sync;

/// How to serve.
pub struct McpConfig {
    /// Opens the sandbox, on the first tool call (and again on the next
    /// call if opening failed). Called on a blocking thread.
    /// [`McpConfig::new`] makes it the runtime's `Opener::open`; a library
    /// user (or a test) may give its own.
    pub make_sandbox: Box<MakeSandbox>,
    /// Where to record every effect, if anywhere; closed when the server
    /// ends.
    pub audit: Option<Arc<AuditLog>>,
    /// The most tool calls running at once ([`MAX_TOOL_CALLS`] by default).
    pub max_calls: usize,
    /// The copy-on-write layers `make_sandbox` opens the sandbox on
    /// (`--cow`), held for the server's life: the review tools
    /// (`workspace_changes`, `checkpoint`, `list_checkpoints`, `rollback`)
    /// act on them. `None`: no review tools.
    pub cow: Option<Arc<hako_runtime::CowHold>>,
    /// `--allow-agent-commit`: the `commit` and `discard` tools are
    /// offered; without it an agent's commit is refused, naming the flag.
    pub allow_agent_commit: bool,
}

impl McpConfig {
    /// A server whose sandbox the runtime opens: the backend `opener`
    /// chose for its spec, gated by the isolation it requires. With a
    /// copy-on-write workspace, its layers are made now (a named
    /// sandbox's locked for the server's life; a temporary one removed
    /// when the server ends), and every sandbox is opened on them.
    pub fn new(
        opener: hako_runtime::Opener,
        audit: Option<Arc<AuditLog>>,
    ) -> hako_core::Result<Self> {
        let cow = opener.hold(None)?;
        let layers = cow.clone();
        let driver = hako_runtime::DriverOptions::default();
        Ok(McpConfig {
            make_sandbox: Box::new(move || opener.open_on(layers.clone(), &driver)),
            audit,
            max_calls: MAX_TOOL_CALLS,
            cow,
            allow_agent_commit: false,
        })
    }
}

impl std::fmt::Debug for McpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpConfig")
            .field("audit", &self.audit)
            .finish_non_exhaustive()
    }
}

/// The most tool calls running at once, of every client, unless
/// [`McpConfig::max_calls`] says otherwise; one more is refused at once
/// with a tool error saying so.
pub const MAX_TOOL_CALLS: usize = 32;

/// How long tool calls still running at the end get to finish after the
/// sandbox is closed (closing makes each of them return at once).
const DRAIN: Duration = Duration::from_secs(1);

/// Serves MCP on stdin and stdout until the client disconnects (or the
/// process gets SIGTERM or SIGINT), then closes the sandbox and the audit
/// log. Builds its own tokio runtime; call it from a thread that is not
/// running one. Logs go through `tracing`, never to stdout.
pub fn serve_stdio(config: McpConfig) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("hako-mcp")
        .build()?;
    let state = Arc::new(
        state::State::new(config.make_sandbox, config.audit)
            .with_max_calls(config.max_calls)
            .with_cow(config.cow, config.allow_agent_commit),
    );
    let result = runtime.block_on(serve(state.clone()));
    // The client is gone: close the sandbox first, which kills whatever
    // tool calls are still waiting on it, then let them finish.
    state.shutdown();
    runtime.shutdown_timeout(DRAIN);
    state.close_audit();
    result
}

async fn serve(state: Arc<state::State>) -> std::io::Result<()> {
    let server = server::HakoServer::new(state);
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| std::io::Error::other(format!("MCP initialization failed: {e}")))?;
    let cancel = running.cancellation_token();
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        quit = running.waiting() => {
            tracing::info!("client disconnected: {quit:?}");
        }
        signalled = stop => {
            signalled?;
            tracing::info!("signalled: shutting down");
            cancel.cancel();
        }
    }
    Ok(())
}
