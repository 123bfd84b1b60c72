#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A subset of the conformance kit, unchanged, on the vm backend, run one
//! after another in one test: exit codes, stdin, and host secrets. Each
//! case boots a VM of its own, 35 to 40 s under TCG on a loaded 2-core
//! host, so the whole kit is not run here (many of its cases also need the
//! workspace shared with the guest, which this backend does not do yet).
//! Measured on such a host: `stdout_and_stderr_are_kept_apart` passes too;
//! `timeout_kills_the_whole_process_tree` fails there, its markers not
//! seen inside within the kit's 4.5 s while the emulated guest starts
//! them. Skips without QEMU or the image (`HAKO_VM_IMAGE`), unless
//! `HAKO_MUST_WORK=1`.

use std::path::Path;

use hako_conformance::Outcome;
use hako_vm::{VmConfig, VmSandbox};

/// The cases run here.
const CASES: &[&str] = &[
    "exit_codes_are_reported_exactly",
    "stdin_is_delivered_byte_for_byte",
    "host_secrets_do_not_reach_the_command",
];

#[test]
fn the_conformance_subset_passes_on_vm() {
    if let Err(reason) = hako_vm::readiness() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED the_conformance_subset_passes_on_vm: {reason}");
        return;
    }
    let factory = hako_conformance::factory(|ws: &Path| {
        let spec = hako_core::SandboxSpec::new(ws.to_path_buf());
        Ok(Box::new(VmSandbox::new(VmConfig::from_spec(spec))?))
    });
    let mut failed = Vec::new();
    for name in CASES {
        let started = std::time::Instant::now();
        let outcome = hako_conformance::run_case(name, factory.clone());
        eprintln!("{name}: {outcome:?} ({:.1?})", started.elapsed());
        match outcome {
            Outcome::Passed => {}
            other => failed.push(format!("{name}: {other:?}")),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
