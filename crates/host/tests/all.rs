#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The host backend's integration tests: the conformance kit twice (with
//! each fence resolver), plus what the kit's workspace-only factory cannot
//! express.
//!
//! The tests start `hako-guest`: run `cargo build --workspace --bins` first
//! (or set `HAKO_GUEST`).

use std::path::Path;

use hako_core::FenceResolver;
use hako_fence::FenceOptions;
use hako_host::{HostConfig, HostSandbox};

hako_conformance::conformance_tests!(host, |ws: &Path| {
    Ok(Box::new(HostSandbox::new(HostConfig::new(ws))?))
});

hako_conformance::conformance_tests!(host_component_walk, |ws: &Path| {
    let mut config = HostConfig::new(ws);
    config.launch.fence = FenceOptions {
        resolver: Some(FenceResolver::ComponentWalk),
        ..FenceOptions::default()
    };
    Ok(Box::new(HostSandbox::new(config)?))
});

mod host_specific;
