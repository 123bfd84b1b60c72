//! Named sandboxes' state: a private directory per name, outside the
//! workspace, holding the upper layer, the work directory overlayfs needs
//! beside it, and the base record.
//!
//! Where: `--state DIR` names the directory the names live in; without
//! it, `$XDG_STATE_HOME/hako`, else `~/.local/state/hako`. A sandbox's
//! state is `<that>/NAME`: `upper/`, `work/`, `base.json`, `created` (an
//! empty file whose change time is the base time) and `lock`.
//!
//! The base record says what the sandbox is based on: the workspace (its
//! canonical path, device and inode, checked again on every use) and a
//! time. overlayfs's lower layer is the live workspace, and copy-up
//! happens inside the kernel where hako cannot record what a file was,
//! so the base is the moment the sandbox was made: a workspace entry
//! whose change time (`ctime`, which no unprivileged caller can set back)
//! is at or after the `created` file's is taken as changed since the
//! sandbox was based on it, and a commit that would touch it is refused.
//! Both times come from the same kernel clock, so no clock is compared
//! with another. A path a commit wrote is recorded (device, inode and
//! change time after the write) and judged by that record from then on.
//! This is conservative: a workspace file changed after the sandbox was
//! made is refused even when the sandbox's copy was made after that
//! change; the person commits the other paths by name and discards or
//! redoes that one.

use std::collections::BTreeMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hako_fence::Fence;
use hako_sys::rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use hako_sys::rustix::io::Errno;

/// The longest name.
pub const MAX_NAME: usize = 64;

/// Why a named sandbox's state cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The name is not one hako accepts.
    #[error("invalid sandbox name {name:?}: use 1 to {MAX_NAME} letters, digits, `.`, `_` or `-`, not starting with `.` or `-`")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// No directory to keep state in.
    #[error("no place for sandbox state: neither XDG_STATE_HOME nor HOME is set to an absolute path; give --state DIR")]
    NoStateHome,
    /// No sandbox of that name.
    #[error("no sandbox named {name:?} in {root:?}")]
    NoSuchSandbox {
        /// The name.
        name: String,
        /// Where names were looked for.
        root: PathBuf,
    },
    /// The state directory would be reachable from inside the sandbox.
    #[error("refused state directory {state:?}: it is inside {inside:?}, which the sandbox can reach; choose one outside with --state DIR")]
    InsideSandbox {
        /// The state directory.
        state: PathBuf,
        /// The workspace or bind holding it.
        inside: PathBuf,
    },
    /// A bind (`--rw`, `--ro`) holds the copy-on-write workspace or lies
    /// inside it: the sandbox would see (and, through a writable one,
    /// write) the real workspace beside or instead of the layered view.
    #[error("refused {bind:?} with --cow: it holds or lies inside the copy-on-write workspace {workspace:?}, and the sandbox would reach the real workspace through it rather than the layer; bind a directory apart from the workspace")]
    BindOverlapsWorkspace {
        /// The bind.
        bind: PathBuf,
        /// The workspace.
        workspace: PathBuf,
    },
    /// The state directory is not private to this user.
    #[error("refused state directory {path:?}: {why}; it must be a directory owned by this user with no group or other permissions (0700)")]
    NotPrivate {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The workspace the sandbox was based on is gone or another one.
    #[error("the workspace {workspace:?} of sandbox {name:?} is {why}; its changes cannot be compared with it")]
    WorkspaceMoved {
        /// The name.
        name: String,
        /// The workspace recorded.
        workspace: PathBuf,
        /// What happened.
        why: &'static str,
    },
    /// Another hako process uses the sandbox.
    #[error(
        "sandbox {name:?} is in use (a run, or another review command); try again when it ends"
    )]
    Busy {
        /// The name.
        name: String,
    },
    /// The base record cannot be read or written.
    #[error("the base record {path:?}: {why}")]
    BadBase {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A file-system call failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The call.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError {
    let path = path.to_path_buf();
    move |source| StateError::Io { op, path, source }
}

/// Checks a sandbox name: 1 to [`MAX_NAME`] ASCII letters, digits, `.`,
/// `_` or `-`, not starting with `.` or `-` (so never `.`, `..`, a hidden
/// file, an option, or a path).
pub fn validate_name(name: &str) -> Result<(), StateError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StateError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The directory names live in: `state` if given, else
/// `$XDG_STATE_HOME/hako`, else `$HOME/.local/state/hako` (relative
/// values of either variable are ignored, as the XDG specification says).
pub fn state_root(state: Option<&Path>) -> Result<PathBuf, StateError> {
    if let Some(dir) = state {
        return std::path::absolute(dir).map_err(io_err("resolve", dir));
    }
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = absolute("XDG_STATE_HOME") {
        return Ok(xdg.join("hako"));
    }
    absolute("HOME")
        .map(|home| home.join(".local/state/hako"))
        .ok_or(StateError::NoStateHome)
}

/// A change time, to the nanosecond.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Time {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: i64,
}

