#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The docker backend with no daemon: a recording runner takes the place of
//! the `docker` CLI, records every argv, and for `docker run` starts
//! `hako-guest --stdio` on the host instead, so the whole path (open, a
//! command, close) runs and the exact calls can be checked.

use std::path::PathBuf;
use std::sync::Arc;

use hako_container::runner::Recorder;
use hako_container::{Engine, EngineKind, Owner};
use hako_core::{Command, Sandbox};
use hako_docker::{self as docker, RunPlan, DEFAULT_IMAGE};
use hako_docker::{DockerConfig, DockerSandbox};

/// Any statically linked executable passes for the guest in the argv (it
/// is only bound, never run, here).
const STATIC_STAND_IN: &str = "/bin/busybox";

#[test]
fn a_docker_sandbox_makes_exactly_the_recorded_calls() {
    let stand_in = PathBuf::from(STATIC_STAND_IN);
    if hako_container::is_static_elf(&stand_in) != Some(true) {
        assert!(!hako_conformance::must_work(), "busybox-static is needed");
        eprintln!("SKIPPED: no static {STATIC_STAND_IN}");
        return;
    }
    let guest = hako_driver::connection::locate_guest().unwrap();
    let recorder = Arc::new(Recorder {
        spawn_with: Some(vec![guest.display().to_string(), "--stdio".into()]),
        ..Recorder::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let engine = Engine {
        argv: vec!["docker".into()],
        kind: EngineKind::Docker,
    };
    let mut config = DockerConfig::new(&ws);
    config.engine = Some(engine.clone());
    config.runner = recorder.clone();
    config.launch.guest = Some(stand_in.clone());
    let sb = DockerSandbox::new(config).unwrap();
    let out = sb.exec(&Command::shell("echo hi; pwd")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("hi\n{}\n", ws.display())
    );
    let name = sb.container().to_string();
    sb.close().unwrap();

    let calls = recorder.calls();
    let runs: Vec<&Vec<String>> = calls
        .iter()
        .filter(|c| c.get(1).map(String::as_str) == Some("run"))
        .collect();
    assert_eq!(runs.len(), 1, "{calls:#?}");
    let run = runs[0];
    // The argv is exactly what the plan renders, with the profile file
    // hako wrote and this process as the owner.
    let profile = run
        .iter()
        .find_map(|a| a.strip_prefix("seccomp="))
        .map(PathBuf::from)
        .unwrap();
    let me = Owner::current();
    let plan = RunPlan {
        name: name.clone(),
        owner: me,
        workspace: ws.clone(),
        guest: stand_in.canonicalize().unwrap(),
        seccomp_profile: profile.clone(),
        image: DEFAULT_IMAGE.into(),
        runtime: None,
        limits: Default::default(),
        tmp_size: hako_container::DEFAULT_TMP_SIZE,
        user: (
            hako_sys::rustix::process::geteuid().as_raw(),
            hako_sys::rustix::process::getegid().as_raw(),
        ),
        sealed: false,
        ro: Vec::new(),
        rw: Vec::new(),
        network: hako_container::RunNetwork::None,
        cow: None,
    };
    assert_eq!(run, &docker::run_argv(&engine, &plan));
    // The client (here, the guest itself) exited cleanly: nothing to
    // remove, and the profile file is gone with the sandbox.
    assert!(
        !calls
            .iter()
            .any(|c| c.get(1).map(String::as_str) == Some("rm")),
        "{calls:#?}"
    );
    assert!(
        !profile.exists(),
        "the seccomp profile outlived the sandbox"
    );
}

/// An engine argv of its own, so that the daemon's runtimes this test
/// scripts are not the ones another test cached.
fn engine(name: &str) -> Engine {
    Engine {
        argv: vec![name.into()],
        kind: EngineKind::Docker,
    }
}

#[test]
fn allow_mode_is_refused_where_nothing_inside_could_reach_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    // docker exec mode: no guest, so no forwarder inside.
    let recorder = Arc::new(Recorder::default());
    let mut config = DockerConfig::new(&ws);
    config.engine = Some(engine("docker-exec-mode"));
    config.runner = recorder.clone();
    config.spec.network = Some(hako_core::NetworkPolicy::allow(["pkg.test"]));
    match hako_docker::DockerExecSandbox::new(config) {
        Err(hako_core::Error::NetworkUnavailable {
            mode: "allow",
            reason,
            ..
        }) => {
            assert!(reason.contains("--no-guest"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(recorder.calls().is_empty(), "{:?}", recorder.calls());
    // A gVisor runtime registered without --host-uds=open.
    let runtimes =
        r#"{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=none","--oci-seccomp"]}}"#;
    let recorder = Arc::new(Recorder {
        script: vec![(
            vec!["info".into()],
            hako_container::runner::RunOutput {
                success: true,
                stdout: runtimes.as_bytes().to_vec(),
                ..Default::default()
            },
        )],
        ..Recorder::default()
    });
    let mut config = DockerConfig::new(&ws);
    config.engine = Some(engine("docker-no-host-uds"));
    config.runner = recorder.clone();
    config.spec.runtime = Some("runsc".into());
    config.launch.guest = Some(PathBuf::from(STATIC_STAND_IN));
    config.spec.network = Some(hako_core::NetworkPolicy::allow(["pkg.test"]));
    match DockerSandbox::new(config) {
        Err(hako_core::Error::NetworkUnavailable {
            mode: "allow",
            reason,
            ..
        }) => {
            assert!(reason.contains("--host-uds=open"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !recorder
            .calls()
            .iter()
            .any(|c| c.get(1).map(String::as_str) == Some("run")),
        "a container was started: {:?}",
        recorder.calls()
    );
}
