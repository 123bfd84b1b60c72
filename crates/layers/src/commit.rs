//! Committing changes to the workspace, and discarding them.
//!
//! A commit first lists the changes again and selects the named paths
//! (a named directory brings what is beneath it, and a directory the
//! selection needs that is new is brought along). Before anything is
//! written, every selected change is checked: `--expect` against the
//! hash of the selection; nothing refused ([`Change::refusal`], a file
//! larger than the fence reads whole, a special file in the workspace); no
//! workspace path changed since the sandbox was based on it
//! ([`Base::changed`]), nor one the sandbox copied up from a workspace
//! file that is gone since (it shows as added: the person deleted or
//! moved the file the sandbox changed; see [`Layers::copied_up`]). A
//! copied-up entry is also what a rename inside the sandbox leaves (the
//! file is copied up, then renamed; overlayfs's record of its origin, in
//! a user namespace, does not say from where): it is taken as lost from
//! the workspace only when the workspace's nearest directory above it
//! had an entry added or removed since ([`Base::lost_beneath`]). Then
//! the changes are applied one entry at a
//! time, each atomically through the fence: removals deepest first, then
//! directories, files and symlinks in path order. Each write checks, at
//! its last step, that the workspace entry is still what the diff showed
//! (its bytes, its target, or nothing), and each file written is read
//! from the upper layer and checked against the SHA-256 the diff showed.
//! A failure while applying stops the commit there: what was applied
//! stays applied (each file whole), and the report says what was.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use hako_core::FenceError;
use hako_fence::{Content, Previous};

use crate::state::Base;
use crate::{diff_hash, hex, Change, Layers, Node, ScanError, Side, Status};

/// Why a commit or discard was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Listing the changes failed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// A fence operation failed or was refused.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// `--expect` names another diff than the one there now.
    #[error("refused: the changes are not the ones reviewed (expected hash {expected}, now {actual}); review them again with `hako diff`")]
    ExpectMismatch {
        /// The hash given.
        expected: String,
        /// The hash of the changes now.
        actual: String,
    },
    /// Changes that are never committed.
    #[error("refused {path:?}: {why}; discard it")]
    Refused {
        /// The path.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// Workspace paths changed since the sandbox was based on them.
    #[error("refused {paths:?}: changed in the workspace since the sandbox was based on it; nothing was committed (commit the other paths by name, or discard these)")]
    ChangedInWorkspace {
        /// The paths.
        paths: Vec<PathBuf>,
    },
    /// The sandbox's side of a path changed between review and commit.
    #[error("refused {path:?}: changed in the sandbox since the diff was made; review it again")]
    ChangedSinceReview {
        /// The path.
        path: PathBuf,
    },
    /// A named path has no change.
    #[error("{path:?} has no change in this sandbox")]
    NoSuchChange {
        /// The path as given.
        path: PathBuf,
    },
    /// A discard of a path whose change is made by a directory above it.
    #[error("cannot discard {path:?} alone: the change comes from {above:?} (deleted, replaced or made opaque as a whole); discard {above:?}")]
    PartOfLarger {
        /// The path as given.
        path: PathBuf,
        /// The upper-layer entry above it.
        above: PathBuf,
    },
    /// A commit stopped part-way: what is listed was applied, each entry
    /// whole; the rest was not.
    #[error("the commit stopped after {} change(s) were applied: {source}", applied.len())]
    Partial {
        /// The hash of the diff it was committing.
        hash: String,
        /// What was applied.
        applied: Vec<Applied>,
        /// Why it stopped.
        source: Box<CommitError>,
    },
    /// Removing from the upper layer failed.
    #[error("remove {path:?} from the upper layer: {source}")]
    Upper {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// One change applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Applied {
    /// The path, relative to the workspace.
    pub path: String,
    /// What was done.
    pub status: Status,
    /// The SHA-256 of what was written: a file's content, or a symlink's
    /// target; `None` for a removal or a directory.
    pub sha256: Option<String>,
}

/// What a commit did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitReport {
    /// The hash of the committed changes.
    pub hash: String,
    /// Each change applied, in the order applied.
    pub applied: Vec<Applied>,
}

