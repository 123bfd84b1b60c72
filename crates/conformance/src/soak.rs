//! Many commands through one sandbox: nothing may leak.
//!
//! Run from a test binary of its own (other tests running in the same
//! process would open and close descriptors meanwhile): [`soak`] opens a
//! sandbox, runs commands one after another and from many threads at once,
//! closes it, and reports what the process holds and what is left of the
//! process tree.

use std::path::Path;
use std::sync::Arc;

use hako_core::{Command, ExitStatus, SessionOptions};

use crate::Factory;

/// What [`soak`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoakReport {
    /// Open descriptors of this process before the sandbox was opened.
    pub fds_before: usize,
    /// Open descriptors of this process after it was closed.
    pub fds_after: usize,
    /// Zombie processes among this process's descendants after the runs
    /// (before close) that were not reaped within a few seconds, with their
    /// command names.
    pub zombies: Vec<String>,
    /// Descendants of this process still there a few seconds after close.
    pub left: Vec<String>,
}

fn open_fds() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

/// Every descendant of this process: (pid, state, command name).
fn descendants() -> Vec<(i32, char, String)> {
    let me = std::process::id() as i32;
    let mut all: Vec<(i32, i32, char, String)> = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = rest.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        all.push((pid, ppid, state, name));
    }
    let mut found = vec![me];
    let mut out = Vec::new();
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid, state, name) in &all {
            if found.contains(ppid) && !found.contains(pid) {
                found.push(*pid);
                out.push((*pid, *state, name.clone()));
                grew = true;
            }
        }
    }
    out
}

/// What `scan` still finds after giving it up to five seconds to come up
/// empty.
fn settled(scan: impl Fn() -> Vec<String>) -> Vec<String> {
    let start = std::time::Instant::now();
    let mut found = scan();
    while !found.is_empty() && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        found = scan();
    }
    found
}

/// Opens a sandbox on `workspace`, runs `sequential` commands one after
/// another, then `threads` threads running `per_thread` commands each at
/// once (each thread in a session of its own where the sandbox offers
/// sessions, with plain execs between); checks every output; closes the
/// sandbox. Fails on the first wrong output or error.
pub fn soak(
    factory: Arc<Factory>,
    workspace: &Path,
    sequential: usize,
    threads: usize,
    per_thread: usize,
) -> Result<SoakReport, String> {
    let fds_before = open_fds().map_err(|e| e.to_string())?;
    let sandbox = factory(workspace).map_err(|e| format!("open: {e}"))?;
    for i in 0..sequential {
        let out = sandbox
            .exec(&Command::new(["echo".to_string(), i.to_string()]))
            .map_err(|e| format!("sequential exec {i}: {e}"))?;
        if out.status != ExitStatus::Code(0) || out.stdout != format!("{i}\n").into_bytes() {
            return Err(format!("sequential exec {i}: {out:?}"));
        }
    }
    let sandbox_ref = sandbox.as_ref();
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || -> Result<(), String> {
                    let sessions = sandbox_ref.sessions();
                    let session = match sessions {
                        Some(s) => Some(
                            s.open_session(&SessionOptions::default())
                                .map_err(|e| format!("thread {t} open session: {e}"))?,
                        ),
                        None => None,
                    };
                    for i in 0..per_thread {
                        let word = format!("t{t}c{i}");
                        let command = Command::shell(format!("printf %s {word}; printf e >&2"));
                        let out = match (sessions, session) {
                            (Some(s), Some(id)) => s.session_exec(id, &command, None),
                            _ => sandbox_ref.exec(&command),
                        }
                        .map_err(|e| format!("thread {t} command {i}: {e}"))?;
                        if out.stdout != word.as_bytes() || out.stderr != b"e" {
                            return Err(format!("thread {t} command {i}: {out:?}"));
                        }
                        // A plain exec now and then, beside the sessions.
                        if i % 5 == 0 {
                            let out = sandbox_ref
                                .exec(&Command::new(["echo", word.as_str()]))
                                .map_err(|e| format!("thread {t} exec {i}: {e}"))?;
                            if out.stdout != format!("{word}\n").into_bytes() {
                                return Err(format!("thread {t} exec {i}: {out:?}"));
                            }
                        }
                    }
                    if let (Some(s), Some(id)) = (sessions, session) {
                        s.close_session(id)
                            .map_err(|e| format!("thread {t} close session: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    for result in results {
        result?;
    }
    // A process that has just exited is a zombie until its parent's next
    // turn reaps it: only one that stays is a leak.
    let zombies = settled(|| {
        descendants()
            .into_iter()
            .filter(|(_, state, _)| *state == 'Z')
            .map(|(pid, _, name)| format!("{pid} {name}"))
            .collect()
    });
    sandbox.close().map_err(|e| format!("close: {e}"))?;
    drop(sandbox);
    // The guest may still be exiting (close does not wait for the kernel to
    // tear a sandbox's namespaces down): only what stays is left behind.
    let left = settled(|| {
        descendants()
            .into_iter()
            .map(|(pid, state, name)| format!("{pid} {state} {name}"))
            .collect()
    });
    let fds_after = open_fds().map_err(|e| e.to_string())?;
    Ok(SoakReport {
        fds_before,
        fds_after,
        zombies,
        left,
    })
}
