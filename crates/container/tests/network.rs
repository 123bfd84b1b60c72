#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The container backends' network: the network kit, unchanged, on docker
//! (runc), docker with gVisor (`--runtime runsc`, registered with
//! `--host-uds=open` so that it reaches the proxy's socket) and gvisor.
//! Needs what tests/docker.rs and tests/gvisor.rs need; the cases that
//! reach an allowed name also need root.

use std::path::{Path, PathBuf};

use hako_container::docker::{self, DEFAULT_IMAGE};
use hako_container::{DockerConfig, DockerSandbox, GvisorConfig, GvisorSandbox};
use hako_core::{Error, NetworkPolicy};

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
    config.runtime = runtime.map(str::to_string);
    config.network = net;
    DockerSandbox::new(config)
}

hako_conformance::network_tests!(docker_runc_network, |ws: &Path, net: NetworkPolicy| {
    Ok(Box::new(open_docker(ws, None, net)?))
});

hako_conformance::network_tests!(docker_runsc_network, |ws: &Path, net: NetworkPolicy| {
    Ok(Box::new(open_docker(ws, Some("runsc"), net)?))
});

hako_conformance::network_tests!(gvisor_network, |ws: &Path, net: NetworkPolicy| {
    hako_container::gvisor::ready().map_err(|reason| skip("gvisor", &reason))?;
    let rootfs = std::env::var_os("HAKO_IMAGE_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| {
            skip(
                "gvisor",
                "HAKO_IMAGE_DIR is not set (hako image build --dir DIR)",
            )
        })?;
    let mut config = GvisorConfig::new(ws);
    config.rootfs = Some(rootfs);
    config.network = net;
    Ok(Box::new(GvisorSandbox::new(config)?))
});