/// The changes at or beneath `paths` (all of them when `paths` is
/// empty), with each new directory above one of them; each path is
/// relative to the workspace, checked lexically by the fence.
pub fn select(
    layers: &Layers,
    changes: Vec<Change>,
    paths: &[PathBuf],
) -> Result<Vec<Change>, CommitError> {
    if paths.is_empty() {
        return Ok(changes);
    }
    let mut wanted = Vec::new();
    for given in paths {
        let rel = layers.lower().relative(given)?;
        if !changes.iter().any(|c| c.path.starts_with(&rel)) {
            return Err(CommitError::NoSuchChange {
                path: given.clone(),
            });
        }
        wanted.push(rel);
    }
    let creates_dir = |c: &Change| {
        matches!(c.new, Some(Node::Dir { .. })) && !matches!(c.old, Some(Node::Dir { .. }))
    };
    let selected = changes
        .iter()
        .filter(|c| {
            wanted.iter().any(|w| c.path.starts_with(w))
                || (creates_dir(c) && wanted.iter().any(|w| w.starts_with(&c.path)))
        })
        .cloned()
        .collect();
    Ok(selected)
}

/// What the workspace entry must be before `change` replaces or removes
/// it, with the bytes read for a file.
fn previous_of(layers: &Layers, change: &Change) -> Result<Option<Vec<u8>>, CommitError> {
    layers.content(change, Side::Old)
}

fn as_previous<'a>(old: &'a Option<Node>, bytes: &'a Option<Vec<u8>>) -> Previous<'a> {
    match (old, bytes) {
        (Some(Node::File { .. }), Some(bytes)) => Previous::File(bytes),
        (Some(Node::Symlink { target }), _) => Previous::Symlink(target),
        (Some(Node::Dir { .. }), _) => Previous::Dir,
        _ => Previous::Absent,
    }
}

/// Applies the changes at or beneath `paths` (all when empty) to the
/// workspace; with `expect`, only if their hash is that one. `base`
/// says what the sandbox was based on, and is updated with what was
/// written (save it after, whatever the outcome).
pub fn commit(
    layers: &Layers,
    base: &mut Base,
    paths: &[PathBuf],
    expect: Option<&str>,
) -> Result<CommitReport, CommitError> {
    let changes = select(layers, layers.changes()?, paths)?;
    let hash = diff_hash(&changes);
    if let Some(expected) = expect {
        if !expected.eq_ignore_ascii_case(&hash) {
            return Err(CommitError::ExpectMismatch {
                expected: expected.to_owned(),
                actual: hash,
            });
        }
    }
    for change in &changes {
        if let Some(why) = change.refusal() {
            return Err(CommitError::Refused {
                path: change.path.clone(),
                why,
            });
        }
        let max = layers.lower().max_read();
        let too_large =
            |n: &Option<Node>| matches!(n, Some(Node::File { size, .. }) if *size > max);
        if too_large(&change.old) || too_large(&change.new) {
            return Err(CommitError::Refused {
                path: change.path.clone(),
                why: "the file is larger than a commit reads whole (256 MiB)",
            });
        }
        if let Some(Node::Special { .. }) = change.old {
            return Err(CommitError::Refused {
                path: change.path.clone(),
                why: "a device, FIFO or socket in the workspace is never touched by a commit",
            });
        }
    }
    let conflicts: Vec<PathBuf> = changes
        .iter()
        .filter(|c| {
            base.changed(layers.lower(), &c.path, c.old.is_some())
                || (c.old.is_none()
                    && layers.copied_up(&c.path)
                    && base.lost_beneath(layers.lower(), &c.path))
        })
        .map(|c| c.path.clone())
        .collect();
    if !conflicts.is_empty() {
        return Err(CommitError::ChangedInWorkspace { paths: conflicts });
    }
    let mut report = CommitReport {
        hash,
        applied: Vec::new(),
    };
    match apply(layers, base, &changes, &mut report) {
        Ok(()) => Ok(report),
        Err(e) if report.applied.is_empty() => Err(e),
        Err(e) => Err(CommitError::Partial {
            hash: report.hash,
            applied: report.applied,
            source: Box::new(e),
        }),
    }
}

