//! `no_new_privs`, seccomp filter installation, and a checked escape hatch
//! for probing system calls by number.
//!
//! [`syscall_ints`] exists for `hako-probe` and for tests: they call the
//! system calls a seccomp policy refuses, with arguments chosen so that the
//! kernel would fail them harmlessly, to tell "refused by the filter" from
//! "allowed but bad argument". An arbitrary `syscall(2)` cannot be a safe
//! function (`munmap`, `mremap` or a pointer argument would let safe code
//! corrupt this process's memory), so the wrapper accepts only a fixed list of
//! calls and checks every argument the kernel could dereference: it must be
//! null or [`BAD_ADDRESS`], which no user-space mapping can have.

use std::io;

/// Sets `no_new_privs` on the calling thread; it is inherited by every child
/// and kept across `execve`.
///
/// Once set it cannot be cleared: `execve` no longer grants privileges
/// (setuid and setgid bits, file capabilities), and an unprivileged thread
/// may install seccomp filters.
pub fn set_no_new_privs() -> io::Result<()> {
    rustix::thread::set_no_new_privs(true).map_err(Into::into)
}

/// Whether `no_new_privs` is set on the calling thread.
pub fn no_new_privs() -> io::Result<bool> {
    rustix::thread::no_new_privs().map_err(Into::into)
}

/// Installs a classic-BPF seccomp filter on the calling thread
/// (`seccomp(SECCOMP_SET_MODE_FILTER, 0, prog)`).
///
/// The filter applies to this thread, to every process and thread it creates
/// afterwards, and across `execve`; filters only stack, none is ever removed.
/// Other threads of this process are not affected. The kernel refuses with
/// `EACCES` unless the thread has `no_new_privs` set ([`set_no_new_privs`])
/// or holds `CAP_SYS_ADMIN` in its user namespace; this function does not set
/// `no_new_privs` itself, so that the caller orders its privilege phases.
/// The kernel validates the program (`EINVAL` for a malformed one, or one
/// longer than 4096 instructions).
pub fn seccomp_set_mode_filter(filter: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(filter.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let prog = libc::sock_fprog {
        len,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `len` instructions of `filter`, which outlive
    // the call; the kernel only copies the program in (the `*mut` in
    // `sock_fprog` is never written through).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &prog as *const libc::sock_fprog,
        )
    };
    crate::check(ret).map(|_| ())
}

/// An address no user-space mapping can ever have: the last page of the
/// 64-bit address space, in the kernel half on x86_64 and aarch64, with every
/// tag bit set (it stays a kernel address after aarch64 top-byte-ignore or
/// x86 linear-address-masking untagging). A system call given it as a
/// pointer fails with `EFAULT` when, and only if, it dereferences it.
pub const BAD_ADDRESS: u64 = 0xffff_ffff_ffff_f000;

/// On x86_64, the bit that marks a system call number as the x32 ABI's.
pub const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// Why [`syscall_ints`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallError {
    /// The kernel (or a seccomp filter) answered with this `errno`.
    Errno(i32),
    /// The wrapper made no call: the number is not on its list, or an
    /// argument could have let the kernel touch this process's memory.
    NotSound(&'static str),
}

/// How [`syscall_ints`] checks one argument.
#[derive(Clone, Copy)]
enum Arg {
    /// An integer the kernel never dereferences (flags, ids, sizes, fds).
    Int,
    /// A pointer: must be 0 or [`BAD_ADDRESS`].
    Ptr,
    /// A descriptor that must be invalid (negative), because a real one
    /// (an io_uring ring) could make the kernel act on this process's
    /// memory, or (a pidfd) put another process's descriptor in it.
    BadFd,
}

use Arg::{BadFd, Int, Ptr};

