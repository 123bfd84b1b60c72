//! hako's private directory: where the container backends keep what they
//! write on the host (gVisor bundles with their `runsc` state, seccomp
//! profiles), out of other local users' reach.
//!
//! The system's temporary directory is shared: any user can make an entry
//! there with a name hako uses, and hako, run as root, would act on it
//! (`hako gc` ran `runsc --root <entry>/state delete --force` on a planted
//! bundle). So hako keeps its state in a directory only its user can
//! enter:
//!
//! - `$XDG_RUNTIME_DIR/hako` when `XDG_RUNTIME_DIR` is an absolute path to
//!   a real directory (not a symlink) that the effective user owns, with
//!   no permission bit for group or others (as logind makes
//!   `/run/user/UID`; under `sudo` it names the invoking user's directory,
//!   which root does not own, and is passed over);
//! - else, for root, `/run/hako-0` (`/run` is root's alone, so no other
//!   user can make the directory first);
//! - else `hako-EUID` in the temporary directory (`$TMPDIR`, else `/tmp`),
//!   which must be sticky if others may write to it (else they could
//!   rename hako's directory away and put theirs in its place).
//!
//! Missing, it is created with mode 0700. Found already there, it must be
//! a real directory (looked at with `lstat`: a symlink is never followed),
//! owned by the effective uid, with no permission bit for group or others;
//! anything else is refused with a [`PrivateDirError`] naming the path and
//! what is wrong, never repaired and never used. Nobody but the user (and
//! root) can then add, rename or remove anything in it; still, what hako
//! finds there is checked again ([`unfit`]) before it acts on it.

use std::fmt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The variable naming the user's runtime directory.
pub const RUNTIME_DIR_VAR: &str = "XDG_RUNTIME_DIR";

/// What makes a path unfit for hako to keep state in or act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// It is a symlink (never followed).
    Symlink,
    /// It is not a directory.
    WrongType,
    /// It is not a regular file (where one is expected).
    NotAFile,
    /// Another user owns it.
    Owner {
        /// Its owner.
        uid: u32,
        /// The effective uid of this process.
        euid: u32,
    },
    /// Group or others have some permission on it.
    OpenToOthers {
        /// Its permission bits.
        mode: u32,
    },
    /// Others may write to it and it is not sticky (the parent of hako's
    /// directory in the temporary directory).
    SharedWithoutStickyBit {
        /// Its permission bits.
        mode: u32,
    },
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::Symlink => write!(f, "it is a symlink"),
            Unfit::WrongType => write!(f, "it is not a directory"),
            Unfit::NotAFile => write!(f, "it is not a regular file"),
            Unfit::Owner { uid, euid } => {
                write!(f, "it is owned by uid {uid}, not by this user (uid {euid})")
            }
            Unfit::OpenToOthers { mode } => write!(
                f,
                "its mode {mode:04o} gives group or others access (it must be 0700)"
            ),
            Unfit::SharedWithoutStickyBit { mode } => write!(
                f,
                "its mode {mode:04o} lets others write to it without the sticky bit"
            ),
        }
    }
}

/// hako's private directory could not be made or is not fit to use.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// Creating it failed.
    #[error("cannot create hako's private directory {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Looking at it (or at the temporary directory it is made in) failed.
    #[error("cannot inspect {path} (for hako's private directory): {source}")]
    Inspect {
        /// The path looked at.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// It (or the temporary directory it is made in) exists and is not fit:
    /// hako neither uses nor repairs it.
    #[error("refused {path} as hako's private directory: {unfit}; hint: hako makes it itself, a real directory of this user's with mode 0700: if you made it, remove it or `chmod 700` it; if another user did, have root remove it; or set {RUNTIME_DIR_VAR} to a directory of yours with mode 0700")]
    Refused {
        /// The path refused.
        path: PathBuf,
        /// What is wrong with it.
        unfit: Unfit,
    },
}

impl From<PrivateDirError> for hako_core::Error {
    fn from(e: PrivateDirError) -> Self {
        hako_core::Error::Io {
            op: "prepare hako's private directory",
            source: std::io::Error::other(e),
        }
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    hako_sys::rustix::process::geteuid().as_raw()
}

/// What is wrong, if anything, with a directory of hako's that `meta`
/// (from `lstat`, never `stat`) describes: it must be a real directory
/// owned by `euid` with no permission bit for group or others.
pub fn unfit(meta: &std::fs::Metadata, euid: u32) -> Option<Unfit> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        Some(Unfit::Symlink)
    } else if !kind.is_dir() {
        Some(Unfit::WrongType)
    } else if meta.uid() != euid {
        Some(Unfit::Owner {
            uid: meta.uid(),
            euid,
        })
    } else if meta.mode() & 0o077 != 0 {
        Some(Unfit::OpenToOthers {
            mode: meta.mode() & 0o7777,
        })
    } else {
        None
    }
}