/// One workspace entry a commit wrote: what it was just after.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Written {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Change time.
    pub ctime: Time,
}

/// What a sandbox is based on (see the module's documentation).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Base {
    /// The record's format.
    pub version: u32,
    /// The workspace's canonical path.
    pub workspace: PathBuf,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// The base time: an entry changed at or after it changed since.
    pub since: Time,
    /// Entries a commit wrote, by path bytes (as lossless text: each byte
    /// outside printable ASCII, and `%`, written `%XX`).
    pub written: BTreeMap<String, Written>,
}

fn key(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_graphic() && b != b'%' || b == b' ' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The workspace entry at `rel`, each component looked up in the
/// directory above without following a symlink: a component that is
/// missing, a symlink or not a directory means there is no entry at
/// `rel` (as the scan, which never follows one, sees the workspace).
/// The empty path is the workspace itself.
fn lstat_beneath(fence: &Fence, rel: &Path) -> Result<Option<Stat>, Errno> {
    use std::path::Component;
    let mut names = Vec::new();
    for part in rel.components() {
        match part {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            _ => return Err(Errno::INVAL),
        }
    }
    let Some((last, parents)) = names.split_last() else {
        return rfs::fstat(fence.root()).map(Some);
    };
    let mut dir: Option<std::os::fd::OwnedFd> = None;
    for name in parents {
        let at = match &dir {
            Some(fd) => fd.as_fd(),
            None => fence.root(),
        };
        match rfs::openat(
            at,
            *name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => dir = Some(fd),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let at = match &dir {
        Some(fd) => fd.as_fd(),
        None => fence.root(),
    };
    match rfs::statat(at, *last, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn ctime(stat: &Stat) -> Time {
    Time {
        sec: stat.st_ctime,
        nsec: stat.st_ctime_nsec as i64,
    }
}

impl Base {
    /// Whether the workspace entry at `rel` changed since the sandbox was
    /// based on it: it appeared (`existed` false), vanished, or its change
    /// time is at or after the base time (or, for an entry a commit
    /// wrote, it is not what the commit left). Directories are judged by
    /// what is in them, not by their own change time (which any entry
    /// added or removed in them moves). An entry that cannot be looked at
    /// counts as changed.
    pub fn changed(&self, fence: &Fence, rel: &Path, existed: bool) -> bool {
        let stat = match lstat_beneath(fence, rel) {
            Ok(stat) => stat,
            Err(_) => return true,
        };
        let Some(stat) = stat else {
            return existed;
        };
        if !existed {
            return true;
        }
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            return false;
        }
        match self.written.get(&key(rel)) {
            Some(w) => (w.dev, w.ino, w.ctime) != (stat.st_dev, stat.st_ino, ctime(&stat)),
            None => ctime(&stat) >= self.since,
        }
    }

    /// Whether the workspace directory that holds `rel` changed since the
    /// sandbox was based on it: an entry was made, removed or renamed in
    /// it (its change time is at or after the base time, or, for a
    /// directory a commit wrote in, it is not what the commit left). A
    /// parent that is gone is judged by the nearest directory above that
    /// is not; one that is no longer a directory, or cannot be looked at,
    /// counts as changed. A file the sandbox copied up that is listed as
    /// added is a workspace file deleted or renamed since only if this
    /// holds: otherwise the sandbox renamed it itself.
    pub fn parent_changed(&self, fence: &Fence, rel: &Path) -> bool {
        for dir in rel.ancestors().skip(1) {
            let stat = match lstat_beneath(fence, dir) {
                Ok(Some(stat)) => stat,
                Ok(None) => continue,
                Err(_) => return true,
            };
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                return true;
            }
            return match self.written.get(&key(dir)) {
                Some(w) => (w.dev, w.ino, w.ctime) != (stat.st_dev, stat.st_ino, ctime(&stat)),
                None => ctime(&stat) >= self.since,
            };
        }
        true
    }

    /// Records what a commit left in the workspace directory `dir` (the
    /// empty path is the workspace itself), which it wrote in.
    pub fn committed_dir(&mut self, fence: &Fence, dir: &Path) {
        match lstat_beneath(fence, dir) {
            Ok(Some(stat)) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                self.written.insert(
                    key(dir),
                    Written {
                        dev: stat.st_dev,
                        ino: stat.st_ino,
                        ctime: ctime(&stat),
                    },
                );
            }
            _ => self.forget(dir),
        }
    }

    /// Records what a commit left at `rel`.
    pub fn committed(&mut self, fence: &Fence, rel: &Path) {
        match lstat_beneath(fence, rel) {
            Ok(Some(stat)) => {
                self.written.insert(
                    key(rel),
                    Written {
                        dev: stat.st_dev,
                        ino: stat.st_ino,
                        ctime: ctime(&stat),
                    },
                );
            }
            // Gone already, or unreadable: judged as changed next time.
            _ => self.forget(rel),
        }
    }

    /// Forgets what a commit wrote at `rel` (it removed it).
    pub fn forget(&mut self, rel: &Path) {
        self.written.remove(&key(rel));
    }
}

/// One named sandbox's state directory, locked for the holder's use.
#[derive(Debug)]
pub struct State {
    name: String,
    dir: PathBuf,
    _lock: Option<File>,
}

/// Makes `dir` (0700) if missing, and checks that it is a directory owned
/// by this user that no one else can enter.
fn private_dir(dir: &Path) -> Result<(), StateError> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create", dir)(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io_err("stat", dir))?;
    let why = if !meta.is_dir() {
        Some("it is not a directory (a symlink is not accepted)".to_owned())
    } else if meta.uid() != hako_sys::rustix::process::getuid().as_raw() {
        Some(format!("it is owned by uid {}", meta.uid()))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!("its mode is {:04o}", meta.mode() & 0o7777))
    } else {
        None
    };
    match why {
        Some(why) => Err(StateError::NotPrivate {
            path: dir.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

/// `p` as it really is: its longest existing beginning resolved (no `..`,
/// no symlink), the names below it, which do not exist yet, as given.
/// A path compared with the workspace before it is made is compared as
/// it will be, not as it is spelled (`ws/../st` is beside `ws`).
fn resolved(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = p;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest
                .iter()
                .rev()
                .fold(real, |acc: PathBuf, name| acc.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// Refuses a state directory that the sandbox could reach: inside the
/// workspace or any directory bound into the sandbox (`binds`: the
/// `--rw` and the `--ro` ones, since what is bound read-only can still be
/// read inside), or holding the workspace.
pub fn check_outside(state: &Path, workspace: &Path, binds: &[PathBuf]) -> Result<(), StateError> {
    let (state_c, ws) = (resolved(state), resolved(workspace));
    if state_c.starts_with(&ws) || ws.starts_with(&state_c) {
        return Err(StateError::InsideSandbox {
            state: state.to_path_buf(),
            inside: workspace.to_path_buf(),
        });
    }
    let mut reachable = binds.to_vec();
    reachable.push(workspace.to_path_buf());
    if let Ok(Some(inside)) = hako_fence::placement::writable_dir_holding(&state_c, &reachable) {
        return Err(StateError::InsideSandbox {
            state: state.to_path_buf(),
            inside,
        });
    }
    Ok(())
}

/// Refuses a bind that holds the workspace or lies inside it (see
/// [`StateError::BindOverlapsWorkspace`]): every path of the workspace
/// must reach the sandbox through the layered view only.
pub fn check_binds_apart(workspace: &Path, binds: &[PathBuf]) -> Result<(), StateError> {
    let ws = resolved(workspace);
    for bind in binds {
        let b = resolved(bind);
        if b.starts_with(&ws) || ws.starts_with(&b) {
            return Err(StateError::BindOverlapsWorkspace {
                bind: bind.clone(),
                workspace: workspace.to_path_buf(),
            });
        }
    }
    Ok(())
}

fn lock(dir: &Path, name: &str) -> Result<File, StateError> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc_nofollow())
        .open(&path)
        .map_err(io_err("open", &path))?;
    match rfs::flock(&file, rfs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(Errno::WOULDBLOCK) => Err(StateError::Busy {
            name: name.to_owned(),
        }),
        Err(e) => Err(io_err("lock", &path)(e.into())),
    }
}

fn libc_nofollow() -> i32 {
    OFlags::NOFOLLOW.bits() as i32
}

impl State {
    /// Makes the state of a new sandbox `name` under `root`, or opens the
    /// existing one (a second run continues on its layers); either way it
    /// must be private and outside the workspace and every directory bound
    /// into the sandbox (`binds`: `--rw` and `--ro`), and an
    /// existing one must be based on this workspace.
    pub fn create(
        root: &Path,
        name: &str,
        workspace: &Path,
        binds: &[PathBuf],
    ) -> Result<State, StateError> {
        validate_name(name)?;
        check_binds_apart(workspace, binds)?;
        // Checked before anything is made, and again once it exists (when
        // every link on the way can be resolved).
        check_outside(root, workspace, binds)?;
        if let Some(parent) = root.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        }
        private_dir(root)?;
        check_outside(root, workspace, binds)?;
        // The layers' paths, which a backend hands on (overlayfs options,
        // an engine's volume) and checks against the workspace, as they
        // really are: no `..`, no symlink on the way.
        let root = std::fs::canonicalize(root).map_err(io_err("resolve", root))?;
        let dir = root.join(name);
        private_dir(&dir)?;
        let lock = lock(&dir, name)?;
        let state = State {
            name: name.to_owned(),
            dir,
            _lock: Some(lock),
        };
        for sub in ["upper", "work"] {
            private_dir(&state.dir.join(sub))?;
        }
        if state.base_path().exists() {
            state.workspace()?;
            return Ok(state);
        }
        let since = state.base_time()?;
        let ws = std::fs::canonicalize(workspace).map_err(io_err("resolve", workspace))?;
        let meta = std::fs::metadata(&ws).map_err(io_err("stat", &ws))?;
        let base = Base {
            version: 1,
            workspace: ws,
            dev: meta.dev(),
            ino: meta.ino(),
            since,
            written: BTreeMap::new(),
        };
        state.save_base(&base)?;
        Ok(state)
    }

    /// Makes the `created` file and returns the base time: the change
    /// time of that file once the kernel's (coarse) clock has moved past
    /// the tick in which it was made, so that every entry changed before
    /// this call has an earlier change time and every entry changed after
    /// it a later or equal one (at most one clock tick of waiting).
    fn base_time(&self) -> Result<Time, StateError> {
        let created = self.dir.join("created");
        File::create(&created).map_err(io_err("create", &created))?;
        let ctime_of = |p: &Path| -> Result<Time, StateError> {
            let m = std::fs::symlink_metadata(p).map_err(io_err("stat", p))?;
            Ok(Time {
                sec: m.ctime(),
                nsec: m.ctime_nsec(),
            })
        };
        let first = ctime_of(&created)?;
        for _ in 0..10_000 {
            // A change of mode moves the change time to the clock's now.
            std::fs::set_permissions(&created, std::fs::Permissions::from_mode(0o600))
                .map_err(io_err("chmod", &created))?;
            let now = ctime_of(&created)?;
            if now > first {
                return Ok(now);
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        Err(StateError::Io {
            op: "wait for the clock to move past",
            path: created,
            source: std::io::Error::from(std::io::ErrorKind::TimedOut),
        })
    }

    /// Opens the existing sandbox `name` under `root`, locked: no run
    /// and no other commit, discard or removal uses it meanwhile.
    pub fn open(root: &Path, name: &str) -> Result<State, StateError> {
        State::open_with(root, name, true)
    }

    /// Opens the existing sandbox `name` under `root` to read it only
    /// (`hako diff`, which may look while a run goes on: what it shows
    /// is committed only if nothing changed since, by `--expect`).
    pub fn open_to_read(root: &Path, name: &str) -> Result<State, StateError> {
        State::open_with(root, name, false)
    }

    fn open_with(root: &Path, name: &str, locked: bool) -> Result<State, StateError> {
        validate_name(name)?;
        let dir = root.join(name);
        if !dir.join("base.json").exists() {
            return Err(StateError::NoSuchSandbox {
                name: name.to_owned(),
                root: root.to_path_buf(),
            });
        }
        private_dir(root)?;
        private_dir(&dir)?;
        let lock = if locked {
            Some(lock(&dir, name)?)
        } else {
            None
        };
        Ok(State {
            name: name.to_owned(),
            dir,
            _lock: lock,
        })
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The upper layer.
    pub fn upper(&self) -> PathBuf {
        self.dir.join("upper")
    }

    /// overlayfs's work directory (same file system as the upper layer).
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    fn base_path(&self) -> PathBuf {
        self.dir.join("base.json")
    }

    /// The base record.
    pub fn base(&self) -> Result<Base, StateError> {
        let path = self.base_path();
        let bad = |why: String| StateError::BadBase {
            path: path.clone(),
            why,
        };
        let text = std::fs::read(&path).map_err(io_err("read", &path))?;
        let base: Base = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if base.version != 1 {
            return Err(bad(format!(
                "version {} is not one this hako reads",
                base.version
            )));
        }
        Ok(base)
    }

    /// Writes the base record atomically.
    pub fn save_base(&self, base: &Base) -> Result<(), StateError> {
        let path = self.base_path();
        let text = serde_json::to_vec_pretty(base).map_err(|e| StateError::BadBase {
            path: path.clone(),
            why: e.to_string(),
        })?;
        let tmp = self.dir.join("base.json.tmp");
        std::fs::write(&tmp, text).map_err(io_err("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))
    }

    /// The workspace the sandbox is based on, checked to be the same
    /// directory (device and inode) as when it was made.
    pub fn workspace(&self) -> Result<PathBuf, StateError> {
        let base = self.base()?;
        let moved = |why| StateError::WorkspaceMoved {
            name: self.name.clone(),
            workspace: base.workspace.clone(),
            why,
        };
        let meta = std::fs::metadata(&base.workspace).map_err(|_| moved("gone"))?;
        if (meta.dev(), meta.ino()) != (base.dev, base.ino) {
            return Err(moved("another directory now"));
        }
        Ok(base.workspace)
    }

    /// Removes the sandbox's state, layers and all.
    pub fn remove(self) -> Result<(), StateError> {
        // overlayfs leaves `work/work` with mode 000: open it up first.
        for sub in ["work/work", "work/index"] {
            let p = self.dir.join(sub);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                let _ = rfs::chmodat(rfs::CWD, &p, Mode::from_raw_mode(0o700), AtFlags::empty());
            }
        }
        std::fs::remove_dir_all(&self.dir).map_err(io_err("remove", &self.dir))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_state_directory_named_through_the_workspace_and_dot_dot_gives_layers_beside_it() {
        // `--state ../st` from the workspace: lexically beneath it, really
        // beside it. The layers' paths are the real ones, so a backend's
        // check that they lie outside the workspace does not refuse them.
        let top = tempfile::tempdir().unwrap();
        let ws = top.path().canonicalize().unwrap().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let state = State::create(&ws.join("../st"), "n", &ws, &[]).unwrap();
        assert!(!state.upper().starts_with(&ws), "{:?}", state.upper());
        assert_eq!(state.upper(), std::fs::canonicalize(state.upper()).unwrap());
    }

    #[test]
    fn names_are_plain_and_bounded() {
        for good in ["fix-1", "a", "A.b_c", &"x".repeat(MAX_NAME)] {
            validate_name(good).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "-x",
            "a b",
            &"x".repeat(MAX_NAME + 1),
            "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_state_dir_inside_the_workspace_or_a_bind_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        let rw = tempfile::tempdir().unwrap();
        let err = State::create(&ws.path().join(".state"), "n", ws.path(), &[]).unwrap_err();
        assert!(matches!(err, StateError::InsideSandbox { .. }), "{err}");
        let err = State::create(
            &rw.path().join("s"),
            "n",
            ws.path(),
            &[rw.path().to_path_buf()],
        )
        .unwrap_err();
        assert!(matches!(err, StateError::InsideSandbox { .. }), "{err}");
    }

    #[test]
    fn state_is_private_locked_and_based_on_its_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let st = tempfile::tempdir().unwrap();
        let root = st.path().join("hako");
        let state = State::create(&root, "n", ws.path(), &[]).unwrap();
        let mode = std::fs::metadata(state.dir()).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        assert!(state.upper().is_dir() && state.work().is_dir());
        assert_eq!(
            state.workspace().unwrap(),
            std::fs::canonicalize(ws.path()).unwrap()
        );
        let busy = State::open(&root, "n").unwrap_err();
        assert!(matches!(busy, StateError::Busy { .. }), "{busy}");
        drop(state);
        let state = State::open(&root, "n").unwrap();
        state.remove().unwrap();
        assert!(matches!(
            State::open(&root, "n").unwrap_err(),
            StateError::NoSuchSandbox { .. }
        ));
    }

    #[test]
    fn a_state_dir_others_can_enter_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        let st = tempfile::tempdir().unwrap();
        let root = st.path().join("hako");
        drop(State::create(&root, "n", ws.path(), &[]).unwrap());
        std::fs::set_permissions(
            root.join("n"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let err = State::open(&root, "n").unwrap_err();
        assert!(matches!(err, StateError::NotPrivate { .. }), "{err}");
    }
}
