//! The runtime's bounds on a real sandbox (the host backend, which needs
//! no privilege): past `max_sessions` or `max_processes` one more is
//! refused, typed, and the sandbox goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use hako_core::{Command, Error, SessionOptions, SpawnOptions};
use hako_runtime::{open, BackendKind, SandboxSpec};

fn spec(ws: &std::path::Path) -> SandboxSpec {
    let mut spec = SandboxSpec::new(ws.to_path_buf());
    spec.max_sessions = 2;
    spec.max_processes = 2;
    spec
}

#[test]
fn a_session_past_max_sessions_is_refused_and_the_sandbox_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let sb = open(BackendKind::Host, &spec(dir.path())).unwrap();
    let sessions = sb.sessions().unwrap();
    let a = sessions.open_session(&SessionOptions::default()).unwrap();
    let b = sessions.open_session(&SessionOptions::default()).unwrap();
    let err = sessions
        .open_session(&SessionOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::LimitReached { limit: 2, .. }), "{err}");
    // The open ones still work, and closing one makes room.
    let out = sessions
        .session_exec(b, &Command::shell("echo still"), None)
        .unwrap();
    assert_eq!(out.stdout, b"still\n");
    sessions.close_session(a).unwrap();
    let c = sessions.open_session(&SessionOptions::default()).unwrap();
    assert_eq!(
        sb.exec(&Command::new(["true"])).unwrap().status.code(),
        Some(0)
    );
    sessions.close_session(b).unwrap();
    sessions.close_session(c).unwrap();
    sb.close().unwrap();
}

#[test]
fn a_process_past_max_processes_is_refused_and_the_sandbox_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let sb = open(BackendKind::Host, &spec(dir.path())).unwrap();
    let procs = sb.processes().unwrap();
    let sleep = Command::new(["sleep", "30"]);
    let a = procs.spawn(&sleep, &SpawnOptions::default()).unwrap();
    procs.spawn(&sleep, &SpawnOptions::default()).unwrap();
    let err = procs.spawn(&sleep, &SpawnOptions::default()).unwrap_err();
    assert!(matches!(err, Error::LimitReached { limit: 2, .. }), "{err}");
    // Commands still run; one ending makes room.
    assert_eq!(
        sb.exec(&Command::new(["true"])).unwrap().status.code(),
        Some(0)
    );
    procs.kill(a).unwrap();
    procs.wait(a, None).unwrap();
    procs
        .spawn(&Command::new(["true"]), &SpawnOptions::default())
        .unwrap();
    sb.close().unwrap();
}
