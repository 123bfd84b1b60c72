#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The docker backend against a real daemon: the conformance kit,
//! unchanged, with the daemon's default runtime (runc) and with gVisor
//! (`--runtime runsc`). Needs dockerd (or podman), the image `hako image
//! build` makes, and a static guest in `HAKO_GUEST_STATIC`; without them
//! every case skips, unless `HAKO_MUST_WORK=1`.

use std::path::Path;

use hako_core::Error;
use hako_docker::{self as docker, DEFAULT_IMAGE};
use hako_docker::{DockerConfig, DockerSandbox};

fn open(ws: &Path, runtime: Option<&str>) -> Result<DockerSandbox, Error> {
    if let Err(reason) = docker::ready(DEFAULT_IMAGE, runtime) {
        eprintln!("docker backend unavailable: {reason}");
        return Err(Error::Unsupported {
            backend: "docker".into(),
            capability: "running on this host (see the reason printed above)",
        });
    }
    let mut config = DockerConfig::new(ws);
    config.spec.runtime = runtime.map(str::to_string);
    DockerSandbox::new(config)
}

hako_conformance::conformance_tests!(docker_runc, |ws: &Path| { Ok(Box::new(open(ws, None)?)) });

hako_conformance::conformance_tests!(docker_runsc, |ws: &Path| {
    Ok(Box::new(open(ws, Some("runsc"))?))
});

/// Podman through the same backend (`HAKO_TEST_PODMAN=1`; on hosts with
/// hybrid cgroups, where Podman's default crun refuses to run, the backend
/// asks for runc itself).
fn open_podman(ws: &Path) -> Result<DockerSandbox, Error> {
    let wanted = std::env::var_os("HAKO_TEST_PODMAN").is_some_and(|v| v == "1");
    let engine = hako_container::Engine::from_words("podman").expect("an engine");
    if !wanted {
        eprintln!("podman is tested only with HAKO_TEST_PODMAN=1");
        return Err(Error::Unsupported {
            backend: "docker".into(),
            capability: "podman unless HAKO_TEST_PODMAN=1",
        });
    }
    let mut config = DockerConfig::new(ws);
    config.engine = Some(engine);
    DockerSandbox::new(config)
}

hako_conformance::conformance_tests!(podman, |ws: &Path| { Ok(Box::new(open_podman(ws)?)) });
