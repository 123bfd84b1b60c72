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

/// Every process's pid and its directory in /proc.
fn processes() -> Vec<(u32, std::path::PathBuf)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, entry.path()))
        })
        .collect()
}

/// The pids of the processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for (pid, dir) in processes() {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
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

/// Every process whose command line names `needle` (the workspace, which
/// QEMU's virtiofsd has on its own).
fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for (pid, dir) in processes() {
        let Ok(raw) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) && pid != std::process::id() {
            found.push((pid, cmdline));
        }
    }
    found
}

#[test]
fn hako_run_on_vm_prints_the_guest_kernel_s_release_and_reports_its_accelerator() {
    if !ready("hako_run_on_vm_prints_the_guest_kernel_s_release_and_reports_its_accelerator") {
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
    let image = hako_vm::image_dir(None).unwrap();
    let release = std::fs::read_to_string(image.join(hako_vm::image::RELEASE_FILE)).unwrap();
    assert_eq!(inside, release.trim());
    // --json names the isolation and the accelerator.
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["run", "--backend", "vm", "--json", "--", "true"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["isolation"], "vm", "{json}");
    let accel = hako_vm::accel::detect().accel.name();
    assert_eq!(json["accelerator"], accel, "{json}");
}

#[test]
fn a_write_from_either_side_of_the_workspace_is_seen_by_the_other_at_once() {
    if !ready("a_write_from_either_side_of_the_workspace_is_seen_by_the_other_at_once") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    // One sandbox, kept open by `hako shell`-less means: a command that
    // writes, waits for the host's answer, and reads it; `hako fs` reads
    // and writes from the host while it waits.
    let mut run = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args([
            "run",
            "--backend",
            "vm",
            "--",
            "sh",
            "-c",
            "echo from-inside > in.txt; echo written; \
             while [ ! -e out.txt ]; do sleep 0.05; done; cat out.txt",
        ])
        .current_dir(ws.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "written\n");
    // The host's file API sees the guest's write at once.
    let read = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["fs", "read", "in.txt"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(read.status.success(), "{read:?}");
    assert_eq!(read.stdout, b"from-inside\n");
    // And the guest sees the host's.
    let write = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["fs", "write", "out.txt"])
        .current_dir(ws.path())
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"from-the-host\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(write.status.success(), "{write:?}");
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "from-the-host\n");
    let status = run.wait().unwrap();
    assert!(status.success());
}

#[test]
fn kill_9_of_hako_leaves_no_qemu_virtiofsd_or_temporary_file_behind() {
    if !ready("kill_9_of_hako_leaves_no_qemu_virtiofsd_or_temporary_file_behind") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    // A temporary directory of this run's own: whatever hako made there
    // and left would show.
    let tmp = tempfile::tempdir().unwrap();
    let image = hako_vm::image_dir(None).unwrap();
    let snapshots = image.join(hako_vm::SNAPSHOTS_DIR);
    let before: Vec<_> = std::fs::read_dir(&snapshots)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
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
        .current_dir(&ws_path)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Once the command runs, the VM is up and its workspace shared.
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
    let needle = format!("--shared-dir={}", ws_path.display());
    assert!(
        !processes_naming(&needle).is_empty(),
        "no virtiofsd shares the workspace"
    );
    hako.kill().unwrap();
    hako.wait().unwrap();
    // Gone, whatever became of them; a bound only so a failure does not
    // hang.
    let start = Instant::now();
    loop {
        let qemu_left = std::path::Path::new(&format!("/proc/{}", qemu[0])).exists()
            && comm(qemu[0]).is_some_and(|c| c.starts_with("qemu"));
        let daemons = processes_naming(&needle);
        if !qemu_left && daemons.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "outlived hako: qemu {qemu_left}, virtiofsd {daemons:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    let after: Vec<_> = std::fs::read_dir(&snapshots)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    for name in &after {
        assert!(
            before.contains(name) || name.to_string_lossy().ends_with(".state"),
            "a stray file among the snapshots: {name:?}"
        );
    }
    // And hako still works afterwards: the next sandbox starts.
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["run", "--backend", "vm", "--", "true"])
        .current_dir(&ws_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The processes whose mount namespace holds a mount naming `needle`.
fn mount_holders(needle: &str) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, dir)| {
            std::fs::read_to_string(dir.join("mountinfo")).is_ok_and(|t| t.contains(needle))
        })
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn run_cow_on_vm_leaves_the_workspace_untouched_until_commit_and_kill_9_leaves_no_mount() {
    if !ready(
        "run_cow_on_vm_leaves_the_workspace_untouched_until_commit_and_kill_9_leaves_no_mount",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    let state = tmp.path().join("state");
    let hako = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hako"));
        cmd.current_dir(&ws);
        cmd
    };
    // `hako run --backend vm --cow` on the named layers, running `script`.
    let on_layers = |script: &str| {
        let mut cmd = hako();
        cmd.args([
            "run",
            "--backend",
            "vm",
            "--cow",
            "--name",
            "fix",
            "--state",
        ])
        .arg(&state)
        .args(["--", "sh", "-c", script]);
        cmd
    };
    let run = |script: &str| on_layers(script).stdin(Stdio::null()).output().unwrap();
    let out = run("echo two >> a.txt && echo new > b.txt && cat a.txt");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\n");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
    assert!(!ws.join("b.txt").exists());
    let diff = hako()
        .args(["diff", "fix", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        text.contains("+two\n") && text.contains("+++ b/b.txt\n"),
        "{diff:?}"
    );
    // A sandbox on the layers, its hako killed outright: the overlay
    // (named in mount tables by its upper layer, beneath the state
    // directory) is in no mount table afterwards, and the layers are
    // free for the next sandbox and for review.
    let needle = state.display().to_string();
    let mut held = on_layers("echo up; exec sleep 1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(held.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    assert!(
        !mount_holders(&needle).is_empty(),
        "the overlay is mounted nowhere"
    );
    let own = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !own.contains(&needle),
        "the overlay is in the host's table: {own}"
    );
    held.kill().unwrap();
    held.wait().unwrap();
    let start = Instant::now();
    while !mount_holders(&needle).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the overlay outlived hako: held by {:?}",
            mount_holders(&needle)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run("cat b.txt");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "new\n", "{out:?}");
    let out = hako()
        .args(["commit", "fix", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
}
