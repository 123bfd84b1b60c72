//! The socket directories of proxies whose hako process is gone (killed
//! with `kill -9`, so its proxy never shut down): found by the owner each
//! directory's name carries, and removed.

use std::path::{Path, PathBuf};

/// Every proxy directory starts so, then `PID-START-` of its owner.
pub(crate) const DIR_PREFIX: &str = "hako-net-";

/// The prefix of this process's proxy directories.
pub(crate) fn own_prefix() -> String {
    let pid = std::process::id();
    let start = hako_sys::proc::start_time(pid).unwrap_or(0);
    format!("{DIR_PREFIX}{pid}-{start}-")
}

/// Whether the directory `name` belongs to a process that no longer runs.
fn is_stale(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
        return false;
    };
    let mut parts = rest.splitn(3, '-');
    let (Some(pid), Some(start), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    match hako_sys::proc::start_time(pid) {
        None => true,
        Some(now) => start != 0 && now != start,
    }
}

/// Removes the proxy directories in `parent` (the system's temporary
/// directory when `None`) whose hako process no longer runs; returns them.
pub fn remove_stale_dirs(parent: Option<&Path>) -> Vec<PathBuf> {
    let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Only directories (never follow a symlink someone planted there)
        // of this user.
        let ours = entry.metadata().is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == rustix::process::geteuid().as_raw()
        });
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || !ours || !is_stale(name) {
            continue;
        }
        // A proxy that still answers is alive, whatever its pid says (a
        // process of another pid namespace sharing this directory).
        if std::os::unix::net::UnixStream::connect(entry.path().join(crate::SOCKET_NAME)).is_ok() {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed.push(entry.path()),
            Err(e) => tracing::warn!("removing a stale proxy directory {name}: {e}"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn only_directories_of_processes_that_are_gone_are_removed() {
        let parent = tempfile::tempdir().unwrap();
        let mine = parent.path().join(format!("{}abc", own_prefix()));
        // Pid 2^22 + 1 is above the kernel's largest pid: it never runs.
        let gone = parent.path().join(format!("{DIR_PREFIX}4194305-77-xyz"));
        let other = parent.path().join("hako-net-not-ours");
        let file = parent.path().join(format!("{DIR_PREFIX}4194305-77-file"));
        for d in [&mine, &gone, &other] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(gone.join("proxy.sock"), b"").unwrap();
        std::fs::write(&file, b"").unwrap();
        // A "gone" owner whose proxy still answers is left alone.
        let answering = parent.path().join(format!("{DIR_PREFIX}4194305-78-live"));
        std::fs::create_dir(&answering).unwrap();
        let _listener =
            std::os::unix::net::UnixListener::bind(answering.join(crate::SOCKET_NAME)).unwrap();
        let removed = remove_stale_dirs(Some(parent.path()));
        assert_eq!(removed, vec![gone.clone()]);
        assert!(answering.exists());
        assert!(mine.exists() && other.exists() && file.exists() && !gone.exists());
    }
}
