//! The last restrictions put on the command's process before `exec`:
//! resource limits, Landlock, `no_new_privs` and an empty capability set.
//!
//! The supervisor calls these in the child it forked for the command, in this
//! order, each phase relying on what the one before left:
//!
//! 1. [`apply_rlimits`]: needs no privilege to lower a limit, and would need
//!    `CAP_SYS_RESOURCE` to raise a hard one, which it never does.
//! 2. [`landlock_restrict_writes`]: `landlock_restrict_self` needs either
//!    `no_new_privs` or `CAP_SYS_ADMIN` in the user namespace; the `landlock`
//!    crate sets `no_new_privs` itself just before, so this works unprivileged.
//!    The domain is inherited across `fork` and `exec` and cannot be lifted.
//! 3. [`set_no_new_privs`]: already set by step 2 when it ran; setting it
//!    again is harmless, and it must hold even when Landlock was skipped.
//!    From here on `exec` can grant no privilege (no set-user-ID, no file
//!    capabilities).
//! 4. [`drop_all_capabilities`]: the securebits and the bounding set need
//!    `CAP_SETPCAP`, so they are handled while it is still held; the final
//!    `capset` to zero removes it with everything else.
//! 5. seccomp (elsewhere), last, so that its filter need not allow the calls
//!    above.
//!
//! Every function returns a [`ConfineError`] naming the step that failed,
//! the OS error and a hint; `From<ConfineError> for io::Error` keeps `?`
//! working in callers that speak `io::Result`.

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, ABI,
};
use rustix::process as rp;
use rustix::thread::{self as rt, CapabilitiesSecureBits, CapabilitySet, CapabilitySets};

