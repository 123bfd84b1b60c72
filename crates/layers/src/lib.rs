//! The review engine of a copy-on-write sandbox.
//!
//! A `--cow` sandbox sees the workspace through overlayfs: the workspace
//! is the lower layer, read-only, and every change a command makes lands
//! in a private upper layer. This crate reads that upper layer and says
//! what it changes ([`scan`], [`Change`]), shows it as `git diff` does
//! ([`render`]), hashes it so that what is committed is exactly what was
//! reviewed ([`diff_hash`]), applies all or part of it to the workspace
//! through the fence, or throws it away ([`commit`]). Named sandboxes keep
//! their layers in a state directory outside the workspace ([`state`]).
//!
//! Invariants:
//! - Only the upper layer is walked, and the lower one only where the
//!   upper one names an entry (or deletes a directory): the cost is the
//!   size of the change, not of the workspace.
//! - No symlink in either layer is followed while scanning; a symlink in
//!   the upper layer is committed as a symlink, never written through.
//! - A commit writes nothing outside the workspace (every write goes
//!   through [`hako_fence::Fence`]), refuses a device, FIFO, socket or
//!   set-user-ID/set-group-ID file, and refuses, naming it, a path whose
//!   workspace file changed since the sandbox was based on it or whose
//!   content is not what the reviewed diff said.

pub mod checkpoint;
pub mod commit;
pub mod render;
pub mod scan;
pub mod state;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub use commit::{commit, discard, CommitError, CommitReport};
pub use scan::{scan, ScanError};

/// What a special file in a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device (other than a whiteout).
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A type the kernel did not name.
    Unknown,
}

impl SpecialKind {
    /// Its name, as shown.
    pub fn name(self) -> &'static str {
        match self {
            SpecialKind::Fifo => "fifo",
            SpecialKind::Socket => "socket",
            SpecialKind::CharDevice => "char_device",
            SpecialKind::BlockDevice => "block_device",
            SpecialKind::Unknown => "unknown",
        }
    }
}

/// One side of a change: what is at a path in one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A regular file.
    File {
        /// Permission bits, with set-user-ID, set-group-ID and sticky.
        mode: u32,
        /// Its size in bytes.
        size: u64,
        /// The SHA-256 of its content.
        sha256: [u8; 32],
        /// Whether a NUL is among its first 8000 bytes (as git decides).
        binary: bool,
    },
    /// A symlink, never followed.
    Symlink {
        /// Its target, as stored.
        target: OsString,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A FIFO, socket or device: shown, never committed.
    Special {
        /// What it is.
        kind: SpecialKind,
        /// Permission bits.
        mode: u32,
    },
}

impl Node {
    /// Its kind's name: `file`, `symlink`, `dir` or the special kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::File { .. } => "file",
            Node::Symlink { .. } => "symlink",
            Node::Dir { .. } => "dir",
            Node::Special { kind, .. } => kind.name(),
        }
    }

    /// `git`'s octal mode: type and permission bits (symlinks 120000).
    pub fn git_mode(&self) -> u32 {
        match self {
            Node::File { mode, .. } => 0o100000 | mode,
            Node::Symlink { .. } => 0o120000,
            Node::Dir { mode } => 0o040000 | mode,
            Node::Special { kind, mode } => {
                let kind = match kind {
                    SpecialKind::Fifo => 0o010000,
                    SpecialKind::Socket => 0o140000,
                    SpecialKind::CharDevice => 0o020000,
                    SpecialKind::BlockDevice => 0o060000,
                    SpecialKind::Unknown => 0,
                };
                kind | mode
            }
        }
    }

    /// The canonical encoding hashed by [`diff_hash`].
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Node::File {
                mode, size, sha256, ..
            } => out.extend_from_slice(format!("file {mode:o} {size} {}", hex(sha256)).as_bytes()),
            Node::Symlink { target } => {
                let target = target.as_bytes();
                out.extend_from_slice(format!("symlink {}:", target.len()).as_bytes());
                out.extend_from_slice(target);
            }
            Node::Dir { mode } => out.extend_from_slice(format!("dir {mode:o}").as_bytes()),
            Node::Special { kind, mode } => {
                out.extend_from_slice(format!("{} {mode:o}", kind.name()).as_bytes())
            }
        }
    }
}

