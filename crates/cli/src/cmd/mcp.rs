//! `hako mcp`: an MCP server on stdio whose tools (files, search,
//! commands, sessions, processes) act inside one sandbox.
//!
//! The flags are checked and the backend picked before serving; the
//! sandbox itself is opened on the first tool call (a failure to open it
//! is then that call's error, with the reason) and closed when the client
//! disconnects. stdout carries the protocol: everything else goes to
//! stderr.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hako_core::Isolation;

use super::SandboxArgs;
use crate::{backend, exit};

/// Flags of `hako mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Append one hash-chained JSON line per effect to FILE (commands, file
    /// operations, refusals, network decisions).
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Refuse to open a sandbox weaker than this.
    #[arg(long, value_name = "LEVEL", default_value = "none")]
    min_isolation: Isolation,
}

/// Runs `hako mcp`.
pub fn run(args: McpArgs) -> u8 {
    let fail = |err: &dyn std::fmt::Display| {
        eprintln!("hako: {err}");
        exit::SANDBOX_FAILED
    };
    let (backend_arg, spec) = match args.sandbox.spec() {
        Ok(spec) => spec,
        Err(e) => return fail(&e),
    };
    // The sandbox opens on the first call; a workspace that is not there
    // is worth saying now.
    if !spec.workspace.is_dir() {
        return fail(&format!(
            "the workspace {} is not a directory",
            spec.workspace.display()
        ));
    }
    let kind = match backend::resolve(backend_arg) {
        Ok(kind) => kind,
        Err(e) => return fail(&e),
    };
    // The policy gate, before anything is served.
    if kind.isolation() < args.min_isolation {
        return fail(&hako_core::Error::IsolationTooWeak {
            required: args.min_isolation,
            actual: kind.isolation(),
            backend: kind.name().into(),
        });
    }
    let audit = match &args.audit {
        Some(path) => match hako_audit::AuditLog::open(path) {
            Ok(log) => Some(Arc::new(log)),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    let min_isolation = args.min_isolation;
    let make_sandbox = Box::new(move || {
        let sandbox = backend::open(kind, &spec)?;
        hako_core::require_isolation(sandbox.as_ref(), min_isolation)?;
        Ok(sandbox)
    });
    tracing::info!(backend = kind.name(), "serving MCP on stdio");
    match hako_mcp::serve_stdio(hako_mcp::McpConfig {
        make_sandbox,
        audit,
    }) {
        Ok(()) => 0,
        // The protocol failed (the client went away before initializing);
        // the sandbox, if it was opened, is closed all the same.
        Err(e) => {
            eprintln!("hako: mcp: {e}");
            1
        }
    }
}
