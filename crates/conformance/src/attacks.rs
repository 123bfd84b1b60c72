//! Attacks from inside that every isolating backend must refuse, written
//! once and run by each backend's escape tests (the host backend, which
//! isolates nothing, is not asked to refuse them).

use std::time::Duration;

use hako_core::{Command, Sandbox};

/// Tries, from a command inside, to open every descriptor of the guest
/// (pid 1), of the command's supervisor (its parent) and of every other
/// process running the guest's program (a spare supervisor), for writing
/// (writing a frame there would speak on hako's channel as the guest) and
/// for reading, and the guest's memory; then checks that the sandbox still
/// answers. Passed over: a character device (such as the `/dev/null` a
/// supervisor holds as its stdio) and the command's own stdin, stdout and
/// stderr, which its supervisor still holds for a moment after starting it
/// (under load the scan can come first; reaching what the command holds
/// already is no escape). `Err` says what was reached, or how the sandbox
/// failed after.
pub fn writing_on_the_guests_link_through_proc(sb: &dyn Sandbox) -> Result<(), String> {
    const SCRIPT: &str = r#"
one=$(tr '\0' ' ' < /proc/1/cmdline 2>/dev/null)
own=" $(readlink /proc/$$/fd/0) $(readlink /proc/$$/fd/1) $(readlink /proc/$$/fd/2) "
targets="1 $PPID"
for p in /proc/[0-9]*; do
  n=${p#/proc/}
  [ "$n" = "$$" ] && continue
  [ "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" = "$one" ] && targets="$targets $n"
done
for n in $targets; do
  for f in $(seq 0 31); do
    # A supervisor's stdio is /dev/null, harmless to reopen.
    [ -c "/proc/$n/fd/$f" ] && continue
    t=$(readlink "/proc/$n/fd/$f" 2>/dev/null)
    case "$own" in *" $t "*) [ -n "$t" ] && continue ;; esac
    if (printf 'hako-forged-frame' > "/proc/$n/fd/$f") 2>/dev/null; then echo "WROTE /proc/$n/fd/$f"; fi
    if (: < "/proc/$n/fd/$f") 2>/dev/null; then echo "OPENED /proc/$n/fd/$f"; fi
  done
  if (: < "/proc/$n/mem") 2>/dev/null; then echo "OPENED /proc/$n/mem"; fi
done
echo "tried $targets"
"#;
    let out = sb
        .exec(&Command::shell(SCRIPT).timeout(Duration::from_secs(120)))
        .map_err(|e| {
            format!("the sandbox failed while a command wrote on /proc/PID/fd of its guest: {e}")
        })?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if said.contains("WROTE") || said.contains("OPENED") {
        return Err(format!(
            "a command reached the guest's descriptors:\n{said}"
        ));
    }
    if !said.contains("tried 1 ") {
        return Err(format!(
            "the attack did not run: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    still_usable(sb)
}

/// Runs `hako-probe --steal-guest-fds` (at `probe`, a path inside the
/// sandbox) for `rounds` rounds: kills the guest's idle supervisors and
/// tries every descriptor of each process forked to replace them, stopped
/// the moment it is seen. A fork of a process that holds hako's channel
/// holds it too until it closes what it inherited. `Err` names each
/// descriptor that opened, or how the sandbox failed during or after.
pub fn stealing_the_guests_link_from_a_fresh_supervisor(
    sb: &dyn Sandbox,
    probe: &str,
    rounds: u32,
) -> Result<(), String> {
    let out = sb
        .exec(
            &Command::new([probe, "--steal-guest-fds", &rounds.to_string()])
                .timeout(Duration::from_secs(120)),
        )
        .map_err(|e| format!("the sandbox failed during the attack: {e}"))?;
    check_catch_report(
        &out.stdout,
        &String::from_utf8_lossy(&out.stderr),
        "the attack caught no fresh supervisor",
        "a fresh supervisor",
    )?;
    // Usable afterwards, twice over (the second needs supervisors the
    // attack did not see).
    still_usable(sb)?;
    still_usable(sb)
}

/// Runs `hako-probe --catch-forks` (at `probe`, inside) while Ctrl-C is
/// typed at a terminal process of the same sandbox: the first signal
/// character typed at a terminal makes the guest find out whether the
/// kernel signals Ctrl-C itself, which forks. The fork must hold nothing of hako's channel. `Err`
/// names each descriptor that opened, or what failed.
pub fn stealing_the_guests_link_while_a_terminal_is_typed_at(
    sb: &dyn Sandbox,
    probe: &str,
) -> Result<(), String> {
    use hako_core::{SpawnOptions, TermSize};
    let p = sb
        .processes()
        .ok_or("this sandbox has no long-lived processes")?;
    let tty = p
        .spawn(
            &Command::shell("read -r x; echo got").timeout(Duration::from_secs(60)),
            &SpawnOptions {
                pty: Some(TermSize { rows: 24, cols: 80 }),
                ..SpawnOptions::default()
            },
        )
        .map_err(|e| format!("spawn on a terminal: {e}"))?;
    let catcher = p
        .spawn(
            &Command::new([probe, "--catch-forks", "3000"]).timeout(Duration::from_secs(60)),
            &SpawnOptions::default(),
        )
        .map_err(|e| format!("spawn the probe: {e}"))?;
    // Once the probe watches (it says so on stderr), the first Ctrl-C
    // typed at the terminal.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let said = p
            .read_output(
                catcher,
                hako_core::Stream::Stderr,
                0,
                4096,
                Some(Duration::from_millis(200)),
            )
            .map_err(|e| format!("read the probe's stderr: {e}"))?;
        if String::from_utf8_lossy(&said.data).contains("watching") {
            break;
        }
        if std::time::Instant::now() > until {
            return Err("the probe did not start watching within 30 s".into());
        }
    }
    p.write_stdin(tty, b"\x03")
        .map_err(|e| format!("type Ctrl-C at the terminal: {e}"))?;
    let end = p
        .wait(catcher, Some(Duration::from_secs(60)))
        .map_err(|e| format!("wait for the probe: {e}"))?;
    let _ = p.wait(tty, Some(Duration::from_secs(10)));
    let out = p
        .read_output(catcher, hako_core::Stream::Stdout, 0, 1 << 20, None)
        .map_err(|e| format!("read the probe's report: {e}"))?;
    check_catch_report(
        &out.data,
        &format!(" ({end:?})"),
        FORKED_NOTHING,
        "a fork of the guest",
    )?;
    still_usable(sb)
}

/// How [`stealing_the_guests_link_while_a_terminal_is_typed_at`]'s error
/// starts when the probe caught no fork (the terminal probe's process
/// lives for a millisecond or so, and on a loaded machine the probe can be
/// off the CPU for all of it): the attack tried nothing, so a test may try
/// again in a fresh sandbox (the guest asks only once per sandbox).
pub const FORKED_NOTHING: &str = "the guest forked nothing while the probe watched";

/// Checks that the sandbox still answers a command after an attack.
fn still_usable(sb: &dyn Sandbox) -> Result<(), String> {
    let again = sb
        .exec(&Command::shell("echo still here").timeout(Duration::from_secs(60)))
        .map_err(|e| format!("the sandbox is not usable after the attack: {e}"))?;
    if again.stdout != b"still here\n" {
        return Err(format!(
            "the sandbox answers wrongly after the attack: {:?} {:?}",
            String::from_utf8_lossy(&again.stdout),
            String::from_utf8_lossy(&again.stderr)
        ));
    }
    Ok(())
}

/// Reads a `hako-probe` fork-catching report (`stdout`, and what to show
/// beside it when it is not JSON): `Err` when it caught no fresh process
/// (`nothing` says why that means the attack tried nothing) or opened any
/// of their descriptors (`reached` names whose).
fn check_catch_report(
    stdout: &[u8],
    beside: &str,
    nothing: &str,
    reached: &str,
) -> Result<(), String> {
    let report: serde_json::Value = serde_json::from_slice(stdout).map_err(|e| {
        format!(
            "the probe's report is not JSON ({e}): {}{beside}",
            String::from_utf8_lossy(stdout)
        )
    })?;
    if report["caught"].as_u64().unwrap_or(0) == 0 {
        return Err(format!("{nothing}, so it tried nothing: {report}"));
    }
    if report["reached"].as_array().is_some_and(|r| !r.is_empty()) {
        return Err(format!(
            "a command opened descriptors of {reached}: {report}"
        ));
    }
    Ok(())
}