/// What a change does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Nothing was there.
    Added,
    /// Nothing is there now.
    Deleted,
    /// A file's content changed (its mode may have too), or a symlink's
    /// target.
    Modified,
    /// Only the permission bits changed.
    ModeChanged,
    /// A different kind of entry replaced what was there (a file by a
    /// symlink, a directory by a file, ...).
    TypeChanged,
}

/// One changed path: what the workspace has there (`old`) and what the
/// sandbox has (`new`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The path, relative to the workspace.
    pub path: PathBuf,
    /// What the workspace has, if anything.
    pub old: Option<Node>,
    /// What the sandbox has, if anything.
    pub new: Option<Node>,
}

impl Change {
    /// What the change does.
    pub fn status(&self) -> Status {
        match (&self.old, &self.new) {
            (None, _) => Status::Added,
            (_, None) => Status::Deleted,
            (Some(old), Some(new)) if old.kind() != new.kind() => Status::TypeChanged,
            (Some(Node::File { sha256: a, .. }), Some(Node::File { sha256: b, .. })) if a == b => {
                Status::ModeChanged
            }
            (Some(Node::Dir { .. }), Some(Node::Dir { .. }))
            | (Some(Node::Special { .. }), Some(Node::Special { .. })) => Status::ModeChanged,
            _ => Status::Modified,
        }
    }

    /// Why committing this change is refused, if it is: a special file,
    /// or a set-user-ID or set-group-ID file.
    pub fn refusal(&self) -> Option<&'static str> {
        match &self.new {
            Some(Node::Special { .. }) => {
                Some("a device, FIFO or socket is never committed to the workspace")
            }
            Some(Node::File { mode, .. }) if mode & 0o6000 != 0 => {
                Some("a set-user-ID or set-group-ID file is never committed to the workspace")
            }
            _ => None,
        }
    }
}

/// Lowercase hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash of a list of changes, for `--expect`: SHA-256 over a
/// canonical encoding (a version line, then for each change in path
/// order its path and both sides: kind, mode, size and content hash, or
/// a symlink's target; every variable-length field length-prefixed), in
/// lowercase hexadecimal. Equal exactly when the changes are: a byte of
/// content, a mode bit, a symlink's target or the workspace's side of
/// any path changed between review and commit gives another hash.
pub fn diff_hash(changes: &[Change]) -> String {
    let mut sorted: Vec<&Change> = changes.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = b"hako-diff-v1\n".to_vec();
    for change in sorted {
        let path = change.path.as_os_str().as_bytes();
        out.extend_from_slice(format!("{}:", path.len()).as_bytes());
        out.extend_from_slice(path);
        for side in [&change.old, &change.new] {
            out.push(b' ');
            match side {
                Some(node) => node.encode(&mut out),
                None => out.push(b'-'),
            }
        }
        out.push(b'\n');
    }
    hex(&Sha256::digest(&out))
}

/// The two layers of one sandbox, each behind a fence: the workspace
/// (lower) and the sandbox's upper layer.
#[derive(Debug)]
pub struct Layers {
    lower: hako_fence::Fence,
    upper: hako_fence::Fence,
    /// For a comparison of two upper layers (checkpoints): the one
    /// compared from, whose files are the old side where it has them.
    from: Option<hako_fence::Fence>,
}

/// Which side of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The workspace's.
    Old,
    /// The sandbox's.
    New,
}

impl Layers {
    /// Opens the workspace `lower` and the upper layer `upper`.
    pub fn open(
        lower: &std::path::Path,
        upper: &std::path::Path,
    ) -> Result<Layers, hako_core::FenceError> {
        let options = hako_fence::FenceOptions::default();
        Ok(Layers {
            lower: hako_fence::Fence::open(lower, options.clone())?,
            upper: hako_fence::Fence::open(upper, options)?,
            from: None,
        })
    }

    /// Opens two upper layers of one workspace to compare: `from` (a
    /// checkpoint) and `to`; see [`Layers::changes_between`].
    pub fn open_between(
        lower: &std::path::Path,
        from: &std::path::Path,
        to: &std::path::Path,
    ) -> Result<Layers, hako_core::FenceError> {
        let mut layers = Layers::open(lower, to)?;
        layers.from = Some(hako_fence::Fence::open(
            from,
            hako_fence::FenceOptions::default(),
        )?);
        Ok(layers)
    }

