#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Escape attempts from inside `docker` sandboxes, on runc and on gVisor
//! (`--runtime runsc`): the container backends' escape kit
//! (`crates/container/testkit/escapes.rs`, which says what each attack
//! is), opened here with this backend.

use hako_docker::{DockerConfig, DockerSandbox, DEFAULT_IMAGE};

include!("../../container/testkit/escapes.rs");

fn open(kind: Kind, ws: &Path, limits: Limits) -> Option<Box<dyn Sandbox>> {
    let runtime = match kind {
        Kind::Runc => None,
        Kind::Runsc => Some("runsc"),
        Kind::Gvisor => unreachable!("the gvisor backend's own tests open it"),
    };
    if let Err(reason) = hako_docker::ready(DEFAULT_IMAGE, runtime) {
        return skip(&reason);
    }
    let mut config = DockerConfig::new(ws);
    config.spec.runtime = runtime.map(str::to_string);
    config.spec.limits = limits;
    Some(Box::new(DockerSandbox::new(config).unwrap()))
}

escapes_on!(docker_runc, Kind::Runc);
escapes_on!(docker_runsc, Kind::Runsc);
