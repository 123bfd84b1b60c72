//! `--steal-guest-fds ROUNDS`: an attack on the guest from inside, for the
//! escape tests. Each round kills every idle supervisor (a process running
//! the guest's program, other than pid 1, the probe's own supervisor and
//! the probe; every other round, all but the oldest), then, for 300 ms, stops every process that appears (the
//! supervisors forked to replace them) the moment it is seen, tries to
//! open each of its descriptors for writing and for reading, and lets it
//! go on. A fork of a process that holds hako's channel holds it too until
//! it closes what it inherited: a descriptor opened here is one a command
//! could write frames to hako through. Character devices (`/dev/null`) are
//! passed over; nothing is written.

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use hako_sys::rustix::process::{getpid, getppid, kill_process, Pid, Signal};
use serde_json::{json, Value};

fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn cmdline(pid: i32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/cmdline")).ok()
}

fn signal(pid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process(pid, sig);
    }
}

/// Every descriptor of `pid` that opens, as `/proc/PID/fd/N -> target`.
fn open_descriptors(pid: i32, reached: &mut Vec<String>) {
    for fd in 0..64 {
        let path = format!("/proc/{pid}/fd/{fd}");
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.file_type().is_char_device() {
            continue;
        }
        let write = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .is_ok();
        let read = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .is_ok();
        if write || read {
            let target = std::fs::read_link(&path)
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            reached.push(format!("{path} -> {target}"));
        }
    }
}

/// For `watch`, stops every process not in `seen` the moment it is seen,
/// tries its descriptors ([`open_descriptors`]) and lets it go on; returns
/// how many it caught.
fn catch_new(seen: &mut HashSet<i32>, watch: Duration, reached: &mut Vec<String>) -> u32 {
    let mut caught = 0;
    let until = Instant::now() + watch;
    while Instant::now() < until {
        for pid in pids() {
            if seen.insert(pid) {
                signal(pid, Signal::STOP);
                caught += 1;
                open_descriptors(pid, reached);
                signal(pid, Signal::CONT);
            }
        }
    }
    caught
}

/// Runs the attack for `rounds` rounds; the report's `reached` lists every
/// descriptor of a guest process that opened.
pub fn steal_guest_fds(rounds: u32) -> Value {
    let me = getpid().as_raw_nonzero().get();
    let parent = getppid().map_or(0, |p| p.as_raw_nonzero().get());
    let guest = cmdline(1).unwrap_or_default();
    let mut seen: HashSet<i32> = HashSet::new();
    let mut reached = Vec::new();
    let mut caught = 0u32;
    let mut killed = 0u32;
    for round in 0..rounds {
        let mut idle: Vec<i32> = pids()
            .into_iter()
            .filter(|&pid| {
                seen.insert(pid);
                pid != 1 && pid != parent && pid != me && cmdline(pid).as_ref() == Some(&guest)
            })
            .collect();
        idle.sort_unstable();
        // Every other round spares the oldest (whatever the guest forks
        // its supervisors from, if it keeps such a process): the guest
        // then has to fork replacements while this runs.
        if round % 2 == 0 && !idle.is_empty() {
            idle.remove(0);
        }
        for pid in idle {
            signal(pid, Signal::KILL);
            killed += 1;
        }
        caught += catch_new(&mut seen, Duration::from_millis(300), &mut reached);
    }
    json!({"rounds": rounds, "killed": killed, "caught": caught, "reached": reached})
}

/// What [`catch_forks`] says on stderr once it watches.
pub const WATCHING: &str = "watching";

/// `--catch-forks MS`: for `ms` milliseconds, stops every process that
/// appears the moment it is seen, tries its descriptors as
/// [`steal_guest_fds`] does, and lets it go on; kills nothing. For forks
/// the guest makes on its own (such as the one that asks the kernel how it
/// treats a terminal's Ctrl-C), which a command can provoke but not time.
/// Says `watching` on stderr once it watches, for whoever provokes them.
pub fn catch_forks(ms: u64) -> Value {
    let mut seen: HashSet<i32> = pids().into_iter().collect();
    eprintln!("{WATCHING}");
    let mut reached = Vec::new();
    let caught = catch_new(&mut seen, Duration::from_millis(ms), &mut reached);
    json!({"ms": ms, "caught": caught, "reached": reached})
}