/// As [`unfit`], for the directory at `path` (looked at with `lstat`).
pub fn check_dir(path: &Path) -> std::io::Result<Option<Unfit>> {
    Ok(unfit(&std::fs::symlink_metadata(path)?, euid()))
}

/// hako's private directory (see the module's documentation), created if
/// missing; an error if what is there is not fit.
pub fn private_dir() -> Result<PathBuf, PrivateDirError> {
    let runtime = std::env::var_os(RUNTIME_DIR_VAR).map(PathBuf::from);
    let temp = root_run_dir().unwrap_or_else(std::env::temp_dir);
    private_dir_at(runtime.as_deref(), &temp)
}

/// For root: `/run`, when it is a directory only root may write. There no
/// other user can make `hako-0` first (in `/tmp` anyone could, and root's
/// container backends would then refuse to start: safe, but a denial of
/// service any local user could cause).
fn root_run_dir() -> Option<PathBuf> {
    if euid() != 0 {
        return None;
    }
    let meta = std::fs::symlink_metadata("/run").ok()?;
    (meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o022 == 0).then(|| PathBuf::from("/run"))
}

/// [`private_dir`] given the runtime directory (`$XDG_RUNTIME_DIR`) and
/// the temporary directory.
pub fn private_dir_at(runtime: Option<&Path>, temp: &Path) -> Result<PathBuf, PrivateDirError> {
    let euid = euid();
    let runtime = runtime.filter(|dir| {
        dir.is_absolute()
            && std::fs::symlink_metadata(dir).is_ok_and(|meta| unfit(&meta, euid).is_none())
    });
    let path = match runtime {
        Some(dir) => dir.join("hako"),
        None => {
            // The temporary directory may itself be a symlink (it is the
            // system's choice, not a name another user controls); what
            // matters is that nobody else can swap entries in it.
            let meta = std::fs::metadata(temp).map_err(|source| PrivateDirError::Inspect {
                path: temp.to_path_buf(),
                source,
            })?;
            let unfit_parent = if !meta.is_dir() {
                Some(Unfit::WrongType)
            } else if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
                Some(Unfit::SharedWithoutStickyBit {
                    mode: meta.mode() & 0o7777,
                })
            } else {
                None
            };
            if let Some(unfit) = unfit_parent {
                return Err(PrivateDirError::Refused {
                    path: temp.to_path_buf(),
                    unfit,
                });
            }
            temp.join(format!("hako-{euid}"))
        }
    };
    // `mkdir` never follows a symlink in the last component: one planted
    // there makes it fail with `EEXIST`, and the check below refuses it.
    match std::fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(PrivateDirError::Create { path, source }),
    }
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(source) => return Err(PrivateDirError::Inspect { path, source }),
    };
    match unfit(&meta, euid) {
        None => Ok(path),
        Some(unfit) => Err(PrivateDirError::Refused { path, unfit }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A temporary directory laid out like `/tmp` (sticky, open to all).
    fn shared_tmp() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        chmod(tmp.path(), 0o1777);
        tmp
    }

    fn refused(result: Result<PathBuf, PrivateDirError>) -> (PathBuf, Unfit) {
        match result {
            Err(PrivateDirError::Refused { path, unfit }) => (path, unfit),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn the_private_directory_is_made_with_mode_0700_and_found_again() {
        let tmp = shared_tmp();
        let dir = private_dir_at(None, tmp.path()).unwrap();
        assert_eq!(dir, tmp.path().join(format!("hako-{}", euid())));
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o777, 0o700);
        assert_eq!(private_dir_at(None, tmp.path()).unwrap(), dir);
    }

    #[test]
    fn a_state_directory_planted_as_a_symlink_is_refused() {
        let tmp = shared_tmp();
        // Planted by someone who wants hako's bundles (and the runsc state
        // in them) in a directory of theirs.
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        chmod(&theirs, 0o700);
        let planted = tmp.path().join(format!("hako-{}", euid()));
        std::os::unix::fs::symlink(&theirs, &planted).unwrap();
        let (path, unfit) = refused(private_dir_at(None, tmp.path()));
        assert_eq!((path, unfit), (planted.clone(), Unfit::Symlink));
        let message = refused_message(private_dir_at(None, tmp.path()));
        assert!(
            message.contains(&planted.display().to_string()),
            "{message}"
        );
        assert!(message.contains("symlink"), "{message}");
        // Nothing was made through it.
        assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
        // The same under a runtime directory.
        let runtime = tempfile::tempdir().unwrap();
        chmod(runtime.path(), 0o700);
        std::os::unix::fs::symlink(&theirs, runtime.path().join("hako")).unwrap();
        let (path, unfit) = refused(private_dir_at(Some(runtime.path()), tmp.path()));
        assert_eq!((path, unfit), (runtime.path().join("hako"), Unfit::Symlink));
    }

    fn refused_message(result: Result<PathBuf, PrivateDirError>) -> String {
        result.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn a_state_directory_writable_by_others_is_refused() {
        let tmp = shared_tmp();
        let dir = tmp.path().join(format!("hako-{}", euid()));
        std::fs::create_dir(&dir).unwrap();
        for mode in [0o777, 0o770, 0o755, 0o701] {
            chmod(&dir, mode);
            let (path, unfit) = refused(private_dir_at(None, tmp.path()));
            assert_eq!((path, unfit), (dir.clone(), Unfit::OpenToOthers { mode }));
        }
        // Not repaired: the user decides.
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o701);
        chmod(&dir, 0o700);
        assert_eq!(private_dir_at(None, tmp.path()).unwrap(), dir);
        // A file in its place is refused too.
        let other = shared_tmp();
        std::fs::write(other.path().join(format!("hako-{}", euid())), b"").unwrap();
        assert_eq!(
            refused(private_dir_at(None, other.path())).1,
            Unfit::WrongType
        );
    }

    #[test]
    fn a_temporary_directory_others_can_write_without_the_sticky_bit_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        chmod(tmp.path(), 0o777);
        let (path, unfit) = refused(private_dir_at(None, tmp.path()));
        assert_eq!(
            (path, unfit),
            (
                tmp.path().to_path_buf(),
                Unfit::SharedWithoutStickyBit { mode: 0o777 }
            )
        );
        chmod(tmp.path(), 0o700);
        assert!(private_dir_at(None, tmp.path()).is_ok());
    }

    #[test]
    fn the_runtime_directory_is_used_only_when_it_is_the_users_alone() {
        let tmp = shared_tmp();
        let runtime = tempfile::tempdir().unwrap();
        chmod(runtime.path(), 0o700);
        let dir = private_dir_at(Some(runtime.path()), tmp.path()).unwrap();
        assert_eq!(dir, runtime.path().join("hako"));
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Open to others, relative, or a symlink: the temporary directory.
        let fallback = tmp.path().join(format!("hako-{}", euid()));
        let open = tempfile::tempdir().unwrap();
        chmod(open.path(), 0o755);
        let link = tmp.path().join("runtime-link");
        std::os::unix::fs::symlink(runtime.path(), &link).unwrap();
        for runtime in [open.path(), Path::new("relative"), &link] {
            assert_eq!(
                private_dir_at(Some(runtime), tmp.path()).unwrap(),
                fallback,
                "{runtime:?}"
            );
        }
    }

    #[test]
    fn a_state_directory_owned_by_another_user_is_refused() {
        if !is_root("a_state_directory_owned_by_another_user_is_refused") {
            return;
        }
        let tmp = shared_tmp();
        let dir = tmp.path().join(format!("hako-{}", euid()));
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let (path, unfit) = refused(private_dir_at(None, tmp.path()));
        assert_eq!(
            (path, unfit),
            (
                dir,
                Unfit::Owner {
                    uid: 65534,
                    euid: euid()
                }
            )
        );
    }

    /// Whether this test runs as root; if not, says why it skips (a
    /// failure under `HAKO_MUST_WORK=1`).
    pub(crate) fn is_root(test: &str) -> bool {
        if euid() == 0 {
            return true;
        }
        let reason = "needs root to make a file another user owns";
        assert!(!hako_conformance::must_work(), "{test}: {reason}");
        eprintln!("SKIPPED {test}: {reason}");
        false
    }
}
