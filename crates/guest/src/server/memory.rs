//! Telling that the sandbox's memory limit killed a command.
//!
//! The guest counts the limit's kills ([`Oom::count`]) when a command
//! starts and when it ends. A command is reported killed for memory
//! ([`killed_for_memory`]) when the count rose while it ran, hako did not
//! kill it (deadline, kill, close), and it ended by `SIGKILL` (or with
//! status 137, a shell's report of its child's `SIGKILL`): a plain `kill -9`
//! does not raise the count, and a memory kill always is a `SIGKILL`.
//!
//! Where the kernel enforces the limit (a `linux` sandbox's cgroup, a
//! runc container's) the count is its own, read again with `pread` from a
//! file opened before the guest locks itself down. Under gVisor nothing
//! inside enforces it (see [`MemoryWatch::Watch`]): the guest watches the
//! sandbox's memory while commands run and, past the limit, kills the
//! process that uses the most, as the kernel's OOM killer would, and counts
//! that kill itself.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hako_core::ExitStatus;
use hako_sys::rustix::process::{self as rproc, Pid, Signal};

use crate::error::failed_on;
use crate::proto::MemoryWatch;
use crate::GuestError;

/// Where the count of memory kills comes from.
pub(crate) enum Oom {
    /// The kernel's: a cgroup file with an `oom_kill N` line.
    Counter(File),
    /// The guest's own watch (gVisor).
    Watch {
        /// The sandbox's limit in bytes.
        limit: u64,
        /// Kills made so far.
        kills: u64,
        /// The last kill, until the sandbox is back under its limit:
        /// gVisor gives a killed process's memory back when it is reaped
        /// and a little later, and the next process must not be killed for
        /// it.
        last_kill: Option<LastKill>,
    },
}

/// A kill of the watch's, whose memory may not have come back yet.
pub(crate) struct LastKill {
    pid: Pid,
    /// When it was killed.
    at: Instant,
    /// When the process was first seen gone (reaped).
    gone_at: Option<Instant>,
}

/// How long after a killed process is gone the watch waits for its memory
/// to come back before it kills again (while still over the limit). Kept
/// short: a grace counted from the kill itself let a new command that
/// started soon after run past the limit unkilled.
const AFTER_A_KILL: Duration = Duration::from_millis(200);
/// How long a killed process that has not gone is waited for before the
/// watch kills again.
const STUCK: Duration = Duration::from_secs(5);

impl Oom {
    /// Opens what `watch` names; a counter that cannot be opened fails
    /// (the guest refuses to serve rather than report memory kills as bare
    /// `SIGKILL`s).
    pub(crate) fn open(watch: &MemoryWatch) -> Result<Oom, GuestError> {
        match watch {
            MemoryWatch::Counter(paths) => Self::open_counter(paths),
            MemoryWatch::Watch { limit } => Ok(Oom::Watch {
                limit: *limit,
                kills: 0,
                last_kill: None,
            }),
        }
    }

    /// Opens the first of `paths` that opens and has an `oom_kill` line.
    pub(crate) fn open_counter(paths: &[PathBuf]) -> Result<Oom, GuestError> {
        let mut last = None;
        for path in paths {
            match File::open(path) {
                Ok(file) => {
                    let oom = Oom::Counter(file);
                    if oom.count().is_some() {
                        return Ok(oom);
                    }
                    last = Some((path.clone(), std::io::ErrorKind::InvalidData.into()));
                }
                Err(err) => last = Some((path.clone(), err)),
            }
        }
        let (path, err) =
            last.unwrap_or_else(|| (PathBuf::from("(none)"), std::io::ErrorKind::NotFound.into()));
        Err(failed_on("open the memory limit's kill count", &path)(err))
    }

    /// The kills so far.
    pub(crate) fn count(&self) -> Option<u64> {
        match self {
            Oom::Counter(file) => {
                // A cgroup's file is short; a VM kernel's /proc/vmstat
                // has its oom_kill line some 4 KiB in.
                let mut buf = [0u8; 16 << 10];
                let n = file.read_at(&mut buf, 0).ok()?;
                parse_oom_kill(&String::from_utf8_lossy(&buf[..n]))
            }
            Oom::Watch { kills, .. } => Some(*kills),
        }
    }

