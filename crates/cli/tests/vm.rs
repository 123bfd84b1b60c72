#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! `hako run --backend vm` as a user runs it, against the real QEMU and
//! the image the test script built once (`HAKO_VM_IMAGE`). Skips without
//! them, unless `HAKO_MUST_WORK=1`. One VM per case: each boot takes tens
//! of seconds under TCG.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn must_work() -> bool {
    std::env::var_os("HAKO_MUST_WORK").is_some_and(|v| v == "1")
}

fn ready(test: &str) -> bool {
    match hako_vm::readiness() {
        Ok(()) => true,
        Err(reason) => {
            assert!(!must_work(), "{reason}");
            eprintln!("SKIPPED {test}: {reason}");
            false
        }
    }
}

/// The pids of the processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

#[test]
fn hako_run_on_vm_prints_the_guest_kernel_s_release() {
    if !ready("hako_run_on_vm_prints_the_guest_kernel_s_release") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["run", "--backend", "vm", "--", "uname", "-r"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let inside = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!inside.is_empty());
    assert_ne!(inside, host.trim());
}

#[test]
fn kill_9_of_hako_leaves_no_qemu_behind() {
    if !ready("kill_9_of_hako_leaves_no_qemu_behind") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut hako = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args([
            "run",
            "--backend",
            "vm",
            "--",
            "sh",
            "-c",
            "echo up; exec sleep 1000",
        ])
        .current_dir(ws.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Once the command runs, the VM is up.
    let mut line = String::new();
    BufReader::new(hako.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    let qemu: Vec<u32> = children(hako.id())
        .into_iter()
        .filter(|p| comm(*p).is_some_and(|c| c.starts_with("qemu")))
        .collect();
    assert_eq!(qemu.len(), 1, "hako's children: {:?}", children(hako.id()));
    hako.kill().unwrap();
    hako.wait().unwrap();
    // Gone, whatever became of it; a bound only so a failure does not hang.
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{}", qemu[0])).exists()
        && comm(qemu[0]).is_some_and(|c| c.starts_with("qemu"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "qemu {} outlived hako",
            qemu[0]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And hako still works afterwards: the next sandbox boots.
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["run", "--backend", "vm", "--", "true"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
