//! Placing and removing single directory entries exactly as a review
//! committed them: what the entry must still be before it is replaced is
//! checked at the last step, and the final component is never followed
//! (a symlink is created as a symlink, replaced as an entry, never written
//! through). Used by `hako commit` (the `hako-layers` crate).
//!
//! Each operation resolves the parent directory beneath the root as every
//! fence operation does, then acts on one name in it with `*at` calls.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use hako_core::{path as lexical, FenceError, FileKind};
use hako_sys::rustix::fs::{self as rfs, AtFlags, Mode, OFlags, RenameFlags};
use hako_sys::rustix::io::Errno;

use crate::{io_err, kind_of, same_version, temp_name, Fence};

/// What an entry must be just before it is replaced or removed; anything
/// else is refused with [`FenceError::ChangedMeanwhile`] and nothing is
/// changed.
#[derive(Debug, Clone, Copy)]
pub enum Previous<'a> {
    /// Nothing at the path (the replacement is created, never put over
    /// something that appeared).
    Absent,
    /// A regular file holding exactly these bytes.
    File(&'a [u8]),
    /// A symlink with exactly this target.
    Symlink(&'a OsStr),
    /// A directory (only for [`Fence::remove_entry`]: it must be empty).
    Dir,
}

/// What an entry becomes.
#[derive(Debug, Clone, Copy)]
pub enum Content<'a> {
    /// A regular file with these bytes and permission bits (only the
    /// `0o777` bits are kept: never set-user-ID, set-group-ID or sticky).
    File {
        /// Its bytes.
        data: &'a [u8],
        /// Its permission bits.
        mode: u32,
    },
    /// A symlink with this target, stored as given and never followed.
    Symlink(&'a OsStr),
}

impl Fence {
    /// The parent directory of `path` (beneath the root) and its last name.
    fn entry_parent(&self, path: &Path) -> Result<(OwnedFd, std::ffi::OsString), FenceError> {
        let rel = self.relative(path)?;
        let (parent_rel, name) = lexical::split_name(&rel, path)?;
        let dir = self.open_dir_path(parent_rel, path)?;
        Ok((dir, name.to_owned()))
    }

    /// Whether the entry `name` in `dir` is `previous` now.
    fn entry_is(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        previous: Previous<'_>,
        path: &Path,
    ) -> Result<bool, FenceError> {
        let stat = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(stat),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(io_err("stat", path, e)),
        };
        Ok(match (previous, stat) {
            (Previous::Absent, None) => true,
            (Previous::Absent, Some(_)) | (_, None) => false,
            (Previous::File(read), Some(_)) => match self.holds(dir, name, read, path)? {
                Some(compared) => match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(now) => same_version(&compared, &now),
                    Err(Errno::NOENT) => false,
                    Err(e) => return Err(io_err("stat", path, e)),
                },
                None => false,
            },
            (Previous::Symlink(target), Some(stat)) => {
                kind_of(stat.st_mode) == FileKind::Symlink
                    && match rfs::readlinkat(dir, name, Vec::new()) {
                        Ok(now) => now.as_bytes() == target.as_bytes(),
                        Err(Errno::NOENT) | Err(Errno::INVAL) => false,
                        Err(e) => return Err(io_err("readlink", path, e)),
                    }
            }
            (Previous::Dir, Some(stat)) => kind_of(stat.st_mode) == FileKind::Dir,
        })
    }

    /// Puts `content` at `path` atomically (a temporary entry beside it,
    /// then a rename), only if the entry there is `previous` at the last
    /// step: with [`Previous::Absent`] the rename refuses to replace
    /// anything (`RENAME_NOREPLACE`); otherwise the entry is compared just
    /// before the rename. The final component is never followed: a
    /// symlink at `path` is replaced, not written through, and a symlink
    /// is created as a symlink whatever its target.
    pub fn put_entry(
        &self,
        path: &Path,
        content: Content<'_>,
        previous: Previous<'_>,
    ) -> Result<(), FenceError> {
        let (dir, name) = self.entry_parent(path)?;
        let tmp = temp_name();
        match content {
            Content::File { data, mode } => {
                let mode = Mode::from_raw_mode(mode & 0o777);
                let fd = rfs::openat(
                    &dir,
                    &tmp,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_err("create temporary file for", path, e))?;
                let written = (|| {
                    let mut file = File::from(fd);
                    file.write_all(data).map_err(|source| FenceError::Io {
                        op: "write",
                        path: path.to_path_buf(),
                        source,
                    })?;
                    // The mode asked for, whatever the umask.
                    rfs::fchmod(&file, mode).map_err(|e| io_err("chmod", path, e))
                })();
                if let Err(e) = written {
                    let _ = rfs::unlinkat(&dir, &tmp, AtFlags::empty());
                    return Err(e);
                }
            }
            Content::Symlink(target) => {
                rfs::symlinkat(target, &dir, &tmp)
                    .map_err(|e| io_err("create temporary symlink for", path, e))?;
            }
        }
        let result = (|| {
            if let Previous::Absent = previous {
                return rfs::renameat_with(&dir, &tmp, &dir, &name, RenameFlags::NOREPLACE)
                    .map_err(|e| match e {
                        Errno::EXIST => FenceError::ChangedMeanwhile {
                            path: path.to_path_buf(),
                        },
                        e => io_err("rename", path, e),
                    });
            }
            if !self.entry_is(&dir, &name, previous, path)? {
                return Err(FenceError::ChangedMeanwhile {
                    path: path.to_path_buf(),
                });
            }
            rfs::renameat(&dir, &tmp, &dir, &name).map_err(|e| io_err("rename", path, e))
        })();
        if result.is_err() {
            let _ = rfs::unlinkat(&dir, &tmp, AtFlags::empty());
        }
        result
    }

    /// Removes the entry at `path` (never what a symlink there points to)
    /// if it is `previous`; a directory must be empty.
    pub fn remove_entry(&self, path: &Path, previous: Previous<'_>) -> Result<(), FenceError> {
        let (dir, name) = self.entry_parent(path)?;
        if !self.entry_is(&dir, &name, previous, path)? {
            return Err(FenceError::ChangedMeanwhile {
                path: path.to_path_buf(),
            });
        }
        let flags = match previous {
            Previous::Dir => AtFlags::REMOVEDIR,
            _ => AtFlags::empty(),
        };
        match rfs::unlinkat(&dir, &name, flags) {
            Ok(()) => Ok(()),
            Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => Err(FenceError::DirectoryNotEmpty {
                path: path.to_path_buf(),
            }),
            Err(e) => Err(io_err("remove", path, e)),
        }
    }

    /// Makes one directory (its parent must exist) with exactly `mode`'s
    /// permission bits and its set-group-ID and sticky bits (`0o3777`:
    /// set-group-ID on a directory only passes its group to what is made
    /// in it; set-user-ID, which Linux ignores on a directory, is dropped).
    pub fn make_dir(&self, path: &Path, mode: u32) -> Result<(), FenceError> {
        let (dir, name) = self.entry_parent(path)?;
        match rfs::mkdirat(&dir, &name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                return Err(FenceError::AlreadyExists {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err("mkdir", path, e)),
        }
        self.chmod_dir_at(&dir, &name, mode, path)
    }

    /// Sets a directory's permission bits (`0o3777`, as [`Fence::make_dir`]); the final component
    /// is never followed, and anything but a directory is refused.
    pub fn set_dir_mode(&self, path: &Path, mode: u32) -> Result<(), FenceError> {
        let (dir, name) = self.entry_parent(path)?;
        self.chmod_dir_at(&dir, &name, mode, path)
    }

    fn chmod_dir_at(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        mode: u32,
        path: &Path,
    ) -> Result<(), FenceError> {
        let fd = rfs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::LOOP => FenceError::NotADirectory {
                path: path.to_path_buf(),
            },
            e => io_err("open", path, e),
        })?;
        rfs::fchmod(&fd, Mode::from_raw_mode(mode & 0o3777)).map_err(|e| io_err("chmod", path, e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::FenceOptions;
    use std::os::unix::fs::PermissionsExt;

    fn fence() -> (tempfile::TempDir, Fence) {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path(), FenceOptions::default()).unwrap();
        (dir, fence)
    }

    #[test]
    fn a_symlink_put_is_a_symlink_and_its_target_is_never_touched() {
        let (dir, fence) = fence();
        fence
            .put_entry(
                Path::new("l"),
                Content::Symlink(OsStr::new("/etc/passwd")),
                Previous::Absent,
            )
            .unwrap();
        let target = std::fs::read_link(dir.path().join("l")).unwrap();
        assert_eq!(target, Path::new("/etc/passwd"));
        // Replacing the symlink with a file replaces the entry, never the target.
        fence
            .put_entry(
                Path::new("l"),
                Content::File {
                    data: b"x",
                    mode: 0o644,
                },
                Previous::Symlink(OsStr::new("/etc/passwd")),
            )
            .unwrap();
        assert_eq!(std::fs::read(dir.path().join("l")).unwrap(), b"x");
    }

    #[test]
    fn put_over_something_that_appeared_is_refused() {
        let (dir, fence) = fence();
        std::fs::write(dir.path().join("f"), "user's").unwrap();
        let err = fence
            .put_entry(
                Path::new("f"),
                Content::File {
                    data: b"agent's",
                    mode: 0o644,
                },
                Previous::Absent,
            )
            .unwrap_err();
        assert!(matches!(err, FenceError::ChangedMeanwhile { .. }), "{err}");
        let err = fence
            .put_entry(
                Path::new("f"),
                Content::File {
                    data: b"agent's",
                    mode: 0o644,
                },
                Previous::File(b"other"),
            )
            .unwrap_err();
        assert!(matches!(err, FenceError::ChangedMeanwhile { .. }), "{err}");
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"user's");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_put_has_exactly_its_mode_without_setuid() {
        let (dir, fence) = fence();
        fence
            .put_entry(
                Path::new("x"),
                Content::File {
                    data: b"#!/bin/sh\n",
                    mode: 0o4755,
                },
                Previous::Absent,
            )
            .unwrap();
        let mode = std::fs::metadata(dir.path().join("x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    #[test]
    fn remove_entry_removes_a_symlink_not_its_target() {
        let (dir, fence) = fence();
        std::fs::write(dir.path().join("t"), "keep").unwrap();
        std::os::unix::fs::symlink("t", dir.path().join("l")).unwrap();
        fence
            .remove_entry(Path::new("l"), Previous::Symlink(OsStr::new("t")))
            .unwrap();
        assert_eq!(std::fs::read(dir.path().join("t")).unwrap(), b"keep");
        assert!(fence
            .remove_entry(Path::new("t"), Previous::File(b"changed"))
            .is_err());
        fence.make_dir(Path::new("d"), 0o750).unwrap();
        let mode = std::fs::metadata(dir.path().join("d"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o750);
        fence.remove_entry(Path::new("d"), Previous::Dir).unwrap();
    }
}
