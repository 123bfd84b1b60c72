//! Faults a command can cause from inside, the same on every backend: its
//! supervisor killed with SIGKILL during a command, a session and a
//! long-lived process. The caller hears of it (a typed error or a status,
//! never a hang), nothing the command started is left, and the sandbox
//! goes on.

use std::time::{Duration, Instant};

use hako_core::{Command, Processes, Sandbox, SessionOptions, Sessions, SpawnOptions};

use crate::check::{still_works, within, Ctx, Res};
use crate::procs::{host_processes_with_arg, sandbox_processes_with_arg};
use crate::Outcome;

/// A hang guard, never a performance assertion.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Fails if a process with `marker` is alive on the host or inside, after
/// giving the sandbox a few seconds to reap what the fault left.
fn none_left(sandbox: &dyn Sandbox, marker: &str, after: &str) -> Res {
    let start = Instant::now();
    loop {
        let host = host_processes_with_arg(marker);
        let inside = sandbox_processes_with_arg(sandbox, marker).ctx("scan /proc inside")?;
        if host.is_empty() && inside.is_empty() {
            return Ok(());
        }
        ensure!(
            start.elapsed() < HANG_GUARD,
            "after {after}, processes with marker {marker} remain: on the host {host:?}, inside {inside:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Shell text that kills its supervisor (the parent of the shell that runs
/// it: `sh -c`'s, or a session's own shell) with SIGKILL, then runs
/// `sleep` with the marker.
fn kill_supervisor_then_sleep(marker: &str) -> String {
    format!("p=$(cut -d' ' -f4 /proc/$$/stat); echo started; kill -9 $p; sleep 600 {marker}")
}

case! {
    /// A command kills its supervisor with SIGKILL: the exec returns (a
    /// typed error or the command's end), the command does not outlive
    /// its supervisor, and the sandbox runs the next command.
    fn a_supervisor_killed_mid_command_ends_only_that_command(h) {
        let m = h.marker();
        let script = kill_supervisor_then_sleep(&m);
        let result = within(
            HANG_GUARD,
            "an exec whose supervisor was killed",
            || h.sandbox().exec(&Command::shell(&script)),
            || {
                let _ = h.sandbox().close();
            },
        )?;
        if let Ok(out) = &result {
            ensure!(
                !matches!(out.status, hako_core::ExitStatus::Code(0)),
                "the command reports success though its supervisor was killed: {out:?}"
            );
        }
        none_left(h.sandbox(), &m, "its supervisor was killed")?;
        still_works(h, "a command killed its supervisor")
    }
}

fn sessions(sb: &dyn Sandbox) -> Res<&dyn Sessions> {
    sb.sessions().ok_or_else(|| {
        Outcome::Skipped(format!(
            "the {} backend offers no sessions",
            sb.capabilities().backend
        ))
    })
}

fn processes(sb: &dyn Sandbox) -> Res<&dyn Processes> {
    sb.processes().ok_or_else(|| {
        Outcome::Skipped(format!(
            "the {} backend offers no long-lived processes",
            sb.capabilities().backend
        ))
    })
}

/// Runs `script` in session `id` of `sb` (from any thread).
fn session_exec(
    sb: &dyn Sandbox,
    id: hako_core::SessionId,
    script: &str,
) -> hako_core::Result<hako_core::Output> {
    match sb.sessions() {
        Some(s) => s.session_exec(id, &Command::shell(script), None),
        None => Err(hako_core::Error::Closed),
    }
}

case! {
    /// A command in a session kills the session's supervisor with
    /// SIGKILL: the call returns, the session is reported ended (every
    /// further call on it is `SessionNotOpen`), nothing it ran is left,
    /// and the sandbox and a new session work.
    fn a_supervisor_killed_mid_session_ends_only_that_session(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        let m = h.marker();
        // A session's commands run in its shell, the supervisor's child.
        let script = kill_supervisor_then_sleep(&m);
        let result = within(
            HANG_GUARD,
            "a session command whose supervisor was killed",
            || session_exec(sb, id, &script),
            || {
                let _ = sb.close();
            },
        )?;
        if let Ok(out) = &result {
            ensure!(
                !matches!(out.status, hako_core::ExitStatus::Code(0)),
                "the session command reports success though its supervisor was killed: {out:?}"
            );
        }
        let next = within(
            HANG_GUARD,
            "the next call on that session",
            || session_exec(sb, id, "echo again"),
            || {
                let _ = sb.close();
            },
        )?;
        match next {
            Err(hako_core::Error::SessionNotOpen { .. }) => {}
            other => fail!("the next call on a session whose supervisor was killed: {other:?}, expected SessionNotOpen"),
        }
        none_left(sb, &m, "a session's supervisor was killed")?;
        let fresh = s.open_session(&SessionOptions::default()).ctx("open a new session")?;
        let out = s
            .session_exec(fresh, &Command::shell("echo fresh"), None)
            .ctx("a command in the new session")?;
        ensure_eq!(out.stdout.as_slice(), b"fresh\n".as_slice(), "the new session's output");
        s.close_session(fresh).ctx("close the new session")?;
        let _ = s.close_session(id);
        still_works(h, "a session's supervisor was killed")
    }
}

case! {
    /// A long-lived process kills its supervisor with SIGKILL: waiting for
    /// it returns an ended state, nothing it ran is left, and the sandbox
    /// starts and ends another one.
    fn a_supervisor_killed_under_a_long_lived_process_ends_only_that_process(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let m = h.marker();
        let script = kill_supervisor_then_sleep(&m);
        let id = p
            .spawn(&Command::shell(&script), &SpawnOptions::default())
            .ctx("spawn a process that kills its supervisor")?;
        let state = within(
            HANG_GUARD,
            "waiting for a process whose supervisor was killed",
            || match sb.processes() {
                Some(p) => p.wait(id, Some(HANG_GUARD)),
                None => Err(hako_core::Error::Closed),
            },
            || {
                let _ = sb.close();
            },
        )?
        .ctx("wait for the process")?;
        ensure!(state.finished(), "the process is still reported running: {state:?}");
        ensure!(
            !matches!(state.status, Some(hako_core::ExitStatus::Code(0))),
            "the process reports success though its supervisor was killed: {state:?}"
        );
        none_left(sb, &m, "a process's supervisor was killed")?;
        let other = p
            .spawn(&Command::shell("echo next"), &SpawnOptions::default())
            .ctx("spawn another process")?;
        let done = p.wait(other, Some(HANG_GUARD)).ctx("wait for it")?;
        ensure!(
            done.status == Some(hako_core::ExitStatus::Code(0)),
            "the next process: {done:?}"
        );
        still_works(h, "a process's supervisor was killed")
    }
}

/// Mounts a tmpfs of `size` on the workspace directory `rel` (made here),
/// unmounted when the case ends.
fn mount_tmpfs(h: &crate::Harness, rel: &str, size: &str) -> Res {
    h.plant_dir(rel)?;
    let target = h.host_path(rel);
    let out = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0777"),
            "tmpfs",
        ])
        .arg(&target)
        .output()
        .ctx("run mount")?;
    let said = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && said.contains("permission denied") && hako_sys::ns::in_container() {
        // Root inside a container without CAP_SYS_ADMIN (Docker's
        // default): the fault cannot be planted here.
        skip!("mounting a small tmpfs in the workspace needs CAP_SYS_ADMIN, which this container's root lacks");
    }
    ensure!(
        out.status.success(),
        "mount -t tmpfs failed: {}",
        said.trim()
    );
    h.defer(move || {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&target)
            .status();
    });
    Ok(())
}

