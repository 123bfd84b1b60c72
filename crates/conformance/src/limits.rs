//! Limits hit inside, from the outside in: a command that reaches the
//! sandbox's limit on open files, on a file's size or on processes fails
//! by itself (the kernel refuses it, the command reports it), and
//! everything else in the sandbox goes on: a session opened before, a
//! long-lived process, the next command. Written once and run by each
//! backend's tests on a sandbox opened with [`limits`].

use std::path::Path;
use std::time::Duration;

use hako_core::{Command, Limits, Output, Sandbox, SessionOptions, SpawnOptions};

/// The limits the sandbox given to [`each_limit_hit_inside_ends_only_that_command`]
/// must have been opened with.
pub fn limits() -> Limits {
    Limits {
        pids: Some(64),
        open_files: Some(32),
        file_size: Some(1 << 20),
        ..Limits::default()
    }
}

fn sh(sb: &dyn Sandbox, script: &str) -> Result<Output, String> {
    sb.exec(&Command::shell(script).timeout(Duration::from_secs(60)))
        .map_err(|e| format!("`{script}`: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Each limit of [`limits`] hit in turn, with a session and a long-lived
/// process open meanwhile; `ws` is the sandbox's workspace on the host.
pub fn each_limit_hit_inside_ends_only_that_command(
    sb: &dyn Sandbox,
    ws: &Path,
) -> Result<(), String> {
    let sessions = sb.sessions().ok_or("this sandbox has no sessions")?;
    let processes = sb.processes().ok_or("this sandbox has no processes")?;
    let session = sessions
        .open_session(&SessionOptions::default())
        .map_err(|e| format!("open a session: {e}"))?;
    let in_session = |script: &str| -> Result<String, String> {
        let out = sessions
            .session_exec(
                session,
                &Command::shell(script).timeout(Duration::from_secs(30)),
                None,
            )
            .map_err(|e| format!("session `{script}`: {e}"))?;
        Ok(text(&out.stdout))
    };
    in_session("x=kept")?;
    let long = processes
        .spawn(&Command::shell("sleep 600"), &SpawnOptions::default())
        .map_err(|e| format!("start a long-lived process: {e}"))?;

    // Open files: `paste` opens every file it is given before it reads.
    let out = sh(
        sb,
        "i=0; while [ $i -lt 40 ]; do : > f$i; i=$((i+1)); done; \
         paste f0 f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 f13 f14 f15 f16 f17 f18 f19 \
         f20 f21 f22 f23 f24 f25 f26 f27 f28 f29 f30 f31 f32 f33 f34 f35 f36 f37 f38 f39",
    )?;
    let stderr = text(&out.stderr);
    if out.status.success() || !stderr.to_lowercase().contains("too many open files") {
        return Err(format!(
            "paste of 40 files under 32 open files: {:?}, stderr {stderr:?}",
            out.status
        ));
    }

    // A file's size: the write past 1 MiB fails (SIGXFSZ or EFBIG).
    let out = sh(sb, "head -c 2000000 /dev/zero > big; echo $?")?;
    let code: i32 = text(&out.stdout).trim().parse().unwrap_or(0);
    let size = std::fs::metadata(ws.join("big")).map_or(0, |m| m.len());
    if code == 0 || size > 1 << 20 {
        return Err(format!(
            "a 2 MB write under a 1 MiB file size: exit {code}, {size} bytes written"
        ));
    }

    // Processes: forks fail inside once the limit is reached.
    let out = sh(
        sb,
        "n=0; while [ $n -lt 100 ]; do sleep 30 & n=$((n+1)); done; echo all-started",
    )?;
    let stderr = text(&out.stderr);
    if text(&out.stdout).contains("all-started") || !stderr.to_lowercase().contains("fork") {
        return Err(format!(
            "100 background processes under 64: stdout {:?}, stderr {stderr:?}",
            text(&out.stdout)
        ));
    }

    // Everything else went on.
    let kept = in_session("echo $x")?;
    if kept != "kept\n" {
        return Err(format!("the session lost its state: {kept:?}"));
    }
    let state = processes
        .wait(long, Some(Duration::ZERO))
        .map_err(|e| format!("the long-lived process: {e}"))?;
    if state.status.is_some() || state.error.is_some() {
        return Err(format!("the long-lived process ended: {state:?}"));
    }
    let out = sh(sb, "echo again | cat")?;
    if text(&out.stdout) != "again\n" {
        return Err(format!(
            "the next command: {:?}, stderr {:?}",
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    processes
        .kill(long)
        .map_err(|e| format!("kill the long-lived process: {e}"))?;
    sessions
        .close_session(session)
        .map_err(|e| format!("close the session: {e}"))?;
    Ok(())
}
