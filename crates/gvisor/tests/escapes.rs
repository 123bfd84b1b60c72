#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Escape attempts from inside `gvisor` sandboxes (on the image
//! directory): the container backends' escape kit
//! (`crates/container/testkit/escapes.rs`, which says what each attack
//! is), opened here with this backend.

use hako_gvisor::{GvisorConfig, GvisorSandbox};

include!("../../container/testkit/escapes.rs");

fn open(kind: Kind, ws: &Path, limits: Limits) -> Option<Box<dyn Sandbox>> {
    assert!(matches!(kind, Kind::Gvisor), "docker's own tests open it");
    if let Err(reason) = hako_gvisor::ready() {
        return skip(&reason);
    }
    let Some(rootfs) = std::env::var_os("HAKO_IMAGE_DIR") else {
        return skip("HAKO_IMAGE_DIR is not set");
    };
    let mut config = GvisorConfig::new(ws);
    config.spec.image = Some(PathBuf::from(rootfs).to_string_lossy().into_owned());
    config.spec.limits = limits;
    Some(Box::new(GvisorSandbox::new(config).unwrap()))
}

escapes_on!(gvisor, Kind::Gvisor);
