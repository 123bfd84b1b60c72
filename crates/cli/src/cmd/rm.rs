//! `hako rm NAME`: removes a named sandbox and its state (its layers,
//! with every change not committed). Refused while it is in use.

use clap::Args;

use super::named::{state_failed, AuditArg, NamedArgs};

/// Flags of `hako rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    #[command(flatten)]
    named: NamedArgs,
    #[command(flatten)]
    audit: AuditArg,
}

/// Runs `hako rm`.
pub fn run(args: RmArgs) -> u8 {
    let state = match args.named.open(false) {
        Ok(state) => state,
        Err(code) => return code,
    };
    let log = match args.audit.open_for(&state) {
        Ok(log) => log,
        Err(code) => return code,
    };
    match state.remove() {
        Ok(()) => {
            log.done(hako_audit::ReviewOp::Remove);
            0
        }
        Err(e) => state_failed(&e),
    }
}
