//! Every system call and every `unsafe` block of hako, behind small safe
//! functions.
//!
//! The rest of the workspace denies `unsafe`. Safe wrappers from `rustix`
//! are re-exported so that callers reach the kernel through this crate only;
//! the few calls `rustix` lacks (`close_range`, `signalfd`, the hook that runs
//! between `fork` and `exec`) are written here, each `unsafe` block with the
//! reason it is sound.
#![allow(unsafe_code)]

pub use rustix;

pub mod confine;
pub mod detached;
pub mod exhaust;
pub mod jail;
pub mod module;
pub mod mount;
pub mod netif;
pub mod ns;
pub mod proc;
pub mod random;
pub mod raw;
pub mod rlimit;
pub mod signal;
pub mod spawn;
pub mod start;
pub mod tty;
pub mod vfork;

use std::io;

/// Converts a libc return value into an `io::Result`, reading `errno` on -1.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Marks this process a child subreaper: orphaned descendants (a child that
/// double-forked, or called `setsid` and was left behind) are re-parented to
/// it instead of to init, so it can find, kill and reap them.
pub fn set_child_subreaper() -> io::Result<()> {
    // Any nonzero value sets the flag; gVisor accepts only 1 (not, say,
    // the caller's pid).
    rustix::process::set_child_subreaper(rustix::process::Pid::from_raw(1)).map_err(Into::into)
}

/// Whether the kernel has `openat2` (Linux 5.6 and later).
pub fn has_openat2() -> bool {
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    !matches!(
        rustix::fs::openat2(
            CWD,
            "/",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::empty()
        ),
        Err(rustix::io::Errno::NOSYS)
    )
}

fn max_rss(who: libc::c_int) -> u64 {
    // SAFETY: `rusage` is plain data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for getrusage to fill.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return 0;
    }
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
}

/// Peak resident set size of this process, in bytes.
pub fn peak_rss_bytes() -> u64 {
    max_rss(libc::RUSAGE_SELF)
}

/// Peak resident set size of the largest waited-for child, in bytes.
pub fn children_peak_rss_bytes() -> u64 {
    max_rss(libc::RUSAGE_CHILDREN)
}

/// Waits for the child `pid` (a process this one started and has not
/// waited for) and returns its raw wait status and the peak resident set
/// size, in bytes, of it and of the descendants it waited for: one
/// child's figure, whatever other children this process has had.
pub fn wait_with_peak_rss(pid: u32) -> io::Result<(i32, u64)> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: `rusage` is plain data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` and `usage` are valid, writable places for
        // wait4 to fill; it waits for the one child named.
        let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if got == pid {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok((status, u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024))
}

/// Takes ownership of an inherited descriptor by number, after checking that
/// it is open, and marks it close-on-exec.
///
/// Call it once per number, early in `main`, before anything else could own
/// that descriptor.
pub fn take_inherited_fd(fd: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: F_GETFD only reads the descriptor's flags; -1 means it is not
    // open.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) }.into())?;
    // SAFETY: the descriptor is open, was inherited across exec, and this
    // function is called once per number before anything else claims it, so
    // nothing else owns it.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// Points stdin, stdout and stderr of this process at `/dev/null`, so that
/// it no longer holds the pipes it handed to a child.
pub fn stdio_to_null() -> io::Result<()> {
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(())
}
