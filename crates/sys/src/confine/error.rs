//! Why a confinement step failed: [`ConfineError`], naming the step, the OS
//! error and a hint.

use std::fmt;
use std::io;
use std::path::PathBuf;

use ::landlock::RulesetError;

use super::Resource;

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
    /// The kernel's Landlock lacks a feature the policy needs.
    LandlockTooOld {
        /// The kernel's Landlock ABI.
        abi: u32,
        /// What is missing, and from which ABI.
        needs: &'static str,
    },
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
            Self::LandlockTooOld { abi, needs } => write!(
                f,
                "this kernel's Landlock (ABI {abi}) lacks {needs}, which the policy needs; \
                 hint: a newer kernel, or allow best effort to run without it"
            ),
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
            | Self::LandlockTooOld { .. }
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
            ConfineError::LandlockUnsupported { .. }
            | ConfineError::LandlockTooOld { .. }
            | ConfineError::LandlockNotEnforced { .. } => io::ErrorKind::Unsupported,
            ConfineError::CapabilitiesRemain { .. } | ConfineError::Landlock { .. } => {
                io::ErrorKind::Other
            }
        };
        io::Error::new(kind, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