    /// Whether the guest watches (and must be woken up now and then while
    /// commands run).
    pub(crate) fn watches(&self) -> bool {
        matches!(self, Oom::Watch { .. })
    }

    /// For [`Oom::Watch`]: when the sandbox uses more than its limit, kills
    /// the process that uses the most memory, none of `spared` (the
    /// guest's own), and counts the kill.
    pub(crate) fn enforce(&mut self, spared: &[Pid]) {
        let Oom::Watch {
            limit,
            kills,
            last_kill,
        } = self
        else {
            return;
        };
        let Some(used) = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| used_bytes(&m))
        else {
            return;
        };
        if used <= *limit {
            *last_kill = None;
            return;
        }
        if let Some(last) = last_kill {
            // Still there (dying, or a zombie not yet reaped): its memory
            // is not back yet; one that lingers past [`STUCK`] is not
            // waited for any longer.
            if last.at.elapsed() < STUCK
                && std::path::Path::new(&format!("/proc/{}", last.pid.as_raw_nonzero())).exists()
            {
                return;
            }
            let gone_at = *last.gone_at.get_or_insert_with(Instant::now);
            if gone_at.elapsed() < AFTER_A_KILL {
                return;
            }
        }
        if let Some(pid) = largest_process(spared) {
            if rproc::kill_process(pid, Signal::KILL).is_ok() {
                *kills += 1;
                *last_kill = Some(LastKill {
                    pid,
                    at: Instant::now(),
                    gone_at: None,
                });
            }
        }
    }
}

/// The `oom_kill N` line of a v1 `memory.oom_control`, a v2
/// `memory.events` or a VM kernel's `/proc/vmstat`.
fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("oom_kill"))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// Memory in use, from `/proc/meminfo`: total less available (gVisor's
/// total is the sandbox's limit, its available what is left of it).
fn used_bytes(meminfo: &str) -> Option<u64> {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some(field("MemTotal")?.saturating_sub(field("MemAvailable")?) * 1024)
}

/// The process with the largest resident set, none of `spared`.
fn largest_process(spared: &[Pid]) -> Option<Pid> {
    let mut best: Option<(u64, Pid)> = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(raw) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(pid) = Pid::from_raw(raw) else {
            continue;
        };
        if raw == 1 || spared.contains(&pid) {
            continue;
        }
        let Some(rss) = std::fs::read_to_string(entry.path().join("statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        else {
            continue;
        };
        if best.is_none_or(|(most, _)| rss > most) {
            best = Some((rss, pid));
        }
    }
    best.map(|(_, pid)| pid)
}

/// Whether a command that ended with `status` was killed by the memory
/// limit: the count rose from `before` to `after` while it ran, and hako
/// did not kill it.
pub(crate) fn killed_for_memory(
    before: Option<u64>,
    after: Option<u64>,
    status: ExitStatus,
    killed_by_hako: bool,
) -> bool {
    let rose = matches!((before, after), (Some(b), Some(a)) if a > b);
    rose && !killed_by_hako && matches!(status, ExitStatus::Signal(9) | ExitStatus::Code(137))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_count_is_read_from_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v1), Some(3));
        assert_eq!(parse_oom_kill(v2), Some(2));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn memory_in_use_is_total_less_available() {
        let m = "MemTotal:  65536 kB\nMemFree:  1000 kB\nMemAvailable:  61440 kB\n";
        assert_eq!(used_bytes(m), Some(4096 * 1024));
    }

    #[test]
    fn only_a_sigkill_while_the_count_rose_and_not_by_hako_is_for_memory() {
        let kill = ExitStatus::Signal(9);
        assert!(killed_for_memory(Some(0), Some(1), kill, false));
        assert!(killed_for_memory(
            Some(0),
            Some(1),
            ExitStatus::Code(137),
            false
        ));
        assert!(
            !killed_for_memory(Some(1), Some(1), kill, false),
            "plain kill -9"
        );
        assert!(
            !killed_for_memory(Some(0), Some(1), kill, true),
            "hako killed it"
        );
        assert!(!killed_for_memory(
            Some(0),
            Some(1),
            ExitStatus::Code(0),
            false
        ));
        assert!(!killed_for_memory(None, None, kill, false), "no limit");
    }
}
