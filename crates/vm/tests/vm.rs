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
    let mut spec = hako_core::SandboxSpec::new(ws);
    spec.limits.memory = Some(256 << 20);
    let sandbox = VmSandbox::new(VmConfig::from_spec(spec)).unwrap();
    let caps = sandbox.capabilities();
    // --memory sizes the VM, and is reported as such.
    assert!(
        caps.limits
            .iter()
            .any(|l| l.kind == hako_core::LimitKind::Memory
                && l.value == Some(256 << 20)
                && l.mechanism == hako_core::LimitMechanism::VmSize),
        "{:?}",
        caps.limits
    );
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
    let out = sandbox
        .exec(&Command::shell(
            "sed -n 's/^MemTotal: *\\([0-9]*\\) kB$/\\1/p' /proc/meminfo",
        ))
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        kib > 0 && kib <= 256 << 10,
        "MemTotal {kib} kB in a 256 MiB VM"
    );
    // Still serving after a command that fails.
    let out = sandbox.exec(&Command::shell("echo hi; exit 3")).unwrap();
    assert_eq!(out.status, ExitStatus::Code(3), "{out:?}");
    assert_eq!(out.stdout, b"hi\n");
    sandbox.close().unwrap();
    // Closed: no QEMU of this process is left (the guest, the VM's init,
    // exits when hako closes the link, and the VM ends with it).
    let start = std::time::Instant::now();
    while !qemu_children().is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "QEMU left after close: {:?}",
            qemu_children()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// This process's children that are QEMU (not yet reaped included).
fn qemu_children() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let state_ppid: Vec<&str> = rest.split_whitespace().take(2).collect();
            head.contains("(qemu")
                && state_ppid.get(1) == Some(&me.to_string().as_str())
                && state_ppid.first() != Some(&"Z")
        })
        .collect()
}

#[test]
fn limits_the_vm_cannot_enforce_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = hako_core::SandboxSpec::new(dir.path().canonicalize().unwrap());
    spec.limits.pids = Some(64);
    spec.limits.open_files = Some(64);
    let err = VmSandbox::new(VmConfig::from_spec(spec))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--pids, --max-open-files not enforced"),
        "{err}"
    );
    assert!(err.contains("--best-effort"), "{err}");
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
