//! What a failure to make a process, a thread or a descriptor is owed to
//! when the machine (or this process) has run out of something: named
//! with the limit that stopped it, how much of it is used, and what
//! raises it. A server that opens sandboxes until the machine is full
//! refuses the next one with this, not with a bare `EAGAIN`.

use std::io;
use std::path::Path;

use rustix::process::{getrlimit, Resource};

/// A limit that stopped something being made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// What ran out: `processes`, `descriptors` or `memory`.
    pub resource: &'static str,
    /// The limit, how much of it is in use, and what raises it.
    pub message: String,
}

/// Why making a process, a thread, a socket or a pipe failed with `err`,
/// when that error means something ran out (`EAGAIN`, `EMFILE`,
/// `ENFILE`, `ENOMEM`); `None` for any other error.
pub fn diagnose(err: &io::Error) -> Option<Exhausted> {
    match err.raw_os_error()? {
        libc::EAGAIN => Some(processes()),
        libc::EMFILE => Some(descriptors()),
        libc::ENFILE => Some(Exhausted {
            resource: "descriptors",
            message: format!(
                "the machine's open files are at its limit ({}; fs.file-max): raise it \
                 (sysctl fs.file-max) or close sandboxes",
                read_trimmed("/proc/sys/fs/file-nr")
                    .map(|nr| file_nr(&nr))
                    .unwrap_or_else(|| "in use: unknown".into())
            ),
        }),
        libc::ENOMEM => Some(Exhausted {
            resource: "memory",
            message: format!(
                "the kernel had no memory for it ({} available): close sandboxes or add memory",
                mem_available()
                    .map_or_else(|| "unknown".into(), |kib| format!("{} MiB", kib / 1024))
            ),
        }),
        _ => None,
    }
}

/// The limit on processes nearest to being reached: this process's
/// cgroup's `pids.max`, the kernel's `pid_max` and `threads-max` (every
/// thread takes an id), or `RLIMIT_NPROC`.
fn processes() -> Exhausted {
    let threads = threads_on_machine();
    let mut nearest: Vec<(u64, u64, String)> = Vec::new();
    if let Some((current, max, path)) = cgroup_pids() {
        nearest.push((
            current,
            max,
            format!(
                "hako's cgroup ({path}) allows {max} processes and holds {current}: raise its \
                 pids.max or close sandboxes"
            ),
        ));
    }
    if let (Some(threads), Some(max)) = (threads, read_u64("/proc/sys/kernel/pid_max")) {
        nearest.push((
            threads,
            max,
            format!(
                "the machine runs {threads} threads and kernel.pid_max is {max} (every \
                 process and thread takes an id): raise it (sysctl kernel.pid_max=4194304) \
                 or close sandboxes"
            ),
        ));
    }
    if let (Some(threads), Some(max)) = (threads, read_u64("/proc/sys/kernel/threads-max")) {
        nearest.push((
            threads,
            max,
            format!(
                "the machine runs {threads} threads and kernel.threads-max is {max}: raise it \
                 (sysctl kernel.threads-max) or close sandboxes"
            ),
        ));
    }
    // Counted per user, which only the kernel knows cheaply; it does not
    // bind root.
    let root = rustix::process::geteuid().is_root();
    if let Some(max) = getrlimit(Resource::Nproc).current.filter(|_| !root) {
        nearest.push((
            0,
            max,
            format!(
                "hako's user may run {max} processes (RLIMIT_NPROC): raise it (ulimit -u) or \
                 close sandboxes"
            ),
        ));
    }
    // The one with the least room left (a cgroup or pid_max, usually).
    let message = nearest
        .into_iter()
        .min_by_key(|(used, max, _)| max.saturating_sub(*used))
        .map(|(_, _, message)| message)
        .unwrap_or_else(|| "the kernel refused another process (EAGAIN)".into());
    Exhausted {
        resource: "processes",
        message,
    }
}

fn descriptors() -> Exhausted {
    let message = match crate::rlimit::open_files() {
        Some((open, limit)) => format!(
            "hako has {open} descriptors open and its limit is {limit} (RLIMIT_NOFILE): raise \
             it (ulimit -n) or run fewer sandboxes in this process"
        ),
        None => "hako is at its limit on open descriptors (RLIMIT_NOFILE): raise it (ulimit -n) \
                 or run fewer sandboxes in this process"
            .into(),
    };
    Exhausted {
        resource: "descriptors",
        message,
    }
}

/// Threads on the machine: the second number of `/proc/loadavg`'s
/// "running/total" field.
fn threads_on_machine() -> Option<u64> {
    let text = read_trimmed("/proc/loadavg")?;
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// This process's cgroup's pids in use and its limit, and the cgroup's
/// path, when it has a finite one (cgroup v2, or v1's pids controller).
fn cgroup_pids() -> Option<(u64, u64, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let dir = if controllers.is_empty() {
            Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'))
        } else if controllers.split(',').any(|c| c == "pids") {
            Path::new("/sys/fs/cgroup/pids").join(path.trim_start_matches('/'))
        } else {
            continue;
        };
        let max = read_u64(dir.join("pids.max"));
        let current = read_u64(dir.join("pids.current"));
        if let (Some(max), Some(current)) = (max, current) {
            return Some((current, max, path.to_string()));
        }
    }
    None
}

/// `/proc/sys/fs/file-nr`'s "allocated unused max" as words.
fn file_nr(text: &str) -> String {
    let mut it = text.split_whitespace();
    match (it.next(), it.next(), it.next()) {
        (Some(used), _, Some(max)) => format!("{used} open of {max}"),
        _ => "in use: unknown".into(),
    }
}

/// `MemAvailable` of `/proc/meminfo`, KiB.
fn mem_available() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A number file; `max` (no limit) is `None`.
fn read_u64(path: impl AsRef<Path>) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn eagain_names_a_process_limit_with_its_figures() {
        let found = diagnose(&io::Error::from_raw_os_error(libc::EAGAIN)).unwrap();
        assert_eq!(found.resource, "processes");
        // Whichever limit is nearest, its name and how to raise it.
        assert!(
            found.message.contains("pids.max")
                || found.message.contains("pid_max")
                || found.message.contains("threads-max")
                || found.message.contains("RLIMIT_NPROC"),
            "{}",
            found.message
        );
        assert!(
            found.message.contains("close sandboxes"),
            "{}",
            found.message
        );
    }

    #[test]
    fn emfile_names_this_processs_descriptor_limit() {
        let found = diagnose(&io::Error::from_raw_os_error(libc::EMFILE)).unwrap();
        assert_eq!(found.resource, "descriptors");
        assert!(found.message.contains("RLIMIT_NOFILE"), "{}", found.message);
    }

    #[test]
    fn other_errors_are_not_taken_for_exhaustion() {
        for errno in [libc::EPERM, libc::ENOENT, libc::EINVAL, libc::ENOSPC] {
            assert_eq!(diagnose(&io::Error::from_raw_os_error(errno)), None);
        }
        assert_eq!(diagnose(&io::Error::other("no errno")), None);
    }

    #[test]
    fn the_machines_threads_and_file_counts_are_read() {
        assert!(threads_on_machine().is_some_and(|n| n > 0));
        assert_eq!(
            file_nr("1024 0 9223372036854775807"),
            "1024 open of 9223372036854775807"
        );
        assert_eq!(file_nr(""), "in use: unknown");
    }
}
