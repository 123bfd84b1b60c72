//! The checks: one system call each that the default policy refuses, with
//! arguments the kernel fails harmlessly should the call reach it. A table
//! in code; the comments give the kernel's first test the arguments fail.

use hako_seccomp::{Arch, ADDR_NO_RANDOMIZE, NAMESPACE_FLAGS, TIOCLINUX, TIOCSTI};
use hako_sys::raw::BAD_ADDRESS;

/// When the kernel itself, without any filter, may answer `EPERM` (or
/// `ENOSYS`) to a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelMayRefuse {
    /// Never: the arguments fail before any permission check.
    Never,
    /// For a caller without the capability the call needs.
    Unprivileged,
    /// Even for root, on some hosts: a sysctl, kernel lockdown, or the
    /// feature compiled out (or, for x32, an ABI the kernel lacks).
    HostConfig,
}

impl KernelMayRefuse {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            KernelMayRefuse::Never => "never",
            KernelMayRefuse::Unprivileged => "unprivileged",
            KernelMayRefuse::HostConfig => "host_config",
        }
    }
}

/// How a check calls its system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// `syscall(nr, args…)` once.
    Plain,
    /// The x32-ABI number of the system call (x86_64 only).
    X32,
    /// `personality(current | ADDR_NO_RANDOMIZE)`, then restore `current`.
    PersonalitySetAndRestore,
}

/// One system call the probe makes.
#[derive(Debug, Clone)]
pub struct Check {
    /// Key in the report.
    pub name: String,
    /// The system call.
    pub syscall: &'static str,
    /// Its arguments.
    pub args: [u64; 6],
    /// The result if the call reaches the kernel.
    pub allowed_looks_like: &'static str,
    /// When the kernel itself may refuse it.
    pub kernel_may_refuse: KernelMayRefuse,
    /// How it is called.
    pub how: How,
}

/// `-1` as a descriptor or id argument.
const MINUS_1: u64 = u64::MAX;
/// A flag bit no call the probe makes accepts.
const BAD_FLAG: u64 = 0x4000_0000;
/// `UMOUNT_UNUSED`: the kernel reserves it to be rejected.
const UMOUNT_UNUSED: u64 = 0x8000_0000;
/// An unshare flag unshare rejects (`CLONE_PARENT`).
const CLONE_PARENT: u64 = 0x8000;
/// `CLONE_THREAD`: without `CLONE_SIGHAND` clone rejects it first.
const CLONE_THREAD: u64 = 0x0001_0000;
/// A clock id past the last one.
const BAD_CLOCK: u64 = 1000;
/// `RLIMIT_NOFILE`.
const RLIMIT_NOFILE: u64 = 7;
const PTRACE_PEEKDATA: u64 = 2;
const UFFD_USER_MODE_ONLY: u64 = 1;
/// A `keyctl` operation that does not exist.
const BAD_KEYCTL: u64 = 0xffff;
/// A `bpf` command that does not exist.
const BAD_BPF_CMD: u64 = 0xffff;
/// `sizeof(struct clone_args)` (version 2).
const CLONE_ARGS_SIZE: u64 = 88;

fn check(
    name: &str,
    syscall: &'static str,
    args: [u64; 6],
    allowed_looks_like: &'static str,
    kernel_may_refuse: KernelMayRefuse,
) -> Check {
    Check {
        name: name.to_owned(),
        syscall,
        args,
        allowed_looks_like,
        kernel_may_refuse,
        how: How::Plain,
    }
}

