#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The docker backend's network: the network kit, unchanged, on docker
//! (runc) and docker with gVisor (`--runtime runsc`, registered with
//! `--host-uds=open` so that it reaches the proxy's socket). Needs what
//! tests/docker.rs needs; the cases that reach an allowed name also need
//! root.

use std::path::Path;

use hako_core::{Error, NetworkPolicy};
use hako_docker::{self as docker, DockerConfig, DockerSandbox, DEFAULT_IMAGE};

fn skip(backend: &str, reason: &str) -> Error {
    eprintln!("{backend} backend unavailable: {reason}");
    Error::Unsupported {
        backend: backend.into(),
        capability: "running on this host (see the reason printed above)",
    }
}

fn open_docker(
    ws: &Path,
    runtime: Option<&str>,
    net: NetworkPolicy,
) -> Result<DockerSandbox, Error> {
    docker::ready(DEFAULT_IMAGE, runtime).map_err(|reason| skip("docker", &reason))?;
    let mut config = DockerConfig::new(ws);
    config.spec.runtime = runtime.map(str::to_string);
    config.spec.network = Some(net);
    DockerSandbox::new(config)
}

hako_conformance::network_tests!(docker_runc_network, |ws: &Path, net: NetworkPolicy| {
    Ok(Box::new(open_docker(ws, None, net)?))
});

hako_conformance::network_tests!(docker_runsc_network, |ws: &Path, net: NetworkPolicy| {
    Ok(Box::new(open_docker(ws, Some("runsc"), net)?))
});
