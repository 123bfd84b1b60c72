#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The vm backend against the real QEMU and the image `hako vm build`
//! made (named by `HAKO_VM_IMAGE`, which the test script builds once).
//! Skips without them, unless `HAKO_MUST_WORK=1`. Few cases: each boots a
//! VM, which takes tens of seconds under TCG on a loaded host.

use hako_core::{Command, ExitStatus, Isolation, Sandbox};
use hako_vm::{VmConfig, VmSandbox};

fn ready() -> bool {
    match hako_vm::readiness() {
        Ok(()) => true,
        Err(reason) => {
            assert!(!hako_conformance::must_work(), "{reason}");
            eprintln!("SKIPPED a_vm_sandbox_runs_its_commands_on_the_guest_s_kernel: {reason}");
            false
        }
    }
}

#[test]
fn a_vm_sandbox_runs_its_commands_on_the_guest_s_kernel() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let sandbox = VmSandbox::new(VmConfig::from_spec(hako_core::SandboxSpec::new(ws))).unwrap();
    let caps = sandbox.capabilities();
    assert_eq!(caps.isolation, Isolation::Vm);
    assert_eq!(caps.backend, "vm");
    // An emulated VM says so.
    let tcg = sandbox.accelerator() == hako_vm::accel::Accelerator::Tcg;
    assert_eq!(
        caps.defects
            .iter()
            .any(|d| d.starts_with("accelerator tcg")),
        tcg,
        "{:?}",
        caps.defects
    );
    let out = sandbox.exec(&Command::new(["uname", "-r"])).unwrap();
    assert_eq!(out.status, ExitStatus::Code(0), "{out:?}");
    let inside = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(inside, host.trim(), "the guest runs the host's kernel");
    let image = hako_vm::image_dir(None).unwrap();
    if let Ok(release) = std::fs::read_to_string(image.join(hako_vm::image::RELEASE_FILE)) {
        assert_eq!(inside, release.trim());
    }
    // Still serving after a command that fails.
    let out = sandbox.exec(&Command::shell("echo hi; exit 3")).unwrap();
    assert_eq!(out.status, ExitStatus::Code(3), "{out:?}");
    assert_eq!(out.stdout, b"hi\n");
    sandbox.close().unwrap();
}

#[test]
fn an_emulated_vm_does_not_stand_for_min_isolation_vm_unless_allowed() {
    let detected = hako_vm::accel::detect();
    if detected.accel.is_hardware() {
        eprintln!("SKIPPED an_emulated_vm_does_not_stand_for_min_isolation_vm_unless_allowed: KVM works here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut spec = hako_core::SandboxSpec::new(dir.path().canonicalize().unwrap());
    spec.min_isolation = Isolation::Vm;
    let err = VmSandbox::new(VmConfig::from_spec(spec))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--allow-emulated-vm"), "{err}");
    assert!(err.contains("accelerator tcg"), "{err}");
}
