//! Checkpoints of a named sandbox: copies of its upper layer, taken
//! while nothing runs in it, to return to (`rollback`) or compare.
//!
//! A checkpoint is `checkpoints/N/` in the state directory: `upper/`, a
//! copy of the upper layer as it was (whiteouts, opaque directories,
//! symlinks, modes; file data copied with `copy_file_range`, which shares
//! blocks where the file system can), and `meta.json` (its number, label
//! and time). The copy walks directory descriptors and never follows a
//! symlink. A device node other than a whiteout cannot be copied
//! unprivileged and is refused, naming it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hako_sys::rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use hako_sys::rustix::io::Errno;

use crate::state::{validate_name, State, StateError};

/// Why a checkpoint could not be taken or returned to.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The state directory failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A file-system call failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The call.
        op: &'static str,
        /// The path, relative to the layer.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something in the layer that cannot be copied.
    #[error("cannot checkpoint {path:?}: {why}")]
    Uncopiable {
        /// The path, relative to the layer.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// No checkpoint of that number or label.
    #[error("sandbox {name:?} has no checkpoint {which:?}")]
    NoSuchCheckpoint {
        /// The sandbox.
        name: String,
        /// As given.
        which: String,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(Errno) -> CheckpointError {
    let path = path.to_path_buf();
    move |e| CheckpointError::Io {
        op,
        path,
        source: e.into(),
    }
}

/// What a checkpoint is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// Its number, from 1.
    pub id: u64,
    /// Its label, if one was given.
    pub label: Option<String>,
    /// When it was taken, Unix milliseconds.
    pub at_ms: u64,
}

/// The overlay xattrs a copy keeps: those the scan and the commit read
/// (a stale origin is one overlayfs meets whenever a workspace file is
/// removed, and ignores).
const KEPT_XATTRS: [&str; 6] = [
    "trusted.overlay.opaque",
    "user.overlay.opaque",
    "trusted.overlay.whiteout",
    "user.overlay.whiteout",
    "trusted.overlay.origin",
    "user.overlay.origin",
];

fn copy_xattrs(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    path: &Path,
) -> Result<(), CheckpointError> {
    for name in KEPT_XATTRS {
        let mut buf = [0u8; 256];
        if let Ok(n) = rfs::fgetxattr(from, name, &mut buf[..]) {
            rfs::fsetxattr(to, name, &buf[..n], rfs::XattrFlags::empty())
                .map_err(io("set xattr of", path))?;
        }
    }
    Ok(())
}

fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Copies the directory `from` into the empty directory `to`.
fn copy_dir(from: BorrowedFd<'_>, to: BorrowedFd<'_>, path: &Path) -> Result<(), CheckpointError> {
    let listing = open_dir(from, OsStr::new(".")).map_err(io("open", path))?;
    let mut names: Vec<OsString> = Vec::new();
    for entry in rfs::Dir::new(listing).map_err(io("list", path))? {
        let entry = entry.map_err(io("list", path))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    for name in names {
        let p = path.join(&name);
        let stat = rfs::statat(from, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(io("stat", &p))?;
        let mode = Mode::from_raw_mode(stat.st_mode & 0o7777);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                rfs::mkdirat(to, &name, Mode::from_raw_mode(0o700)).map_err(io("mkdir", &p))?;
                let src = open_dir(from, &name).map_err(io("open", &p))?;
                let dst = open_dir(to, &name).map_err(io("open", &p))?;
                copy_xattrs(src.as_fd(), dst.as_fd(), &p)?;
                copy_dir(src.as_fd(), dst.as_fd(), &p)?;
                rfs::fchmod(&dst, mode).map_err(io("chmod", &p))?;
            }
            FileType::RegularFile => {
                let src = rfs::openat(
                    from,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io("open", &p))?;
                let dst = rfs::openat(
                    to,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(io("create", &p))?;
                let (mut s, mut d) = (File::from(src), File::from(dst));
                std::io::copy(&mut s, &mut d).map_err(|source| CheckpointError::Io {
                    op: "copy",
                    path: p.clone(),
                    source,
                })?;
                copy_xattrs(s.as_fd(), d.as_fd(), &p)?;
                rfs::fchmod(&d, mode).map_err(io("chmod", &p))?;
            }
            FileType::Symlink => {
                let target =
                    rfs::readlinkat(from, &name, Vec::new()).map_err(io("readlink", &p))?;
                rfs::symlinkat(target.as_c_str(), to, &name).map_err(io("symlink", &p))?;
            }
            FileType::CharacterDevice if stat.st_rdev == 0 => {
                // A whiteout: unprivileged users may make this one device.
                rfs::mknodat(to, &name, FileType::CharacterDevice, mode, 0)
                    .map_err(io("make whiteout", &p))?;
            }
            FileType::Fifo | FileType::Socket => {
                rfs::mknodat(to, &name, FileType::from_raw_mode(stat.st_mode), mode, 0)
                    .map_err(io("make", &p))?;
            }
            _ => {
                return Err(CheckpointError::Uncopiable {
                    path: p,
                    why: "a device node (other than a whiteout) cannot be copied without privilege",
                })
            }
        }
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl State {
    fn checkpoints_dir(&self) -> PathBuf {
        self.dir().join("checkpoints")
    }

    /// The checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let dir = self.checkpoints_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(CheckpointError::Io {
                    op: "list",
                    path: dir,
                    source,
                })
            }
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let meta = entry.path().join("meta.json");
            if let Ok(text) = std::fs::read(&meta) {
                if let Ok(cp) = serde_json::from_slice::<Checkpoint>(&text) {
                    out.push(cp);
                }
            }
        }
        out.sort_by_key(|c| c.id);
        Ok(out)
    }

    /// The checkpoint `which` (its number, or its label; the latest of
    /// that label) and its copy of the upper layer.
    pub fn checkpoint_upper(&self, which: &str) -> Result<(Checkpoint, PathBuf), CheckpointError> {
        let all = self.checkpoints()?;
        let found = all
            .iter()
            .rev()
            .find(|c| c.id.to_string() == which || c.label.as_deref() == Some(which));
        match found {
            Some(cp) => Ok((
                cp.clone(),
                self.checkpoints_dir().join(cp.id.to_string()).join("upper"),
            )),
            None => Err(CheckpointError::NoSuchCheckpoint {
                name: self.name().to_owned(),
                which: which.to_owned(),
            }),
        }
    }

    /// Records the upper layer as a new checkpoint (the state must be
    /// locked: nothing runs in the sandbox).
    pub fn checkpoint(&self, label: Option<&str>) -> Result<Checkpoint, CheckpointError> {
        if let Some(label) = label {
            validate_name(label)?;
        }
        let dir = self.checkpoints_dir();
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CheckpointError::Io {
                    op: "create",
                    path: dir,
                    source,
                })
            }
        }
        let id = self.checkpoints()?.last().map_or(1, |c| c.id + 1);
        let tmp = dir.join(format!(".{id}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        let upper = tmp.join("upper");
        std::fs::create_dir_all(&upper).map_err(|source| CheckpointError::Io {
            op: "create",
            path: upper.clone(),
            source,
        })?;
        let made = (|| {
            let from = rfs::open(
                self.upper(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io("open", Path::new("upper")))?;
            let to = rfs::open(
                &upper,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io("open", Path::new("checkpoint")))?;
            copy_dir(from.as_fd(), to.as_fd(), Path::new(""))?;
            let cp = Checkpoint {
                id,
                label: label.map(str::to_owned),
                at_ms: now_ms(),
            };
            let meta = serde_json::to_vec_pretty(&cp).unwrap_or_default();
            std::fs::write(tmp.join("meta.json"), meta).map_err(|source| CheckpointError::Io {
                op: "write",
                path: tmp.join("meta.json"),
                source,
            })?;
            std::fs::rename(&tmp, dir.join(id.to_string())).map_err(|source| {
                CheckpointError::Io {
                    op: "rename",
                    path: dir.join(id.to_string()),
                    source,
                }
            })?;
            Ok(cp)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        made
    }

    /// Returns the upper layer to checkpoint `which` (the state must be
    /// locked: nothing runs in the sandbox). The checkpoint is kept; the
    /// layer's present state is lost unless it was checkpointed.
    pub fn rollback(&self, which: &str) -> Result<Checkpoint, CheckpointError> {
        let (cp, saved) = self.checkpoint_upper(which)?;
        let fresh = self.dir().join("upper.rollback");
        let old = self.dir().join("upper.old");
        for stale in [&fresh, &old] {
            let _ = std::fs::remove_dir_all(stale);
        }
        let err = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { op, path, source }
        };
        std::fs::create_dir(&fresh).map_err(err("create", &fresh))?;
        let copied = (|| {
            let from = rfs::open(
                &saved,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io("open", Path::new("checkpoint")))?;
            let to = rfs::open(
                &fresh,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io("open", Path::new("upper")))?;
            copy_dir(from.as_fd(), to.as_fd(), Path::new(""))
        })();
        if let Err(e) = copied {
            let _ = std::fs::remove_dir_all(&fresh);
            return Err(e);
        }
        std::fs::set_permissions(&fresh, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(err("chmod", &fresh))?;
        // Swapped by two renames: a crash between them leaves
        // `upper.old` and no `upper`, which a second rollback mends.
        let upper = self.upper();
        if upper.exists() {
            std::fs::rename(&upper, &old).map_err(err("rename", &upper))?;
        }
        std::fs::rename(&fresh, &upper).map_err(err("rename", &fresh))?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(cp)
    }
}
