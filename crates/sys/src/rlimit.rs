//! This process's own resource limits (a sandbox's are set in
//! [`crate::confine`]).

use std::io;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// This process's soft limit on open descriptors before and after
/// [`raise_open_files_limit`] (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit it had.
    pub before: Option<u64>,
    /// The soft limit it has now: the hard limit.
    pub now: Option<u64>,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit.
///
/// The soft limit is usually 1024, kept low for programs that still use
/// `select(2)` (which cannot watch a descriptor numbered 1024 or more); hako
/// does not, and its egress proxies' connections are budgeted from the soft
/// limit (64 connections for all sandboxes of a process at 1024). The hard
/// limit is the most the administrator allows, and raising the soft limit
/// up to it needs no privilege. Processes started afterwards inherit the
/// raised soft limit, as they would from a shell that ran `ulimit -n`,
/// unless a sandbox's own limit (`--max-open-files`) sets another.
pub fn raise_open_files_limit() -> io::Result<OpenFilesLimit> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    Ok(OpenFilesLimit {
        before: limit.current,
        now: getrlimit(Resource::Nofile).current,
    })
}

/// This process's open descriptors and its soft limit on them, when the
/// limit is finite: what a failure to start something may be owed to. A
/// process at its limit cannot open `/proc/self/fd` to count: it then has
/// as many open as its limit.
pub fn open_files() -> Option<(u64, u64)> {
    let limit = getrlimit(Resource::Nofile).current?;
    let open = match std::fs::read_dir("/proc/self/fd") {
        // Less the descriptor reading the directory.
        Ok(dir) => (dir.count() as u64).saturating_sub(1),
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => limit,
        Err(_) => return None,
    };
    Some((open, limit))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn raising_the_open_files_limit_brings_the_soft_limit_up_to_the_hard_one() {
        let Some(hard) = getrlimit(Resource::Nofile).maximum else {
            eprintln!("skipped: the hard limit on open descriptors is unlimited");
            return;
        };
        // Just below the hard limit: low enough to be raised, high enough
        // for every other test of this binary running meanwhile.
        let lowered = hard - 1;
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(lowered),
                maximum: Some(hard),
            },
        )
        .unwrap();
        let raised = raise_open_files_limit().unwrap();
        assert_eq!(
            raised,
            OpenFilesLimit {
                before: Some(lowered),
                now: Some(hard),
            }
        );
        let limit = getrlimit(Resource::Nofile);
        assert_eq!((limit.current, limit.maximum), (Some(hard), Some(hard)));
        // Already at the hard limit: nothing changes.
        let again = raise_open_files_limit().unwrap();
        assert_eq!((again.before, again.now), (Some(hard), Some(hard)));
    }
}
