//! Emptying the calling thread's capability sets, and locking the
//! securebits so that not even uid 0 regains any by `exec`.

use rustix::thread::{self as rt, CapabilitiesSecureBits, CapabilitySet, CapabilitySets};

use super::ConfineError;

/// What [`drop_all_capabilities`] could apply beyond the steps it always
/// applies (clearing the ambient set, then `capset` of the effective,
/// permitted and inheritable sets to zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapsDropped {
    /// The thread held `CAP_SETPCAP` (effective, or permitted and raised) at
    /// the start.
    pub had_setpcap: bool,
    /// The securebits `NOROOT`, `NO_SETUID_FIXUP`, `NO_CAP_AMBIENT_RAISE` were
    /// set and, with `KEEP_CAPS` off, all four locked. Needs `CAP_SETPCAP`,
    /// and a kernel that has securebits (gVisor's has none).
    pub securebits_locked: bool,
    /// The bounding set is empty: every capability was dropped from it (needs
    /// `CAP_SETPCAP`), or it already was.
    pub bounding_set_empty: bool,
    /// What stays in the permitted set (see
    /// [`drop_capabilities_keeping`]); empty after
    /// [`drop_all_capabilities`].
    pub kept: CapabilitySet,
}

/// The securebits [`drop_all_capabilities`] sets: uid 0 gains no capability
/// by `exec`, uid changes do not touch capability sets (there are none left to
/// touch), capabilities are not kept across `setuid`, ambient capabilities
/// cannot be raised; each one locked.
fn wanted_securebits() -> CapabilitiesSecureBits {
    CapabilitiesSecureBits::NO_ROOT
        | CapabilitiesSecureBits::NO_ROOT_LOCKED
        | CapabilitiesSecureBits::NO_SETUID_FIXUP
        | CapabilitiesSecureBits::NO_SETUID_FIXUP_LOCKED
        | CapabilitiesSecureBits::KEEP_CAPS_LOCKED
        | CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE
        | CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE_LOCKED
}

/// The highest capability number the kernel knows, from
/// `/proc/sys/kernel/cap_last_cap`, or 63 when that cannot be read (numbers
/// the kernel does not know are then refused with `EINVAL` and skipped).
/// Read once per process; a fork inherits what was read.
fn last_cap() -> u32 {
    static LAST_CAP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST_CAP.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .map_or(63, |n| n.min(63))
    })
}

/// Reads now what [`drop_all_capabilities`] needs to know of the kernel
/// (its highest capability number), so that a process forked afterwards
/// (a sandbox's pid 1, its supervisors) drops its capabilities without
/// opening a file.
pub fn learn_capabilities() {
    let _ = last_cap();
}

fn cap_bit(cap: u32) -> CapabilitySet {
    CapabilitySet::from_bits_retain(1u64 << cap)
}

/// Empties every capability set of the calling thread: ambient, bounding,
/// inheritable, permitted and effective; and, where `CAP_SETPCAP` is held,
/// sets and locks the securebits first so that not even uid 0 regains
/// capabilities by `exec`.
///
/// Order: the securebits and the bounding set need `CAP_SETPCAP`, so they
/// come before the `capset` that removes it. A thread that never had
/// `CAP_SETPCAP` (an unprivileged process outside a user namespace) cannot
/// change either; that is reported in [`CapsDropped`], not an error, since
/// such a thread has no capability to lose and `no_new_privs` keeps `exec`
/// from granting any. Any other failure is an error.
///
/// Capability sets are per thread: call this in a single-threaded process
/// (the child about to `exec`), whose other threads would keep theirs.
pub fn drop_all_capabilities() -> Result<CapsDropped, ConfineError> {
    drop_capabilities_keeping(CapabilitySet::empty())
}

/// Like [`drop_all_capabilities`], but the capabilities of `keep` that the
/// thread holds in its permitted set stay there (never effective, never
/// inheritable, and gone from the bounding set, so no `exec` passes them
/// on): a guard, not a power. A process that holds a permitted capability
/// its caller lacks is out of the caller's reach through `/proc/PID` and
/// `ptrace` (the ptrace access check of Linux's commoncap and of gVisor
/// alike), whatever their uids; so a guest that keeps one is out of the
/// reach of every command it starts, which hold none. A capability of
/// `keep` the thread did not hold is not kept: check
/// [`CapsDropped::kept`].
pub fn drop_capabilities_keeping(keep: CapabilitySet) -> Result<CapsDropped, ConfineError> {
    let caps = rt::capabilities(None).map_err(|e| ConfineError::Capget(e.into()))?;
    let kept = keep & caps.permitted;
    let mut had_setpcap = caps.effective.contains(CapabilitySet::SETPCAP);
    if !had_setpcap && caps.permitted.contains(CapabilitySet::SETPCAP) {
        rt::set_capabilities(
            None,
            CapabilitySets {
                effective: caps.effective | CapabilitySet::SETPCAP,
                ..caps
            },
        )
        .map_err(|e| ConfineError::Capset(e.into()))?;
        had_setpcap = true;
    }

    // Ambient first: needs no privilege. EINVAL means a kernel before 4.3,
    // which has no ambient set to clear.
    match rt::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(ConfineError::ClearAmbient(e.into())),
    }

    // Securebits, while CAP_SETPCAP is still held.
    let mut securebits_locked = false;
    if had_setpcap {
        // Setting bits to the values they are locked at is allowed, so this
        // is idempotent; a bit locked to another value gives EPERM. EINVAL
        // is a kernel without securebits (gVisor's; Linux refuses only
        // with EPERM): reported in `securebits_locked`, since with the
        // bounding and inheritable sets empty, as below, not even uid 0
        // gains a capability by `exec`.
        match rt::set_capabilities_secure_bits(wanted_securebits()) {
            Ok(()) => securebits_locked = true,
            Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(ConfineError::Securebits(e.into())),
        }
    }

    // Bounding set, while CAP_SETPCAP is still held.
    let last = last_cap();
    let mut bounding_set_empty = true;
    for cap in 0..=last {
        if had_setpcap {
            match rt::remove_capability_from_bounding_set(cap_bit(cap)) {
                // EINVAL: a number this kernel does not know.
                Ok(()) | Err(rustix::io::Errno::INVAL) => {}
                Err(e) => {
                    return Err(ConfineError::BoundingSet {
                        cap,
                        source: e.into(),
                    })
                }
            }
        } else if rt::capability_is_in_bounding_set(cap_bit(cap)).unwrap_or(false) {
            bounding_set_empty = false;
        }
    }

    // Last: empty effective, permitted and inheritable. Lowering is always
    // allowed; CAP_SETPCAP goes with the rest.
    let empty = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: kept,
        inheritable: CapabilitySet::empty(),
    };
    rt::set_capabilities(None, empty).map_err(|e| ConfineError::Capset(e.into()))?;
    let after = rt::capabilities(None).map_err(|e| ConfineError::Capget(e.into()))?;
    if after != empty {
        return Err(ConfineError::CapabilitiesRemain {
            effective: after.effective.bits(),
            permitted: after.permitted.bits(),
            inheritable: after.inheritable.bits(),
        });
    }

    Ok(CapsDropped {
        had_setpcap,
        securebits_locked,
        bounding_set_empty,
        kept,
    })
}