/// Why a confinement step failed. Each variant names the operation; its
/// `Display` adds the OS error and a hint.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfineError {
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    NoNewPrivs(io::Error),
    /// `capget` on the calling thread failed.
    Capget(io::Error),
    /// `capset` failed (raising `CAP_SETPCAP` into the effective set, or
    /// emptying every set).
    Capset(io::Error),
    /// Capabilities were still held after `capset` to zero.
    CapabilitiesRemain {
        /// Effective set read back.
        effective: u64,
        /// Permitted set read back.
        permitted: u64,
        /// Inheritable set read back.
        inheritable: u64,
    },
    /// `prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)` failed.
    ClearAmbient(io::Error),
    /// `prctl(PR_SET_SECUREBITS)` failed although `CAP_SETPCAP` was held.
    Securebits(io::Error),
    /// `prctl(PR_CAPBSET_DROP)` failed for one capability although
    /// `CAP_SETPCAP` was held.
    BoundingSet {
        /// The capability number.
        cap: u32,
        /// The OS error.
        source: io::Error,
    },
    /// A limit whose soft value is above its hard value.
    RlimitInvalid {
        /// The resource.
        resource: Resource,
        /// Requested soft limit.
        soft: u64,
        /// Requested hard limit.
        hard: u64,
    },
    /// `setrlimit` failed.
    Rlimit {
        /// The resource.
        resource: Resource,
        /// Soft limit passed to the kernel (after clamping to the hard one).
        soft: u64,
        /// Hard limit passed to the kernel (after clamping to the current one).
        hard: u64,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel offers no Landlock: `landlock_create_ruleset` failed with
    /// this error (`ENOSYS`: not built in or filtered; `EOPNOTSUPP`: not
    /// enabled at boot).
    LandlockUnsupported(io::Error),
    /// A path given for a Landlock rule exists but cannot be opened.
    LandlockPath {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Building or applying the Landlock ruleset failed.
    Landlock {
        /// The step: "handle access rights of", "create", "add a rule to",
        /// "enforce".
        step: &'static str,
        /// The error from the `landlock` crate.
        source: RulesetError,
    },
    /// Enforcing a prepared ruleset (`landlock_restrict_self`) failed.
    LandlockEnforce(io::Error),
    /// The ruleset was applied only in part, or not at all.
    LandlockNotEnforced {
        /// The kernel's Landlock ABI.
        abi: u32,
        /// "partially" or "not".
        status: &'static str,
    },
}

impl fmt::Display for ConfineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoNewPrivs(e) => write!(
                f,
                "cannot set no_new_privs (prctl PR_SET_NO_NEW_PRIVS): {e}; \
                 hint: needs Linux 3.5 or later"
            ),
            Self::Capget(e) => write!(f, "cannot read the capability sets (capget): {e}"),
            Self::Capset(e) => write!(
                f,
                "cannot change the effective, permitted and inheritable capability sets \
                 (capset): {e}; hint: a security module or an outer seccomp filter may \
                 refuse capset"
            ),
            Self::CapabilitiesRemain {
                effective,
                permitted,
                inheritable,
            } => write!(
                f,
                "capabilities remain after capset to zero: effective {effective:#018x}, \
                 permitted {permitted:#018x}, inheritable {inheritable:#018x}"
            ),
            Self::ClearAmbient(e) => write!(
                f,
                "cannot clear the ambient capability set (prctl PR_CAP_AMBIENT_CLEAR_ALL): \
                 {e}"
            ),
            Self::Securebits(e) => write!(
                f,
                "cannot set and lock the securebits NOROOT, NO_SETUID_FIXUP, \
                 KEEP_CAPS_LOCKED and NO_CAP_AMBIENT_RAISE (prctl PR_SET_SECUREBITS): {e}; \
                 hint: EPERM here means a securebit was already locked to another value"
            ),
            Self::BoundingSet { cap, source } => write!(
                f,
                "cannot drop capability {cap} from the bounding set (prctl PR_CAPBSET_DROP): \
                 {source}"
            ),
            Self::RlimitInvalid {
                resource,
                soft,
                hard,
            } => write!(
                f,
                "invalid {}: soft limit {soft} is above hard limit {hard}",
                resource.name()
            ),
            Self::Rlimit {
                resource,
                soft,
                hard,
                source,
            } => write!(
                f,
                "cannot set {} to soft {soft}, hard {hard} (setrlimit): {source}; \
                 hint: limits can only be lowered without CAP_SYS_RESOURCE",
                resource.name()
            ),
            Self::LandlockEnforce(e) => write!(
                f,
                "cannot enforce the Landlock ruleset (landlock_restrict_self): {e}"
            ),
            Self::LandlockUnsupported(e) => {
                write!(
                    f,
                    "Landlock is not available (landlock_create_ruleset: {e}); "
                )?;
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    write!(
                        f,
                        "hint: the kernel has Landlock but it is not enabled; add landlock \
                         to the lsm= boot parameter (e.g. lsm=landlock,lockdown,yama,\
                         integrity,apparmor,bpf) or to CONFIG_LSM"
                    )
                } else {
                    write!(
                        f,
                        "hint: needs Linux 5.13 or later built with \
                         CONFIG_SECURITY_LANDLOCK=y, and no outer seccomp filter (such as \
                         a container runtime's) refusing the landlock calls"
                    )
                }
            }
            Self::LandlockPath { path, source } => write!(
                f,
                "cannot open {} for a Landlock rule: {source}",
                path.display()
            ),
            Self::Landlock { step, source } => {
                write!(f, "cannot {step} the Landlock ruleset: {source}")
            }
            Self::LandlockNotEnforced { abi, status } => write!(
                f,
                "the Landlock ruleset was {status} enforced (kernel ABI {abi}); refusing to \
                 run with writes unrestricted; hint: allow best effort to run without it"
            ),
        }
    }
}

impl std::error::Error for ConfineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::NoNewPrivs(e)
            | Self::Capget(e)
            | Self::Capset(e)
            | Self::ClearAmbient(e)
            | Self::Securebits(e)
            | Self::LandlockUnsupported(e)
            | Self::LandlockEnforce(e)
            | Self::BoundingSet { source: e, .. }
            | Self::Rlimit { source: e, .. }
            | Self::LandlockPath { source: e, .. } => Some(e),
            Self::Landlock { source, .. } => Some(source),
            Self::CapabilitiesRemain { .. }
            | Self::RlimitInvalid { .. }
            | Self::LandlockNotEnforced { .. } => None,
        }
    }
}

