//! Landlock: every write-type filesystem access refused except where the
//! command may write; reads and execution untouched.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ::landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, ABI,
};

use super::{set_no_new_privs, ConfineError};

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

    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(access)
        .map_err(landlock_err("handle access rights of"))?
        .create()
        .map_err(landlock_err("create"))?;

    let wanted = rules
        .write_paths
        .iter()
        .map(|p| (p, access))
        .chain(rules.write_files.iter().map(|p| (p, file_access(access))));
    let (ruleset, skipped) = add_path_rules(ruleset, wanted, file_access)?;
    prepared(ruleset, kernel_abi, skipped)
}

/// Adds a rule for each existing path of `wanted` (a file's rights cut to
/// `on_file` of them; none left, no rule) and returns the paths that do
/// not exist.
fn add_path_rules<'a>(
    mut ruleset: RulesetCreated,
    wanted: impl Iterator<Item = (&'a PathBuf, BitFlags<AccessFs>)>,
    on_file: impl Fn(BitFlags<AccessFs>) -> BitFlags<AccessFs>,
) -> Result<(RulesetCreated, Vec<PathBuf>), ConfineError> {
    let mut skipped = Vec::new();
    for (path, allowed) in wanted {
        let Some((fd, is_dir)) = open_rule_path(path)? else {
            skipped.push(path.clone());
            continue;
        };
        let allowed = if is_dir { allowed } else { on_file(allowed) };
        if allowed.is_empty() {
            // Listing, asked of a file: nothing to grant.
            continue;
        }
        ruleset = ruleset
            .add_rule(::landlock::PathBeneath::new(fd, allowed))
            .map_err(|source| ConfineError::Landlock {
                step: "add a rule to",
                source,
            })?;
    }
    Ok((ruleset, skipped))
}

/// The ruleset's descriptor, as a [`PreparedLandlock`]; an error when the
/// kernel enforces none of it.
fn prepared(
    ruleset: RulesetCreated,
    abi: u32,
    skipped: Vec<PathBuf>,
) -> Result<PreparedLandlock, ConfineError> {
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or(ConfineError::LandlockNotEnforced { abi, status: "not" })?;
    Ok(PreparedLandlock { fd, abi, skipped })
}

/// A whole filesystem (and, where the kernel has them, network and scope)
/// policy, for commands with no mount namespace of their own (the
/// `landlock` backend): what is not granted here is out of reach,
/// reading included. Landlock grants by hierarchy, so a path given is
/// granted with everything beneath it: give the entries to allow, never a
/// parent that holds a secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LandlockPolicy {
    /// Read and execute beneath these (directories: also list them).
    pub read: Vec<PathBuf>,
    /// Directories that may be listed, nothing more (those holding a
    /// secret, whose other entries are in `read`).
    pub list: Vec<PathBuf>,
    /// Every right beneath these: read, execute, create, remove, rename,
    /// write, truncate, ioctl on devices, and (ABI 9) connecting to the
    /// unix sockets there.
    pub write: Vec<PathBuf>,
    /// Single device files (such as `/dev/null` or `/dev/tty`) that may be
    /// read, written and receive ioctls, but not removed or replaced.
    pub devices: Vec<PathBuf>,
    /// `Some`: TCP is handled (ABI 4 and later), and only these ports may be
    /// connected to, none bound; `None`: TCP is left alone (the network is
    /// the host's, or a seccomp filter refuses every network socket).
    pub tcp_connect: Option<Vec<u16>>,
    /// Signals and abstract unix sockets scoped to the domain (ABI 6): a
    /// command can signal, and connect to the abstract sockets of, only
    /// processes in its own domain. Required: a kernel without it fails
    /// [`landlock_prepare_policy`].
    pub scoped: bool,
}

/// What a ruleset of [`landlock_prepare_policy`] enforces, beyond the
/// filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStatus {
    /// The kernel's Landlock ABI.
    pub abi: u32,
    /// TCP binds and connects are restricted (ABI 4).
    pub tcp: bool,
    /// Signals and abstract unix sockets are scoped (ABI 6).
    pub scoped: bool,
    /// Connecting to a unix socket file needs a rule for it (ABI 9).
    pub unix_connect: bool,
}

