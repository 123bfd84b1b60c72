//! Terminals from the outside in: what a person typing at a sandbox's
//! terminal expects (Ctrl-D ends a reader, Ctrl-C and Ctrl-\ end a
//! shell's foreground job), written once and run by each backend's tests.
//! Each returns whether the kernel (or the guest) did it, so that a
//! backend known not to (gVisor before its fixes, see the README) can
//! report instead of assert; anything else that goes wrong is an `Err`.

use std::time::Duration;

use hako_core::{
    Command, ExitStatus, ProcessId, Processes, Sandbox, SpawnOptions, Stream, TermSize,
};

fn on_a_terminal() -> SpawnOptions {
    SpawnOptions {
        pty: Some(TermSize { rows: 24, cols: 80 }),
        ..SpawnOptions::default()
    }
}

fn processes(sb: &dyn Sandbox) -> Result<&dyn Processes, String> {
    sb.processes()
        .ok_or_else(|| "this sandbox has no long-lived processes".to_string())
}

/// Types `text` at process `id`'s terminal and returns its output read
/// until `want` shows (or the process ends, or `rounds` reads of up to
/// 200 ms each came back without it).
pub fn type_and_read(
    p: &dyn Processes,
    id: ProcessId,
    text: &[u8],
    want: &str,
    rounds: usize,
) -> Result<String, String> {
    p.write_stdin(id, text)
        .map_err(|e| format!("type at the terminal: {e}"))?;
    let mut got = Vec::new();
    let mut offset = 0;
    for _ in 0..rounds {
        let slice = p
            .read_output(
                id,
                Stream::Stdout,
                offset,
                1 << 16,
                Some(Duration::from_millis(200)),
            )
            .map_err(|e| format!("read the terminal: {e}"))?;
        got.extend_from_slice(&slice.data);
        offset = slice.next;
        if String::from_utf8_lossy(&got).contains(want) || slice.ended {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// Kills process `id` and waits for it.
fn kill(p: &dyn Processes, id: ProcessId) -> Result<(), String> {
    p.kill(id).map_err(|e| format!("kill the process: {e}"))?;
    let end = p
        .wait(id, Some(Duration::from_secs(20)))
        .map_err(|e| format!("wait for the killed process: {e}"))?;
    if end.finished() {
        Ok(())
    } else {
        Err("the killed process did not end".into())
    }
}

/// `cat` on a terminal, a line typed, then Ctrl-D at the start of the
/// next line: whether `cat` saw end of file and ended (and the shell after
/// it said so) within `wait`. The process is killed if it did not.
pub fn ctrl_d_ends_cat(sb: &dyn Sandbox, wait: Duration) -> Result<bool, String> {
    let p = processes(sb)?;
    let id = p
        .spawn(
            &Command::shell("cat; echo cat-ended-$((1+1))"),
            &on_a_terminal(),
        )
        .map_err(|e| format!("spawn cat on a terminal: {e}"))?;
    // Echoed once by the terminal, once by cat.
    let shown = type_and_read(p, id, b"abc\n", "abc\r\nabc\r\n", 100)?;
    if !shown.contains("abc\r\nabc\r\n") {
        kill(p, id)?;
        return Err(format!("the line typed was not echoed twice: {shown:?}"));
    }
    p.write_stdin(id, b"\x04")
        .map_err(|e| format!("type Ctrl-D: {e}"))?;
    let end = p
        .wait(id, Some(wait))
        .map_err(|e| format!("wait for cat: {e}"))?;
    if !end.finished() {
        kill(p, id)?;
        return Ok(false);
    }
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let slice = p
            .read_output(id, Stream::Stdout, offset, 1 << 16, None)
            .map_err(|e| format!("read the terminal: {e}"))?;
        out.extend_from_slice(&slice.data);
        offset = slice.next;
        if slice.ended || slice.data.is_empty() {
            break;
        }
    }
    let out = String::from_utf8_lossy(&out);
    if !out.contains("cat-ended-2") || end.status != Some(ExitStatus::Code(0)) {
        return Err(format!("cat ended, but not as asked: {out:?} {end:?}"));
    }
    Ok(true)
}

/// How many processes have `marker` on their command line (the pattern
/// does not match its own).
fn count_marked(sb: &dyn Sandbox, marker: &str) -> Result<usize, String> {
    let pattern = format!("[{}]{}", &marker[..1], &marker[1..]);
    let out = sb
        .exec(
            &Command::shell(format!(
                "grep -l '{pattern}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
            ))
            .timeout(Duration::from_secs(60)),
        )
        .map_err(|e| format!("look for the sleep: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("count the sleeps: {e}: {:?}", out.stdout))
}

/// An interactive job-control shell (`sh -i`) on a terminal, running
/// `sleep MARKER` (hours) in the foreground: its process id and the
/// marker, once the sleep runs.
fn shell_running_a_sleep(sb: &dyn Sandbox) -> Result<(ProcessId, String), String> {
    let p = processes(sb)?;
    let marker = format!("{}", 70_000_000 + std::process::id());
    let id = p
        .spawn(&Command::new(["sh", "-i"]), &on_a_terminal())
        .map_err(|e| format!("spawn sh -i on a terminal: {e}"))?;
    p.write_stdin(id, format!("sleep {marker}\n").as_bytes())
        .map_err(|e| format!("type at the terminal: {e}"))?;
    for _ in 0..200 {
        if count_marked(sb, &marker)? > 0 {
            return Ok((id, marker));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(p, id)?;
    Err("the sleep never started".into())
}

/// Kills the shell `id` and checks that its job, `sleep MARKER`, is gone
/// with it (soon: under gVisor the guest kills a command's orphans once
/// nothing else runs).
fn end_shell(sb: &dyn Sandbox, id: ProcessId, marker: &str) -> Result<(), String> {
    kill(processes(sb)?, id)?;
    for _ in 0..100 {
        if count_marked(sb, marker)? == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("the shell's job outlived it".into())
}

/// An interactive job-control shell on a terminal runs `sleep` in the
/// foreground; `typed` (Ctrl-C or Ctrl-\\) is typed once the sleep runs.
/// Whether the shell prompted again and ran the next line while the sleep
/// would still run (it sleeps for hours), looked for in up to `rounds`
/// reads of 200 ms; either way the shell is killed after, and its job must
/// be gone with it.
pub fn a_control_byte_interrupts_the_foreground_job_of_an_interactive_shell(
    sb: &dyn Sandbox,
    typed: &[u8],
    rounds: usize,
) -> Result<bool, String> {
    let p = processes(sb)?;
    let (id, marker) = shell_running_a_sleep(sb)?;
    p.write_stdin(id, typed)
        .map_err(|e| format!("type {typed:?}: {e}"))?;
    let shown = type_and_read(p, id, b"echo back-$((1+1))\n", "back-2", rounds)?;
    end_shell(sb, id, &marker)?;
    Ok(shown.contains("back-2\r\n"))
}

/// As [`a_control_byte_interrupts_the_foreground_job_of_an_interactive_shell`]
/// with Ctrl-Z: whether the foreground job was stopped (the shell lists it
/// as stopped) and the shell prompted again and ran the next line.
pub fn ctrl_z_stops_the_foreground_job_of_an_interactive_shell(
    sb: &dyn Sandbox,
    rounds: usize,
) -> Result<bool, String> {
    let p = processes(sb)?;
    let (id, marker) = shell_running_a_sleep(sb)?;
    p.write_stdin(id, b"\x1a")
        .map_err(|e| format!("type Ctrl-Z: {e}"))?;
    let shown = type_and_read(p, id, b"jobs; echo back-$((1+1))\n", "back-2", rounds)?;
    // The sleep is still there, stopped, until the shell ends.
    let still = count_marked(sb, &marker)?;
    end_shell(sb, id, &marker)?;
    let stopped = shown.to_lowercase().contains("stopped");
    Ok(shown.contains("back-2\r\n") && stopped && still > 0)
}