/// Applies checked changes, recording each in `report` as it is done.
fn apply(
    layers: &Layers,
    base: &mut Base,
    changes: &[Change],
    report: &mut CommitReport,
) -> Result<(), CommitError> {
    let fence = layers.lower();
    // Removals, deepest first: what is deleted, and what a change of kind
    // replaces.
    for change in changes.iter().rev() {
        let removes = match (&change.old, &change.new) {
            (Some(_), None) => true,
            (Some(old), Some(new)) => old.kind() != new.kind(),
            _ => false,
        };
        if !removes {
            continue;
        }
        let bytes = previous_of(layers, change)?;
        fence.remove_entry(&change.path, as_previous(&change.old, &bytes))?;
        base.forget(&change.path);
        if change.new.is_none() {
            report.applied.push(Applied {
                path: change.path.to_string_lossy().into_owned(),
                status: Status::Deleted,
                sha256: None,
            });
        }
    }
    // Then what the sandbox has, parents first.
    for change in changes {
        let Some(new) = &change.new else { continue };
        let same_kind = change.old.as_ref().is_some_and(|o| o.kind() == new.kind());
        let old_bytes = if same_kind {
            previous_of(layers, change)?
        } else {
            None
        };
        let previous = if same_kind {
            as_previous(&change.old, &old_bytes)
        } else {
            Previous::Absent
        };
        let sha256 = match new {
            Node::Dir { mode } => {
                if same_kind {
                    fence.set_dir_mode(&change.path, *mode)?;
                } else {
                    fence.make_dir(&change.path, *mode)?;
                }
                None
            }
            Node::File { mode, sha256, .. } => {
                let data = layers.content(change, Side::New)?.unwrap_or_default();
                let content = Content::File {
                    data: &data,
                    mode: *mode,
                };
                fence.put_entry(&change.path, content, previous)?;
                Some(hex(sha256))
            }
            Node::Symlink { target } => {
                fence.put_entry(&change.path, Content::Symlink(target), previous)?;
                Some(hex(&crate::scan::sha256(
                    std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()),
                )))
            }
            Node::Special { .. } => continue,
        };
        if !matches!(new, Node::Dir { .. }) {
            base.committed(fence, &change.path);
        }
        report.applied.push(Applied {
            path: change.path.to_string_lossy().into_owned(),
            status: change.status(),
            sha256,
        });
    }
    Ok(())
}

/// Removes the upper layer's entries at or beneath `paths` (everything
/// in it when `paths` is empty), so that the sandbox sees the workspace
/// there again. A path whose change is made by an entry above it (a
/// deleted, replaced or opaque directory) is refused, naming that entry:
/// discarding a part of it would not bring the workspace's back.
/// Paths are relative to the workspace, or absolute beneath `workspace`.
/// Returns the paths removed from the upper layer.
pub fn discard(
    upper: &Path,
    workspace: &Path,
    paths: &[PathBuf],
) -> Result<Vec<PathBuf>, CommitError> {
    let upper_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| CommitError::Upper { path, source }
    };
    if paths.is_empty() {
        let mut removed = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(upper)
            .map_err(upper_err(upper))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(upper_err(upper))?;
        names.sort();
        for name in names {
            remove_tree(&upper.join(&name)).map_err(upper_err(Path::new(&name)))?;
            removed.push(PathBuf::from(name));
        }
        return Ok(removed);
    }
    let mut targets = Vec::new();
    for given in paths {
        let rel = hako_core::path::relative(given, workspace)?;
        if rel == Path::new(".") {
            return discard(upper, workspace, &[]);
        }
        // Each directory above must be a plain merged one.
        let mut above = PathBuf::new();
        let parts: Vec<&OsStr> = rel.iter().collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            above.push(part);
            let meta = match std::fs::symlink_metadata(upper.join(&above)) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(CommitError::NoSuchChange {
                        path: given.clone(),
                    })
                }
                Err(e) => return Err(upper_err(&above)(e)),
            };
            let opaque = ["trusted.overlay.opaque", "user.overlay.opaque"]
                .iter()
                .any(|n| {
                    hako_sys::rustix::fs::lgetxattr(upper.join(&above), *n, &mut [0u8; 8][..])
                        .is_ok()
                });
            if !meta.is_dir() || opaque {
                return Err(CommitError::PartOfLarger {
                    path: given.clone(),
                    above,
                });
            }
        }
        match std::fs::symlink_metadata(upper.join(&rel)) {
            Ok(_) => targets.push(rel),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CommitError::NoSuchChange {
                    path: given.clone(),
                })
            }
            Err(e) => return Err(upper_err(&rel)(e)),
        }
    }
    for rel in &targets {
        remove_tree(&upper.join(rel)).map_err(upper_err(rel))?;
    }
    Ok(targets)
}

/// Removes an entry of the upper layer and, for a directory, everything
/// beneath it, never following a symlink (`remove_dir_all` removes a
/// symlink itself and does not descend through one).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
