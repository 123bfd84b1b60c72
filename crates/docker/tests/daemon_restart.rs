#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! dockerd restarted while a docker sandbox is open and runs a command.
//! With `live-restore` off (Docker's default) the daemon's stop ends every
//! container: the sandbox is lost, and says so (`SandboxLost`, naming the
//! container) on the running command and on every later call; closing
//! works and leaves no container; a new sandbox opens once the daemon is
//! back. With `live-restore` on, the sandbox goes on.
//!
//! Its own test binary, with its one test: restarting the daemon ends the
//! containers of any other test running beside it. It restarts dockerd
//! only when asked (`HAKO_TEST_DOCKERD_RESTART=1`, which `scripts/test-all`
//! sets; it starts dockerd by hand, as this test does), and always leaves
//! dockerd running and answering, even when it fails.

use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use hako_core::{Command, Sandbox};
use hako_docker::{self as docker, DockerConfig, DockerSandbox, DEFAULT_IMAGE};

mod support;
use support::containers_named;

/// A hang guard for the daemon's stop and start, never a performance
/// assertion.
const GUARD: Duration = Duration::from_secs(60);

fn answers() -> bool {
    Process::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The running dockerd's pid, from its pid file.
fn dockerd_pid() -> Option<i32> {
    std::fs::read_to_string("/var/run/docker.pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

/// Starts dockerd by hand (as `scripts/test-all` does) unless it answers,
/// and waits until it does.
fn ensure_dockerd() {
    if answers() {
        return;
    }
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dockerd-restart.log");
    let log = std::fs::File::create(&log).unwrap();
    // `--fork`: setsid returns at once, and dockerd, not a child of this
    // test, outlives it.
    let forked = Process::new("setsid")
        .args(["--fork", "dockerd"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert!(forked.success(), "setsid --fork dockerd: {forked}");
    let start = Instant::now();
    while !answers() {
        assert!(start.elapsed() < GUARD, "dockerd did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops dockerd (SIGTERM, as a service manager would) and waits for it
/// to end.
fn stop_dockerd() {
    let pid = dockerd_pid().expect("dockerd's pid file");
    let status = Process::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < GUARD, "dockerd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Brings dockerd back when dropped, whatever happened.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ensure_dockerd();
    }
}

#[test]
fn dockerd_restarted_while_a_sandbox_runs_a_command_reports_it_lost_and_a_new_one_opens() {
    if std::env::var_os("HAKO_TEST_DOCKERD_RESTART").is_none_or(|v| v != "1") {
        // Not a skip of something that cannot run here: restarting the
        // daemon would end the containers of whatever else runs.
        eprintln!("not run: restarting dockerd is asked for with HAKO_TEST_DOCKERD_RESTART=1");
        return;
    }
    if let Err(reason) = docker::ready(DEFAULT_IMAGE, None) {
        assert!(!hako_conformance::must_work(), "docker is needed: {reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let live_restore = Process::new("docker")
        .args(["info", "-f", "{{.LiveRestoreEnabled}}"])
        .output()
        .unwrap();
    let live_restore = String::from_utf8_lossy(&live_restore.stdout).trim() == "true";
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let _restore = Restore;
    let sandbox = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let name = sandbox.container().to_string();
    let result = std::thread::scope(|scope| {
        let run =
            scope.spawn(|| sandbox.exec(&Command::shell("echo started; sleep 20; echo done")));
        // The command runs before the daemon stops.
        std::thread::sleep(Duration::from_millis(500));
        stop_dockerd();
        ensure_dockerd();
        run.join().unwrap()
    });
    if live_restore {
        let out = result.unwrap();
        assert_eq!(
            out.stdout, b"started\ndone\n",
            "the command runs on with live-restore"
        );
        let out = sandbox.exec(&Command::new(["echo", "on"])).unwrap();
        assert_eq!(out.stdout, b"on\n");
    } else {
        match result {
            Err(e @ hako_core::Error::SandboxLost { .. }) => {
                assert!(e.to_string().contains(&name), "names the container: {e}")
            }
            other => panic!("the command when dockerd stopped: {other:?}"),
        }
        let start = Instant::now();
        match sandbox.exec(&Command::new(["true"])) {
            Err(e @ hako_core::Error::SandboxLost { .. }) => {
                assert!(e.to_string().contains(&name), "{e}")
            }
            other => panic!("a later call: {other:?}"),
        }
        assert!(start.elapsed() < GUARD, "a later call hung");
    }
    sandbox.close().unwrap();
    assert!(containers_named(&name).is_empty(), "{name} is left");
    // The daemon is back: a new sandbox opens and runs.
    let again = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let out = again.exec(&Command::new(["echo", "again"])).unwrap();
    assert_eq!(out.stdout, b"again\n");
    again.close().unwrap();
}
