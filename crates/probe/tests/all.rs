//! Runs the `hako-probe` binary with and without the default seccomp filter
//! and compares: under the filter every refused system call must get the
//! policy's errno; without it (as root) the same calls must reach the kernel,
//! which proves the probe's arguments tell the two apart.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

use serde_json::Value;

fn probe(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_hako-probe"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "hako-probe {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn filtered() -> Value {
    probe(&["--apply-default-seccomp"])
}

fn must_work() -> bool {
    std::env::var("HAKO_MUST_WORK").is_ok_and(|v| v == "1")
}

/// Checks that need root, as the CI runs them; skipped with a reason
/// otherwise, and failed instead under `HAKO_MUST_WORK=1`.
fn is_root_or_skip(report: &Value, test: &str) -> bool {
    if report["euid"] == 0 {
        return true;
    }
    assert!(
        !must_work(),
        "{test} needs root and HAKO_MUST_WORK=1 is set"
    );
    eprintln!("skipped {test}: not root");
    false
}

#[test]
fn every_refused_syscall_gets_the_policys_errno_under_the_filter() {
    let report = filtered();
    assert_eq!(report["applied_default_seccomp"], true);
    let checks = report["syscalls"].as_object().unwrap();
    assert!(checks.len() > 40);
    for (name, check) in checks {
        assert_eq!(check["refused"], true, "{name} was not refused: {check}");
        let want = if check["policy"] == "ENOSYS" { 38 } else { 1 };
        assert_eq!(check["errno"], want, "{name}: {check}");
    }
}

#[test]
fn without_the_filter_the_probes_calls_reach_the_kernel() {
    let report = probe(&[]);
    assert_eq!(
        report["status"]["Seccomp"], "0",
        "this test runs unfiltered"
    );
    let root = is_root_or_skip(
        &report,
        "without_the_filter_the_probes_calls_reach_the_kernel",
    );
    let checks = report["syscalls"].as_object().unwrap();
    let mut reached = 0;
    for (name, check) in checks {
        let may_refuse = check["kernel_may_refuse"].as_str().unwrap();
        let refused = check["refused"] == true;
        if !refused {
            reached += 1;
        }
        match may_refuse {
            "never" => assert!(!refused, "{name} looks refused without a filter: {check}"),
            "unprivileged" if root => {
                assert!(
                    !refused,
                    "{name} looks refused for root without a filter: {check}"
                )
            }
            _ if refused => eprintln!("note: {name} refused by this kernel itself: {check}"),
            _ => {}
        }
        assert!(check.get("not_made").is_none(), "{name}: {check}");
    }
    // At least most of them prove the arguments reach the kernel.
    assert!(
        reached * 4 >= checks.len() * 3,
        "{reached} of {}",
        checks.len()
    );
}

#[test]
fn under_the_filter_a_new_user_namespace_is_refused() {
    let report = filtered();
    assert_eq!(report["behaviour"]["unshare_newuser"]["errno"], 1);
    assert_eq!(report["syscalls"]["unshare_newuser"]["errno"], 1);
    assert_eq!(report["syscalls"]["clone_newuser"]["errno"], 1);
}

#[test]
fn without_the_filter_root_can_create_a_user_namespace() {
    let report = probe(&[]);
    if !is_root_or_skip(
        &report,
        "without_the_filter_root_can_create_a_user_namespace",
    ) {
        return;
    }
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    if max.trim() == "0" {
        assert!(!must_work(), "user namespaces are disabled on this host");
        eprintln!("skipped: user.max_user_namespaces is 0");
        return;
    }
    assert_eq!(
        report["behaviour"]["unshare_newuser"]["ret"], 0,
        "{}",
        report["behaviour"]
    );
}

#[test]
fn threads_processes_and_background_jobs_work_under_the_filter() {
    // glibc creates threads and spawns processes with clone3 first; the
    // filter answers ENOSYS and glibc falls back to clone.
    let behaviour = &filtered()["behaviour"];
    for key in ["thread", "spawn_self", "shell_background_job"] {
        assert_eq!(behaviour[key]["ok"], true, "{key}: {}", behaviour[key]);
    }
}

#[test]
fn under_the_filter_the_personality_query_stays_allowed() {
    let report = filtered();
    let query = &report["behaviour"]["personality_query"];
    assert!(query["ret"].is_i64(), "{query}");
    let set = &report["syscalls"]["personality_addr_no_randomize"];
    assert_eq!(set["errno"], 1, "{set}");
}

#[test]
fn under_the_filter_tiocsti_on_stdin_is_refused() {
    let report = filtered();
    assert_eq!(report["behaviour"]["tiocsti_fd0"]["errno"], 1);
    assert_eq!(report["syscalls"]["ioctl_tiocsti_high_bits"]["errno"], 1);
}

#[test]
fn the_report_shows_no_new_privs_and_a_seccomp_filter() {
    let status = &filtered()["status"];
    assert_eq!(status["NoNewPrivs"], "1");
    assert_eq!(status["Seccomp"], "2");
    for field in hako_probe::STATUS_FIELDS {
        assert!(status[*field].is_string(), "{field} missing: {status}");
    }
    let plain = probe(&[]);
    assert_eq!(plain["status"]["NoNewPrivs"], "0");
    assert!(plain["hostname"].is_string());
    assert!(plain["uid"].is_u64() && plain["gid"].is_u64());
}
