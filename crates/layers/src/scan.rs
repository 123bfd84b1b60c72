//! Finding the changes: a walk of the upper layer only, each entry
//! compared with the lower directory (the workspace) at the same path.
//!
//! The upper layer is in overlayfs's format: a whiteout (a character
//! device 0/0, or a zero-size file carrying the `overlay.whiteout` xattr)
//! deletes the lower entry of its name; a directory with the
//! `overlay.opaque` xattr set to `y` hides every lower entry beneath it;
//! a directory over a lower non-directory hides it too. Both xattr
//! namespaces are read: `trusted.` (overlayfs mounted by root) and `user.`
//! (the `userxattr` mount an unprivileged user namespace makes).
//! Redirected directories and metacopy files (`overlay.redirect`,
//! `overlay.metacopy`) are refused: hako never mounts with them, and a
//! layer that has them is not one it made.
//!
//! The walk goes through directory descriptors, opening each name with
//! `O_NOFOLLOW` in the one above it, in both layers: no symlink in
//! either is ever followed, so nothing outside either root is read. The
//! lower layer is visited only where the upper one has an entry, except
//! beneath a lower directory that the upper layer deletes or hides,
//! whose entries are each listed as deleted.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hako_sys::rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use hako_sys::rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::{Change, Node, SpecialKind};

/// The most changes one scan lists: a layer with more is refused rather
/// than held in memory without bound.
pub const MAX_CHANGES: usize = 1_000_000;
/// How many leading bytes decide whether a file is binary (a NUL among
/// them), as git decides.
const BINARY_PROBE: usize = 8000;

/// Why the changes could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A file-system call failed.
    #[error("{op} {layer} layer's {path:?}: {source}")]
    Io {
        /// The call that failed.
        op: &'static str,
        /// `upper` or `lower`.
        layer: &'static str,
        /// The path, relative to the layer's root.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The upper layer holds something hako never makes.
    #[error("refused {path:?} in the upper layer: {what}; hako mounts overlayfs without redirect_dir and metacopy, so this layer was not made by it")]
    Unsupported {
        /// The path, relative to the layer's root.
        path: PathBuf,
        /// What was found.
        what: &'static str,
    },
    /// More changes than [`MAX_CHANGES`].
    #[error("the upper layer holds more than {max} changes; refusing to list them all")]
    TooManyChanges {
        /// The limit.
        max: usize,
    },
}

fn io(op: &'static str, layer: &'static str, path: &Path) -> impl FnOnce(Errno) -> ScanError {
    let path = path.to_path_buf();
    move |e| ScanError::Io {
        op,
        layer,
        path,
        source: e.into(),
    }
}

/// The xattr names, in both namespaces.
const OPAQUE: [&str; 2] = ["trusted.overlay.opaque", "user.overlay.opaque"];
const REDIRECT: [&str; 2] = ["trusted.overlay.redirect", "user.overlay.redirect"];
const METACOPY: [&str; 2] = ["trusted.overlay.metacopy", "user.overlay.metacopy"];
const WHITEOUT: [&str; 2] = ["trusted.overlay.whiteout", "user.overlay.whiteout"];

/// The value of the first of `names` that `fd` has.
fn xattr(fd: BorrowedFd<'_>, names: [&str; 2]) -> Option<Vec<u8>> {
    names.iter().find_map(|name| {
        let mut buf = vec![0u8; 256];
        match rfs::fgetxattr(fd, *name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                Some(buf)
            }
            // A longer value: present all the same.
            Err(Errno::RANGE) => Some(Vec::new()),
            Err(_) => None,
        }
    })
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// A directory's names, sorted, without `.` and `..`.
fn names(dir: BorrowedFd<'_>) -> Result<Vec<OsString>, Errno> {
    let fd = open_dir_at(dir, OsStr::new("."))?;
    let mut names = Vec::new();
    for entry in rfs::Dir::new(fd)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Option<Stat>, Errno> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_whiteout_device(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::CharacterDevice && stat.st_rdev == 0
}

/// A regular file's SHA-256 and whether it looks binary, read through a
/// descriptor opened without following a symlink and checked to be the
/// file `stat` described.
fn hash_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    stat: &Stat,
) -> Result<([u8; 32], bool, OwnedFd), Errno> {
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let now = rfs::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino) {
        // Replaced while it was looked at.
        return Err(Errno::AGAIN);
    }
    let mut file = File::from(
        fd.try_clone()
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?,
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut seen = 0usize;
    let mut binary = false;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        if n == 0 {
            break;
        }
        if seen < BINARY_PROBE {
            let probe = &buf[..n.min(BINARY_PROBE - seen)];
            binary |= probe.contains(&0);
        }
        seen = seen.saturating_add(n);
        hasher.update(&buf[..n]);
    }
    Ok((hasher.finalize().into(), binary, fd))
}

