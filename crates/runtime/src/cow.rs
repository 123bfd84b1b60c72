//! A copy-on-write workspace (`--cow`, `--name`, `--state`, and the
//! profile keys `cow`, `name`, `state`): the layers a sandbox is opened
//! on, held while it uses them, and the review operations every front end
//! offers on them (the changes, checkpoints, rollback, commit, discard).
//!
//! [`CowRequest`] is what the flags and the profile ask for; [`CowHold`]
//! the layers made for it: a named sandbox's state (locked while held, so
//! no other run, review command or server uses it meanwhile) or a
//! temporary layer, removed when the last holder lets go. Every sandbox
//! the runtime opens on layers holds them ([`crate::Opener::open_on`]), so
//! `hako run`, `shell`, `fs`, `mcp` and `serve` share this one path.
//!
//! The operations that change the upper layer or the workspace
//! (rollback, commit, discard) are done with no sandbox mounted on the
//! layers: the front end closes its sandbox first (which ends every
//! process and session in it) and opens another on the same layers after
//! ([`CowHold::exclusive`] keeps two such operations apart). Reading
//! (the changes) and checkpointing read the upper layer only, and may be
//! done while the sandbox runs.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use hako_audit::{Committed, FrontEnd, Record, Review, ReviewOp};
use hako_core::{CowLayers, SandboxSpec};
pub use hako_layers::checkpoint::Checkpoint as CheckpointInfo;
use hako_layers::checkpoint::{Checkpoint, CheckpointError};
use hako_layers::commit::{select, Applied};
pub use hako_layers::state::StateError;
use hako_layers::state::{state_root, validate_name, State};
use hako_layers::{diff_hash, render, CommitError, CommitReport, Layers};

/// What the flags and the profile ask of a copy-on-write workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CowRequest {
    /// `--name NAME`: keep the layers as this named sandbox (checked to
    /// be a name hako accepts); `None` is a temporary layer per sandbox.
    pub name: Option<String>,
    /// `--state DIR`: where named sandboxes are kept (default
    /// `$XDG_STATE_HOME/hako`, else `~/.local/state/hako`).
    pub state: Option<PathBuf>,
}

