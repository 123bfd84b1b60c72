//! What the vm backend's test files share: where QEMU, the image
//! (`HAKO_VM_IMAGE`) or virtiofsd (`HAKO_VIRTIOFSD`) is missing, a case
//! skips and says why, unless `HAKO_MUST_WORK=1`.
#![allow(dead_code)] // each test file uses what it needs

use hako_core::Error;

/// `Ok` where the vm backend runs here; else the error a kit's factory
/// returns to skip its case, after printing why.
pub fn readiness() -> Result<(), Error> {
    hako_vm::readiness().map_err(|reason| {
        eprintln!("vm backend unavailable: {reason}");
        Error::Unsupported {
            backend: "vm".into(),
            capability: "running on this host (see the reason printed above)",
        }
    })
}

/// Whether the vm backend runs here; prints why not, and fails under
/// `HAKO_MUST_WORK=1`.
pub fn ready() -> bool {
    match hako_vm::readiness() {
        Ok(()) => true,
        Err(reason) => {
            assert!(!hako_conformance::must_work(), "{reason}");
            eprintln!("SKIPPED: {reason}");
            false
        }
    }
}
