//! A container guest sealing itself before it serves (see [`Seal`]).
//!
//! Order, and why:
//! 1. Masks, while the guest still holds `CAP_SYS_ADMIN` (the only reason
//!    it was given it): `/dev/null` bound over each secret file, an empty
//!    read-only tmpfs over each secret directory.
//! 2. `no_new_privs` (the runtime sets it too; seccomp needs it once the
//!    capabilities are gone).
//! 3. Every capability dropped, the bounding set emptied (with the
//!    `CAP_SETPCAP` given for this) and the securebits locked where the
//!    kernel has them (gVisor's has none; with the bounding and
//!    inheritable sets empty, not even uid 0 gains a capability by
//!    `exec`): a set that is not empty afterwards is a failure, not a
//!    warning. With [`Seal::guard`], `CAP_SETPCAP` alone stays in the
//!    permitted set, never effective: the guest and its supervisors hold a
//!    capability no command can, which puts them out of the commands'
//!    reach through `/proc` and `ptrace` (see `Seal::guard`).
//! 4. The default seccomp policy: from here no process of the sandbox can
//!    mount, unmount or reach any other call the policy refuses.
//!
//! Any failure ends the guest before it has read a single command.

use hako_sys::rustix::thread::CapabilitySet;

use crate::error::{failed, failed_on};
use crate::proto::Seal;
use crate::GuestError;

/// Applies `seal` to the calling (single-threaded) guest.
pub(crate) fn apply(seal: &Seal) -> Result<(), GuestError> {
    use hako_sys::mount as m;
    let null = std::path::Path::new("/dev/null");
    for dir in &seal.mask_dirs {
        crate::linux::mount_if_present(dir, || {
            m::mount(
                Some(std::path::Path::new("tmpfs")),
                dir,
                Some("tmpfs"),
                m::MS_RDONLY | m::MS_NOSUID | m::MS_NODEV | m::MS_NOEXEC,
                Some("mode=0000"),
            )
        })
        .map_err(failed_on("mask", dir))?;
    }
    for file in &seal.mask_files {
        crate::linux::mount_if_present(file, || m::mount(Some(null), file, None, m::MS_BIND, None))
            .map_err(failed_on("mask", file))?;
    }
    hako_sys::confine::set_no_new_privs().map_err(failed("set no_new_privs"))?;
    let guard = if seal.guard {
        CapabilitySet::SETPCAP
    } else {
        CapabilitySet::empty()
    };
    let dropped =
        hako_sys::confine::drop_capabilities_keeping(guard).map_err(failed("drop capabilities"))?;
    if dropped.kept != guard {
        return Err(GuestError::GuardNotKept);
    }
    if !dropped.bounding_set_empty {
        return Err(GuestError::BoundingSetNotEmptied);
    }
    if seal.seccomp {
        let program = crate::confine::default_seccomp()?;
        hako_seccomp::apply(&program).map_err(failed("install the seccomp filter"))?;
    }
    Ok(())
}
