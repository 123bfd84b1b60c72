#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The linux backend's guest killed from outside with SIGKILL, during a
//! command: the caller hears of it at once with an error, every further
//! call fails cleanly, and nothing is left.

use std::time::{Duration, Instant};

use hako_conformance::host_processes_with_arg;
use hako_core::{Command, Sandbox};
use hako_linux::{LinuxConfig, LinuxSandbox};

/// The parent of host process `pid`.
fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_guest_killed_mid_command_is_named_and_every_call_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let sandbox = LinuxSandbox::new(LinuxConfig::new(&ws)).unwrap();
    let marker = format!("{}", 700_000_000 + std::process::id());
    let err = std::thread::scope(|scope| {
        let run = scope.spawn(|| sandbox.exec(&Command::new(["sleep", "600", marker.as_str()])));
        let start = Instant::now();
        let command = loop {
            if let Some((pid, _)) = host_processes_with_arg(&marker).first() {
                break *pid;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the command never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The command's parent is its supervisor, whose parent is the
        // guest (pid 1 of the sandbox).
        let guest = parent(parent(command));
        let killed = std::process::Command::new("kill")
            .args(["-9", &guest.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        match run.join().unwrap() {
            Ok(out) => panic!("the exec reported {out:?} though its guest was killed"),
            Err(e) => {
                assert!(e.is_sandbox_lost(), "a typed SandboxLost: {e:?}");
                e.to_string()
            }
        }
    });
    assert!(
        err.contains("guest"),
        "the error names what was lost: {err}"
    );
    let start = Instant::now();
    let next = sandbox.exec(&Command::new(["true"]));
    assert!(
        matches!(next, Err(hako_core::Error::SandboxLost { .. })),
        "{next:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the next call hung"
    );
    let _ = sandbox.close();
    let start = Instant::now();
    while !host_processes_with_arg(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the command outlived its guest"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_guest_killed_mid_command_session_and_process_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let sandbox = LinuxSandbox::new(LinuxConfig::new(&ws)).unwrap();
    hako_conformance::lost::lost_mid_command_session_and_process(&sandbox, |marker| {
        let (command, _) = host_processes_with_arg(marker)
            .into_iter()
            .next()
            .ok_or("no command on the host")?;
        // The guest (the sandbox's pid 1) is the child of the launcher,
        // this process's child: the command's ancestor two below it.
        let me = std::process::id() as i32;
        let mut guest = command;
        while parent(parent(guest)) != me {
            guest = parent(guest);
            if guest <= 1 {
                return Err("the guest is not among the command's ancestors".into());
            }
        }
        let killed = std::process::Command::new("kill")
            .args(["-9", &guest.to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        killed
            .success()
            .then_some(())
            .ok_or("kill failed".to_string())
    })
    .unwrap();
}
