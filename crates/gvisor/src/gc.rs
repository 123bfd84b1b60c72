//! Removing what dead hako processes left behind: gVisor bundles whose
//! owners are gone.
//!
//! Bundles are looked for in hako's private directory only (see
//! `hako_container::private`), never in the shared temporary directory, and each
//! is checked before anything is done with it: the bundle and its `runsc`
//! state must be real directories (not symlinks) owned by this user with no
//! permission for group or others, and its `owner` file a regular file of
//! this user's. Anything else is skipped and reported, never followed,
//! removed, or handed to `runsc`.

use std::io::Read;
use std::path::{Path, PathBuf};

use hako_container::private::{self, PrivateDirError, Unfit};
use hako_container::runner::Runner;
use hako_container::Owner;

use crate::host_view;

/// Prefix of every gVisor bundle directory (followed by the owner's pid).
pub const BUNDLE_PREFIX: &str = "hako-gvisor-";

/// Longest `owner` file read (a line per owner, two at most in practice).
const OWNER_FILE_CAP: u64 = 4096;

/// An entry named like a bundle that hako does not act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} is not hako's to act on: {unfit}")]
pub struct NotOurs {
    /// The entry (the bundle, its `state` or its `owner` file).
    pub path: PathBuf,
    /// What is wrong with it.
    pub unfit: Unfit,
}

/// Removing a bundle failed.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// It, or something in it, is not fit to act on: nothing was done.
    #[error(transparent)]
    NotOurs(#[from] NotOurs),
    /// Looking at it failed.
    #[error("inspecting {path}: {source}")]
    Inspect {
        /// What was looked at.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Removing it failed.
    #[error("removing {path}: {source}")]
    Remove {
        /// The bundle.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What a look at the bundles found.
#[derive(Debug, Default)]
pub struct BundleScan {
    /// Bundles whose every owner (the hako process, and the cleaner it
    /// left) is gone.
    pub stale: Vec<PathBuf>,
    /// Entries named like bundles that hako does not act on, and why.
    pub skipped: Vec<NotOurs>,
}

/// What collecting the bundles did.
#[derive(Debug, Default)]
pub struct BundleReport {
    /// Stale bundles removed.
    pub removed: Vec<PathBuf>,
    /// Entries not acted on, and why.
    pub skipped: Vec<NotOurs>,
    /// Stale bundles that could not be removed.
    pub failed: Vec<BundleError>,
}

/// Whether `meta` (from `lstat` or `fstat`) is a regular file of `euid`'s.
fn unfit_file(meta: &std::fs::Metadata, euid: u32) -> Option<Unfit> {
    use std::os::unix::fs::MetadataExt;
    if meta.file_type().is_symlink() {
        Some(Unfit::Symlink)
    } else if !meta.is_file() {
        Some(Unfit::NotAFile)
    } else if meta.uid() != euid {
        Some(Unfit::Owner {
            uid: meta.uid(),
            euid,
        })
    } else {
        None
    }
}

/// The owners a bundle's `owner` file names: `Ok(None)` while there is
/// none (a bundle being made, or no bundle) or it is not one.
fn read_owners(bundle: &Path, euid: u32) -> std::result::Result<Option<Vec<Owner>>, NotOurs> {
    use hako_sys::rustix::fs::{Mode, OFlags};
    let path = bundle.join("owner");
    let not_ours = |unfit| NotOurs {
        path: path.clone(),
        unfit,
    };
    // Opened without following a symlink, and without blocking on a FIFO;
    // then what was opened is checked.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = match hako_sys::rustix::fs::open(&path, flags, Mode::empty()) {
        Ok(fd) => std::fs::File::from(fd),
        Err(hako_sys::rustix::io::Errno::LOOP) => return Err(not_ours(Unfit::Symlink)),
        Err(_) => return Ok(None),
    };
    let Ok(meta) = file.metadata() else {
        return Ok(None);
    };
    if let Some(unfit) = unfit_file(&meta, euid) {
        return Err(not_ours(unfit));
    }
    let mut text = String::new();
    if file.take(OWNER_FILE_CAP).read_to_string(&mut text).is_err() {
        return Ok(None);
    }
    Ok(owners(&text))
}

/// The owners a bundle's `owner` file names, a `pid start` pair per line:
/// the hako process that wrote it, then any cleaner (see
/// `crate::host_view`). `None` for a file that is not one.
fn owners(text: &str) -> Option<Vec<Owner>> {
    let owners = host_view::parse_owners(text)?;
    Some(
        owners
            .into_iter()
            .map(|(pid, start)| Owner { pid, start })
            .collect(),
    )
}

/// Checks the bundle at `path` and its `state` before anything is done
/// with them; returns whether it has a `state`.
fn check_bundle(path: &Path, euid: u32) -> std::result::Result<bool, BundleError> {
    let inspect = |path: &Path| {
        std::fs::symlink_metadata(path).map_err(|source| BundleError::Inspect {
            path: path.to_path_buf(),
            source,
        })
    };
    if let Some(unfit) = private::unfit(&inspect(path)?, euid) {
        return Err(NotOurs {
            path: path.to_path_buf(),
            unfit,
        }
        .into());
    }
    let state = path.join("state");
    match std::fs::symlink_metadata(&state) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BundleError::Inspect {
            path: state,
            source,
        }),
        Ok(meta) => match private::unfit(&meta, euid) {
            Some(unfit) => Err(NotOurs { path: state, unfit }.into()),
            None => Ok(true),
        },
    }
}