impl CowRequest {
    /// Checks the name, if one is given.
    pub fn check(&self) -> Result<(), String> {
        match &self.name {
            Some(name) => validate_name(name).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// Why a review operation failed or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The state directory failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A checkpoint could not be taken or returned to.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Listing, committing or discarding failed or was refused.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// A layer could not be opened.
    #[error(transparent)]
    Fence(#[from] hako_core::FenceError),
}

impl ReviewError {
    /// Whether it is a refusal (nothing was done, by policy or because
    /// what was asked is not there), rather than a failure.
    pub fn is_refusal(&self) -> bool {
        match self {
            ReviewError::Checkpoint(
                CheckpointError::NoSuchCheckpoint { .. } | CheckpointError::Uncopiable { .. },
            ) => true,
            ReviewError::State(StateError::InvalidName { .. }) => true,
            ReviewError::Commit(e) => match e {
                CommitError::ExpectMismatch { .. }
                | CommitError::Refused { .. }
                | CommitError::ChangedInWorkspace { .. }
                | CommitError::ChangedSinceReview { .. }
                | CommitError::NoSuchChange { .. }
                | CommitError::PartOfLarger { .. } => true,
                CommitError::Fence(f) => {
                    f.is_refusal() || matches!(f, hako_core::FenceError::ChangedMeanwhile { .. })
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether what was asked is not there (a checkpoint, a change at a
    /// path).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ReviewError::Checkpoint(CheckpointError::NoSuchCheckpoint { .. })
                | ReviewError::Commit(CommitError::NoSuchChange { .. })
        )
    }
}

/// Refuses a state directory beneath a system directory the `linux` and
/// `gvisor` sandboxes see (read-only) in their view of the host
/// (`hako_view::SYSTEM_DIRS`): its layers and checkpoints would be
/// readable inside, beside the layered view.
fn outside_the_view(root: &std::path::Path) -> Result<(), StateError> {
    let canon = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    for dir in hako_view::SYSTEM_DIRS {
        let dir = std::path::Path::new(dir);
        let dir_c = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if canon.starts_with(dir) || canon.starts_with(&dir_c) {
            return Err(StateError::InsideSandbox {
                state: root.to_path_buf(),
                inside: dir.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// The layers of one copy-on-write sandbox, held: a named sandbox's
/// state, locked until this is dropped, or a temporary layer, removed
/// when this is dropped (whatever the outcome of what ran on it).
pub struct CowHold {
    state: Option<State>,
    temporary: Option<tempfile::TempDir>,
    named: bool,
    /// Held by an operation that needs the layers to itself.
    busy: Mutex<()>,
}

impl std::fmt::Debug for CowHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CowHold")
            .field("name", &self.name())
            .field("dir", &self.state.as_ref().map(State::dir))
            .finish()
    }
}

/// What [`CowHold::changes`] found: the changes as a unified diff, a
/// summary, JSON entries, and the hash `commit` takes to commit exactly
/// them.
#[derive(Debug, Clone)]
pub struct Changes {
    /// How many changes.
    pub count: usize,
    /// Their hash (`hako diff`'s, `--expect`'s).
    pub hash: String,
    /// A unified diff like `git diff`.
    pub unified: String,
    /// One line per change and the totals (`hako diff --stat`).
    pub stat: String,
    /// `hako diff --json`: the hash and one entry per change.
    pub json: serde_json::Value,
}

impl CowHold {
    /// The layers of a sandbox on `spec`'s workspace: the named sandbox
    /// `name` (made if new, continued if not) under the request's state
    /// directory, or a temporary layer when `name` is `None`.
    pub fn open(
        request: &CowRequest,
        name: Option<&str>,
        spec: &SandboxSpec,
    ) -> Result<CowHold, StateError> {
        let binds: Vec<PathBuf> = spec.rw.iter().chain(&spec.ro).cloned().collect();
        match name {
            Some(name) => {
                let root = state_root(request.state.as_deref())?;
                outside_the_view(&root)?;
                let state = State::create(&root, name, &spec.workspace, &binds)?;
                Ok(CowHold {
                    state: Some(state),
                    temporary: None,
                    named: true,
                    busy: Mutex::new(()),
                })
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("hako-cow-")
                    .tempdir()
                    .map_err(|source| StateError::Io {
                        op: "create a temporary layer in",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let state =
                    State::create(&dir.path().join("hako"), "cow", &spec.workspace, &binds)?;
                Ok(CowHold {
                    state: Some(state),
                    temporary: Some(dir),
                    named: false,
                    busy: Mutex::new(()),
                })
            }
        }
    }

    fn state(&self) -> &State {
        // Only `Drop` takes it.
        match &self.state {
            Some(state) => state,
            None => unreachable!("the state is held until the hold is dropped"),
        }
    }

    /// The named sandbox's name; `None` for a temporary layer.
    pub fn name(&self) -> Option<&str> {
        match (&self.state, self.named) {
            (Some(state), true) => Some(state.name()),
            _ => None,
        }
    }

    /// The two directories a backend mounts.
    pub fn layers(&self) -> CowLayers {
        CowLayers {
            upper: self.state().upper(),
            work: self.state().work(),
        }
    }

    /// Held by one operation at a time that needs the layers with no
    /// sandbox on them (rollback, commit, discard), from before the
    /// sandbox is closed until the next is opened.
    pub fn exclusive(&self) -> MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The changes (those at or beneath `paths`; all when empty) from the
    /// workspace, or checkpoint `from`, to the sandbox now, or checkpoint
    /// `to`. Reads only.
    pub fn changes(
        &self,
        paths: &[PathBuf],
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<Changes, ReviewError> {
        let state = self.state();
        let workspace = state.workspace()?;
        let upper_of = |which: Option<&str>| -> Result<Option<PathBuf>, ReviewError> {
            match which {
                None => Ok(None),
                Some(w) => Ok(Some(state.checkpoint_upper(w)?.1)),
            }
        };
        let from = upper_of(from)?;
        let to = upper_of(to)?.unwrap_or_else(|| state.upper());
        let layers = match &from {
            Some(from) => Layers::open_between(&workspace, from, &to)?,
            None => Layers::open(&workspace, &to)?,
        };
        let all = layers.changes_between().map_err(CommitError::from)?;
        let changes = select(&layers, all, paths)?;
        Ok(Changes {
            count: changes.len(),
            hash: diff_hash(&changes),
            unified: render::unified(&layers, &changes),
            stat: render::stat(&layers, &changes),
            json: render::json(&layers, &changes),
        })
    }

    /// Records the upper layer as a new checkpoint; one at a time, and
    /// never while a rollback, commit or discard holds
    /// [`CowHold::exclusive`] (two at once would take one number).
    pub fn checkpoint(&self, label: Option<&str>) -> Result<Checkpoint, ReviewError> {
        let _alone = self.exclusive();
        Ok(self.state().checkpoint(label)?)
    }

    /// The checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, ReviewError> {
        Ok(self.state().checkpoints()?)
    }

    /// Returns the upper layer to checkpoint `which` (its number or
    /// label). No sandbox may be on the layers: hold
    /// [`CowHold::exclusive`] and close it first.
    pub fn rollback(&self, which: &str) -> Result<Checkpoint, ReviewError> {
        Ok(self.state().rollback(which)?)
    }

    /// Applies the changes at or beneath `paths` (all when empty) to the
    /// workspace through the fence, only if they hash to `expect` when it
    /// is given. No sandbox may be on the layers: hold
    /// [`CowHold::exclusive`] and close it first. What was written is
    /// recorded in the state whatever the outcome.
    pub fn commit(
        &self,
        paths: &[PathBuf],
        expect: Option<&str>,
    ) -> Result<CommitReport, ReviewError> {
        let state = self.state();
        let workspace = state.workspace()?;
        let layers = Layers::open(&workspace, &state.upper())?;
        let mut base = state.base()?;
        let result = hako_layers::commit(&layers, &mut base, paths, expect);
        state.save_base(&base)?;
        Ok(result?)
    }

    /// Throws away the changes at or beneath `paths` (all when empty)
    /// from the upper layer; the workspace is not touched. No sandbox may
    /// be on the layers: hold [`CowHold::exclusive`] and close it first.
    pub fn discard(&self, paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReviewError> {
        let state = self.state();
        let workspace = state.workspace()?;
        Ok(hako_layers::discard(&state.upper(), &workspace, paths)?)
    }

    /// The audit record of `op` done on these layers by `front_end`
    /// (`sandbox`: the server's id of the sandbox, if it has one).
    pub fn record(&self, front_end: FrontEnd, sandbox: Option<u64>, op: ReviewOp) -> Record {
        review_record(front_end, self.name(), sandbox, op)
    }
}

/// The audit record of a review operation: the same one whichever front
/// end did it.
pub fn review_record(
    front_end: FrontEnd,
    name: Option<&str>,
    sandbox: Option<u64>,
    op: ReviewOp,
) -> Record {
    Record::Review(Review {
        front_end,
        name: name.map(str::to_owned),
        sandbox,
        op,
    })
}

/// The applied changes as the audit log records them (each path with
/// its status and the SHA-256 written).
pub fn committed(applied: &[Applied]) -> Vec<Committed> {
    applied
        .iter()
        .map(|a| Committed {
            path: a.path.clone(),
            status: serde_json::to_value(a.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            sha256: a.sha256.clone(),
        })
        .collect()
}

/// The review record of a commit's outcome: every path written, complete
/// or not; `None` when nothing was written (a refusal).
pub fn commit_op(result: &Result<CommitReport, ReviewError>) -> Option<ReviewOp> {
    match result {
        Ok(report) => Some(ReviewOp::Commit {
            diff_hash: report.hash.clone(),
            changes: committed(&report.applied),
            complete: true,
        }),
        Err(ReviewError::Commit(CommitError::Partial { hash, applied, .. })) => {
            Some(ReviewOp::Commit {
                diff_hash: hash.clone(),
                changes: committed(applied),
                complete: false,
            })
        }
        Err(_) => None,
    }
}

/// The review record of a discard.
pub fn discard_op(removed: &[PathBuf]) -> ReviewOp {
    ReviewOp::Discard {
        paths: removed
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
    }
}

impl Drop for CowHold {
    fn drop(&mut self) {
        if let (Some(state), Some(_)) = (self.state.take(), &self.temporary) {
            if let Err(e) = state.remove() {
                tracing_free_warn(&e.to_string());
            }
        }
    }
}

/// A removal that failed is said on stderr: this crate has no logger,
/// and a temporary layer left behind is worth knowing of.
fn tracing_free_warn(message: &str) {
    eprintln!("hako: cannot remove a temporary copy-on-write layer: {message}");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_temporary_layer_is_removed_when_its_last_holder_lets_go() {
        let ws = tempfile::tempdir().unwrap();
        let spec = SandboxSpec::new(ws.path().to_path_buf());
        let hold = std::sync::Arc::new(CowHold::open(&CowRequest::default(), None, &spec).unwrap());
        let layers = hold.layers();
        assert!(layers.upper.is_dir() && layers.work.is_dir());
        assert_eq!(hold.name(), None);
        let second = hold.clone();
        drop(hold);
        assert!(layers.upper.is_dir(), "still held");
        drop(second);
        assert!(!layers.upper.exists());
    }

    #[test]
    fn a_state_directory_under_a_system_directory_of_the_view_is_refused_and_nothing_made() {
        let ws = tempfile::tempdir().unwrap();
        let spec = SandboxSpec::new(ws.path().to_path_buf());
        for root in ["/usr/local/hako-state-test", "/etc/hako-state-test"] {
            let request = CowRequest {
                name: Some("n".into()),
                state: Some(root.into()),
            };
            let err = CowHold::open(&request, Some("n"), &spec).unwrap_err();
            assert!(matches!(err, StateError::InsideSandbox { .. }), "{err}");
            assert!(!std::path::Path::new(root).exists(), "{root} was made");
        }
    }

    #[test]
    fn a_named_layer_is_locked_while_held_and_kept_after() {
        let ws = tempfile::tempdir().unwrap();
        let st = tempfile::tempdir().unwrap();
        let spec = SandboxSpec::new(ws.path().to_path_buf());
        let request = CowRequest {
            name: Some("n".into()),
            state: Some(st.path().join("hako")),
        };
        let hold = CowHold::open(&request, Some("n"), &spec).unwrap();
        assert_eq!(hold.name(), Some("n"));
        std::fs::write(hold.layers().upper.join("new.txt"), "x\n").unwrap();
        let busy = CowHold::open(&request, Some("n"), &spec).unwrap_err();
        assert!(matches!(busy, StateError::Busy { .. }), "{busy}");
        let changes = hold.changes(&[], None, None).unwrap();
        assert_eq!(changes.count, 1);
        assert!(changes.unified.contains("+x"), "{}", changes.unified);
        let cp = hold.checkpoint(Some("one")).unwrap();
        std::fs::write(hold.layers().upper.join("later.txt"), "y\n").unwrap();
        assert_eq!(hold.rollback("one").unwrap().id, cp.id);
        assert_eq!(hold.changes(&[], None, None).unwrap().count, 1);
        let upper = hold.layers().upper;
        drop(hold);
        assert!(upper.join("new.txt").is_file(), "a named layer is kept");
        let again = CowHold::open(&request, Some("n"), &spec).unwrap();
        let err = again.rollback("nine").unwrap_err();
        assert!(err.is_refusal() && err.is_not_found(), "{err}");
    }
}
