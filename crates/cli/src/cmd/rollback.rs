//! `hako rollback NAME CHECKPOINT`: returns a named copy-on-write
//! sandbox's layer to a checkpoint (its number or label). What the layer
//! held since is lost unless it was checkpointed. Refused while a run (or
//! a review command) uses the sandbox, so no process or session of it is
//! running when its view changes.

use clap::Args;

use super::named::{AuditArg, NamedArgs};

/// Flags of `hako rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    named: NamedArgs,
    /// The checkpoint: its number or its label.
    #[arg(value_name = "CHECKPOINT")]
    checkpoint: String,
    #[command(flatten)]
    audit: AuditArg,
}

/// Runs `hako rollback`.
pub fn run(args: RollbackArgs) -> u8 {
    let state = match args.named.open(false) {
        Ok(state) => state,
        Err(code) => return code,
    };
    let log = match args.audit.open_for(&state) {
        Ok(log) => log,
        Err(code) => return code,
    };
    match state.rollback(&args.checkpoint) {
        Ok(cp) => {
            log.done(hako_audit::ReviewOp::Rollback { checkpoint: cp.id });
            println!("rolled back to {}", cp.id);
            0
        }
        Err(e) => super::checkpoint::failed(&e),
    }
}