/// What the entry `name` in `dir`, described by `stat`, is.
fn node(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    stat: &Stat,
    layer: &'static str,
    path: &Path,
) -> Result<Node, ScanError> {
    let mode = stat.st_mode & 0o7777;
    Ok(match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {
            // The sticky bit means nothing on a file, and a commit never
            // writes it: it is not a change.
            let mode = mode & 0o6777;
            let (sha256, binary, _fd) =
                hash_file(dir, name, stat).map_err(io("read", layer, path))?;
            Node::File {
                mode,
                size: u64::try_from(stat.st_size).unwrap_or(0),
                sha256,
                binary,
            }
        }
        // Set-user-ID, which Linux ignores on a directory, is not kept.
        FileType::Directory => Node::Dir {
            mode: mode & 0o3777,
        },
        FileType::Symlink => {
            let target =
                rfs::readlinkat(dir, name, Vec::new()).map_err(io("readlink", layer, path))?;
            Node::Symlink {
                target: OsStr::from_bytes(target.as_bytes()).to_owned(),
            }
        }
        FileType::Fifo => Node::Special {
            kind: SpecialKind::Fifo,
            mode,
        },
        FileType::Socket => Node::Special {
            kind: SpecialKind::Socket,
            mode,
        },
        FileType::CharacterDevice => Node::Special {
            kind: SpecialKind::CharDevice,
            mode,
        },
        FileType::BlockDevice => Node::Special {
            kind: SpecialKind::BlockDevice,
            mode,
        },
        FileType::Unknown => Node::Special {
            kind: SpecialKind::Unknown,
            mode,
        },
    })
}

/// How much of each layer one scan looked at: the measure of "walks
/// only what changed".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Visited {
    /// Upper-layer entries looked at.
    pub upper_entries: usize,
    /// Workspace entries looked at (each `stat`ed once).
    pub lower_entries: usize,
    /// Workspace directories listed (only those the upper layer deletes,
    /// hides or makes opaque).
    pub lower_dirs_listed: usize,
}

/// One walk's state: the changes found so far.
struct Walk {
    changes: Vec<Change>,
    visited: Visited,
}

impl Walk {
    fn push(&mut self, change: Change) -> Result<(), ScanError> {
        if self.changes.len() >= MAX_CHANGES {
            return Err(ScanError::TooManyChanges { max: MAX_CHANGES });
        }
        self.changes.push(change);
        Ok(())
    }

    /// Lists the lower entry `name` in `dir` (and, for a directory,
    /// everything beneath it) as deleted.
    fn deleted(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &Stat,
        path: &Path,
    ) -> Result<(), ScanError> {
        let old = node(dir, name, stat, "lower", path)?;
        if let Node::Dir { .. } = old {
            self.deleted_beneath(dir, name, path)?;
        }
        self.push(Change {
            path: path.to_path_buf(),
            old: Some(old),
            new: None,
        })
    }

    /// Lists everything beneath the lower directory `name` in `dir` as
    /// deleted.
    fn deleted_beneath(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        path: &Path,
    ) -> Result<(), ScanError> {
        let sub = open_dir_at(dir, name).map_err(io("open", "lower", path))?;
        self.visited.lower_dirs_listed += 1;
        for child in names(sub.as_fd()).map_err(io("list", "lower", path))? {
            self.visited.lower_entries += 1;
            let child_path = path.join(&child);
            if let Some(stat) =
                stat_at(sub.as_fd(), &child).map_err(io("stat", "lower", &child_path))?
            {
                self.deleted(sub.as_fd(), &child, &stat, &child_path)?;
            }
        }
        Ok(())
    }

    /// Compares the upper directory `upper` (at `path`) with the lower
    /// one, if any; with `opaque`, lower entries the upper one does not
    /// name are deleted.
    fn dir(
        &mut self,
        upper: BorrowedFd<'_>,
        lower: Option<BorrowedFd<'_>>,
        opaque: bool,
        path: &Path,
    ) -> Result<(), ScanError> {
        let upper_names = names(upper).map_err(io("list", "upper", path))?;
        if opaque {
            if let Some(lower) = lower {
                self.visited.lower_dirs_listed += 1;
                for name in names(lower).map_err(io("list", "lower", path))? {
                    if upper_names.binary_search(&name).is_ok() {
                        continue;
                    }
                    self.visited.lower_entries += 1;
                    let child_path = path.join(&name);
                    if let Some(stat) =
                        stat_at(lower, &name).map_err(io("stat", "lower", &child_path))?
                    {
                        self.deleted(lower, &name, &stat, &child_path)?;
                    }
                }
            }
        }
        for name in upper_names {
            self.entry(upper, lower, &name, &path.join(&name))?;
        }
        Ok(())
    }

