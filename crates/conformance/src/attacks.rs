//! Attacks from inside that every isolating backend must refuse, written
//! once and run by each backend's escape tests (the host backend, which
//! isolates nothing, is not asked to refuse them).

use std::time::Duration;

use hako_core::{Command, Sandbox};

/// Tries, from a command inside, to open every descriptor of the guest
/// (pid 1), of the command's supervisor (its parent) and of every other
/// process running the guest's program (a spare supervisor), for writing
/// (writing a frame there would speak on hako's channel as the guest) and
/// for reading, and the guest's memory (a character device, such as the
/// `/dev/null` a supervisor holds as its stdio, is passed over); then
/// checks that the sandbox still answers. `Err` says what was reached, or how the sandbox failed after.
pub fn writing_on_the_guests_link_through_proc(sb: &dyn Sandbox) -> Result<(), String> {
    const SCRIPT: &str = r#"
one=$(tr '\0' ' ' < /proc/1/cmdline 2>/dev/null)
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
    let again = sb
        .exec(&Command::shell("echo still here").timeout(Duration::from_secs(60)))
        .map_err(|e| format!("the sandbox is not usable after the attack: {e}"))?;
    if again.stdout != b"still here\n" {
        return Err(format!(
            "the sandbox answers wrongly after the attack: {:?}",
            String::from_utf8_lossy(&again.stdout)
        ));
    }
    Ok(())
}
