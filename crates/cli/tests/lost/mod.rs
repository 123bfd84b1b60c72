//! `hako run` whose sandbox is lost mid command (its guest, the linux
//! sandbox's pid 1, killed from outside): it fails saying so, with the
//! exit code of a sandbox that failed, and its audit log records the loss.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{dirs, hako, text};

/// Host processes whose first argument is `argv0` and that have an
/// argument equal to `arg`.
fn pids(argv0: &str, arg: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.first() == Some(&argv0.as_bytes()) && args.contains(&arg.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn run_whose_sandbox_is_lost_mid_command_says_so_and_its_audit_log_records_it() {
    let d = dirs();
    let log = d.outside.join("audit.log");
    let marker = format!("{}", 730_000_000 + std::process::id());
    let child = hako()
        .args(["run", "--backend", "linux", "--workspace"])
        .arg(&d.ws)
        .arg("--audit")
        .arg(&log)
        .args(["--", "sleep", "600", &marker])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let command = loop {
        if let Some(pid) = pids("sleep", &marker).first() {
            break *pid;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The command's parent is its supervisor, whose parent is the
    // sandbox's pid 1, the guest.
    let guest = parent(parent(command));
    let killed = std::process::Command::new("kill")
        .args(["-9", &guest.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let said = text(&out.stderr);
    assert!(said.contains("the sandbox was lost"), "{said}");
    let records = hako_audit::records(&log).unwrap();
    let lost: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "lost")
        .collect();
    assert_eq!(lost.len(), 1, "{records:?}");
    assert_eq!(lost[0]["front_end"], "run");
    assert_eq!(lost[0]["backend"], "linux");
    assert_eq!(lost[0]["during"], "run command");
    assert!(
        lost[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("guest ended")),
        "{:?}",
        lost[0]
    );
    let verify = hako().args(["audit", "verify"]).arg(&log).output().unwrap();
    assert!(verify.status.success(), "{verify:?}");
    let start = Instant::now();
    while !pids("sleep", &marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the command outlived its guest"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
