//! Seccomp user notification of `connect`, and what its supervisor needs
//! to act for the process that made the call: reading the address from its
//! memory, taking a copy of its socket, and putting a socket in its place.
//!
//! The egress proxy uses it for forwarded host ports on `linux` (see
//! `hako_net::direct`): a sandboxed process's `connect` to such a port is
//! answered with a socket the proxy connected on the host's loopback, so
//! that the bytes never pass through a relay. A notification the
//! supervisor does not take continues into the kernel unchanged, in the
//! sandbox's own network namespace.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

// seccomp_data: nr at 0, arch at 4.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

#[cfg(target_arch = "x86_64")]
const NATIVE_AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
const NATIVE_AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;

/// `connect`'s number on this architecture.
pub const SYS_CONNECT: i32 = libc::SYS_connect as i32;

/// The `AUDIT_ARCH_*` value of this architecture.
pub const AUDIT_ARCH: u32 = NATIVE_AUDIT_ARCH;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: JEQ_K,
        jt,
        jf,
        k,
    }
}

/// The filter: `connect` of this architecture goes to the listener; every
/// other call (and every other architecture's) is allowed here, so that the
/// sandbox's own filter alone decides it.
fn connect_filter() -> [libc::sock_filter; 6] {
    [
        stmt(LD_W_ABS, OFFSET_ARCH),
        jump(AUDIT_ARCH, 0, 3),
        stmt(LD_W_ABS, OFFSET_NR),
        jump(SYS_CONNECT as u32, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_USER_NOTIF),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Whether the kernel's notification structures are the size this crate
/// was built with (they have not changed since they were added, but a
/// larger one would be written past ours).
fn sizes_match() -> io::Result<()> {
    let mut sizes = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: SECCOMP_GET_NOTIF_SIZES writes one `seccomp_notif_sizes`
    // through the pointer, which is valid and writable for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0 as libc::c_uint,
            &mut sizes as *mut libc::seccomp_notif_sizes,
        )
    };
    crate::check(ret)?;
    let ours = (
        std::mem::size_of::<libc::seccomp_notif>(),
        std::mem::size_of::<libc::seccomp_notif_resp>(),
        std::mem::size_of::<libc::seccomp_data>(),
    );
    let kernel = (
        usize::from(sizes.seccomp_notif),
        usize::from(sizes.seccomp_notif_resp),
        usize::from(sizes.seccomp_data),
    );
    if ours == kernel {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the kernel's seccomp notification sizes {kernel:?} are not this build's {ours:?}"
            ),
        ))
    }
}

/// Installs, on the calling thread, a filter that sends every `connect` to
/// a supervisor, and returns the listener (close-on-exec) the supervisor
/// reads them from. Like every filter it applies to the processes and
/// threads this one creates afterwards, and across `execve`.
///
/// Needs `no_new_privs` or `CAP_SYS_ADMIN` in the thread's user namespace.
/// The kernel refuses with `EBUSY` when a filter already installed has a
/// listener (a sandbox inside a sandbox): a thread has at most one.
///
/// Once it is installed, every `connect` of those processes waits for an
/// answer on the listener; when the last copy of the listener is closed,
/// they fail with `ENOSYS`. The caller must hand it to a supervisor that
/// answers every notification, or fail.
pub fn install_connect_notifier() -> io::Result<OwnedFd> {
    sizes_match()?;
    let filter = connect_filter();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at the six instructions of `filter`, which
    // outlive the call; the kernel only copies the program in.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    };
    let fd = crate::check(ret)? as RawFd;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(fd)
}

/// One system call waiting for its supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The notification's id (answers name it).
    pub id: u64,
    /// The calling thread's id, in the supervisor's pid namespace.
    pub tid: i32,
    /// The system call's number.
    pub nr: i32,
    /// Its `AUDIT_ARCH_*`.
    pub arch: u32,
    /// Its arguments.
    pub args: [u64; 6],
}

fn ioctl<T>(listener: BorrowedFd<'_>, request: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    // SAFETY: each caller passes the request that matches `T`, and `arg`
    // points at a live, writable `T` for the call.
    let ret = unsafe { libc::ioctl(listener.as_raw_fd(), request, arg) };
    crate::check(ret.into()).map(|_| ())
}

