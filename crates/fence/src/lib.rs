//! The file fence.
//!
//! A [`Fence`] holds a directory descriptor of the sandbox root for its whole
//! life and resolves every path against it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: the kernel walks the
//! path and refuses, at every step, anything that would leave the root. There
//! is no window between a check and a use for a swapped symlink to slip
//! through, because no path string is ever resolved twice: operations work on
//! the descriptors the resolution returned.
//!
//! Where `openat2` is missing (Linux before 5.6), the fence walks component
//! by component with `O_NOFOLLOW`, reading and following symlinks itself and
//! keeping every step beneath the root.
//!
//! Invariants:
//! - No operation reads, writes, creates or removes anything outside the root.
//! - A write replaces the file atomically: a temporary file in the same
//!   directory, then `renameat`. A refused or failed write changes nothing.
//! - A read never loads more than asked, never blocks on a FIFO and never
//!   opens a device for reading.
//! - Creating never follows a dangling symlink.

mod entry;
pub mod placement;
mod resolve;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hako_core::{path as lexical, DirEntry, DirListing, FenceError, FenceResolver, FileKind};
use hako_core::{Metadata, ReadOutcome};
use hako_sys::rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use hako_sys::rustix::io::Errno;

pub use entry::{Content, Previous};
pub use resolve::{open_beneath, resolver_available};

/// The most bytes a whole-file read loads by default: 256 MiB.
pub const DEFAULT_MAX_READ: u64 = 256 << 20;
/// The most entries a listing returns by default.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// The most a read allocates up front, whatever size the file reports.
const PREALLOCATE_MAX: u64 = 8 << 20;
/// How many symlinks one resolution may follow, as in the kernel.
const MAX_SYMLINKS: usize = 40;

/// How a fence is set up.
#[derive(Debug, Clone)]
pub struct FenceOptions {
    /// How paths are resolved; `None` picks `openat2` when the kernel has it.
    pub resolver: Option<FenceResolver>,
    /// The most bytes [`Fence::read_all`] loads.
    pub max_read: u64,
    /// The most entries [`Fence::list`] returns.
    pub max_entries: usize,
}

