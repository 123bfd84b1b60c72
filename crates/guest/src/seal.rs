//! A container guest sealing itself before it serves (see [`Seal`]).
//!
//! Order, and why:
//! 0. The process limit ([`Seal::pids_max`]), while the guest holds
//!    `CAP_SYS_ADMIN` and before it forks anything: gVisor's own `pids`
//!    controller mounted on a directory the masks cover next, a group
//!    with the limit, pid 1 in it (so its zygote, supervisors and every
//!    command are counted), then that directory covered with an empty
//!    read-only tmpfs. The hierarchy stays mounted (unmounting it would
//!    drop the limit) but out of every command's reach, and the seccomp
//!    policy below keeps any process from unmounting the cover.
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
use crate::proto::{Seal, PIDS_CGROUP_DIR};
use crate::GuestError;

/// Applies `seal` to the calling (single-threaded) guest.
pub(crate) fn apply(seal: &Seal) -> Result<(), GuestError> {
    use hako_sys::mount as m;
    if let Some(max) = seal.pids_max {
        limit_pids(max)?;
    }
    let null = std::path::Path::new("/dev/null");
    for dir in &seal.mask_dirs {
        crate::namespaces::mount_if_present(dir, || {
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
        crate::namespaces::mount_if_present(file, || {
            m::mount(Some(null), file, None, m::MS_BIND, None)
        })
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
        let program = crate::lockdown::default_seccomp()?;
        hako_seccomp::apply(&program).map_err(failed("install the seccomp filter"))?;
    }
    Ok(())
}

/// Step 0 of [`apply`]: the sandbox's process limit in gVisor's `pids`
/// controller, which counts the sandbox's processes and threads only (a
/// limit on the runtime's host cgroup also counts gVisor's own threads,
/// and ends the sandbox rather than failing a fork inside it).
fn limit_pids(max: u64) -> Result<(), GuestError> {
    use hako_sys::mount as m;
    let dir = std::path::Path::new(PIDS_CGROUP_DIR);
    let op = "limit processes: mount the pids controller on";
    m::mount(
        Some(std::path::Path::new("none")),
        dir,
        Some("cgroup"),
        m::MS_NOSUID | m::MS_NODEV | m::MS_NOEXEC,
        Some("pids"),
    )
    .map_err(failed_on(op, dir))?;
    // gVisor makes the hierarchy's root 0555, owned by root: the guest is
    // uid 0 (its owner) but holds no CAP_DAC_OVERRIDE, so it opens the
    // root to itself before it makes its group. Nothing else can reach
    // it: it is covered below before any other process exists.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(failed_on("limit processes: open to the guest", dir))?;
    let group = dir.join("hako");
    match std::fs::create_dir(&group) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(failed_on("limit processes: create", &group)(e)),
    }
    let limit = group.join("pids.max");
    std::fs::write(&limit, max.to_string()).map_err(failed_on("limit processes: write", &limit))?;
    let procs = group.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(failed_on("limit processes: join", &procs))?;
    // Fail closed: the limit reads back, and this process is in its group.
    let set =
        std::fs::read_to_string(&limit).map_err(failed_on("limit processes: read", &limit))?;
    if set.trim() != max.to_string() {
        return Err(GuestError::PidsNotJoined(format!(
            "pids.max reads {:?}, not {max}",
            set.trim()
        )));
    }
    let mine =
        std::fs::read_to_string(&procs).map_err(failed_on("limit processes: read", &procs))?;
    let me = std::process::id().to_string();
    if !mine.lines().any(|l| l.trim() == me) {
        return Err(GuestError::PidsNotJoined(format!(
            "{} does not list pid {me}",
            procs.display()
        )));
    }
    m::mount(
        Some(std::path::Path::new("tmpfs")),
        dir,
        Some("tmpfs"),
        m::MS_RDONLY | m::MS_NOSUID | m::MS_NODEV | m::MS_NOEXEC,
        Some("mode=0000"),
    )
    .map_err(failed_on("limit processes: cover", dir))
}