/// Waits for the next notification on `listener`. `ENOENT`: the caller
/// went away before it could be read (take the next one).
pub fn recv_notification(listener: BorrowedFd<'_>) -> io::Result<Notification> {
    // SAFETY: all-zero is a valid `seccomp_notif` (integers only), and the
    // kernel requires the buffer zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n)?;
    Ok(Notification {
        id: n.id,
        tid: n.pid as i32,
        nr: n.data.nr,
        arch: n.data.arch,
        args: n.data.args,
    })
}

/// Whether notification `id` is still waiting: its caller has not been
/// interrupted or killed, so what was read about it is still about it.
pub fn notification_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    let mut id = id;
    ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id).is_ok()
}

fn send(listener: BorrowedFd<'_>, id: u64, val: i64, error: i32, flags: u32) -> io::Result<()> {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags,
    };
    ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp)
}

/// Lets the call go on into the kernel as the caller made it.
pub fn respond_continue(listener: BorrowedFd<'_>, id: u64) -> io::Result<()> {
    send(
        listener,
        id,
        0,
        0,
        libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    )
}

/// Ends the call without running it: it returns `Ok(value)`, or fails
/// with `errno` (a positive error number).
pub fn respond(listener: BorrowedFd<'_>, id: u64, result: Result<i64, i32>) -> io::Result<()> {
    match result {
        Ok(value) => send(listener, id, value, 0, 0),
        Err(errno) => send(listener, id, 0, -errno.abs(), 0),
    }
}

/// Puts a copy of `fd` in the caller's descriptor table at number `at`,
/// replacing what was there (`SECCOMP_ADDFD_FLAG_SETFD`), close-on-exec if
/// `cloexec`. The call itself still waits for [`respond`].
pub fn install_fd_at(
    listener: BorrowedFd<'_>,
    id: u64,
    fd: BorrowedFd<'_>,
    at: RawFd,
    cloexec: bool,
) -> io::Result<()> {
    let (Ok(srcfd), Ok(newfd)) = (u32::try_from(fd.as_raw_fd()), u32::try_from(at)) else {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    };
    let mut addfd = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
        srcfd,
        newfd,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &mut addfd)
}

/// Reads `buf.len()` bytes at `addr` in thread `tid`'s memory
/// (`process_vm_readv`; needs the right to ptrace it). Returns how many
/// were read.
pub fn read_memory(tid: i32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, writable for its length; `remote`
    // is only read, in the other process, by the kernel, which checks it.
    let ret = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
    crate::check(ret as libc::c_long).map(|n| n as usize)
}

/// A copy of descriptor `fd` of thread `tid` (`pidfd_getfd`; needs the
/// right to ptrace it), close-on-exec.
pub fn copy_fd_of(tid: i32, fd: RawFd) -> io::Result<OwnedFd> {
    let open = |flags: libc::c_uint| {
        // SAFETY: pidfd_open takes two integers and returns a new
        // descriptor or -1.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, flags) };
        crate::check(ret).map(|fd| {
            // SAFETY: a new descriptor that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
        })
    };
    // PIDFD_THREAD (O_EXCL, Linux 6.9) lets a pidfd name any thread; before,
    // only a thread-group leader, whose descriptor table its threads share.
    let pidfd = open(libc::O_EXCL as libc::c_uint).or_else(|_| open(0))?;
    // SAFETY: pidfd_getfd takes three integers and returns a new
    // descriptor (close-on-exec) or -1.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let fd = crate::check(ret)? as RawFd;
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_filter_notifies_connect_of_this_architecture_only() {
        let f = connect_filter();
        // Another architecture jumps straight to ALLOW.
        assert_eq!((f[1].k, f[1].jf), (AUDIT_ARCH, 3));
        assert_eq!(f[1 + 1 + 3].k, libc::SECCOMP_RET_ALLOW);
        // connect notifies, anything else falls through to ALLOW.
        assert_eq!((f[3].k, f[3].jt, f[3].jf), (SYS_CONNECT as u32, 0, 1));
        assert_eq!(f[4].k, libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(f[5].k, libc::SECCOMP_RET_ALLOW);
    }

    #[test]
    fn this_build_matches_the_kernels_notification_sizes() {
        sizes_match().unwrap();
    }
}
