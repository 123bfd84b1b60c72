#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The conformance kit, unchanged, on the vm backend: QEMU (TCG where KVM
//! cannot run the guest's kernel), the image `hako vm build` made
//! (`HAKO_VM_IMAGE`), the workspace shared over virtio-fs (`virtiofsd`,
//! `HAKO_VIRTIOFSD`). The first VM boots and keeps a snapshot of itself
//! idle; every other starts from it. Without QEMU, the image or virtiofsd
//! every case skips, unless `HAKO_MUST_WORK=1`.

use std::path::Path;

use hako_vm::{VmConfig, VmSandbox};

mod support;

hako_conformance::conformance_tests!(vm, |ws: &Path| {
    support::readiness()?;
    let spec = hako_core::SandboxSpec::new(ws.to_path_buf());
    Ok(Box::new(VmSandbox::new(VmConfig::from_spec(spec))?))
});
