//! Finding processes by a marker in their command line, from the host's
//! `/proc` and from inside the sandbox (whose pid namespace may differ).

use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, Sandbox};

/// Host processes with an argument equal to `arg`, as `(pid, command line)`.
/// This process is never listed.
pub fn host_processes_with_arg(arg: &str) -> Vec<(i32, String)> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        // A process that exited meanwhile has no command line: skip it.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        if args.contains(&arg.as_bytes()) {
            let shown = args
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            out.push((pid as i32, shown));
        }
    }
    out
}

/// Kills a host process (best effort; used to clean up after a failure).
pub(crate) fn kill(pid: i32) {
    use hako_sys::rustix::process::{kill_process, Pid, Signal};
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process(pid, Signal::KILL);
    }
}

/// The script that lists, from inside, the processes with an argument equal
/// to `$HAKO_MARK`. POSIX sh, `tr` and `/proc` only (no `ps`); the marker
/// comes through the environment so that the scanning shell's own command
/// line does not contain it.
const SCAN: &str = r#"for p in /proc/[0-9]*; do
  c=$(tr '\000' ' ' < "$p/cmdline" 2>/dev/null) || continue
  case " $c" in
    *" $HAKO_MARK "*) echo "${p#/proc/} $c" ;;
  esac
done
exit 0"#;

/// Processes with an argument equal to `arg`, as seen from inside the
/// sandbox (its own pid namespace, if it has one): one `pid cmdline` line
/// each.
pub fn sandbox_processes_with_arg(sandbox: &dyn Sandbox, arg: &str) -> Result<Vec<String>, Error> {
    let out = sandbox.exec(
        &Command::shell(SCAN)
            .env("HAKO_MARK", arg)
            .timeout(Duration::from_secs(60)),
    )?;
    if out.status != ExitStatus::Code(0) || out.timed_out {
        return Err(Error::Backend {
            backend: sandbox.capabilities().backend.clone(),
            op: "scan /proc from inside",
            message: format!(
                "the scan exited {:?} (timed out: {}): {}",
                out.status,
                out.timed_out,
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}
