//! Which accelerator a VM runs on: KVM where `/dev/kvm` works with the
//! guest's kernel, else QEMU's TCG (an emulator; QEMU's own security
//! policy does not count TCG as a security boundary, so hako says so).

use std::path::Path;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accelerator {
    /// Hardware virtualisation through `/dev/kvm`.
    Kvm,
    /// QEMU's emulator.
    Tcg,
}

impl Accelerator {
    /// The name QEMU's `-accel` takes (and hako reports).
    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Kvm => "kvm",
            Accelerator::Tcg => "tcg",
        }
    }

    /// Whether the VM's boundary is hardware's (KVM), not an emulator's.
    pub fn is_hardware(self) -> bool {
        self == Accelerator::Kvm
    }
}

/// What the host offers, and the accelerator chosen with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The accelerator a VM gets.
    pub accel: Accelerator,
    /// Why, when it is not KVM (or KVM with a caveat).
    pub why: Option<String>,
}

/// The variable that names the accelerator (`kvm` or `tcg`) in place of
/// detection, for a host whose KVM needs a kernel hako cannot tell apart
/// (a PVM host with a PVM guest kernel given by `--kernel`).
pub const ACCEL_VAR: &str = "HAKO_VM_ACCEL";

/// Chooses the accelerator: `$HAKO_VM_ACCEL` if set, else KVM when
/// `/dev/kvm` opens read-write and the host is not PVM, else TCG.
pub fn detect() -> Detected {
    match std::env::var(ACCEL_VAR).ok().as_deref() {
        Some("kvm") => {
            return Detected {
                accel: Accelerator::Kvm,
                why: Some(format!("{ACCEL_VAR}=kvm")),
            }
        }
        Some("tcg") => {
            return Detected {
                accel: Accelerator::Tcg,
                why: Some(format!("{ACCEL_VAR}=tcg")),
            }
        }
        _ => {}
    }
    detect_at(Path::new("/dev/kvm"), Path::new("/sys/module"))
}

/// [`detect`] against the given device and `/sys/module` (for tests).
pub fn detect_at(kvm: &Path, sys_module: &Path) -> Detected {
    let tcg = |why: String| Detected {
        accel: Accelerator::Tcg,
        why: Some(why),
    };
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(kvm) {
        return tcg(format!(
            "{} cannot be opened ({e}): emulated with TCG, which is not a hardware boundary",
            kvm.display()
        ));
    }
    if sys_module.join("kvm_pvm").exists() {
        return tcg(format!(
            "{} is PVM (kvm_pvm), which boots only kernels built with PVM guest support: emulated with TCG; give such a kernel (hako vm build --kernel) and set {ACCEL_VAR}=kvm",
            kvm.display()
        ));
    }
    Detected {
        accel: Accelerator::Kvm,
        why: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn no_kvm_device_is_tcg_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let found = detect_at(&dir.path().join("kvm"), dir.path());
        assert_eq!(found.accel, Accelerator::Tcg);
        assert!(found.why.unwrap().contains("cannot be opened"));
    }

    #[test]
    fn a_pvm_host_is_tcg_and_names_pvm() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kvm"), "").unwrap();
        std::fs::create_dir(dir.path().join("kvm_pvm")).unwrap();
        let found = detect_at(&dir.path().join("kvm"), dir.path());
        assert_eq!(found.accel, Accelerator::Tcg);
        assert!(found.why.unwrap().contains("PVM guest support"));
        std::fs::remove_dir(dir.path().join("kvm_pvm")).unwrap();
        assert_eq!(
            detect_at(&dir.path().join("kvm"), dir.path()).accel,
            Accelerator::Kvm
        );
    }
}
