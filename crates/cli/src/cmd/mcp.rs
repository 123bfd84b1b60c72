//! `hako mcp`: an MCP server on stdio, or on streamable HTTP with
//! `--http ADDR`, whose tools (files, search, commands, sessions,
//! processes) act inside one sandbox.
//!
//! The flags are checked, the backend picked, what it needs checked
//! (`hako_runtime::preflight`: its guest, its image) and (with `--http`)
//! the address bound before serving; the sandbox itself is opened on the first
//! tool call (a failure to open it is then that call's error, with the
//! reason) and closed when the client disconnects (stdio) or the server is
//! stopped (HTTP). On stdio, stdout carries the protocol: everything else
//! goes to stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use hako_core::Isolation;

use super::SandboxArgs;
use crate::exit;

/// Flags of `hako mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Append one hash-chained JSON line per effect to FILE (commands, file
    /// operations, refusals, network decisions) [default: the profile's
    /// `audit`, else none].
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Serve MCP's streamable HTTP transport on ADDR (e.g. 127.0.0.1:8701),
    /// path /mcp, instead of stdio; every request needs the bearer token.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// With --http: a file holding the bearer token clients must send;
    /// without it a token is generated and printed once on stderr.
    #[arg(long, value_name = "FILE", requires = "http")]
    token_file: Option<PathBuf>,
    /// With --cow: offer the agent the `commit` and `discard` tools
    /// [default: committing stays with the person, `hako commit NAME`].
    #[arg(long)]
    allow_agent_commit: bool,
}

/// Runs `hako mcp`.
pub fn run(args: McpArgs) -> u8 {
    let fail = |err: &dyn std::fmt::Display| {
        eprintln!("hako: {}", crate::show::message(&err.to_string()));
        exit::SANDBOX_FAILED
    };
    let plan = match args.sandbox.plan() {
        Ok(plan) => plan,
        Err(e) => return fail(&e),
    };
    // The sandbox opens on the first call; a workspace that is not there
    // is worth saying now.
    if !plan.spec.workspace.is_dir() {
        return fail(&format!(
            "the workspace {} is not a directory",
            plan.spec.workspace.display()
        ));
    }
    if args.allow_agent_commit && plan.cow.is_none() {
        return fail(&"--allow-agent-commit lets an agent commit a copy-on-write sandbox's changes: give --cow (or the profile's `cow = true`) too");
    }
    // `--audit`, else the profile's `audit`.
    let audit_path = args.audit.clone().or_else(|| plan.audit.clone());
    // The backend is chosen, and the policy gate passed, before anything
    // is served.
    let opener = match hako_runtime::Opener::from_plan(plan, Isolation::None) {
        Ok(opener) => opener,
        Err(e) => return fail(&e),
    };
    let kind = opener.kind();
    // What the backend needs (its guest, its image) is checked now: a
    // server that cannot open a sandbox refuses to start, with the fix,
    // rather than failing its client's first call.
    if let Err(u) = hako_runtime::preflight(kind, opener.spec()) {
        return fail(&format!(
            "the {} backend cannot start here: {u}",
            kind.name()
        ));
    }
    // With --http: the token and the bound socket, before the audit log is
    // opened, so a port in use leaves no log behind.
    let http = match args.http.as_deref() {
        Some(addr) => match http_config(addr, args.token_file.as_deref()) {
            Ok(http) => Some(http),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    let writable = opener.spec().writable();
    // With --cow, the layers are held from now until the server ends (a
    // name in use is said now, before the audit log is opened).
    let mut config = match hako_mcp::McpConfig::new(opener, None) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    config.allow_agent_commit = args.allow_agent_commit;
    config.audit = match &audit_path {
        Some(path) => match hako_audit::AuditLog::open(path, &writable) {
            Ok(log) => {
                if let Some(cut) = log.repaired() {
                    eprintln!("hako mcp: audit log: {cut}; recorded and continued");
                }
                Some(Arc::new(log))
            }
            Err(e) => return fail(&e),
        },
        None => None,
    };
    if let Some(http) = http {
        if let Ok(local) = http.listener.local_addr() {
            eprintln!(
                "hako mcp: listening on http://{local}{} ({} backend)",
                hako_mcp::MCP_PATH,
                kind.name()
            );
        }
        return match hako_mcp::serve_http(config, http) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("hako: mcp: {}", crate::show::message(&e.to_string()));
                1
            }
        };
    }
    tracing::info!(backend = kind.name(), "serving MCP on stdio");
    match hako_mcp::serve_stdio(config) {
        Ok(()) => 0,
        // The protocol failed (the client went away before initializing);
        // the sandbox, if it was opened, is closed all the same.
        Err(e) => {
            eprintln!("hako: mcp: {}", crate::show::message(&e.to_string()));
            1
        }
    }
}

/// The token (read from `token_file`, or generated and printed once on
/// stderr) and the socket bound on `addr`, or what went wrong.
fn http_config(addr: &str, token_file: Option<&Path>) -> Result<hako_mcp::HttpConfig, String> {
    let from_file = match token_file {
        Some(path) => match hako_runtime::token::read(path) {
            Ok(Some(t)) => Some(t),
            Ok(None) => return Err(format!("the token file {} is empty", path.display())),
            Err(e) => {
                return Err(format!(
                    "cannot read the token file {}: {e}",
                    path.display()
                ))
            }
        },
        None => None,
    };
    if let Some(warning) = token_file.and_then(hako_runtime::http::token_file_warning) {
        eprintln!("hako mcp: warning: {warning}");
    }
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    if let Some(warning) = listener
        .local_addr()
        .ok()
        .and_then(hako_runtime::http::listen_warning)
    {
        eprintln!("hako mcp: warning: {warning}");
    }
    let token = match from_file {
        Some(t) => t,
        None => {
            let t = hako_runtime::token::generate()
                .map_err(|e| format!("cannot generate a token: {e}"))?;
            eprintln!("hako mcp: token {t}");
            t
        }
    };
    Ok(hako_mcp::HttpConfig { listener, token })
}
