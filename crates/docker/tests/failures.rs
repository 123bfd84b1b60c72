#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The docker backend when things go wrong, against the real runtimes:
//! every failure is a clear error that names what failed, nothing hangs,
//! and nothing is left behind. Skips (unless `HAKO_MUST_WORK=1`) without
//! dockerd, the image or a static guest.

use std::process::Command as Process;
use std::time::{Duration, Instant};

use hako_container::engine::{Engine, EngineKind};
use hako_core::{Command, Sandbox};
use hako_docker::{self as docker, DockerConfig, DockerSandbox, DEFAULT_IMAGE};

mod support;
use support::containers_named;

fn docker_ready() -> bool {
    match docker::ready(DEFAULT_IMAGE, None) {
        Ok(()) => true,
        Err(reason) => {
            assert!(!hako_conformance::must_work(), "docker is needed: {reason}");
            eprintln!("SKIPPED: {reason}");
            false
        }
    }
}

fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    (dir, ws)
}

fn error_of<T: std::fmt::Debug>(result: hako_core::Result<T>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_runtime_binary_is_named() {
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let mut config = DockerConfig::new(&ws);
    config.engine = Some(Engine {
        argv: vec!["/nonexistent/hako-no-docker".into()],
        kind: EngineKind::Docker,
    });
    let err = error_of(DockerSandbox::new(config));
    assert!(
        err.contains("/nonexistent/hako-no-docker is not installed"),
        "{err}"
    );
}

#[test]
fn a_daemon_that_is_down_is_reported_with_the_clients_words() {
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let mut config = DockerConfig::new(&ws);
    // A daemon socket nobody listens on: what a stopped dockerd looks like.
    config.engine = Some(Engine {
        argv: vec![
            "docker".into(),
            "--host".into(),
            "unix:///nonexistent/docker.sock".into(),
        ],
        kind: EngineKind::Docker,
    });
    let start = Instant::now();
    let err = error_of(DockerSandbox::new(config));
    assert!(err.contains("Cannot connect to the Docker daemon"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "it hung");
}

#[test]
fn a_missing_image_is_named_and_never_pulled() {
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let mut config = DockerConfig::new(&ws);
    config.spec.image = Some("hako-no-such-image:1".into());
    let err = error_of(DockerSandbox::new(config));
    assert!(err.contains("hako-no-such-image"), "{err}");
    assert!(err.to_lowercase().contains("no such image"), "{err}");
}

#[test]
fn a_container_killed_mid_exec_is_named_and_the_next_call_fails_cleanly() {
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let sandbox = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let name = sandbox.container().to_string();
    let err = std::thread::scope(|scope| {
        let exec = scope.spawn(|| sandbox.exec(&Command::shell("sleep 600")));
        std::thread::sleep(Duration::from_millis(500));
        let killed = Process::new("docker")
            .args(["kill", &name])
            .output()
            .unwrap();
        assert!(killed.status.success(), "{killed:?}");
        error_of(exec.join().unwrap())
    });
    assert!(err.contains(&name), "the error names the container: {err}");
    let start = Instant::now();
    let next = error_of(sandbox.exec(&Command::new(["true"])));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the next call hung"
    );
    assert!(next.contains(&name), "{next}");
    sandbox.close().unwrap();
    assert!(containers_named(&name).is_empty(), "the container is gone");
}

#[test]
fn closing_or_dropping_a_sandbox_removes_its_container() {
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let sandbox = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let name = sandbox.container().to_string();
    assert_eq!(
        containers_named(&name),
        std::slice::from_ref(&name),
        "running while open"
    );
    sandbox.close().unwrap();
    assert!(containers_named(&name).is_empty(), "close removed {name}");
    let sandbox = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let name = sandbox.container().to_string();
    drop(sandbox);
    assert!(containers_named(&name).is_empty(), "drop removed {name}");
}

#[test]
fn containers_of_a_dead_owner_are_collected_and_a_live_owners_are_not() {
    if !docker_ready() {
        return;
    }
    // A process that has exited: its pid names no live owner.
    let mut gone = Process::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let me = hako_container::Owner::current();
    let create = |name: &str, pid: u32, start: u64| {
        let out = Process::new("docker")
            .args(["create", "--name", name, "--label"])
            .arg(format!("hako.owner.pid={pid}"))
            .arg("--label")
            .arg(format!("hako.owner.start={start}"))
            .args([DEFAULT_IMAGE, "true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let stale = format!("hako-test-stale-{}", std::process::id());
    let live = format!("hako-test-live-{}", std::process::id());
    create(&stale, dead_pid, 1);
    create(&live, me.pid, me.start);
    let engine = Engine {
        argv: vec!["docker".into()],
        kind: EngineKind::Docker,
    };
    let removed = hako_docker::gc::collect(&engine, &hako_container::runner::CliRunner).unwrap();
    let live_left = containers_named(&live);
    let _ = Process::new("docker")
        .args(["rm", "--force", &live])
        .output();
    assert!(removed.contains(&stale), "{removed:?}");
    assert!(!removed.contains(&live), "{removed:?}");
    assert!(containers_named(&stale).is_empty());
    assert_eq!(live_left, [live]);
}

#[test]
fn a_container_killed_during_a_session_and_a_process_is_named_and_every_call_fails_cleanly() {
    use hako_core::{SessionOptions, SpawnOptions};
    if !docker_ready() {
        return;
    }
    let (_d, ws) = workspace();
    let sandbox = DockerSandbox::new(DockerConfig::new(&ws)).unwrap();
    let name = sandbox.container().to_string();
    let sessions = sandbox.sessions().unwrap();
    let processes = sandbox.processes().unwrap();
    let session = sessions.open_session(&SessionOptions::default()).unwrap();
    let process = processes
        .spawn(&Command::shell("sleep 600"), &SpawnOptions::default())
        .unwrap();
    let err = std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            sandbox
                .sessions()
                .unwrap()
                .session_exec(session, &Command::shell("sleep 600"), None)
        });
        std::thread::sleep(Duration::from_millis(500));
        let killed = Process::new("docker")
            .args(["kill", &name])
            .output()
            .unwrap();
        assert!(killed.status.success(), "{killed:?}");
        error_of(run.join().unwrap())
    });
    assert!(
        err.contains(&name),
        "the session's error names the container: {err}"
    );
    // The process is reported ended, not running, and every further call
    // fails at once with an error, none hangs.
    let start = Instant::now();
    match processes.wait(process, Some(Duration::from_secs(30))) {
        Ok(state) => assert!(state.finished(), "{state:?}"),
        Err(e) => assert!(e.to_string().contains(&name), "{e}"),
    }
    error_of(sessions.session_exec(session, &Command::shell("true"), None));
    error_of(processes.spawn(&Command::shell("true"), &SpawnOptions::default()));
    error_of(sandbox.exec(&Command::new(["true"])));
    assert!(start.elapsed() < Duration::from_secs(30), "a call hung");
    sandbox.close().unwrap();
    assert!(containers_named(&name).is_empty(), "the container is gone");
}

