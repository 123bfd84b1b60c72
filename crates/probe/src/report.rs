//! The report: every check's outcome beside what the policy would answer,
//! the process's credentials and `/proc/self/status` fields, and a few
//! behaviours (threads, spawning, a shell job) that must keep working.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use hako_seccomp::{default_policy, Arch, NAMESPACE_FLAGS, PERSONALITY_QUERY, TIOCSTI};
use hako_sys::raw::BAD_ADDRESS;
use serde_json::{json, Map, Value};

use crate::call::{errno_name, policy_errno, raw, run_check, Outcome};
use crate::table::{checks, How};

fn run_result(result: Result<(), String>) -> Value {
    match result {
        Ok(()) => json!({"ok": true, "error": null}),
        Err(error) => json!({"ok": false, "error": error}),
    }
}

fn spawn_ok(command: &mut Command) -> Result<(), String> {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exited with {status}"))
    }
}

/// `/proc/self/status` fields the report includes.
pub const STATUS_FIELDS: &[&str] = &[
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
];

fn status() -> Value {
    status_fields(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())
}

/// The [`STATUS_FIELDS`] of a `/proc/PID/status` text, their values trimmed.
fn status_fields(text: &str) -> Value {
    let mut map = Map::new();
    for line in text.lines() {
        if let Some((key, value)) = line.split_once(':') {
            if STATUS_FIELDS.contains(&key) {
                map.insert(key.to_owned(), json!(value.trim()));
            }
        }
    }
    Value::Object(map)
}

/// The x32 `mount` call alone (x86_64 only): its outcome, if the process
/// survives it.
pub fn single_x32_mount(arch: Arch) -> Value {
    match checks(arch).into_iter().find(|c| c.how == How::X32) {
        Some(check) => Value::Object(run_check(arch, &check).0.to_json()),
        None => json!({"skipped": "no x32 ABI on this architecture"}),
    }
}

/// The result of `unshare(CLONE_NEWUSER)` in this process (`--single
/// unshare-newuser`, run in a fresh single-threaded child).
pub fn unshare_newuser_here(arch: Arch) -> Value {
    let newuser = NAMESPACE_FLAGS
        .iter()
        .find(|(ns, _)| *ns == "newuser")
        .map_or(0x1000_0000, |&(_, flag)| flag);
    Value::Object(raw(arch.syscall_number("unshare"), [newuser, 0, 0, 0, 0, 0]).to_json())
}

fn unshare_newuser_in_child() -> Value {
    let run = || -> Result<Value, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let output = Command::new(exe)
            .args(["--single", "unshare-newuser"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&output.stdout).map_err(|e| format!("{e}: {}", output.status))
    };
    run().unwrap_or_else(
        |error| json!({"ret": null, "errno": null, "error": null, "spawn_error": error}),
    )
}

/// Runs every check and returns the report.
pub fn report(arch: Arch, applied_default_seccomp: bool) -> Value {
    report_with(arch, applied_default_seccomp, false)
}

/// [`report`], without the x32 check when `skip_x32`: under a container
/// runtime's filter (libseccomp), a call of an ABI the profile does not
/// list kills the process instead of failing, and the report would be lost
/// with it (see [`single_x32_mount`]).
pub fn report_with(arch: Arch, applied_default_seccomp: bool, skip_x32: bool) -> Value {
    let policy = default_policy();
    let mut syscalls = BTreeMap::new();
    for check in checks(arch) {
        if skip_x32 && check.how == How::X32 {
            continue;
        }
        let (outcome, args) = run_check(arch, &check);
        let want = policy_errno(&policy, &check, &args);
        let refused = matches!((outcome, want), (Outcome::Errno(e), Some(w)) if e == w);
        let mut entry = outcome.to_json();
        entry.insert("syscall".into(), json!(check.syscall));
        entry.insert(
            "args".into(),
            json!(args.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>()),
        );
        entry.insert("allowed_looks_like".into(), json!(check.allowed_looks_like));
        entry.insert(
            "kernel_may_refuse".into(),
            json!(check.kernel_may_refuse.as_str()),
        );
        entry.insert(
            "policy".into(),
            json!(want.map_or_else(|| "allow".to_owned(), errno_name)),
        );
        entry.insert("refused".into(), json!(refused));
        syscalls.insert(check.name, Value::Object(entry));
    }

    let personality = arch.syscall_number("personality");
    let ioctl = arch.syscall_number("ioctl");
    let behaviour = json!({
        "unshare_newuser": unshare_newuser_in_child(),
        "personality_query": raw(personality, [PERSONALITY_QUERY, 0, 0, 0, 0, 0]).to_json(),
        "tiocsti_fd0": raw(ioctl, [0, TIOCSTI, BAD_ADDRESS, 0, 0, 0]).to_json(),
        "thread": run_result(
            std::thread::spawn(|| 42)
                .join()
                .map_err(|_| "the thread panicked".to_owned())
                .and_then(|v| if v == 42 { Ok(()) } else { Err("wrong value".into()) }),
        ),
        "spawn_self": run_result(
            std::env::current_exe()
                .map_err(|e| e.to_string())
                .and_then(|exe| spawn_ok(Command::new(exe).args(["--single", "noop"]))),
        ),
        "shell_background_job": run_result(spawn_ok(
            Command::new("/bin/sh").args(["-c", "true & wait $!"]),
        )),
    });

    use hako_sys::rustix::process;
    json!({
        "arch": arch.name(),
        "applied_default_seccomp": applied_default_seccomp,
        "status": status(),
        "uid": process::getuid().as_raw(),
        "euid": process::geteuid().as_raw(),
        "gid": process::getgid().as_raw(),
        "egid": process::getegid().as_raw(),
        // Asked of the kernel, for kernels whose /proc/self/status has no
        // NoNewPrivs line (gVisor).
        "no_new_privs": hako_sys::raw::no_new_privs().map(u8::from).ok(),
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default(),
        "syscalls": syscalls,
        "behaviour": behaviour,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_status_fields_asked_for_are_kept_trimmed() {
        let text = "Name:\tprobe\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\nCapEffX:\t1\n";
        assert_eq!(
            status_fields(text),
            json!({"CapEff": "0000000000000000", "NoNewPrivs": "1",
                   "Seccomp": "2", "Seccomp_filters": "1"})
        );
        assert_eq!(status_fields(""), json!({}));
    }

    #[test]
    fn a_run_is_reported_ok_or_with_its_error() {
        assert_eq!(run_result(Ok(())), json!({"ok": true, "error": null}));
        assert_eq!(
            run_result(Err("no".into())),
            json!({"ok": false, "error": "no"})
        );
    }
}