/// The bundles in `dir` whose owners are gone, and the entries named like
/// bundles that are not fit to act on.
pub fn stale_bundles_in(dir: &Path) -> BundleScan {
    let euid = private::euid();
    let mut scan = BundleScan::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return scan;
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(BUNDLE_PREFIX))
        .map(|e| e.path())
        .collect();
    paths.sort();
    for path in paths {
        // The bundle itself first: nothing is read through a symlink or
        // from a directory another user could have filled.
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                if let Some(unfit) = private::unfit(&meta, euid) {
                    scan.skipped.push(NotOurs { path, unfit });
                    continue;
                }
            }
            // Removed meanwhile.
            Err(_) => continue,
        }
        let owners = match read_owners(&path, euid) {
            Ok(Some(owners)) => owners,
            Ok(None) => continue,
            Err(not_ours) => {
                scan.skipped.push(not_ours);
                continue;
            }
        };
        // Only once every owner (the hako process, and the cleaner it
        // left) is gone.
        if owners.iter().any(Owner::alive) {
            continue;
        }
        match check_bundle(&path, euid) {
            Ok(_) => scan.stale.push(path),
            Err(BundleError::NotOurs(not_ours)) => scan.skipped.push(not_ours),
            Err(e) => tracing::debug!("gvisor: not collecting {}: {e}", path.display()),
        }
    }
    scan
}

/// [`stale_bundles_in`] hako's private directory.
pub fn stale_bundles() -> std::result::Result<BundleScan, PrivateDirError> {
    Ok(stale_bundles_in(&private::private_dir()?))
}

/// Deletes any container left in the bundle's `runsc` state (with `runsc`
/// through `runner`), then the bundle; the bundle and its state are
/// checked first, and nothing is done with one that is not fit.
pub fn remove_bundle(
    runner: &dyn Runner,
    runsc: &Path,
    path: &Path,
) -> std::result::Result<(), BundleError> {
    if check_bundle(path, private::euid())? {
        let state = path.join("state");
        let root = |words: &[&str]| {
            [
                runsc.display().to_string(),
                "--root".into(),
                state.display().to_string(),
            ]
            .into_iter()
            .chain(words.iter().map(|w| w.to_string()))
            .collect::<Vec<_>>()
        };
        if let Ok(out) = runner.output(&root(&["list", "-q"])) {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = runner.output(&root(&["delete", "--force", id]));
            }
        }
    }
    // `remove_dir_all` never follows a symlink it meets inside.
    std::fs::remove_dir_all(path).map_err(|source| BundleError::Remove {
        path: path.to_path_buf(),
        source,
    })
}

/// Removes the stale bundles in `dir` (see [`remove_bundle`]).
pub fn collect_bundles_in(dir: &Path, runner: &dyn Runner, runsc: &Path) -> BundleReport {
    let scan = stale_bundles_in(dir);
    let mut report = BundleReport {
        skipped: scan.skipped,
        ..BundleReport::default()
    };
    for path in scan.stale {
        match remove_bundle(runner, runsc, &path) {
            Ok(()) => report.removed.push(path),
            Err(BundleError::NotOurs(not_ours)) => report.skipped.push(not_ours),
            Err(e) => report.failed.push(e),
        }
    }
    report
}