/// `docker inspect -f FORMAT name`, trimmed.
fn inspect(name: &str, format: &str) -> Result<String, String> {
    let out = Process::new("docker")
        .args(["inspect", "-f", format, name])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn kill_9(pids: &[i32]) -> Result<(), String> {
    if pids.is_empty() {
        return Err("nothing to kill".into());
    }
    for pid in pids {
        let status = Process::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("kill -9 {pid}: {status}"));
        }
    }
    Ok(())
}

/// A sandbox on `runtime` whose guest is lost to `kill` (given the
/// container's name): every call fails with `SandboxLost` naming the
/// container (see `hako_conformance::lost`), and the container is gone
/// after close.
fn lost_when_killed(runtime: Option<&str>, kill: impl FnOnce(&str) -> Result<(), String>) {
    if let Err(reason) = docker::ready(DEFAULT_IMAGE, runtime) {
        assert!(!hako_conformance::must_work(), "docker is needed: {reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (_d, ws) = workspace();
    let mut config = DockerConfig::new(&ws);
    config.spec.runtime = runtime.map(str::to_string);
    let sandbox = DockerSandbox::new(config).unwrap();
    let name = sandbox.container().to_string();
    let lost =
        hako_conformance::lost::lost_mid_command_session_and_process(&sandbox, |_| kill(&name))
            .unwrap();
    for err in [lost.command.to_string(), lost.later.to_string()] {
        assert!(err.contains(&name), "the error names the container: {err}");
    }
    assert!(containers_named(&name).is_empty(), "the container is gone");
}

#[test]
fn the_containers_init_killed_from_the_host_mid_command_session_and_process_is_reported_lost() {
    // The guest is the container's init: its host pid, as the engine
    // reports it.
    lost_when_killed(None, |name| {
        let pid = inspect(name, "{{.State.Pid}}")?;
        kill_9(&[pid.parse().map_err(|_| format!("pid {pid:?}"))?])
    });
}

/// The host processes named `argv0` of the runsc container `name`: its
/// `runsc-sandbox` names the container's id; the gofer is its sibling.
fn runsc_processes(argv0: &str, name: &str) -> Result<Vec<i32>, String> {
    let id = inspect(name, "{{.Id}}")?;
    let sandboxes = hako_conformance::lost::host_processes_named("runsc-sandbox", &id);
    if argv0 == "runsc-sandbox" {
        return Ok(sandboxes);
    }
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let parents: Vec<_> = sandboxes.iter().filter_map(|p| parent(*p)).collect();
    Ok(hako_conformance::lost::host_processes_named(argv0, "")
        .into_iter()
        .filter(|p| parent(*p).is_some_and(|pp| parents.contains(&pp)))
        .collect())
}

#[test]
fn runscs_sandbox_process_killed_under_docker_mid_command_session_and_process_is_reported_lost() {
    lost_when_killed(Some("runsc"), |name| {
        kill_9(&runsc_processes("runsc-sandbox", name)?)
    });
}

#[test]
fn runscs_gofer_killed_under_docker_mid_command_session_and_process_is_reported_lost() {
    lost_when_killed(Some("runsc"), |name| {
        kill_9(&runsc_processes("runsc-gofer", name)?)
    });
}

#[test]
fn a_runtime_dockerd_does_not_know_is_named_with_whether_it_is_installed() {
    if !docker_ready() {
        return;
    }
    let engine = hako_container::engine::shared(&hako_container::runner::CliRunner).unwrap();
    if engine.kind != EngineKind::Docker {
        eprintln!("SKIPPED: runtimes are registered with dockerd only");
        return;
    }
    // Installed (on PATH) but not registered: register it, not install it.
    let known = docker::readiness(DEFAULT_IMAGE, Some("sh")).unwrap_err();
    assert_eq!(known.reason, "dockerd has no runtime named sh");
    assert!(
        known.hint.starts_with(
            "sh is installed but dockerd does not know it: register it in /etc/docker/daemon.json"
        ),
        "{known}"
    );
    // Not installed: install it, then register it.
    let missing = docker::readiness(DEFAULT_IMAGE, Some("hako-no-such-runtime")).unwrap_err();
    assert!(
        missing.hint.starts_with("install hako-no-such-runtime"),
        "{missing}"
    );
    // And the runtimes it knows pass.
    docker::readiness(DEFAULT_IMAGE, Some("runc")).unwrap();
}

#[test]
fn a_missing_default_image_is_built_on_first_use_or_named_with_the_command_to_run() {
    if !docker_ready() {
        return;
    }
    use hako_container::image::{ensure_built_from, present, DEFAULT_BUSYBOX};
    use hako_container::runner::CliRunner;
    let engine = hako_container::engine::shared(&CliRunner).unwrap();
    let tag = format!("hako-test-first-use-{}:latest", std::process::id());
    // No static busybox: one line, with the command that fixes it, and
    // nothing imported.
    let err = ensure_built_from(
        &engine,
        &CliRunner,
        &tag,
        std::path::Path::new("/nonexistent/busybox"),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("image {tag} is not present")),
        "{err}"
    );
    assert!(
        err.contains("run `sudo apt-get install busybox-static`"),
        "{err}"
    );
    assert!(!present(&engine, &CliRunner, &tag).unwrap());
    // With it: built once, then known.
    assert!(ensure_built_from(
        &engine,
        &CliRunner,
        &tag,
        std::path::Path::new(DEFAULT_BUSYBOX)
    )
    .unwrap());
    assert!(present(&engine, &CliRunner, &tag).unwrap());
    assert!(!ensure_built_from(
        &engine,
        &CliRunner,
        &tag,
        std::path::Path::new(DEFAULT_BUSYBOX)
    )
    .unwrap());
    // The image built runs a sandbox.
    let (_dir, ws) = workspace();
    let mut config = DockerConfig::new(&ws);
    config.spec.image = Some(tag.clone());
    let sb = DockerSandbox::new(config).unwrap();
    let out = sb.exec(&Command::new(["sh", "-c", "echo built"])).unwrap();
    assert_eq!(out.stdout, b"built\n");
    sb.close().unwrap();
    let _ = Process::new("docker")
        .args(["image", "rm", "-f", &tag])
        .output();
}