impl Default for FenceOptions {
    fn default() -> Self {
        FenceOptions {
            resolver: None,
            max_read: DEFAULT_MAX_READ,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// A root directory and every file operation confined to it.
#[derive(Debug)]
pub struct Fence {
    root: OwnedFd,
    /// The root's absolute path, canonical; absolute paths under it are
    /// accepted and made relative. Never used to open anything.
    workdir: PathBuf,
    /// The root's absolute path as given, when it differs from `workdir`.
    alias: Option<PathBuf>,
    resolver: FenceResolver,
    max_read: u64,
    max_entries: usize,
}

fn io_err(op: &'static str, given: &Path, errno: Errno) -> FenceError {
    let path = lexical::shown(given);
    match errno {
        Errno::NOENT => FenceError::NotFound { path },
        Errno::NOTDIR => FenceError::NotADirectory { path },
        Errno::ISDIR => FenceError::IsADirectory { path },
        Errno::XDEV => FenceError::SymlinkEscape { path },
        Errno::LOOP => FenceError::MagicLink { path },
        Errno::NAMETOOLONG => FenceError::TooLong {
            path,
            what: "path",
            len: given.as_os_str().len(),
            max: lexical::PATH_MAX,
        },
        other => FenceError::Io {
            op,
            path,
            source: other.into(),
        },
    }
}

fn kind_of(mode: u32) -> FileKind {
    match rfs::FileType::from_raw_mode(mode) {
        rfs::FileType::RegularFile => FileKind::File,
        rfs::FileType::Directory => FileKind::Dir,
        rfs::FileType::Symlink => FileKind::Symlink,
        rfs::FileType::Fifo => FileKind::Fifo,
        rfs::FileType::Socket => FileKind::Socket,
        rfs::FileType::CharacterDevice => FileKind::CharDevice,
        rfs::FileType::BlockDevice => FileKind::BlockDevice,
        _ => FileKind::Unknown,
    }
}

/// The refusal for an operation that needs a regular file and found `kind`.
fn not_regular(kind: FileKind, path: &Path) -> FenceError {
    let path = path.to_path_buf();
    match kind {
        FileKind::Dir => FenceError::IsADirectory { path },
        kind => FenceError::NotRegularFile { path, kind },
    }
}

/// Whether two `stat`s are of one file at one version: the same inode,
/// size, and modification and change times (a write moves the change
/// time, which no caller can set back).
fn same_version(a: &rfs::Stat, b: &rfs::Stat) -> bool {
    (
        a.st_dev,
        a.st_ino,
        a.st_size,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_dev,
        b.st_ino,
        b.st_size,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_name() -> OsString {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    OsString::from(format!(
        ".hako-write-{}-{n}-{nanos:08x}.tmp",
        std::process::id()
    ))
}

impl Fence {
    /// Opens the root directory and holds it for the fence's life.
    ///
    /// The root path itself is trusted configuration: it is resolved once,
    /// here, following symlinks.
    pub fn open(root: &Path, options: FenceOptions) -> Result<Fence, FenceError> {
        let fd = rfs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open root", root, e))?;
        let workdir = std::fs::canonicalize(root).map_err(|source| FenceError::Io {
            op: "canonicalize root",
            path: root.to_path_buf(),
            source,
        })?;
        let given = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let alias = (given != workdir).then_some(given);
        let resolver = match options.resolver {
            Some(r) => r,
            None if resolver_available(FenceResolver::Openat2) => FenceResolver::Openat2,
            None => FenceResolver::ComponentWalk,
        };
        Ok(Fence {
            root: fd,
            workdir,
            alias,
            resolver,
            max_read: options.max_read,
            max_entries: options.max_entries,
        })
    }

    /// Opens the directory `root` and holds it, but takes `shown` as its
    /// path (for display and for mapping absolute paths): for a root
    /// reached another way than by the path callers know it, such as a
    /// copy-on-write sandbox's layered view of the workspace, opened
    /// through `/proc/PID/root` of a process inside the sandbox.
    pub fn open_as(root: &Path, shown: &Path, options: FenceOptions) -> Result<Fence, FenceError> {
        let mut fence = Fence::open(shown, options)?;
        fence.root = rfs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open root", root, e))?;
        Ok(fence)
    }

    /// The root's canonical absolute path (for display and for mapping
    /// absolute paths; never opened again).
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// How this fence resolves paths.
    pub fn resolver(&self) -> FenceResolver {
        self.resolver
    }

    /// The whole-file read limit.
    pub fn max_read(&self) -> u64 {
        self.max_read
    }

    /// The listing entry limit.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The root directory descriptor.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Checks a caller's path lexically and makes it relative to the root.
    pub fn relative(&self, path: &Path) -> Result<PathBuf, FenceError> {
        match lexical::relative(path, &self.workdir) {
            Err(FenceError::AbsoluteOutside { .. }) if self.alias.is_some() => {
                lexical::relative(path, self.alias.as_deref().unwrap_or(&self.workdir))
            }
            other => other,
        }
    }

    /// Opens `rel` beneath the root with `flags`, following symlinks only
    /// where they stay beneath the root.
    fn resolve(
        &self,
        rel: &Path,
        flags: OFlags,
        mode: Mode,
        given: &Path,
    ) -> Result<OwnedFd, FenceError> {
        resolve::open_beneath(self.resolver, self.root.as_fd(), rel, flags, mode)
            .map_err(|e| io_err("open", given, e))
    }

    fn open_dir_path(&self, rel: &Path, given: &Path) -> Result<OwnedFd, FenceError> {
        self.resolve(
            rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            given,
        )
    }

    /// Opens a directory for use as a working directory (an `O_PATH`
    /// descriptor that `fchdir` accepts).
    pub fn open_dir(&self, path: &Path) -> Result<OwnedFd, FenceError> {
        let rel = self.relative(path)?;
        self.open_dir_path(&rel, path)
    }

    /// Opens a regular file for reading, refusing anything else without
    /// opening it: the path is resolved once to an `O_PATH` descriptor (which
    /// opens nothing: no FIFO blocks, no device driver runs), its type is
    /// checked, and only a regular file is then reopened for reading through
    /// that descriptor.
    fn open_regular(&self, path: &Path) -> Result<File, FenceError> {
        let rel = self.relative(path)?;
        let fd = self.resolve(&rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), path)?;
        let stat = rfs::fstat(&fd).map_err(|e| io_err("fstat", path, e))?;
        match kind_of(stat.st_mode) {
            FileKind::File => {}
            kind => return Err(not_regular(kind, path)),
        }
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let reopened = match resolve::reopen(&fd, flags) {
            Ok(file) => file,
            // No /proc to reopen through: resolve the path again, beneath the
            // root as before, and accept it only if it is the same inode.
            Err(Errno::NOENT) => self.resolve(&rel, flags, Mode::empty(), path)?,
            Err(e) => return Err(io_err("reopen", path, e)),
        };
        let again = rfs::fstat(&reopened).map_err(|e| io_err("fstat", path, e))?;
        if (again.st_dev, again.st_ino) != (stat.st_dev, stat.st_ino) {
            return Err(FenceError::SymlinkEscape {
                path: path.to_path_buf(),
            });
        }
        Ok(File::from(reopened))
    }

    /// Reads at most `max` bytes from the start of a regular file.
    pub fn read(&self, path: &Path, max: u64) -> Result<ReadOutcome, FenceError> {
        let file = self.open_regular(path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        // Trust the size only as a hint, and only up to a point: a sparse
        // file can claim terabytes, and the file can change while it is read.
        let hint = size.min(max).min(PREALLOCATE_MAX);
        let mut data = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
        let read_err = |source| FenceError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        };
        (&file).take(max).read_to_end(&mut data).map_err(read_err)?;
        let mut probe = [0u8; 1];
        let truncated = data.len() as u64 == max && (&file).read(&mut probe).map_err(read_err)? > 0;
        Ok(ReadOutcome { data, truncated })
    }

    /// Reads a whole regular file, refusing one larger than the read limit.
    pub fn read_all(&self, path: &Path) -> Result<Vec<u8>, FenceError> {
        let outcome = self.read(path, self.max_read)?;
        if outcome.truncated {
            let size = self.stat(path).map(|m| m.size).unwrap_or(self.max_read + 1);
            return Err(FenceError::FileTooLarge {
                path: path.to_path_buf(),
                size,
                max: self.max_read,
            });
        }
        Ok(outcome.data)
    }

    /// Finds the directory and name that creating or replacing `path` acts
    /// on: a final symlink is followed while it stays beneath the root, and a
    /// dangling one is refused (its target is never created).
    fn create_target(&self, path: &Path) -> Result<(OwnedFd, OsString), FenceError> {
        let mut rel = self.relative(path)?;
        for _ in 0..MAX_SYMLINKS {
            let (parent_rel, name) = lexical::split_name(&rel, path)?;
            let parent = self.open_dir_path(parent_rel, path)?;
            let target = match rfs::readlinkat(&parent, name, Vec::new()) {
                // Not a symlink, or nothing there yet: act on this entry.
                Err(Errno::INVAL) | Err(Errno::NOENT) => return Ok((parent, name.to_owned())),
                Err(e) => return Err(io_err("readlink", path, e)),
                Ok(target) => PathBuf::from(OsStr::from_bytes(target.as_bytes())),
            };
            if target.is_absolute() {
                return Err(FenceError::SymlinkEscape {
                    path: path.to_path_buf(),
                });
            }
            // The target is relative to the directory the link is in, which
            // the path as written may reach through other symlinks: join it
            // onto that directory's real path.
            let real_parent = resolve::real_dir_path(self.root.as_fd(), parent_rel)
                .map_err(|e| io_err("resolve", path, e))?;
            let next = real_parent.join(&target);
            rel = match lexical::relative(&next, &self.workdir) {
                Ok(next) => next,
                Err(FenceError::DotDotEscape { .. }) => {
                    return Err(FenceError::SymlinkEscape {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => return Err(e),
            };
            // The whole chain must resolve beneath the root to something that
            // exists; otherwise creating would make the target appear.
            match self.resolve(&rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), path) {
                Ok(_) => {}
                Err(FenceError::NotFound { .. }) => {
                    return Err(FenceError::DanglingSymlink {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Err(FenceError::MagicLink {
            path: path.to_path_buf(),
        })
    }

    /// Replaces a file's contents atomically.
    pub fn write(&self, path: &Path, data: &[u8]) -> Result<(), FenceError> {
        self.replace(path, data, None)
    }

    /// Replaces a file's contents atomically, only if it still holds
    /// exactly `read` (what the caller read before computing `data`: an
    /// edit). The check is made after the new content is written to its
    /// temporary file, just before the rename: the file at the path is
    /// opened (never through a symlink), compared byte for byte, and its
    /// identity (device, inode, size, modification and change times) is
    /// checked to be the one just compared and unchanged by the reading,
    /// in the last step before `renameat`. A file written, replaced or
    /// removed since `read` was read is refused with
    /// [`FenceError::ChangedMeanwhile`], and nothing is written.
    pub fn write_if_unchanged(
        &self,
        path: &Path,
        data: &[u8],
        read: &[u8],
    ) -> Result<(), FenceError> {
        self.replace(path, data, Some(read))
    }

    /// Whether the entry `name` in `dir` still holds exactly `read`, and
    /// the identity of what was compared.
    fn holds(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        read: &[u8],
        path: &Path,
    ) -> Result<Option<rfs::Stat>, FenceError> {
        let fd = match rfs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Removed, or swapped for a symlink, since it was read.
            Err(Errno::NOENT) | Err(Errno::LOOP) => return Ok(None),
            Err(e) => return Err(io_err("open", path, e)),
        };
        let before = rfs::fstat(&fd).map_err(|e| io_err("fstat", path, e))?;
        if kind_of(before.st_mode) != FileKind::File
            || u64::try_from(before.st_size).ok() != Some(read.len() as u64)
        {
            return Ok(None);
        }
        let mut now = Vec::with_capacity(read.len().min(PREALLOCATE_MAX as usize));
        (&File::from(fd.try_clone().map_err(|source| FenceError::Io {
            op: "dup",
            path: path.to_path_buf(),
            source,
        })?))
            .take(read.len() as u64 + 1)
            .read_to_end(&mut now)
            .map_err(|source| FenceError::Io {
                op: "read",
                path: path.to_path_buf(),
                source,
            })?;
        let after = rfs::fstat(&fd).map_err(|e| io_err("fstat", path, e))?;
        if now != read || !same_version(&before, &after) {
            return Ok(None);
        }
        Ok(Some(after))
    }

    /// Writes `data` to a temporary file beside `path`'s target and
    /// renames it over the target; with `unchanged`, only if the target
    /// still holds that (see [`Fence::write_if_unchanged`]).
    fn replace(
        &self,
        path: &Path,
        data: &[u8],
        unchanged: Option<&[u8]>,
    ) -> Result<(), FenceError> {
        let (dir, name) = self.create_target(path)?;
        let mode = match rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match kind_of(stat.st_mode) {
                // The replacement is a new file owned by the writer: keep the
                // permission bits, never set-user-ID or set-group-ID.
                FileKind::File => Mode::from_raw_mode(stat.st_mode & 0o1777),
                // Swapped for a symlink since create_target: the rename
                // replaces the link itself; its 0777 says nothing.
                FileKind::Symlink => Mode::from_raw_mode(0o644),
                kind => return Err(not_regular(kind, path)),
            },
            Err(Errno::NOENT) => Mode::from_raw_mode(0o644),
            Err(e) => return Err(io_err("stat", path, e)),
        };
        let tmp = temp_name();
        let fd = rfs::openat(
            &dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )
        .map_err(|e| io_err("create temporary file for", path, e))?;
        let result = (|| {
            let mut file = File::from(fd);
            file.write_all(data).map_err(|source| FenceError::Io {
                op: "write",
                path: path.to_path_buf(),
                source,
            })?;
            rfs::fchmod(&file, mode).map_err(|e| io_err("chmod", path, e))?;
            if let Some(read) = unchanged {
                let changed = || FenceError::ChangedMeanwhile {
                    path: path.to_path_buf(),
                };
                let compared = self.holds(&dir, &name, read, path)?.ok_or_else(changed)?;
                // The last step before the rename: the entry is still the
                // file just compared, and nothing wrote to it since.
                match rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(now) if same_version(&compared, &now) => {}
                    Ok(_) | Err(Errno::NOENT) => return Err(changed()),
                    Err(e) => return Err(io_err("stat", path, e)),
                }
            }
            rfs::renameat(&dir, &tmp, &dir, &name).map_err(|e| io_err("rename", path, e))
        })();
        if result.is_err() {
            let _ = rfs::unlinkat(&dir, &tmp, AtFlags::empty());
        }
        result
    }

    /// Appends to a regular file, creating it if missing.
    pub fn append(&self, path: &Path, data: &[u8]) -> Result<(), FenceError> {
        let (dir, name) = self.create_target(path)?;
        // Check the type before opening: opening a device for writing can
        // have effects of its own.
        match rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match kind_of(stat.st_mode) {
                FileKind::File => {}
                kind => return Err(not_regular(kind, path)),
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(io_err("stat", path, e)),
        }
        let fd = rfs::openat(
            &dir,
            &name,
            OFlags::WRONLY
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| match e {
            // Swapped for a symlink since the check: never follow it.
            Errno::LOOP => FenceError::SymlinkEscape {
                path: path.to_path_buf(),
            },
            e => io_err("open", path, e),
        })?;
        let stat = rfs::fstat(&fd).map_err(|e| io_err("fstat", path, e))?;
        let kind = kind_of(stat.st_mode);
        if kind != FileKind::File {
            return Err(not_regular(kind, path));
        }
        if stat.st_nlink > 1 {
            return Err(FenceError::Hardlinked {
                path: path.to_path_buf(),
                links: stat.st_nlink,
            });
        }
        File::from(fd)
            .write_all(data)
            .map_err(|source| FenceError::Io {
                op: "append",
                path: path.to_path_buf(),
                source,
            })
    }

    /// Removes a file, a symlink (not its target) or an empty directory.
    pub fn remove(&self, path: &Path) -> Result<(), FenceError> {
        let rel = self.relative(path)?;
        let (parent_rel, name) = lexical::split_name(&rel, path)?;
        let dir = self.open_dir_path(parent_rel, path)?;
        match rfs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::ISDIR) => match rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
                Ok(()) => Ok(()),
                Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => Err(FenceError::DirectoryNotEmpty {
                    path: path.to_path_buf(),
                }),
                Err(e) => Err(io_err("rmdir", path, e)),
            },
            Err(e) => Err(io_err("unlink", path, e)),
        }
    }

    /// Lists a directory from `lstat` data, sorted by name, at most the
    /// entry limit.
    pub fn list(&self, path: &Path) -> Result<DirListing, FenceError> {
        let rel = self.relative(path)?;
        let fd = self.resolve(
            &rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            path,
        )?;
        let mut dir = rfs::Dir::new(fd).map_err(|e| io_err("opendir", path, e))?;
        let mut names = Vec::new();
        let mut truncated = false;
        for entry in dir.by_ref() {
            let entry = entry.map_err(|e| io_err("readdir", path, e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if names.len() == self.max_entries {
                truncated = true;
                break;
            }
            names.push(OsStr::from_bytes(name).to_owned());
        }
        let dir_fd = dir.fd().map_err(|e| io_err("opendir", path, e))?;
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            let stat = match rfs::statat(dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Removed since it was listed.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(io_err("stat", &Path::new(path).join(&name), e)),
            };
            entries.push(DirEntry {
                name,
                kind: kind_of(stat.st_mode),
                size: u64::try_from(stat.st_size).unwrap_or(0),
                mode: stat.st_mode & 0o7777,
                mtime: stat.st_mtime,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(DirListing { entries, truncated })
    }

    /// Creates a directory and its missing parents (`mkdir -p`).
    pub fn make_dir_all(&self, path: &Path) -> Result<(), FenceError> {
        let rel = self.relative(path)?;
        let mut prefix = PathBuf::new();
        for component in rel.components() {
            prefix.push(component);
            match self.open_dir_path(&prefix, path) {
                Ok(_) => continue,
                Err(FenceError::NotFound { .. }) => {}
                Err(FenceError::NotADirectory { .. }) => {
                    return Err(FenceError::AlreadyExists {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => return Err(e),
            }
            let (parent_rel, name) = lexical::split_name(&prefix, path)?;
            let parent = self.open_dir_path(parent_rel, path)?;
            match rfs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
                Ok(()) => {}
                Err(Errno::EXIST) => {
                    // Something appeared: a dangling symlink (never followed
                    // to create its target) or a racing mkdir.
                    if let Ok(stat) = rfs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                        if kind_of(stat.st_mode) == FileKind::Symlink {
                            return Err(FenceError::DanglingSymlink {
                                path: path.to_path_buf(),
                            });
                        }
                    }
                    self.open_dir_path(&prefix, path)?;
                }
                Err(e) => return Err(io_err("mkdir", path, e)),
            }
        }
        Ok(())
    }

    /// The path's own metadata (`lstat`): a symlink is reported as a symlink.
    pub fn stat(&self, path: &Path) -> Result<Metadata, FenceError> {
        let rel = self.relative(path)?;
        let (dir, name): (OwnedFd, OsString) = match lexical::split_name(&rel, path) {
            Ok((parent_rel, name)) => (self.open_dir_path(parent_rel, path)?, name.to_owned()),
            // The root, `.` or a path ending in `..`: stat the directory.
            Err(_) => (self.open_dir_path(&rel, path)?, OsString::from(".")),
        };
        let stat = rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_err("stat", path, e))?;
        let kind = kind_of(stat.st_mode);
        let symlink_target = if kind == FileKind::Symlink {
            rfs::readlinkat(&dir, &name, Vec::new())
                .ok()
                .map(|t| OsStr::from_bytes(t.as_bytes()).to_owned())
        } else {
            None
        };
        Ok(Metadata {
            kind,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mode: stat.st_mode & 0o7777,
            mtime: stat.st_mtime,
            links: stat.st_nlink,
            symlink_target,
        })
    }
}