impl From<ConfineError> for io::Error {
    fn from(err: ConfineError) -> Self {
        let kind = match &err {
            ConfineError::NoNewPrivs(e)
            | ConfineError::Capget(e)
            | ConfineError::Capset(e)
            | ConfineError::ClearAmbient(e)
            | ConfineError::Securebits(e)
            | ConfineError::LandlockEnforce(e)
            | ConfineError::BoundingSet { source: e, .. }
            | ConfineError::Rlimit { source: e, .. }
            | ConfineError::LandlockPath { source: e, .. } => e.kind(),
            ConfineError::RlimitInvalid { .. } => io::ErrorKind::InvalidInput,
            ConfineError::LandlockUnsupported { .. } | ConfineError::LandlockNotEnforced { .. } => {
                io::ErrorKind::Unsupported
            }
            ConfineError::CapabilitiesRemain { .. } | ConfineError::Landlock { .. } => {
                io::ErrorKind::Other
            }
        };
        io::Error::new(kind, err)
    }
}

// ---------------------------------------------------------------------------
// no_new_privs

/// Sets `no_new_privs` on the calling thread (inherited by its children and
/// kept across `exec`): from now on `exec` grants no privilege, neither
/// set-user-ID/set-group-ID bits nor file capabilities.
pub fn set_no_new_privs() -> Result<(), ConfineError> {
    rt::set_no_new_privs(true).map_err(|e| ConfineError::NoNewPrivs(e.into()))
}

// ---------------------------------------------------------------------------
// Capabilities

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

// ---------------------------------------------------------------------------
// Resource limits

/// A resource limited by `setrlimit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resource {
    /// `RLIMIT_AS`: bytes of virtual address space.
    AddressSpace,
    /// `RLIMIT_CORE`: bytes of a core dump (0: none).
    Core,
    /// `RLIMIT_CPU`: seconds of CPU time; `SIGXCPU` at the soft limit,
    /// `SIGKILL` at the hard one.
    Cpu,
    /// `RLIMIT_DATA`: bytes of data segment and private mappings.
    Data,
    /// `RLIMIT_FSIZE`: bytes a file may grow to; beyond it `SIGXFSZ`, whose
    /// default action kills, or `EFBIG` where the signal is ignored.
    Fsize,
    /// `RLIMIT_MEMLOCK`: bytes of locked memory.
    Memlock,
    /// `RLIMIT_NOFILE`: one more than the highest descriptor number.
    Nofile,
    /// `RLIMIT_NPROC`: processes of the real uid (counted per user
    /// namespace); not enforced on a process with `CAP_SYS_ADMIN` or
    /// `CAP_SYS_RESOURCE`.
    Nproc,
    /// `RLIMIT_STACK`: bytes of main-thread stack.
    Stack,
}

impl Resource {
    /// The kernel's name, e.g. `RLIMIT_AS`.
    pub fn name(self) -> &'static str {
        match self {
            Self::AddressSpace => "RLIMIT_AS",
            Self::Core => "RLIMIT_CORE",
            Self::Cpu => "RLIMIT_CPU",
            Self::Data => "RLIMIT_DATA",
            Self::Fsize => "RLIMIT_FSIZE",
            Self::Memlock => "RLIMIT_MEMLOCK",
            Self::Nofile => "RLIMIT_NOFILE",
            Self::Nproc => "RLIMIT_NPROC",
            Self::Stack => "RLIMIT_STACK",
        }
    }

    fn to_rustix(self) -> rp::Resource {
        match self {
            Self::AddressSpace => rp::Resource::As,
            Self::Core => rp::Resource::Core,
            Self::Cpu => rp::Resource::Cpu,
            Self::Data => rp::Resource::Data,
            Self::Fsize => rp::Resource::Fsize,
            Self::Memlock => rp::Resource::Memlock,
            Self::Nofile => rp::Resource::Nofile,
            Self::Nproc => rp::Resource::Nproc,
            Self::Stack => rp::Resource::Stack,
        }
    }
}

/// One resource limit to apply. [`Rlimit::INFINITY`] means no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rlimit {
    /// The resource.
    pub resource: Resource,
    /// The soft limit, the one enforced; must not exceed `hard`.
    pub soft: u64,
    /// The hard limit, the ceiling up to which the process may raise `soft`.
    pub hard: u64,
}