/// Every system call check, for `arch`. The comments give the kernel's first
/// test the arguments fail.
pub fn checks(arch: Arch) -> Vec<Check> {
    use KernelMayRefuse::{HostConfig, Never, Unprivileged};
    const B: u64 = BAD_ADDRESS;
    let mut out = vec![
        // Copying the device name from BAD_ADDRESS faults.
        check("mount", "mount", [B, B, B, 0, B, 0], "EFAULT", Never),
        // Unknown flags are rejected before the path is looked up.
        check(
            "umount2",
            "umount2",
            [B, UMOUNT_UNUSED, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // may_mount() first (EPERM unprivileged), then the path faults.
        check(
            "pivot_root",
            "pivot_root",
            [B, B, 0, 0, 0, 0],
            "EFAULT",
            Unprivileged,
        ),
        check(
            "move_mount",
            "move_mount",
            [MINUS_1, B, MINUS_1, B, BAD_FLAG, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "open_tree",
            "open_tree",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "fsopen",
            "fsopen",
            [B, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "fsmount",
            "fsmount",
            [MINUS_1, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // A negative descriptor is EINVAL before anything else.
        check(
            "fsconfig",
            "fsconfig",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "fspick",
            "fspick",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "mount_setattr",
            "mount_setattr",
            [MINUS_1, B, BAD_FLAG, B, 0, 0],
            "EINVAL",
            Never,
        ),
        // Linux 6.15 and later; ENOSYS before.
        check(
            "open_tree_attr",
            "open_tree_attr",
            [MINUS_1, B, BAD_FLAG, B, 0, 0],
            "EINVAL",
            HostConfig,
        ),
    ];
    for &(ns, flag) in NAMESPACE_FLAGS {
        // CLONE_PARENT is not an unshare flag: EINVAL before anything.
        out.push(check(
            &format!("unshare_{ns}"),
            "unshare",
            [flag | CLONE_PARENT, 0, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ));
        if ns != "newtime" {
            // CLONE_THREAD without CLONE_SIGHAND: EINVAL before a task is copied.
            out.push(check(
                &format!("clone_{ns}"),
                "clone",
                [flag | CLONE_THREAD, 0, 0, 0, 0, 0],
                "EINVAL",
                Never,
            ));
        }
    }
    out.extend([
        // Copying struct clone_args from BAD_ADDRESS faults.
        check(
            "clone3",
            "clone3",
            [B, CLONE_ARGS_SIZE, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check("setns", "setns", [MINUS_1, 0, 0, 0, 0, 0], "EBADF", Never),
        check(
            "keyctl",
            "keyctl",
            [BAD_KEYCTL, 0, 0, 0, 0, 0],
            "EOPNOTSUPP",
            Never,
        ),
        // Copying the key type from BAD_ADDRESS faults.
        check("add_key", "add_key", [B, B, 0, 0, 0, 0], "EFAULT", Never),
        check(
            "request_key",
            "request_key",
            [B, B, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        // Older kernels refuse unprivileged bpf before the command.
        check(
            "bpf",
            "bpf",
            [BAD_BPF_CMD, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // Copying the attributes from BAD_ADDRESS faults.
        check(
            "perf_event_open",
            "perf_event_open",
            [B, 0, MINUS_1, MINUS_1, 0, 0],
            "EFAULT",
            Never,
        ),
        // No process has pid 0.
        check(
            "ptrace",
            "ptrace",
            [PTRACE_PEEKDATA, 0, 0, 0, 0, 0],
            "ESRCH",
            Never,
        ),
        // flags must be 0.
        check(
            "process_vm_readv",
            "process_vm_readv",
            [0, 0, 0, 0, 0, 1],
            "EINVAL",
            Never,
        ),
        check(
            "process_vm_writev",
            "process_vm_writev",
            [0, 0, 0, 0, 0, 1],
            "EINVAL",
            Never,
        ),
        // Unknown flags are refused before the pidfd is looked at.
        check(
            "pidfd_getfd",
            "pidfd_getfd",
            [MINUS_1, 0, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // UFFD_USER_MODE_ONLY passes the privilege test (Linux 5.11 and
        // later), then the unknown flag is EINVAL.
        check(
            "userfaultfd",
            "userfaultfd",
            [UFFD_USER_MODE_ONLY | BAD_FLAG, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // kernel.io_uring_disabled may refuse first.
        check(
            "io_uring_setup",
            "io_uring_setup",
            [0, B, 0, 0, 0, 0],
            "EFAULT",
            HostConfig,
        ),
        check(
            "io_uring_enter",
            "io_uring_enter",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EBADF",
            Never,
        ),
        // Descriptor -1 means "no ring" since 6.13, where opcode 0 is EINVAL.
        check(
            "io_uring_register",
            "io_uring_register",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EINVAL (EBADF before 6.13)",
            Never,
        ),
        // CAP_SYS_BOOT, kernel.kexec_load_disabled and lockdown first; then
        // too many segments and an unknown architecture.
        check(
            "kexec_load",
            "kexec_load",
            [0, 0xffff_ffff, 0, BAD_FLAG, 0, 0],
            "EINVAL",
            HostConfig,
        ),
        check(
            "kexec_file_load",
            "kexec_file_load",
            [MINUS_1, MINUS_1, 0, B, BAD_FLAG, 0],
            "EINVAL",
            HostConfig,
        ),
        // CAP_SYS_MODULE and kernel.modules_disabled first; then an image
        // of length 0 is not an ELF file.
        check(
            "init_module",
            "init_module",
            [B, 0, B, 0, 0, 0],
            "ENOEXEC",
            HostConfig,
        ),
        check(
            "finit_module",
            "finit_module",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            HostConfig,
        ),
        check(
            "delete_module",
            "delete_module",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            HostConfig,
        ),
        // Copying the handle faults (or, on some versions, descriptor -1 is EBADF first).
        check(
            "open_by_handle_at",
            "open_by_handle_at",
            [MINUS_1, B, 0, 0, 0, 0],
            "EFAULT or EBADF",
            Unprivileged,
        ),
        // CAP_SYS_BOOT first; then the magic numbers are wrong.
        check(
            "reboot",
            "reboot",
            [0, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // Unknown swap flags are EINVAL before the capability test.
        check(
            "swapon",
            "swapon",
            [B, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "swapoff",
            "swapoff",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            Unprivileged,
        ),
        // A non-null name: accounting is never turned off.
        check("acct", "acct", [B, 0, 0, 0, 0, 0], "EFAULT", Unprivileged),
        check(
            "settimeofday",
            "settimeofday",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check(
            "clock_settime",
            "clock_settime",
            [BAD_CLOCK, B, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // The struct is copied in (and faults) before the clock is looked up.
        check(
            "clock_adjtime",
            "clock_adjtime",
            [BAD_CLOCK, B, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check("adjtimex", "adjtimex", [B, 0, 0, 0, 0, 0], "EFAULT", Never),
        // On descriptor -1 the request is never looked at.
        check(
            "ioctl_tiocsti",
            "ioctl",
            [MINUS_1, TIOCSTI, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        check(
            "ioctl_tiocsti_high_bits",
            "ioctl",
            [MINUS_1, TIOCSTI | 0xffff_ffff_0000_0000, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        check(
            "ioctl_tioclinux",
            "ioctl",
            [MINUS_1, TIOCLINUX, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        // The new limits are copied in (and fault) before the process is
        // looked up: nothing is changed.
        check(
            "prlimit64_of_another_process",
            "prlimit64",
            [1, RLIMIT_NOFILE, B, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        Check {
            name: "personality_addr_no_randomize".into(),
            syscall: "personality",
            args: [ADDR_NO_RANDOMIZE, 0, 0, 0, 0, 0],
            allowed_looks_like: "the previous persona (the change is undone at once)",
            kernel_may_refuse: Never,
            how: How::PersonalitySetAndRestore,
        },
    ]);
    if arch == Arch::X86_64 {
        out.push(Check {
            name: "x32_mount".into(),
            syscall: "mount",
            args: [0; 6],
            allowed_looks_like: "EFAULT (ENOSYS: the kernel has no x32 ABI)",
            kernel_may_refuse: HostConfig,
            how: How::X32,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::policy_errno;
    use hako_seccomp::default_policy;
    use std::collections::BTreeSet;

    fn native() -> Arch {
        Arch::native().unwrap()
    }

    #[test]
    fn every_syscall_of_the_policy_has_a_check_the_policy_refuses() {
        let policy = default_policy();
        let mut refused = BTreeSet::new();
        for check in checks(native()) {
            if check.how == How::X32 {
                continue;
            }
            let errno = policy_errno(&policy, &check, &check.args);
            assert!(
                errno.is_some(),
                "{} is not refused by the policy",
                check.name
            );
            refused.insert(check.syscall);
        }
        for name in policy.syscalls() {
            assert!(refused.contains(name), "no check calls {name}");
        }
    }

    #[test]
    fn every_rule_of_unshare_clone_and_ioctl_has_a_check() {
        let policy = default_policy();
        let checks = checks(native());
        for rule in policy
            .rules
            .iter()
            .filter(|r| ["unshare", "clone", "ioctl"].contains(&r.syscall.as_str()))
        {
            assert!(
                checks
                    .iter()
                    .any(|c| policy.matching_rule(c.syscall, &c.args) == Some(rule)),
                "no check for {rule:?}"
            );
        }
    }

    #[test]
    fn check_names_are_unique_and_every_check_exists_here() {
        let checks = checks(native());
        let names: BTreeSet<_> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), checks.len());
        for check in &checks {
            assert!(
                native().syscall_number(check.syscall).is_some(),
                "{}",
                check.name
            );
        }
    }

    #[test]
    fn what_the_kernel_may_refuse_is_named_as_the_report_says() {
        assert_eq!(KernelMayRefuse::Never.as_str(), "never");
        assert_eq!(KernelMayRefuse::Unprivileged.as_str(), "unprivileged");
        assert_eq!(KernelMayRefuse::HostConfig.as_str(), "host_config");
    }
}