/// `(number, argument kinds)` of every call [`syscall_ints`] accepts.
const ACCEPTED: &[(libc::c_long, [Arg; 6])] = &[
    (libc::SYS_getpid, [Int; 6]),
    (libc::SYS_mount, [Ptr, Ptr, Ptr, Int, Ptr, Int]),
    (libc::SYS_umount2, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_pivot_root, [Ptr, Ptr, Int, Int, Int, Int]),
    (libc::SYS_move_mount, [Int, Ptr, Int, Ptr, Int, Int]),
    (libc::SYS_open_tree, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_fsopen, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_fsmount, [Int; 6]),
    (libc::SYS_fsconfig, [Int, Int, Ptr, Ptr, Int, Int]),
    (libc::SYS_fspick, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_mount_setattr, [Int, Ptr, Int, Ptr, Int, Int]),
    // open_tree_attr: the same number on every architecture (Linux 6.15).
    (467, [Int, Ptr, Int, Ptr, Int, Int]),
    (libc::SYS_unshare, [Int; 6]),
    // clone is checked further in `clone_cannot_succeed`.
    (libc::SYS_clone, [Int, Ptr, Ptr, Ptr, Ptr, Int]),
    (libc::SYS_clone3, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_setns, [Int; 6]),
    // keyctl's arguments are pointers or integers depending on the
    // operation: all are treated as pointers.
    (libc::SYS_keyctl, [Int, Ptr, Ptr, Ptr, Ptr, Int]),
    (libc::SYS_add_key, [Ptr, Ptr, Ptr, Int, Int, Int]),
    (libc::SYS_request_key, [Ptr, Ptr, Ptr, Int, Int, Int]),
    (libc::SYS_bpf, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_perf_event_open, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_ptrace, [Int, Int, Ptr, Ptr, Int, Int]),
    (libc::SYS_process_vm_readv, [Int, Ptr, Int, Ptr, Int, Int]),
    (libc::SYS_process_vm_writev, [Int, Ptr, Int, Ptr, Int, Int]),
    (libc::SYS_pidfd_getfd, [BadFd, Int, Int, Int, Int, Int]),
    (libc::SYS_userfaultfd, [Int; 6]),
    (libc::SYS_io_uring_setup, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_io_uring_enter, [BadFd, Int, Int, Int, Ptr, Int]),
    (
        libc::SYS_io_uring_register,
        [BadFd, Int, Ptr, Int, Int, Int],
    ),
    (libc::SYS_kexec_load, [Int, Int, Ptr, Int, Int, Int]),
    (libc::SYS_kexec_file_load, [Int, Int, Int, Ptr, Int, Int]),
    (libc::SYS_init_module, [Ptr, Int, Ptr, Int, Int, Int]),
    (libc::SYS_finit_module, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_delete_module, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_open_by_handle_at, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_reboot, [Int, Int, Int, Ptr, Int, Int]),
    (libc::SYS_swapon, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_swapoff, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_acct, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_settimeofday, [Ptr, Ptr, Int, Int, Int, Int]),
    (libc::SYS_clock_settime, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_clock_adjtime, [Int, Ptr, Int, Int, Int, Int]),
    (libc::SYS_adjtimex, [Ptr, Int, Int, Int, Int, Int]),
    (libc::SYS_personality, [Int; 6]),
    (libc::SYS_ioctl, [Int, Int, Ptr, Int, Int, Int]),
    // With both limit pointers 0 or BAD_ADDRESS nothing is read or set.
    (libc::SYS_prlimit64, [Int, Int, Ptr, Ptr, Int, Int]),
];

/// x86_64 only: x32-ABI numbers ([`X32_SYSCALL_BIT`] set) accepted when
/// every argument is 0, for probing whether the x32 ABI reaches the kernel.
const ACCEPTED_X32_BASES: &[libc::c_long] = &[libc::SYS_getpid, libc::SYS_mount];

/// A `clone` the kernel refuses before creating anything: `CLONE_THREAD`
/// without `CLONE_SIGHAND` is `EINVAL`, checked first in `copy_process` on
/// every kernel. Any other `clone` would return twice, into a copy of this
/// process that shares its locks (or, with `CLONE_VM`, its memory and stack).
fn clone_cannot_succeed(flags: u64) -> bool {
    let thread = libc::CLONE_THREAD as u64;
    let sighand = libc::CLONE_SIGHAND as u64;
    flags & thread != 0 && flags & sighand == 0
}

fn check_args(kinds: &[Arg; 6], args: &[u64; 6]) -> Result<(), SyscallError> {
    for (kind, &value) in kinds.iter().zip(args) {
        match kind {
            Int => {}
            Ptr if value == 0 || value == BAD_ADDRESS => {}
            Ptr => {
                return Err(SyscallError::NotSound(
                    "a pointer argument must be 0 or BAD_ADDRESS",
                ))
            }
            // The kernel reads the descriptor as a C int.
            BadFd if (value as u32 as i32) < 0 => {}
            BadFd => {
                return Err(SyscallError::NotSound(
                    "an io_uring descriptor argument must be invalid",
                ))
            }
        }
    }
    Ok(())
}