impl Rlimit {
    /// No limit (`RLIM_INFINITY`).
    pub const INFINITY: u64 = u64::MAX;

    /// A limit with equal soft and hard values, so that the process cannot
    /// raise it.
    pub fn new(resource: Resource, limit: u64) -> Self {
        Self {
            resource,
            soft: limit,
            hard: limit,
        }
    }
}

fn to_rlim(value: u64) -> Option<u64> {
    (value != Rlimit::INFINITY).then_some(value)
}

/// Applies each limit to the calling process (limits are per process and
/// inherited across `fork` and `exec`).
///
/// A hard limit can only be lowered without `CAP_SYS_RESOURCE`, so a requested
/// hard limit above the current one is clamped to the current one, and the
/// soft limit to the resulting hard one: the limit in force is never looser
/// than asked. A soft limit above its own hard limit is an error.
pub fn apply_rlimits(limits: &[Rlimit]) -> Result<(), ConfineError> {
    for limit in limits {
        if limit.soft > limit.hard {
            return Err(ConfineError::RlimitInvalid {
                resource: limit.resource,
                soft: limit.soft,
                hard: limit.hard,
            });
        }
        let resource = limit.resource.to_rustix();
        let current_hard = rp::getrlimit(resource).maximum.unwrap_or(Rlimit::INFINITY);
        let hard = limit.hard.min(current_hard);
        let soft = limit.soft.min(hard);
        rp::setrlimit(
            resource,
            rp::Rlimit {
                current: to_rlim(soft),
                maximum: to_rlim(hard),
            },
        )
        .map_err(|e| ConfineError::Rlimit {
            resource: limit.resource,
            soft,
            hard,
            source: e.into(),
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Landlock

/// `LANDLOCK_CREATE_RULESET_VERSION` from `<linux/landlock.h>`.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// Asks the kernel for its Landlock ABI version, without restricting
/// anything.
fn probe_landlock_abi() -> io::Result<u32> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the
    // kernel reads no memory and only returns the ABI version (or -1 with
    // errno ENOSYS/EOPNOTSUPP); no descriptor is created.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    let abi = crate::check(ret)?;
    u32::try_from(abi).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The Landlock ABI version the kernel offers (1 for Linux 5.13, ... 7 for
/// 6.15), or `None` when it has no usable Landlock (not built in, not enabled
/// at boot, or refused by an outer seccomp filter). Restricts nothing.
pub fn landlock_abi() -> Option<u32> {
    probe_landlock_abi().ok().filter(|&abi| abi > 0)
}

/// Where the command may write; everything else is read-only to it as far as
/// Landlock is concerned (reads and execution are not restricted here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LandlockRules {
    /// Directories beneath which every write-type access is allowed: create,
    /// remove, rename (also across them), write, truncate, and ioctl on
    /// devices. Put `/dev/pts` here for terminals: a shell opening its
    /// terminal needs write and ioctl there.
    pub write_paths: Vec<PathBuf>,
    /// Single files (such as `/dev/null` or `/dev/tty`) that may be opened for
    /// writing, truncated, and, for devices, receive ioctls; but not removed
    /// or replaced. A directory given here allows the same on the files
    /// beneath it, without creating or removing any.
    pub write_files: Vec<PathBuf>,
}

/// What [`landlock_restrict_writes`] put in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandlockStatus {
    /// The kernel's Landlock ABI version in force (e.g. 7 on Linux 6.15).
    pub abi: u32,
    /// Whether every handled access right is enforced; always true in an
    /// `Ok`, since anything less is an error.
    pub fully_enforced: bool,
    /// Requested paths that do not exist and so got no rule (writes there,
    /// should they appear, are refused).
    pub skipped: Vec<PathBuf>,
}

/// The write-type access rights handled at a kernel ABI: those of
/// [`AccessFs::from_write`], capped at ABI 5 (`IoctlDev`) so that rights of
/// later ABIs are added only once vetted here (ABI 9's `ResolveUnix` would
/// restrict connecting to UNIX sockets, which is out of scope).
fn handled_write_access(abi: ABI) -> BitFlags<AccessFs> {
    AccessFs::from_write(abi.min(ABI::V5))
}

/// The subset of `access` that applies to a non-directory.
fn file_access(access: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
    access & (AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev)
}

/// Opens `path` with `O_PATH` for a rule; `Ok(None)` when it does not exist.
fn open_rule_path(path: &Path) -> Result<Option<(OwnedFd, bool)>, ConfineError> {
    use rustix::fs::{FileType, Mode, OFlags};
    let fd = match rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => {
            return Err(ConfineError::LandlockPath {
                path: path.to_path_buf(),
                source: e.into(),
            })
        }
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| ConfineError::LandlockPath {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
    Ok(Some((fd, is_dir)))
}

/// Restricts the calling thread, its future children and whatever they
/// `exec`, so that every write-type filesystem access is refused except
/// beneath `rules.write_paths` and on `rules.write_files`. Reads and
/// execution stay unrestricted (the mount namespace's read-only binds do
/// that part).
///
/// Handles every write-type right of the kernel's ABI: write, truncate
/// (ABI 3), remove file/dir, make char/dir/reg/sock/fifo/block/sym, refer
/// (ABI 2: renaming or linking across directories), ioctl on devices (ABI 5).
/// Descriptors opened before the call keep their rights (a terminal on fd 0,
/// 1, 2 keeps its ioctls); a terminal opened afterwards needs a rule, see
/// [`LandlockRules::write_paths`].
///
/// Fails closed: no Landlock in the kernel, or a ruleset not fully enforced,
/// is an error; the caller decides whether to go on without it. Paths that do
/// not exist are skipped and listed in [`LandlockStatus::skipped`]. Sets
/// `no_new_privs` as a side effect (the kernel requires it, or
/// `CAP_SYS_ADMIN`). Paths are opened (following symlinks) now, so give the
/// paths as they are in the final root, after `pivot_root`.
pub fn landlock_restrict_writes(rules: &LandlockRules) -> Result<LandlockStatus, ConfineError> {
    let prepared = landlock_prepare_writes(rules)?;
    prepared.restrict_self()?;
    Ok(prepared.status())
}

/// A Landlock ruleset built once (paths opened, rules added, every handled
/// right checked against the kernel), to be enforced by many processes:
/// [`PreparedLandlock::restrict_self`] is one system call. Its descriptor
/// is close-on-exec.
#[derive(Debug)]
pub struct PreparedLandlock {
    fd: OwnedFd,
    abi: u32,
    skipped: Vec<PathBuf>,
}

/// Builds the ruleset of [`landlock_restrict_writes`] without enforcing it.
/// Fails closed the same way: no Landlock, or a right the kernel cannot
/// enforce, is an error.
pub fn landlock_prepare_writes(rules: &LandlockRules) -> Result<PreparedLandlock, ConfineError> {
    let kernel_abi = probe_landlock_abi().map_err(ConfineError::LandlockUnsupported)?;
    // The crate advises a fixed ABI; the aim here is the best the kernel
    // offers, so the rights follow the kernel's ABI, capped at the last one
    // vetted (see `handled_write_access`). Requesting exactly what the kernel
    // supports, as a hard requirement, makes anything less than full
    // enforcement an error rather than a silent downgrade.
    let abi = ABI::from(i32::try_from(kernel_abi).unwrap_or(i32::MAX));
    if abi == ABI::Unsupported {
        return Err(ConfineError::LandlockUnsupported(
            io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        ));
    }
    let access = handled_write_access(abi);
    let landlock_err = |step| move |source| ConfineError::Landlock { step, source };

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(access)
        .map_err(landlock_err("handle access rights of"))?
        .create()
        .map_err(landlock_err("create"))?;

    let mut skipped = Vec::new();
    let wanted = rules
        .write_paths
        .iter()
        .map(|p| (p, access))
        .chain(rules.write_files.iter().map(|p| (p, file_access(access))));
    for (path, allowed) in wanted {
        let Some((fd, is_dir)) = open_rule_path(path)? else {
            skipped.push(path.clone());
            continue;
        };
        let allowed = if is_dir {
            allowed
        } else {
            file_access(allowed)
        };
        ruleset = ruleset
            .add_rule(landlock::PathBeneath::new(fd, allowed))
            .map_err(landlock_err("add a rule to"))?;
    }
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or(ConfineError::LandlockNotEnforced {
        abi: kernel_abi,
        status: "not",
    })?;
    Ok(PreparedLandlock {
        fd,
        abi: kernel_abi,
        skipped,
    })
}

impl PreparedLandlock {
    /// Enforces the ruleset on the calling thread, its future children and
    /// whatever they exec. Sets `no_new_privs` first (the kernel requires it,
    /// or `CAP_SYS_ADMIN`). Makes no allocation: it may run between fork and
    /// exec.
    pub fn restrict_self(&self) -> Result<(), ConfineError> {
        landlock_restrict_self_with(std::os::fd::AsFd::as_fd(&self.fd))
    }

    /// The ruleset's descriptor (to hand to a process that enforces it with
    /// [`landlock_restrict_self_with`]).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }

    /// What enforcing it puts in force.
    pub fn status(&self) -> LandlockStatus {
        LandlockStatus {
            abi: self.abi,
            fully_enforced: true,
            skipped: self.skipped.clone(),
        }
    }
}

/// Enforces the Landlock ruleset `fd` (from [`PreparedLandlock::fd`],
/// possibly inherited under another number) on the calling thread. Sets
/// `no_new_privs` first. No allocation.
pub fn landlock_restrict_self_with(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), ConfineError> {
    use std::os::fd::AsRawFd as _;
    set_no_new_privs()?;
    // SAFETY: landlock_restrict_self takes a descriptor number and flags 0;
    // the kernel checks that it is a Landlock ruleset.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            fd.as_raw_fd(),
            0 as libc::c_uint,
        )
    };
    crate::check(ret)
        .map(drop)
        .map_err(ConfineError::LandlockEnforce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handled_rights_grow_with_the_abi_and_stop_at_ioctl_dev() {
        assert!(!handled_write_access(ABI::V1).contains(AccessFs::Refer));
        assert!(handled_write_access(ABI::V2).contains(AccessFs::Refer));
        assert!(handled_write_access(ABI::V3).contains(AccessFs::Truncate));
        assert!(!handled_write_access(ABI::V4).contains(AccessFs::IoctlDev));
        assert!(handled_write_access(ABI::V5).contains(AccessFs::IoctlDev));
        assert_eq!(handled_write_access(ABI::V9), handled_write_access(ABI::V5));
        for abi in [ABI::V1, ABI::V5, ABI::V9] {
            let handled = handled_write_access(abi);
            assert!(!handled.contains(AccessFs::ReadFile));
            assert!(!handled.contains(AccessFs::ReadDir));
            assert!(!handled.contains(AccessFs::Execute));
        }
    }

    #[test]
    fn file_rules_carry_only_file_rights() {
        let file = file_access(handled_write_access(ABI::V5));
        assert_eq!(
            file,
            AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
        );
        assert_eq!(
            file_access(handled_write_access(ABI::V1)),
            BitFlags::from(AccessFs::WriteFile)
        );
    }

    #[test]
    fn infinity_maps_to_no_limit() {
        assert_eq!(to_rlim(Rlimit::INFINITY), None);
        assert_eq!(to_rlim(16), Some(16));
    }

    #[test]
    fn soft_above_hard_is_refused_before_any_syscall() {
        let err = apply_rlimits(&[Rlimit {
            resource: Resource::Nofile,
            soft: 10,
            hard: 5,
        }]);
        assert!(matches!(err, Err(ConfineError::RlimitInvalid { .. })));
    }

    #[test]
    fn errors_name_the_step_and_give_a_hint() {
        let e = ConfineError::LandlockUnsupported(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        let msg = e.to_string();
        assert!(msg.contains("Landlock") && msg.contains("lsm="), "{msg}");
        let e = ConfineError::Rlimit {
            resource: Resource::Fsize,
            soft: 1,
            hard: 1,
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert!(e.to_string().contains("RLIMIT_FSIZE"));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn landlock_abi_agrees_with_the_probe() {
        assert_eq!(landlock_abi(), probe_landlock_abi().ok().filter(|&a| a > 0));
    }
}
