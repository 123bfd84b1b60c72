//! The memory limit from the outside in, written once and run by each
//! memory-capable backend's tests (linux, docker with runc and with runsc,
//! gvisor) on a sandbox opened with `--memory` [`LIMIT`]: a command that
//! goes past it is reported killed for memory (not a bare `SIGKILL`), the
//! same sandbox runs the next command and an open session goes on; a
//! plain `kill -9` is not reported as memory.

use std::time::Duration;

use hako_core::{Command, ExitStatus, Sandbox, SessionOptions};

/// The `--memory` these cases expect their sandbox to have.
pub const LIMIT: u64 = 64 << 20;

/// A hang guard, never a performance assertion.
const GUARD: Duration = Duration::from_secs(60);

/// busybox `dd` allocates its block (256 MiB, four times [`LIMIT`]) and
/// reads into it, touching every page, 64 times over: the memory stays in
/// use for a while (seconds, if nothing kills it), as a program's that
/// grows past its limit does. Under gVisor the guest's watch looks every
/// 5 ms, but a loaded machine may not run it for several hundred: it may
/// miss a burst that is over at once (sixteen reads, about half a second
/// under load, were seen to pass unkilled in CI).
const ALLOCATE: [&str; 5] = [
    "dd",
    "if=/dev/zero",
    "of=/dev/null",
    "bs=268435456",
    "count=64",
];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A command allocating past the limit is reported killed for memory;
/// then a second command and a session opened before it still work.
pub fn a_command_over_the_memory_limit_is_reported_killed_for_memory_and_the_sandbox_goes_on(
    sb: &dyn Sandbox,
) -> Result<(), String> {
    let sessions = sb.sessions();
    let session = match sessions {
        Some(s) => Some(
            s.open_session(&SessionOptions::default())
                .map_err(|e| format!("open a session: {e}"))?,
        ),
        None => None,
    };
    if let (Some(s), Some(id)) = (sessions, session) {
        let out = s
            .session_exec(
                id,
                &Command::shell("x=before; echo $x").timeout(GUARD),
                None,
            )
            .map_err(|e| format!("a session command before the overrun: {e}"))?;
        if text(&out.stdout) != "before\n" {
            return Err(format!("the session said {out:?}"));
        }
    }
    let out = sb
        .exec(&Command::new(ALLOCATE).timeout(GUARD))
        .map_err(|e| format!("the sandbox did not survive a command over --memory: {e}"))?;
    if !out.oom_killed {
        return Err(format!(
            "a 256 MiB allocation under --memory 64M is not reported killed for memory: {out:?} (stderr {})",
            text(&out.stderr)
        ));
    }
    if out.status != ExitStatus::Signal(9) || out.timed_out {
        return Err(format!("killed for memory, yet {out:?}"));
    }
    // The same, run by a shell that goes on after its child was killed.
    let script = format!("{}; echo status=$?", ALLOCATE.join(" "));
    let out = sb
        .exec(&Command::shell(&script).timeout(GUARD))
        .map_err(|e| format!("a second overrun: {e}"))?;
    if text(&out.stdout) != "status=137\n" || out.oom_killed {
        // The shell itself was not killed and exited 0: its command ran on.
        return Err(format!(
            "a shell whose child was killed for memory should go on and print status=137: {out:?}"
        ));
    }
    let out = sb
        .exec(&Command::shell("echo again | cat").timeout(GUARD))
        .map_err(|e| format!("a command after the overrun: {e}"))?;
    if text(&out.stdout) != "again\n" || out.oom_killed {
        return Err(format!("the command after the overrun said {out:?}"));
    }
    if let (Some(s), Some(id)) = (sessions, session) {
        let out = s
            .session_exec(id, &Command::shell("echo $x after").timeout(GUARD), None)
            .map_err(|e| format!("the session after the overrun: {e}"))?;
        if text(&out.stdout) != "before after\n" || out.oom_killed {
            return Err(format!("the session after the overrun said {out:?}"));
        }
        // A session command over the limit: reported killed for memory
        // (the session's shell reports its child's end), the session goes
        // on.
        let out = s
            .session_exec(id, &Command::shell(ALLOCATE.join(" ")).timeout(GUARD), None)
            .map_err(|e| format!("an overrun in the session: {e}"))?;
        if !out.oom_killed {
            return Err(format!(
                "an overrun in a session is not reported killed for memory: {out:?}"
            ));
        }
        let out = s
            .session_exec(id, &Command::shell("echo $x still").timeout(GUARD), None)
            .map_err(|e| format!("the session after its own overrun: {e}"))?;
        if text(&out.stdout) != "before still\n" {
            return Err(format!("the session after its overrun said {out:?}"));
        }
        s.close_session(id)
            .map_err(|e| format!("close the session: {e}"))?;
    }
    Ok(())
}

/// A command killed by `kill -9` (from inside, by itself), in a sandbox
/// with a memory limit, is a plain `SIGKILL`: not reported as memory.
pub fn a_plain_kill_9_is_not_reported_as_memory(sb: &dyn Sandbox) -> Result<(), String> {
    let out = sb
        .exec(&Command::new(["sh", "-c", "kill -9 $$"]).timeout(GUARD))
        .map_err(|e| format!("kill -9: {e}"))?;
    if out.status != ExitStatus::Signal(9) {
        return Err(format!("kill -9 $$ ended otherwise: {out:?}"));
    }
    if out.oom_killed {
        return Err(format!("a plain kill -9 is reported as memory: {out:?}"));
    }
    let out = sb
        .exec(&Command::shell("sleep 30 & kill -9 $!; wait $!; echo status=$?").timeout(GUARD))
        .map_err(|e| format!("kill -9 of a child: {e}"))?;
    if text(&out.stdout) != "status=137\n" || out.oom_killed {
        return Err(format!("a child's kill -9 is reported as memory: {out:?}"));
    }
    Ok(())
}
