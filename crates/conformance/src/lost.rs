//! A sandbox lost while open: its guest killed from outside (the
//! container's init, gVisor's sandbox process or its gofer, the engine
//! restarted) while a command, a session's command and a long-lived
//! process run. Written once and run by each backend's tests with the
//! fault it can inject: every call in progress and every later one fails
//! with [`Error::SandboxLost`], none hangs, closing works, and nothing the
//! sandbox ran is left on the host.

use std::time::{Duration, Instant};

use hako_core::{Command, Error, Sandbox, SessionOptions, SpawnOptions};

use crate::procs::{host_processes_with_arg, sandbox_processes_with_arg};

/// A hang guard, never a performance assertion.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// What the caller of a lost sandbox saw.
#[derive(Debug)]
pub struct Lost {
    /// The error of the command that ran when the guest was lost.
    pub command: Error,
    /// The error of every later call (an exec), which names what was lost.
    pub later: Error,
}

fn must_be_lost<T: std::fmt::Debug>(
    what: &str,
    result: hako_core::Result<T>,
) -> Result<Error, String> {
    match result {
        Err(e @ Error::SandboxLost { .. }) => Ok(e),
        other => Err(format!("{what}: {other:?}, expected SandboxLost")),
    }
}

/// Hosts processes named `argv0` (their first argument) with an argument
/// that contains `needle`: how a test finds a runtime's process
/// (`runsc-sandbox`, `runsc-gofer`) of one sandbox.
pub fn host_processes_named(argv0: &str, needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline);
        let mut args = text.split('\0');
        if args.next() == Some(argv0) && args.any(|a| a.contains(needle)) {
            out.push(pid);
        }
    }
    out
}

/// Runs a command, a session's command and a long-lived process in `sb`
/// (each `sleep` with a marker), calls `kill` with the marker once all
/// three run (a host process with it is a command: its parent its
/// supervisor, whose parent is the guest, where they are host processes), and
/// checks that the caller hears of it: the three fail with
/// [`Error::SandboxLost`], so do a later exec, session and process, none
/// hangs, `close` works, and no process with the marker is left on the
/// host. Returns the errors seen, for the test to check what they name.
pub fn lost_mid_command_session_and_process(
    sb: &dyn Sandbox,
    kill: impl FnOnce(&str) -> Result<(), String>,
) -> Result<Lost, String> {
    let sessions = sb.sessions().ok_or("this sandbox has no sessions")?;
    let processes = sb.processes().ok_or("this sandbox has no processes")?;
    let marker = format!("{}", 710_000_000 + std::process::id());
    let sleep = format!("sleep 600 {marker}");
    let session = sessions
        .open_session(&SessionOptions::default())
        .map_err(|e| format!("open a session: {e}"))?;
    let process = processes
        .spawn(&Command::shell(&sleep), &SpawnOptions::default())
        .map_err(|e| format!("spawn: {e}"))?;
    let (command, in_session) = std::thread::scope(|scope| {
        let exec = scope.spawn(|| sb.exec(&Command::shell(&sleep)));
        let in_session = scope.spawn(|| match sb.sessions() {
            Some(s) => s.session_exec(session, &Command::shell(&sleep), None),
            None => Err(Error::Closed),
        });
        // All three run before the fault.
        let start = Instant::now();
        let ready = loop {
            match sandbox_processes_with_arg(sb, &marker) {
                Ok(found) if found.len() >= 3 => break Ok(()),
                Ok(_) if start.elapsed() < HANG_GUARD => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(found) => break Err(format!("the three never ran: {found:?}")),
                Err(e) => break Err(format!("scan inside: {e}")),
            }
        };
        let killed = ready.and_then(|()| kill(&marker));
        if let Err(e) = killed {
            let _ = sb.close();
            let _ = exec.join();
            let _ = in_session.join();
            return Err(e);
        }
        // A fault that did not lose the sandbox leaves them running: they
        // are ended by closing it, and that is a failure, never a hang.
        let start = Instant::now();
        while !(exec.is_finished() && in_session.is_finished()) {
            if start.elapsed() > HANG_GUARD {
                let _ = sb.close();
                let _ = exec.join();
                let _ = in_session.join();
                return Err("the calls in progress did not end after the fault".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let command = exec.join().map_err(|_| "the exec panicked".to_string())?;
        let in_session = in_session
            .join()
            .map_err(|_| "the session's command panicked".to_string())?;
        Ok((command, in_session))
    })?;
    let start = Instant::now();
    let command = must_be_lost("the command running when the guest was lost", command)?;
    must_be_lost("the session's command", in_session)?;
    must_be_lost(
        "waiting for the long-lived process",
        processes.wait(process, Some(HANG_GUARD)),
    )?;
    let later = must_be_lost("a later exec", sb.exec(&Command::new(["true"])))?;
    must_be_lost(
        "a later session",
        sessions.open_session(&SessionOptions::default()),
    )?;
    must_be_lost(
        "a later process",
        processes.spawn(&Command::shell("true"), &SpawnOptions::default()),
    )?;
    if start.elapsed() > HANG_GUARD {
        return Err(format!(
            "the calls after the fault took {:?}",
            start.elapsed()
        ));
    }
    sb.close()
        .map_err(|e| format!("close a lost sandbox: {e}"))?;
    let start = Instant::now();
    loop {
        let left = host_processes_with_arg(&marker);
        if left.is_empty() {
            break;
        }
        if start.elapsed() > HANG_GUARD {
            return Err(format!("left on the host: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Lost { command, later })
}