/// Makes system call `nr` with integer arguments and returns its result or
/// its `errno`, after checking that the call cannot touch this process's
/// memory; otherwise returns [`SyscallError::NotSound`] without calling.
///
/// Only the calls a seccomp policy of hako refuses (mount and its new API,
/// namespaces, keys, bpf, perf, ptrace, process_vm_*, pidfd_getfd (on an
/// invalid pidfd only), userfaultfd, io_uring,
/// kexec, modules, reboot, swap, acct, clocks, personality, ioctl) and
/// `getpid` are accepted. It is sound because:
/// - every argument the kernel may dereference must be null or
///   [`BAD_ADDRESS`], so the kernel neither reads nor writes memory of ours
///   (it fails with `EFAULT` instead);
/// - no accepted call maps, unmaps or protects memory, or changes the stack
///   or registers;
/// - `clone` is accepted only with flags the kernel rejects before creating a
///   process ([`libc::CLONE_THREAD`] without [`libc::CLONE_SIGHAND`]), and
///   io_uring calls only on invalid descriptors.
///
/// It is no sandbox: as root, an accepted call with meaningful integers
/// still acts on the system (`reboot` with the right magic numbers, `setns`,
/// `kexec_file_load` unloading a kernel). It is meant for probes and tests,
/// whose arguments are chosen so that the kernel fails each call harmlessly.
pub fn syscall_ints(nr: i64, args: [u64; 6]) -> Result<i64, SyscallError> {
    if cfg!(target_arch = "x86_64") && nr & X32_SYSCALL_BIT != 0 {
        if !ACCEPTED_X32_BASES.contains(&(nr & !X32_SYSCALL_BIT)) {
            return Err(SyscallError::NotSound(
                "this x32 system call is not accepted",
            ));
        }
        if args.iter().any(|&a| a != 0) {
            return Err(SyscallError::NotSound(
                "x32 system calls are accepted with all arguments 0 only",
            ));
        }
    } else {
        let Some((_, kinds)) = ACCEPTED.iter().find(|(n, _)| *n == nr) else {
            return Err(SyscallError::NotSound(
                "this system call is not accepted by syscall_ints",
            ));
        };
        check_args(kinds, &args)?;
        if nr == libc::SYS_clone && !clone_cannot_succeed(args[0]) {
            return Err(SyscallError::NotSound(
                "clone is accepted only with CLONE_THREAD and without CLONE_SIGHAND",
            ));
        }
    }
    let [a0, a1, a2, a3, a4, a5] = args.map(|a| a as libc::c_long);
    // SAFETY: the checks above leave only calls that cannot read or write
    // this process's memory (every dereferenced argument is null or
    // BAD_ADDRESS), cannot change its mappings, stack or registers, and
    // cannot create a process or thread; see the function's documentation.
    let ret = unsafe { libc::syscall(nr, a0, a1, a2, a3, a4, a5) };
    if ret == -1 {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Err(SyscallError::Errno(errno))
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getpid_is_answered_by_the_kernel() {
        let pid = syscall_ints(libc::SYS_getpid, [0; 6]).unwrap();
        assert_eq!(pid, i64::from(std::process::id()));
    }

    #[test]
    fn a_real_pointer_argument_is_declined_without_a_call() {
        let buf = [0u8; 16];
        let ptr = buf.as_ptr() as u64;
        assert!(matches!(
            syscall_ints(libc::SYS_mount, [ptr, 0, 0, 0, 0, 0]),
            Err(SyscallError::NotSound(_))
        ));
    }

    #[test]
    fn calls_that_change_memory_are_declined() {
        for nr in [libc::SYS_munmap, libc::SYS_mprotect, libc::SYS_fork] {
            assert!(matches!(
                syscall_ints(nr, [0; 6]),
                Err(SyscallError::NotSound(_))
            ));
        }
    }

    #[test]
    fn clone_is_declined_unless_the_kernel_must_refuse_it() {
        let sigchld = libc::SIGCHLD as u64;
        assert!(matches!(
            syscall_ints(libc::SYS_clone, [sigchld, 0, 0, 0, 0, 0]),
            Err(SyscallError::NotSound(_))
        ));
        let thread = libc::CLONE_THREAD as u64;
        assert_eq!(
            syscall_ints(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]),
            Err(SyscallError::Errno(libc::EINVAL))
        );
    }

    #[test]
    fn a_bad_address_fails_with_efault() {
        assert_eq!(
            syscall_ints(libc::SYS_adjtimex, [BAD_ADDRESS, 0, 0, 0, 0, 0]),
            Err(SyscallError::Errno(libc::EFAULT))
        );
    }
}
