#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The gvisor backend's network: the network kit, unchanged. Needs what
//! tests/gvisor.rs needs; the cases that reach an allowed name also need
//! root.

use std::path::{Path, PathBuf};

use hako_core::{Error, NetworkPolicy};
use hako_gvisor::{GvisorConfig, GvisorSandbox};

fn skip(backend: &str, reason: &str) -> Error {
    eprintln!("{backend} backend unavailable: {reason}");
    Error::Unsupported {
        backend: backend.into(),
        capability: "running on this host (see the reason printed above)",
    }
}

hako_conformance::network_tests!(gvisor_network, |ws: &Path, net: NetworkPolicy| {
    hako_gvisor::ready().map_err(|reason| skip("gvisor", &reason))?;
    let rootfs = std::env::var_os("HAKO_IMAGE_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| {
            skip(
                "gvisor",
                "HAKO_IMAGE_DIR is not set (hako image build --dir DIR)",
            )
        })?;
    let mut config = GvisorConfig::new(ws);
    config.spec.image = Some(rootfs.to_string_lossy().into_owned());
    config.spec.network = Some(net);
    Ok(Box::new(GvisorSandbox::new(config)?))
});
