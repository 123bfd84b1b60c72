#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! `docker exec` mode against a real daemon: commands, their status and
//! output, stdin, the working directory and environment, a missing
//! program, a deadline (the container restarts and stays usable), files
//! through the fence, and no container left after close. Skips (unless
//! `HAKO_MUST_WORK=1`) without dockerd and the image.

use std::path::Path;
use std::process::Command as Process;
use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, Sandbox};
use hako_docker::DEFAULT_IMAGE;
use hako_docker::{DockerConfig, DockerExecSandbox};

mod support;
use support::containers_named;

fn open(ws: &Path) -> Option<DockerExecSandbox> {
    let present = Process::new("docker")
        .args(["image", "inspect", DEFAULT_IMAGE])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        assert!(
            !hako_conformance::must_work(),
            "docker and the image {DEFAULT_IMAGE} are needed"
        );
        eprintln!("SKIPPED: no docker or no image {DEFAULT_IMAGE}");
        return None;
    }
    Some(DockerExecSandbox::new(DockerConfig::new(ws)).unwrap())
}

#[test]
fn docker_exec_mode_runs_commands_with_their_status_output_and_input() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let Some(sb) = open(&ws) else { return };
    assert!(sb.sessions().is_none() && sb.processes().is_none());
    assert!(!sb.capabilities().optional.sessions);
    let out = sb
        .exec(&Command::shell("echo out; echo err >&2; exit 3"))
        .unwrap();
    assert_eq!(out.status, ExitStatus::Code(3));
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    std::fs::create_dir(ws.join("sub")).unwrap();
    let out = sb
        .exec(
            &Command::shell("pwd; printf %s \"$GREETING\"; cat")
                .cwd("sub")
                .env("GREETING", "hello")
                .stdin(b" world".to_vec()),
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\nhello world", ws.join("sub").display())
    );
    let out = sb
        .exec(&Command::shell("head -c 100000 /dev/zero").max_output(1000))
        .unwrap();
    assert_eq!(
        (out.stdout.len(), out.stdout_total, out.stdout_truncated),
        (1000, 100_000, true)
    );
    match sb.exec(&Command::new(["hako-no-such-program"])) {
        Err(Error::CommandNotFound { program }) => assert_eq!(program, "hako-no-such-program"),
        other => panic!("expected CommandNotFound, got {other:?}"),
    }
    // Files written through the fence are seen inside, and the other way.
    sb.write_file(Path::new("note"), b"from hako").unwrap();
    let out = sb
        .exec(&Command::shell("cat note; echo inside > back"))
        .unwrap();
    assert_eq!(out.stdout, b"from hako");
    assert_eq!(sb.read_file(Path::new("back")).unwrap(), b"inside\n");
    let name = sb.container().to_string();
    sb.close().unwrap();
    assert!(
        containers_named(&name).is_empty(),
        "the container is removed at close"
    );
    assert!(matches!(
        sb.exec(&Command::new(["true"])),
        Err(Error::Closed)
    ));
}

#[test]
fn docker_exec_mode_deadline_kills_everything_and_the_sandbox_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let Some(sb) = open(&ws) else { return };
    let out = sb
        .exec(
            &Command::shell("echo before; sleep 987654 & sleep 987655")
                .timeout(Duration::from_millis(500)),
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.status, ExitStatus::Signal(9));
    assert_eq!(out.stdout, b"before\n");
    let out = sb
        .exec(&Command::shell(
            "ps -o args | grep -c '^sleep 98765' || true",
        ))
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "nothing survived the deadline"
    );
    sb.close().unwrap();
}

/// `docker exec` without `--interactive` hands the command the host's
/// `/dev/null` as its stdin, and some engine versions then give that
/// device to the exec'd user by changing its owner on the host (Podman
/// 4.3 with runc, as Debian 12 ships them; runc 1.1.3 and 1.1.4): hako
/// always attaches stdin and closes it when the command has none. The
/// host's `/dev/null` keeps its owner and mode, a command with no input
/// reads end of file at once, and the sandbox goes on.
#[test]
fn exec_mode_leaves_the_host_s_dev_null_owner_and_mode_as_they_were() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let Some(sb) = open(&ws) else { return };
    let before = std::fs::metadata("/dev/null").unwrap();
    for script in [
        "true",
        "cat",
        "id -u >/dev/null; exec 0<&-; true",
        "ls -l /dev/null",
    ] {
        let out = sb
            .exec(&Command::shell(script).timeout(Duration::from_secs(60)))
            .unwrap();
        assert!(out.status.success() && !out.timed_out, "{script}: {out:?}");
    }
    let after = std::fs::metadata("/dev/null").unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode()),
        (before.uid(), before.gid(), before.mode()),
        "the host's /dev/null changed"
    );
    let out = sb
        .exec(&Command::shell("cat").stdin(b"still here".to_vec()))
        .unwrap();
    assert_eq!(out.stdout, b"still here");
    sb.close().unwrap();
}