/// The last ABI whose rights are vetted for [`landlock_prepare_policy`]:
/// the rights of a later one are handled only once added here.
const POLICY_ABI: ABI = ABI::V9;

/// Builds the ruleset [`LandlockPolicy`] describes, handling every
/// filesystem right of the kernel's ABI (up to [`POLICY_ABI`]), without
/// enforcing it. Fails closed: no Landlock, a right the kernel cannot
/// enforce, or `scoped` asked of a kernel before ABI 6, is an error.
/// Paths that do not exist are skipped.
pub fn landlock_prepare_policy(
    policy: &LandlockPolicy,
) -> Result<(PreparedLandlock, PolicyStatus), ConfineError> {
    use ::landlock::{Access, AccessNet, NetPort, Scope};
    let kernel_abi = probe_landlock_abi().map_err(ConfineError::LandlockUnsupported)?;
    let abi = ABI::from(i32::try_from(kernel_abi).unwrap_or(i32::MAX)).min(POLICY_ABI);
    if abi == ABI::Unsupported {
        return Err(ConfineError::LandlockUnsupported(
            io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        ));
    }
    let landlock_err = |step| move |source| ConfineError::Landlock { step, source };
    let all = AccessFs::from_all(abi);
    let scopes = Scope::from_all(abi);
    if policy.scoped && scopes.is_empty() {
        return Err(ConfineError::LandlockTooOld {
            abi: kernel_abi,
            needs: "scoped signals and abstract unix sockets (Landlock ABI 6, Linux 6.12)",
        });
    }
    let tcp = AccessNet::from_all(abi) & (AccessNet::BindTcp | AccessNet::ConnectTcp);
    let handle_tcp = policy.tcp_connect.is_some() && !tcp.is_empty();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(landlock_err("handle access rights of"))?;
    if handle_tcp {
        ruleset = ruleset
            .handle_access(tcp)
            .map_err(landlock_err("handle network rights of"))?;
    }
    if policy.scoped {
        ruleset = ruleset
            .scope(scopes)
            .map_err(landlock_err("scope signals and sockets in"))?;
    }
    let ruleset = ruleset.create().map_err(landlock_err("create"))?;
    let read = all & (AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute);
    let device = all & (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev);
    let wanted = (policy.read.iter().map(|p| (p, read)))
        .chain(policy.list.iter().map(|p| (p, all & AccessFs::ReadDir)))
        .chain(policy.write.iter().map(|p| (p, all)))
        .chain(policy.devices.iter().map(|p| (p, device)));
    let file_rights = AccessFs::ReadFile | AccessFs::Execute | file_access(all);
    let (mut ruleset, skipped) = add_path_rules(ruleset, wanted, |a| a & file_rights)?;
    if handle_tcp {
        for &port in policy.tcp_connect.iter().flatten() {
            ruleset = ruleset
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(landlock_err("add a port rule to"))?;
        }
    }
    let status = PolicyStatus {
        abi: kernel_abi,
        tcp: handle_tcp,
        scoped: policy.scoped,
        unix_connect: all.contains(AccessFs::ResolveUnix),
    };
    Ok((prepared(ruleset, kernel_abi, skipped)?, status))
}

/// What [`landlock_prepare_policy`] would enforce on this kernel, without
/// building anything: `None` without Landlock.
pub fn landlock_policy_status() -> Option<PolicyStatus> {
    use ::landlock::{Access, AccessNet, Scope};
    let kernel_abi = landlock_abi()?;
    let abi = ABI::from(i32::try_from(kernel_abi).unwrap_or(i32::MAX)).min(POLICY_ABI);
    Some(PolicyStatus {
        abi: kernel_abi,
        tcp: !AccessNet::from_all(abi).is_empty(),
        scoped: !Scope::from_all(abi).is_empty(),
        unix_connect: AccessFs::from_all(abi).contains(AccessFs::ResolveUnix),
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
    fn landlock_abi_agrees_with_the_probe() {
        assert_eq!(landlock_abi(), probe_landlock_abi().ok().filter(|&a| a > 0));
    }
}
