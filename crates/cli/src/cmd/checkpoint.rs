//! `hako checkpoint NAME [LABEL]`: records a named copy-on-write
//! sandbox's layer as it is now (an agent harness calls it once per
//! turn), to return to with `hako rollback` or compare with `hako diff
//! --from`. `--list` lists the checkpoints. Refused while a run uses the
//! sandbox.

use clap::Args;

use super::named::NamedArgs;
use crate::exit;

/// Flags of `hako checkpoint`.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    named: NamedArgs,
    /// A label to find it by (as a name: letters, digits, `.`, `_`, `-`).
    #[arg(value_name = "LABEL")]
    label: Option<String>,
    /// List the checkpoints instead (number, label, time).
    #[arg(long, conflicts_with = "label")]
    list: bool,
}

/// Runs `hako checkpoint`.
pub fn run(args: CheckpointArgs) -> u8 {
    // Listing reads only; taking one holds the sandbox (nothing runs).
    let state = match args.named.open(args.list) {
        Ok(state) => state,
        Err(code) => return code,
    };
    if args.list {
        return match state.checkpoints() {
            Ok(all) => {
                for cp in all {
                    println!(
                        "{}\t{}\t{}",
                        cp.id,
                        cp.label.as_deref().unwrap_or("-"),
                        cp.at_ms
                    );
                }
                0
            }
            Err(e) => failed(&e),
        };
    }
    match state.checkpoint(args.label.as_deref()) {
        Ok(cp) => {
            println!("{}", cp.id);
            0
        }
        Err(e) => failed(&e),
    }
}

/// Shows a checkpoint failure; its exit code.
pub fn failed(e: &hako_layers::checkpoint::CheckpointError) -> u8 {
    use hako_layers::checkpoint::CheckpointError;
    eprintln!("hako: {}", crate::show::message(&e.to_string()));
    match e {
        CheckpointError::NoSuchCheckpoint { .. } | CheckpointError::Uncopiable { .. } => {
            exit::REVIEW_REFUSED
        }
        _ => exit::SANDBOX_FAILED,
    }
}
