//! What the review commands (`hako diff`, `commit`, `discard`, `rm`)
//! share: the sandbox's name and where its state is, opened into its
//! layers, and how their failures are shown and what exit code each has.

use std::path::PathBuf;

use clap::Args;
use hako_audit::{AuditLog, Failure, FrontEnd, ReviewOp};
use hako_layers::state::{state_root, State, StateError};
use hako_layers::{CommitError, Layers};

use crate::exit;

/// The named sandbox a review command acts on.
#[derive(Debug, Clone, Args)]
pub struct NamedArgs {
    /// The sandbox's name (as given to `--name`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Where named sandboxes are kept [default: $XDG_STATE_HOME/hako, else ~/.local/state/hako].
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

impl NamedArgs {
    /// Opens the sandbox's state, locked unless `read_only`.
    pub fn open(&self, read_only: bool) -> Result<State, u8> {
        let opened = state_root(self.state.as_deref()).and_then(|root| {
            if read_only {
                State::open_to_read(&root, &self.name)
            } else {
                State::open(&root, &self.name)
            }
        });
        opened.map_err(|e| state_failed(&e))
    }

    /// Opens the sandbox's state and its two layers.
    pub fn layers(&self, read_only: bool) -> Result<(State, Layers), u8> {
        let state = self.open(read_only)?;
        let workspace = state.workspace().map_err(|e| state_failed(&e))?;
        match Layers::open(&workspace, &state.upper()) {
            Ok(layers) => Ok((state, layers)),
            Err(e) => {
                eprintln!("hako: {}", crate::show::message(&e.to_string()));
                Err(exit::SANDBOX_FAILED)
            }
        }
    }
}

/// Shows a state failure; its exit code.
pub fn state_failed(e: &StateError) -> u8 {
    eprintln!("hako: {}", crate::show::message(&e.to_string()));
    exit::SANDBOX_FAILED
}

/// Shows a review failure; its exit code: [`exit::REVIEW_REFUSED`] for a
/// refusal before anything was written, [`exit::COMMIT_PARTIAL`] when a
/// commit stopped part-way, [`exit::SANDBOX_FAILED`] otherwise.
pub fn review_failed(e: &CommitError) -> u8 {
    eprintln!("hako: {}", crate::show::message(&e.to_string()));
    match e {
        CommitError::Partial { applied, .. } => {
            for a in applied {
                eprintln!(
                    "hako: applied before it stopped: {}",
                    crate::show::escaped(&a.path)
                );
            }
            exit::COMMIT_PARTIAL
        }
        CommitError::ExpectMismatch { .. }
        | CommitError::Refused { .. }
        | CommitError::ChangedInWorkspace { .. }
        | CommitError::ChangedSinceReview { .. }
        | CommitError::NoSuchChange { .. }
        | CommitError::PartOfLarger { .. } => exit::REVIEW_REFUSED,
        CommitError::Fence(f) if f.is_refusal() => exit::REVIEW_REFUSED,
        CommitError::Fence(hako_core::FenceError::ChangedMeanwhile { .. }) => exit::REVIEW_REFUSED,
        _ => exit::SANDBOX_FAILED,
    }
}

/// `--audit FILE` of the review commands that change something.
#[derive(Debug, Clone, Args)]
pub struct AuditArg {
    /// Append what was done (each path committed with the SHA-256 written,
    /// or discarded) to this hash-chained audit log.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
}

/// The audit log of a review command, if one was asked for.
pub struct ReviewLog {
    log: Option<AuditLog>,
    name: String,
}

impl AuditArg {
    /// Opens the log, refusing one inside the workspace (where a sandbox
    /// could rewrite it).
    pub fn open(&self, name: &str, workspace: &std::path::Path) -> Result<ReviewLog, u8> {
        let log = match &self.audit {
            None => None,
            Some(path) => match AuditLog::open(path, &[workspace.to_path_buf()]) {
                Ok(log) => Some(log),
                Err(e) => {
                    eprintln!("hako: {}", crate::show::message(&e.to_string()));
                    return Err(exit::SANDBOX_FAILED);
                }
            },
        };
        Ok(ReviewLog {
            log,
            name: name.to_owned(),
        })
    }
}

impl AuditArg {
    /// [`AuditArg::open`] for `state`, whose workspace may be gone (a
    /// sandbox on it can still be removed or rolled back).
    pub fn open_for(&self, state: &State) -> Result<ReviewLog, u8> {
        self.open(state.name(), &state.workspace().unwrap_or_default())
    }
}

impl ReviewLog {
    /// Records `op`.
    pub fn done(&self, op: ReviewOp) {
        if let Some(log) = &self.log {
            let record =
                hako_runtime::cow::review_record(FrontEnd::Review, Some(&self.name), None, op);
            if let Err(e) = log.write(&record) {
                eprintln!("hako: audit log: {e}");
            }
        }
    }

    /// Records a refusal or failure, and returns its exit code.
    pub fn failed(&self, e: &CommitError) -> u8 {
        let code = review_failed(e);
        if let Some(log) = &self.log {
            let mut failure = Failure::new(FrontEnd::Review, &e.to_string());
            failure.exit_code = Some(code);
            let _ = log.write(&failure.record(code == exit::REVIEW_REFUSED));
        }
        code
    }
}

/// The applied changes as the audit log records them.
pub fn committed(applied: &[hako_layers::commit::Applied]) -> Vec<hako_audit::Committed> {
    hako_runtime::cow::committed(applied)
}
