//! `hako commit NAME [PATH...]`: applies a copy-on-write sandbox's
//! changes (all, or those at and beneath the paths named) to the real
//! workspace through the fence, each entry atomically; with `--expect
//! HASH`, only if they are exactly the ones `hako diff` showed with that
//! hash. See `hako_layers::commit` for what is refused.

use std::path::PathBuf;

use clap::Args;

use super::named::{committed, state_failed, AuditArg, NamedArgs};

/// Flags of `hako commit`.
#[derive(Debug, Args)]
pub struct CommitArgs {
    #[command(flatten)]
    named: NamedArgs,
    /// Only these paths (and what is beneath them), relative to the workspace.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Commit only if the changes hash to this (`hako diff` prints it).
    #[arg(long, value_name = "HASH")]
    expect: Option<String>,
    /// Report as JSON: the hash and each change applied with the SHA-256 written.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    audit: AuditArg,
}

/// Runs `hako commit`.
pub fn run(args: CommitArgs) -> u8 {
    let (state, layers) = match args.named.layers(false) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let log = match state.workspace() {
        Ok(ws) => match args.audit.open(state.name(), &ws) {
            Ok(log) => log,
            Err(code) => return code,
        },
        Err(e) => return state_failed(&e),
    };
    let mut base = match state.base() {
        Ok(base) => base,
        Err(e) => return state_failed(&e),
    };
    let result = hako_layers::commit(&layers, &mut base, &args.paths, args.expect.as_deref());
    // What was written is recorded whatever the outcome.
    if let Err(e) = state.save_base(&base) {
        return state_failed(&e);
    }
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            if let hako_layers::CommitError::Partial { hash, applied, .. } = &e {
                log.done(hako_audit::ReviewOp::Commit {
                    diff_hash: hash.clone(),
                    changes: committed(applied),
                    complete: false,
                });
            }
            return log.failed(&e);
        }
    };
    log.done(hako_audit::ReviewOp::Commit {
        diff_hash: report.hash.clone(),
        changes: committed(&report.applied),
        complete: true,
    });
    if args.json {
        match serde_json::to_string(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("hako: {e}"),
        }
    } else {
        for applied in &report.applied {
            let status = serde_json::to_value(applied.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            match &applied.sha256 {
                Some(sha) => println!(
                    "{status} {} sha256:{sha}",
                    crate::show::escaped(&applied.path)
                ),
                None => println!("{status} {}", crate::show::escaped(&applied.path)),
            }
        }
        println!("# hash: {}", report.hash);
    }
    0
}
