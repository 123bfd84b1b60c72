//! The `vm` backend: a virtual machine per sandbox, with a kernel of its
//! own, its init the same guest every backend runs.
//!
//! QEMU boots the image `hako vm build` makes ([`image`]: Debian's cloud
//! kernel and an initramfs with the static guest as init) on its `microvm`
//! machine, with KVM where it works with the guest's kernel, else TCG
//! ([`accel`], which says why). The guest speaks hako's protocol over a
//! virtio-serial port that is QEMU's stdio, so the driver reaches it as it
//! reaches a container's guest. No NIC; QEMU's own seccomp sandbox on.
//!
//! What it enforces: the commands run on the guest's kernel, behind the
//! VMM; with KVM the boundary is the hardware's. With TCG the boundary is
//! QEMU's emulator, which QEMU's security policy does not count as one:
//! the sandbox's capabilities and `hako doctor` say so. What it does not
//! yet: the workspace is not shared with the guest (`/workspace` inside is
//! the guest's own), the VMM is not jailed beyond `-sandbox on`, no
//! network.

pub mod accel;
pub mod image;
pub mod jail;
mod launcher;
mod qemu;
mod qmp;
mod runner;
mod sandbox;
pub mod virtiofs;
pub mod vmm;

pub use launcher::{StartKind, StartReport};
pub use sandbox::{
    bare_boot_argv, default_plan, image_dir, qemu_argv, qemu_path, snapshot_path, QemuPlan,
    VmConfig, VmSandbox, DEFAULT_MEMORY_MIB, SNAPSHOTS_DIR,
};

/// The backend's name.
pub const NAME: &str = "vm";

/// The variable naming the image's directory (in place of
/// [`image::default_dir`]).
pub const IMAGE_VAR: &str = "HAKO_VM_IMAGE";

/// The variable naming the QEMU binary.
pub const QEMU_VAR: &str = "HAKO_QEMU";

/// Why the backend cannot run here, and what to do: QEMU missing, or no
/// image built. Ready is not fast: see [`accel::detect`] for how the VM
/// would run.
pub fn readiness() -> Result<(), hako_container::NotReady> {
    let qemu = qemu_path(None);
    let found = if qemu.components().count() > 1 {
        qemu.is_file()
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(&qemu).is_file()))
            .unwrap_or(false)
    };
    if !found {
        return Err(hako_container::NotReady {
            reason: format!("{} is not installed", qemu.display()),
            hint: format!("install qemu-system-x86 (Debian), or set {QEMU_VAR}"),
        });
    }
    image_dir(None).map_err(|e| hako_container::NotReady {
        reason: e.to_string(),
        hint: "run `hako vm build`".into(),
    })?;
    if virtiofs::find().is_none() {
        return Err(hako_container::NotReady {
            reason: "virtiofsd is not installed (the vm backend shares the workspace with it)".into(),
            hint: format!(
                "`cargo install virtiofsd` (it builds against libseccomp-dev and libcap-ng-dev), or your distribution's virtiofsd package; hako finds it beside itself, in /usr/libexec or on PATH, or set {}",
                virtiofs::VIRTIOFSD_VAR
            ),
        });
    }
    Ok(())
}
