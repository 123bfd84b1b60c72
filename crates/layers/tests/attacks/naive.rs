//! The broken twin: a commit that copies the upper layer onto the
//! workspace with path-based calls that follow whatever they find, as a
//! first attempt might. The attack cases must catch it, so that a case
//! that cannot fail is found at once.

use std::path::Path;

use crate::Fixture;

/// Copies `paths` (everything when empty) of the upper layer onto the
/// workspace, following symlinks, and applies whiteouts by path.
pub fn commit(f: &Fixture, paths: &[&str]) {
    let upper = f.upper();
    walk(&upper, &upper, f.ws(), paths);
}

fn walk(root: &Path, dir: &Path, ws: &Path, paths: &[&str]) {
    use std::os::unix::fs::FileTypeExt;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let rel = entry.path().strip_prefix(root).unwrap().to_path_buf();
        let kind = entry.file_type().unwrap();
        let wanted = paths.is_empty() || paths.iter().any(|p| rel.starts_with(p));
        let to = ws.join(&rel);
        if kind.is_dir() {
            let _ = std::fs::create_dir_all(&to);
            walk(root, &entry.path(), ws, paths);
        } else if !wanted {
        } else if kind.is_char_device() {
            // A whiteout: remove by path (following a symlink above it).
            let _ = std::fs::remove_file(&to).or_else(|_| std::fs::remove_dir_all(&to));
        } else if kind.is_symlink() {
            let _ = std::fs::remove_file(&to);
            let _ = std::os::unix::fs::symlink(std::fs::read_link(entry.path()).unwrap(), &to);
        } else {
            let _ = std::fs::write(&to, std::fs::read(entry.path()).unwrap());
        }
    }
}
