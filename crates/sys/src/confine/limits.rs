//! Resource limits (`setrlimit`): never looser than asked, never raising a
//! hard limit.

use rustix::process as rp;

use super::ConfineError;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
