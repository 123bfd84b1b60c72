//! The review engine's tests: layers made by hand in overlayfs's format
//! (`engine`, `attacks`), and by a real overlayfs mount (`overlay`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod attacks;
mod checkpoints;
mod engine;
mod overlay;

use std::path::{Path, PathBuf};

use hako_layers::state::State;
use hako_layers::{Change, Layers};
use hako_sys::rustix::fs::{self as rfs, FileType, Mode};

/// A workspace, a state directory beside it and a named sandbox on them.
pub struct Fixture {
    pub ws: tempfile::TempDir,
    pub state_root: tempfile::TempDir,
    pub state: Option<State>,
}

impl Fixture {
    /// A fixture whose workspace is made by `lower` before the sandbox is.
    pub fn new(lower: impl FnOnce(&Path)) -> Fixture {
        let ws = tempfile::tempdir().unwrap();
        lower(ws.path());
        let state_root = tempfile::tempdir().unwrap();
        let state = State::create(&state_root.path().join("hako"), "t", ws.path(), &[]).unwrap();
        Fixture {
            ws,
            state_root,
            state: Some(state),
        }
    }

    pub fn state(&self) -> &State {
        self.state.as_ref().unwrap()
    }

    pub fn ws(&self) -> &Path {
        self.ws.path()
    }

    pub fn upper(&self) -> PathBuf {
        self.state().upper()
    }

    pub fn layers(&self) -> Layers {
        Layers::open(self.ws(), &self.upper()).unwrap()
    }

    pub fn changes(&self) -> Vec<Change> {
        self.layers().changes().unwrap()
    }

    /// Commits `paths` (all when empty), saving the base.
    pub fn commit(
        &self,
        paths: &[&str],
        expect: Option<&str>,
    ) -> Result<hako_layers::CommitReport, hako_layers::CommitError> {
        let mut base = self.state().base().unwrap();
        let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        let result = hako_layers::commit(&self.layers(), &mut base, &paths, expect);
        self.state().save_base(&base).unwrap();
        result
    }
}

/// A whiteout (character device 0/0) at `path`.
pub fn whiteout(path: &Path) {
    rfs::mknodat(rfs::CWD, path, FileType::CharacterDevice, Mode::empty(), 0).unwrap();
}

/// Marks the directory `path` opaque, as an unprivileged overlay does.
pub fn opaque(path: &Path) {
    rfs::setxattr(path, "user.overlay.opaque", b"y", rfs::XattrFlags::empty()).unwrap();
}

/// Writes a file, making its parents.
pub fn put(path: &Path, data: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// Every entry beneath `root` with its kind and content, for comparing
/// two trees.
pub fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                out.push((
                    rel,
                    format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                ));
            } else if meta.is_dir() {
                out.push((rel, format!("dir {mode:o}")));
                walk(root, &p, out);
            } else {
                let data = std::fs::read(&p).unwrap();
                out.push((rel, format!("{mode:o} {}", String::from_utf8_lossy(&data))));
            }
        }
    }
    walk(root, root, &mut out);
    out
}
