#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The linux backend's network: the network kit, unchanged (`none`,
//! `allow` through the egress proxy, `host`). The cases that reach an
//! allowed name start a server in a network namespace of their own and
//! need root.

use std::path::Path;

use hako_core::NetworkPolicy;
use hako_linux::{LinuxConfig, LinuxSandbox};

hako_conformance::network_tests!(linux_network, |ws: &Path, net: NetworkPolicy| {
    let mut config = LinuxConfig::new(ws);
    config.spec.network = Some(net);
    Ok(Box::new(LinuxSandbox::new(config)?))
});