/// Fails unless `err` is the file system's "no space".
fn no_space(err: &hako_core::Error, what: &str) -> Res {
    let said = err.to_string();
    let kind = match err.as_fence() {
        Some(hako_core::FenceError::Io { source, .. }) => Some(source.kind()),
        _ => None,
    };
    ensure!(
        kind == Some(std::io::ErrorKind::StorageFull) && said.contains("No space left"),
        "{what}: expected a no-space error, got {err:?} ({said})"
    );
    Ok(())
}

case! {
    /// The workspace's file system is full: `write_file` fails with a
    /// no-space error and leaves the old content and no temporary file; a
    /// command that fills it gets ENOSPC inside and the sandbox goes on.
    fn a_full_workspace_fails_writes_with_no_space_and_keeps_the_old_content(h) {
        if !crate::harness::is_root() {
            skip!("mounting a small tmpfs in the workspace needs root");
        }
        mount_tmpfs(h, "small", "256k")?;
        // A sandbox built after the mount sees it inside too.
        let sb = h.new_sandbox().ctx("build a sandbox on the workspace with the tmpfs")?;
        let sb = sb.as_ref();
        let outcome = (|| -> Res {
            sb.write_file(std::path::Path::new("small/keep"), b"old")
                .ctx("write the old content")?;
            // A command fills it: ENOSPC inside, reported by the command.
            let out = sb
                .exec(&Command::shell("cat /dev/zero > small/filler; echo status $?"))
                .ctx("a command that fills the file system")?;
            let said = String::from_utf8_lossy(&out.stderr).into_owned();
            ensure!(
                String::from_utf8_lossy(&out.stdout).trim() != "status 0",
                "filling 256 KiB with 1 MiB succeeded: {out:?}"
            );
            ensure!(said.contains("No space left"), "the command's stderr: {said}");
            let err = match sb.write_file(std::path::Path::new("small/keep"), &vec![b'n'; 64 << 10]) {
                Ok(()) => fail!("a 64 KiB write to a full file system succeeded"),
                Err(e) => e,
            };
            no_space(&err, "write_file to a full file system")?;
            let kept = sb.read_file(std::path::Path::new("small/keep")).ctx("read the old content")?;
            ensure_eq!(kept.as_slice(), b"old".as_slice(), "the old content after a failed write");
            let names: Vec<String> = sb
                .list_dir(std::path::Path::new("small"))
                .ctx("list the full directory")?
                .entries
                .iter()
                .map(|e| e.name.to_string_lossy().into_owned())
                .collect();
            ensure_eq!(names, vec!["filler".to_string(), "keep".to_string()], "what is left in the full directory");
            let out = sb.exec(&Command::shell("echo alive")).ctx("a command after the disk filled")?;
            ensure_eq!(out.stdout.as_slice(), b"alive\n".as_slice(), "a command after the disk filled");
            // (Whether removing the filler makes room at once is the
            // backend's: gVisor may hold the removed file open a while.)
            sb.remove(std::path::Path::new("small/filler")).ctx("remove the filler")?;
            Ok(())
        })();
        let closed = sb.close();
        outcome?;
        closed.ctx("close the sandbox")?;
        still_works(h, "the workspace's file system filled")
    }
}