    /// What changes from the view of the `from` layer to the view of the
    /// upper one ([`Layers::open_between`]); without `from`, the same as
    /// [`Layers::changes`].
    pub fn changes_between(&self) -> Result<Vec<Change>, ScanError> {
        let Some(from) = &self.from else {
            return self.changes();
        };
        let a = scan(self.lower.root(), from.root())?;
        let b = self.changes()?;
        Ok(between(&a, &b))
    }

    /// The workspace's fence.
    pub fn lower(&self) -> &hako_fence::Fence {
        &self.lower
    }

    /// Every change, sorted by path.
    pub fn changes(&self) -> Result<Vec<Change>, ScanError> {
        scan(self.lower.root(), self.upper.root())
    }

    /// Every change, and how much of each layer was looked at to find
    /// them.
    pub fn changes_counted(&self) -> Result<(Vec<Change>, scan::Visited), ScanError> {
        scan::scan_counted(self.lower.root(), self.upper.root())
    }

    /// Whether the upper layer's entry at `rel` was copied up from a
    /// workspace file (overlayfs records its origin, `overlay.origin`, on
    /// a copy-up): such an entry listed as added means the workspace file
    /// it was made from is gone since.
    pub fn copied_up(&self, rel: &std::path::Path) -> bool {
        let path = self.upper.workdir().join(rel);
        ["trusted.overlay.origin", "user.overlay.origin"]
            .iter()
            .any(|name| {
                let mut buf = [0u8; 0];
                match hako_sys::rustix::fs::lgetxattr(&path, *name, &mut buf[..]) {
                    Ok(_) => true,
                    // Present, with a value longer than no bytes.
                    Err(hako_sys::rustix::io::Errno::RANGE) => true,
                    Err(_) => false,
                }
            })
    }

    /// The content of a file on one side of a change, checked to be what
    /// the change says (its SHA-256): `None` when that side is not a
    /// regular file.
    pub fn content(&self, change: &Change, side: Side) -> Result<Option<Vec<u8>>, CommitError> {
        let (node, fence) = match side {
            Side::Old => (&change.old, &self.lower),
            Side::New => (&change.new, &self.upper),
        };
        let Some(Node::File { sha256, .. }) = node else {
            return Ok(None);
        };
        // Comparing two layers, a side's file is in its layer or, where
        // that layer has not changed it, in the workspace.
        let first = match side {
            Side::Old => self.from.as_ref(),
            Side::New => self.from.as_ref().map(|_| &self.upper),
        };
        if let Some(layer) = first {
            if let Ok(data) = layer.read_all(&change.path) {
                if scan::sha256(&data) == *sha256 {
                    return Ok(Some(data));
                }
            }
        }
        let fence = if self.from.is_some() {
            &self.lower
        } else {
            fence
        };
        let data = fence.read_all(&change.path)?;
        if scan::sha256(&data) != *sha256 {
            return Err(match side {
                Side::Old => CommitError::ChangedInWorkspace {
                    paths: vec![change.path.clone()],
                },
                Side::New => CommitError::ChangedSinceReview {
                    path: change.path.clone(),
                },
            });
        }
        Ok(Some(data))
    }
}

/// The changes from one view of the workspace to another, each given as
/// its changes to the workspace (`from` and `to`, as [`scan`] lists them):
/// a path either changes has, whose view differs. A side a list does not
/// name is the workspace's, which the other list's `old` says.
pub fn between(from: &[Change], to: &[Change]) -> Vec<Change> {
    use std::collections::BTreeMap;
    let a: BTreeMap<&std::path::Path, &Change> =
        from.iter().map(|c| (c.path.as_path(), c)).collect();
    let b: BTreeMap<&std::path::Path, &Change> = to.iter().map(|c| (c.path.as_path(), c)).collect();
    let mut paths: Vec<&std::path::Path> = a.keys().chain(b.keys()).copied().collect();
    paths.sort();
    paths.dedup();
    let mut out = Vec::new();
    for path in paths {
        let view = |mine: &BTreeMap<&std::path::Path, &Change>,
                    other: &BTreeMap<&std::path::Path, &Change>| {
            match (mine.get(path), other.get(path)) {
                (Some(c), _) => c.new.clone(),
                (None, Some(c)) => c.old.clone(),
                (None, None) => None,
            }
        };
        let (old, new) = (view(&a, &b), view(&b, &a));
        if old != new {
            out.push(Change {
                path: path.to_path_buf(),
                old,
                new,
            });
        }
    }
    out
}
