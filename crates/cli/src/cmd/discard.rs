//! `hako discard NAME [PATH...]`: throws away a copy-on-write sandbox's
//! changes (all, or those at and beneath the paths named), so that it
//! sees the workspace there again. The workspace is not touched.

use std::path::PathBuf;

use clap::Args;

use super::named::{state_failed, AuditArg, NamedArgs};

/// Flags of `hako discard`.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    #[command(flatten)]
    named: NamedArgs,
    /// Only these paths (and what is beneath them), relative to the workspace.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    audit: AuditArg,
}

/// Runs `hako discard`.
pub fn run(args: DiscardArgs) -> u8 {
    let state = match args.named.open(false) {
        Ok(state) => state,
        Err(code) => return code,
    };
    let workspace = match state.workspace() {
        Ok(ws) => ws,
        Err(e) => return state_failed(&e),
    };
    let log = match args.audit.open(state.name(), &workspace) {
        Ok(log) => log,
        Err(code) => return code,
    };
    match hako_layers::discard(&state.upper(), &workspace, &args.paths) {
        Ok(removed) => {
            for path in &removed {
                println!(
                    "discarded {}",
                    crate::show::escaped(path.as_os_str().as_encoded_bytes())
                );
            }
            log.done(hako_audit::ReviewOp::Discard {
                paths: removed
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
            });
            0
        }
        Err(e) => log.failed(&e),
    }
}
