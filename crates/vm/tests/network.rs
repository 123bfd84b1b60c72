#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The vm backend's network: the network kit, unchanged. The VM has no
//! NIC: in network mode `allow` the guest's forwarder reaches the egress
//! proxy through a bridge that carries its connections over a second
//! virtio-serial port. Needs what tests/conformance.rs needs.

use std::path::Path;

use hako_core::NetworkPolicy;
use hako_vm::{VmConfig, VmSandbox};

mod support;

hako_conformance::network_tests!(vm_network, |ws: &Path, net: NetworkPolicy| {
    support::readiness()?;
    let mut spec = hako_core::SandboxSpec::new(ws.to_path_buf());
    spec.network = Some(net);
    Ok(Box::new(VmSandbox::new(VmConfig::from_spec(spec))?))
});