/// [`collect_bundles_in`] hako's private directory.
pub fn collect_bundles(
    runner: &dyn Runner,
    runsc: &Path,
) -> std::result::Result<BundleReport, PrivateDirError> {
    Ok(collect_bundles_in(&private::private_dir()?, runner, runsc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_container::runner::{Recorder, RunOutput};
    use std::os::unix::fs::DirBuilderExt;

    /// Pid 2^22 + 1 is above the kernel's largest pid: it never runs.
    const GONE: u32 = 4_194_305;

    fn mkdir_private(path: &Path) {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// A directory like hako's private one (mode 0700).
    fn private_tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    /// A bundle in `dir` as hako writes one, of a hako process that is
    /// gone: its `owner` file, and a `state` with something in it.
    fn bundle_in(dir: &Path, name: &str) -> PathBuf {
        let bundle = dir.join(name);
        mkdir_private(&bundle);
        std::fs::write(bundle.join("owner"), host_view::owner_line(GONE, 77))
            .unwrap_or_else(|e| panic!("{e}"));
        mkdir_private(&bundle.join("state"));
        std::fs::write(bundle.join("state/container"), b"x").unwrap_or_else(|e| panic!("{e}"));
        bundle
    }

    /// `runsc list` answering one container.
    fn runsc_with_a_container() -> Recorder {
        Recorder {
            script: vec![(
                vec!["list".into()],
                RunOutput {
                    success: true,
                    stdout: b"hako-1\n".to_vec(),
                    stderr: Vec::new(),
                },
            )],
            ..Recorder::default()
        }
    }

    #[test]
    fn a_bundle_of_this_user_whose_owners_are_gone_is_collected() {
        let dir = private_tmp();
        let bundle = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{GONE}-a"));
        // A live owner's bundle, and a bundle still being written (no
        // owner file yet), are left alone.
        let me = Owner::current();
        let live = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{}-b", me.pid));
        std::fs::write(live.join("owner"), host_view::owner_line(me.pid, me.start))
            .unwrap_or_else(|e| panic!("{e}"));
        let young = dir.path().join(format!("{BUNDLE_PREFIX}{GONE}-c"));
        mkdir_private(&young);
        let runner = runsc_with_a_container();
        let report = collect_bundles_in(dir.path(), &runner, Path::new("runsc"));
        assert_eq!(report.removed, std::slice::from_ref(&bundle));
        assert!(report.skipped.is_empty() && report.failed.is_empty());
        let state = bundle.join("state").display().to_string();
        assert_eq!(
            runner.calls(),
            [
                vec!["runsc", "--root", &state, "list", "-q"],
                vec!["runsc", "--root", &state, "delete", "--force", "hako-1"],
            ]
        );
        assert!(!bundle.exists() && live.exists() && young.exists());
    }

    /// Whether this test runs as root; if not, says why it skips (a
    /// failure under `HAKO_MUST_WORK=1`).
    fn is_root(test: &str) -> bool {
        if private::euid() == 0 {
            return true;
        }
        let reason = "needs root to make a file another user owns";
        assert!(!hako_conformance::must_work(), "{test}: {reason}");
        eprintln!("SKIPPED {test}: {reason}");
        false
    }

    #[test]
    fn a_bundle_planted_by_another_user_is_not_collected_by_gc() {
        if !is_root("a_bundle_planted_by_another_user_is_not_collected_by_gc") {
            return;
        }
        let dir = private_tmp();
        // Everything as hako would write it, dead owners and a `state` to
        // hand to `runsc --root`, but another user's.
        let planted = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{GONE}-planted"));
        for path in ["", "owner", "state", "state/container"] {
            std::os::unix::fs::lchown(planted.join(path), Some(65534), Some(65534))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let runner = runsc_with_a_container();
        let report = collect_bundles_in(dir.path(), &runner, Path::new("runsc"));
        assert!(runner.calls().is_empty(), "{:?}", runner.calls());
        assert!(report.removed.is_empty() && report.failed.is_empty());
        assert_eq!(
            report.skipped,
            [NotOurs {
                path: planted.clone(),
                unfit: Unfit::Owner {
                    uid: 65534,
                    euid: 0
                }
            }]
        );
        assert!(planted.join("state/container").exists());
        // Asked to remove it by name, it refuses too.
        let err = remove_bundle(&runner, Path::new("runsc"), &planted).err();
        assert!(matches!(err, Some(BundleError::NotOurs(_))), "{err:?}");
        assert!(runner.calls().is_empty());
        assert!(planted.join("state/container").exists());
    }

    #[test]
    fn a_symlinked_bundle_is_not_followed_by_gc() {
        let dir = private_tmp();
        let elsewhere = private_tmp();
        let target = bundle_in(elsewhere.path(), "target");
        let link = dir.path().join(format!("{BUNDLE_PREFIX}{GONE}-link"));
        std::os::unix::fs::symlink(&target, &link).unwrap_or_else(|e| panic!("{e}"));
        let runner = runsc_with_a_container();
        let report = collect_bundles_in(dir.path(), &runner, Path::new("runsc"));
        assert!(runner.calls().is_empty(), "{:?}", runner.calls());
        assert!(report.removed.is_empty() && report.failed.is_empty());
        assert_eq!(
            report.skipped,
            [NotOurs {
                path: link.clone(),
                unfit: Unfit::Symlink
            }]
        );
        let err = remove_bundle(&runner, Path::new("runsc"), &link).err();
        assert!(matches!(err, Some(BundleError::NotOurs(_))), "{err:?}");
        assert!(runner.calls().is_empty());
        assert!(target.join("state/container").exists() && link.exists());
    }

    #[test]
    fn a_bundle_whose_state_or_owner_file_is_a_symlink_or_open_to_others_is_not_collected() {
        let dir = private_tmp();
        let elsewhere = private_tmp();
        let target = bundle_in(elsewhere.path(), "target");
        // `state` pointing at another state directory.
        let state_link = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{GONE}-a"));
        std::fs::remove_dir_all(state_link.join("state")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(target.join("state"), state_link.join("state"))
            .unwrap_or_else(|e| panic!("{e}"));
        // `owner` pointing at a file that names dead owners.
        let owner_link = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{GONE}-b"));
        std::fs::remove_file(owner_link.join("owner")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(target.join("owner"), owner_link.join("owner"))
            .unwrap_or_else(|e| panic!("{e}"));
        // A bundle others may write to.
        let open = bundle_in(dir.path(), &format!("{BUNDLE_PREFIX}{GONE}-c"));
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap_or_else(|e| panic!("{e}"));
        let runner = runsc_with_a_container();
        let report = collect_bundles_in(dir.path(), &runner, Path::new("runsc"));
        assert!(runner.calls().is_empty(), "{:?}", runner.calls());
        assert!(report.removed.is_empty() && report.failed.is_empty());
        assert_eq!(
            report.skipped,
            [
                NotOurs {
                    path: state_link.join("state"),
                    unfit: Unfit::Symlink
                },
                NotOurs {
                    path: owner_link.join("owner"),
                    unfit: Unfit::Symlink
                },
                NotOurs {
                    path: open.clone(),
                    unfit: Unfit::OpenToOthers { mode: 0o777 }
                },
            ]
        );
        assert!(target.join("state/container").exists());
        assert!(state_link.exists() && owner_link.exists() && open.exists());
    }

    #[test]
    fn a_bundle_is_stale_only_once_every_owner_is_gone() {
        let me = Owner::current();
        let dead = Owner {
            pid: u32::MAX - 1,
            start: 1,
        };
        let text = |o: &[&Owner]| {
            o.iter()
                .map(|o| host_view::owner_line(o.pid, o.start))
                .collect::<String>()
        };
        assert_eq!(owners(&text(&[&me])), Some(vec![me.clone()]));
        // The cleaner's line follows the writer's, after a blank line.
        let both = format!("{}\n{}", text(&[&dead]), text(&[&me]));
        let both = owners(&both).unwrap_or_default();
        assert_eq!(both, vec![dead.clone(), me.clone()]);
        assert!(!both.iter().all(|o| !o.alive()), "a live cleaner keeps it");
        assert!(owners(&text(&[&dead]))
            .unwrap_or_default()
            .iter()
            .all(|o| !o.alive()));
        for bad in ["", "12", "12 x", "12 3 4", "\n\n"] {
            assert_eq!(owners(bad), None, "{bad:?}");
        }
    }
}