    /// Compares the upper entry `name` with the lower one of that name.
    fn entry(
        &mut self,
        upper: BorrowedFd<'_>,
        lower: Option<BorrowedFd<'_>>,
        name: &OsStr,
        path: &Path,
    ) -> Result<(), ScanError> {
        let Some(ustat) = stat_at(upper, name).map_err(io("stat", "upper", path))? else {
            return Ok(());
        };
        self.visited.upper_entries += 1;
        let lstat = match lower {
            Some(lower) => {
                self.visited.lower_entries += 1;
                stat_at(lower, name).map_err(io("stat", "lower", path))?
            }
            None => None,
        };
        let lower_is_dir =
            lstat.is_some_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory);
        if is_whiteout_device(&ustat) {
            if let (Some(lower), Some(lstat)) = (lower, lstat) {
                self.deleted(lower, name, &lstat, path)?;
            }
            return Ok(());
        }
        match FileType::from_raw_mode(ustat.st_mode) {
            FileType::Directory => {
                let sub = open_dir_at(upper, name).map_err(io("open", "upper", path))?;
                if xattr(sub.as_fd(), REDIRECT).is_some() {
                    return Err(ScanError::Unsupported {
                        path: path.to_path_buf(),
                        what: "a redirected directory (overlay.redirect)",
                    });
                }
                let opaque = xattr(sub.as_fd(), OPAQUE).is_some_and(|v| v == b"y");
                let new = Node::Dir {
                    mode: ustat.st_mode & 0o3777,
                };
                let (Some(lower), Some(lstat)) = (lower, lstat) else {
                    self.push(Change {
                        path: path.to_path_buf(),
                        old: None,
                        new: Some(new),
                    })?;
                    return self.dir(sub.as_fd(), None, false, path);
                };
                if !lower_is_dir {
                    // A directory over a file or symlink hides it.
                    let old = node(lower, name, &lstat, "lower", path)?;
                    self.push(Change {
                        path: path.to_path_buf(),
                        old: Some(old),
                        new: Some(new),
                    })?;
                    return self.dir(sub.as_fd(), None, false, path);
                }
                let old = Node::Dir {
                    mode: lstat.st_mode & 0o3777,
                };
                if old != new {
                    self.push(Change {
                        path: path.to_path_buf(),
                        old: Some(old),
                        new: Some(new),
                    })?;
                }
                let lower_sub = open_dir_at(lower, name).map_err(io("open", "lower", path))?;
                self.dir(sub.as_fd(), Some(lower_sub.as_fd()), opaque, path)
            }
            kind => {
                let new = node(upper, name, &ustat, "upper", path)?;
                if kind == FileType::RegularFile {
                    let fd = rfs::openat(
                        upper,
                        name,
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(io("open", "upper", path))?;
                    if xattr(fd.as_fd(), METACOPY).is_some() {
                        return Err(ScanError::Unsupported {
                            path: path.to_path_buf(),
                            what: "a metacopy file (overlay.metacopy)",
                        });
                    }
                    if ustat.st_size == 0 && xattr(fd.as_fd(), WHITEOUT).is_some() {
                        if let (Some(lower), Some(lstat)) = (lower, lstat) {
                            self.deleted(lower, name, &lstat, path)?;
                        }
                        return Ok(());
                    }
                }
                let old = match (lower, lstat) {
                    (Some(lower), Some(lstat)) => {
                        if lower_is_dir {
                            self.deleted_beneath(lower, name, path)?;
                        }
                        Some(node(lower, name, &lstat, "lower", path)?)
                    }
                    _ => None,
                };
                if old.as_ref() != Some(&new) {
                    self.push(Change {
                        path: path.to_path_buf(),
                        old,
                        new: Some(new),
                    })?;
                }
                Ok(())
            }
        }
    }
}

/// The changes the upper layer `upper` makes to the lower directory
/// `lower`, sorted by path (a directory before what is in it).
pub fn scan(lower: BorrowedFd<'_>, upper: BorrowedFd<'_>) -> Result<Vec<Change>, ScanError> {
    scan_counted(lower, upper).map(|(changes, _)| changes)
}

/// [`scan`], and how much of each layer it looked at.
pub fn scan_counted(
    lower: BorrowedFd<'_>,
    upper: BorrowedFd<'_>,
) -> Result<(Vec<Change>, Visited), ScanError> {
    let mut walk = Walk {
        changes: Vec::new(),
        visited: Visited::default(),
    };
    let root = Path::new("");
    let lower_root = open_dir_at(lower, OsStr::new(".")).map_err(io("open", "lower", root))?;
    let upper_root = open_dir_at(upper, OsStr::new(".")).map_err(io("open", "upper", root))?;
    walk.dir(upper_root.as_fd(), Some(lower_root.as_fd()), false, root)?;
    walk.changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((walk.changes, walk.visited))
}

/// The SHA-256 of a regular file's content, read through `fd`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}
