//! Whether a host path lies where a sandbox can write: for files hako
//! reads or writes with the user's full rights and that a command inside
//! must not be able to replace between two runs (the audit log, a
//! profile). Compared by path, with every link resolved, and by identity:
//! a directory can be reached under two paths (a bind mount of it
//! elsewhere), so each directory above the file, up to the root, is also
//! compared by device and inode.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The directory of `writable` that holds `path`, if one does: `path`
/// itself is taken as the directory entry it names (its directory
/// resolved, its last component not), and, where it exists, as the file
/// it leads to. A directory of `writable` that cannot be resolved is
/// compared as given. Errors only when `path`'s directory cannot be
/// resolved.
pub fn writable_dir_holding(path: &Path, writable: &[PathBuf]) -> io::Result<Option<PathBuf>> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(parent)?;
    let entry = match path.file_name() {
        Some(name) => dir.join(name),
        None => dir.clone(),
    };
    let resolved = std::fs::canonicalize(path).ok();
    let mut above: Vec<(u64, u64)> = dir.ancestors().filter_map(identity).collect();
    if let Some(target) = &resolved {
        above.extend(target.ancestors().skip(1).filter_map(identity));
    }
    for w in writable {
        let w = std::fs::canonicalize(w).unwrap_or_else(|_| w.clone());
        let by_path = entry.starts_with(&w) || resolved.as_ref().is_some_and(|t| t.starts_with(&w));
        let by_identity = identity(&w).is_some_and(|id| above.contains(&id));
        if by_path || by_identity {
            return Ok(Some(w));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_path_beneath_a_writable_directory_is_found_whatever_its_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        let writable = [ws.clone()];
        let canonical = std::fs::canonicalize(&ws).unwrap();
        for path in [
            ws.join("a.toml"),
            ws.join("sub/../a.toml"),
            ws.join("sub/a.toml"),
        ] {
            assert_eq!(
                writable_dir_holding(&path, &writable).unwrap(),
                Some(canonical.clone()),
                "{}",
                path.display()
            );
        }
        // Through a link from outside.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&ws, &link).unwrap();
        assert!(writable_dir_holding(&link.join("a"), &writable)
            .unwrap()
            .is_some());
        // A link outside that leads to a file inside.
        std::fs::write(ws.join("real.toml"), "").unwrap();
        let to_inside = tmp.path().join("profile.toml");
        std::os::unix::fs::symlink(ws.join("real.toml"), &to_inside).unwrap();
        assert!(writable_dir_holding(&to_inside, &writable)
            .unwrap()
            .is_some());
        // Beside it is not beneath it.
        assert_eq!(
            writable_dir_holding(&tmp.path().join("ws2.toml"), &writable).unwrap(),
            None
        );
    }
}
