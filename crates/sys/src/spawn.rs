//! What runs in a child between `fork` and `exec`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Marks every descriptor from `first` up close-on-exec, in the calling
/// process.
///
/// Used between fork and exec so that nothing but stdio (and what the caller
/// placed below `first`) reaches the new program, including descriptors this
/// process inherited without close-on-exec. Marking rather than closing keeps
/// the pipe through which `std` reports a failed exec working.
pub fn cloexec_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range takes plain integers; with CLOSE_RANGE_CLOEXEC it
    // only sets a flag and closes nothing.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    // Kernels before 5.11 (and gVisor) lack the flag: mark the open ones,
    // as /proc lists them, or else one by one up to the soft limit. Only
    // async-signal-safe calls are used.
    let listed = each_open_fd_from(first, |fd| {
        // SAFETY: fcntl on an integer that was just listed as open.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    });
    if listed.is_ok() {
        return Ok(());
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let top = RawFd::try_from(limit.rlim_cur.min(1 << 20)).unwrap_or(1 << 20);
    for fd in first..top {
        // SAFETY: fcntl on an integer; EBADF for unused numbers is expected
        // and ignored.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// `close_range(first, L, flags)` with `L` the larger of 2^20 and the hard
/// RLIMIT_NOFILE, less one (the highest number a descriptor can have where
/// `close_range(first, ~0)` is refused); whether it succeeded.
///
/// # Safety
/// Every descriptor from `first` up must be the caller's to close (or
/// mark); async-signal-safe.
unsafe fn close_range_up_to_limit(first: RawFd, flags: libc::c_uint) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return false;
    }
    let top = limit
        .rlim_max
        .clamp(1 << 20, libc::c_uint::MAX as libc::rlim_t - 1);
    // SAFETY: close_range on integers, as the caller vouches.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            (top - 1) as libc::c_uint,
            flags,
        )
    };
    ret == 0
}

/// Calls `f` on every descriptor from `first` up that `/proc/self/fd`
/// lists (its own directory descriptor excepted), reading the directory
/// into a stack buffer: no allocation, async-signal-safe. `f` may close
/// the descriptor it is given.
fn each_open_fd_from(first: RawFd, mut f: impl FnMut(RawFd)) -> io::Result<()> {
    // SAFETY: open of a NUL-terminated path.
    let dir = unsafe {
        libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    let result = loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                buf.len() as libc::c_ulong,
            )
        };
        if n < 0 {
            break Err(io::Error::last_os_error());
        }
        if n == 0 {
            break Ok(());
        }
        let filled = &buf[..n as usize];
        let mut at = 0;
        // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8,
        // then the NUL-terminated name.
        while at + 19 <= filled.len() {
            let reclen = usize::from(u16::from_ne_bytes([filled[at + 16], filled[at + 17]]));
            if reclen == 0 || at + reclen > filled.len() {
                break;
            }
            let mut fd: RawFd = 0;
            let mut digits = 0;
            for &b in &filled[at + 19..at + reclen] {
                if !b.is_ascii_digit() {
                    break;
                }
                fd = fd.saturating_mul(10).saturating_add(RawFd::from(b - b'0'));
                digits += 1;
            }
            if digits > 0 && fd >= first && fd != dir {
                f(fd);
            }
            at += reclen;
        }
    };
    // SAFETY: closing the directory descriptor opened above.
    unsafe { libc::close(dir) };
    result
}

/// A last step run in the child just before exec (e.g. applying Landlock,
/// capabilities and seccomp). It may allocate only when the parent is
/// single-threaded.
pub type ConfineHook = Box<dyn FnMut() -> io::Result<()> + Send + Sync>;

/// How a child is prepared between fork and exec.
#[derive(Default)]
pub struct ChildSetup {
    /// Start a new session (and with it a new process group), so the child
    /// has no controlling terminal and its group can be signalled as one.
    pub new_session: bool,
    /// Start a new process group in the caller's session, so that signals
    /// sent to the caller's group (Ctrl-C at a terminal) do not reach the
    /// child.
    pub new_process_group: bool,
    /// Change into this directory by descriptor (no path is resolved again,
    /// so nothing can be swapped in between the check and the chdir).
    pub cwd: Option<OwnedFd>,
    /// Place this descriptor at fd 3 in the child.
    pub fd3: Option<OwnedFd>,
    /// Ask the kernel to send SIGKILL to the child when the thread that
    /// spawned it exits.
    pub parent_death_kill: bool,
    /// Make stdin (a terminal) the controlling terminal of the new session
    /// (with `new_session`).
    pub controlling_tty: bool,
    /// Run last, after every other step; see [`ConfineHook`].
    pub confine: Option<ConfineHook>,
}

impl std::fmt::Debug for ChildSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSetup")
            .field("new_session", &self.new_session)
            .field("new_process_group", &self.new_process_group)
            .field("cwd", &self.cwd)
            .field("fd3", &self.fd3)
            .field("parent_death_kill", &self.parent_death_kill)
            .field("controlling_tty", &self.controlling_tty)
            .field("confine", &self.confine.is_some())
            .finish()
    }
}

/// Installs `setup` as the `pre_exec` hook of `command`. In the child the
/// signal mask is emptied, and every descriptor above stdio (above fd 3 when
/// `fd3` is given) is closed at exec. (Ignored signals are the caller's to
/// restore, once: see `signal::restore_ignored_signals`.)
///
/// The descriptors in `setup` are owned by the hook, which lives as long as
/// `command`: drop the command after spawning it to close the parent's copies.
pub fn prepare(command: &mut Command, setup: ChildSetup) {
    let ChildSetup {
        new_session,
        new_process_group,
        cwd,
        fd3,
        parent_death_kill,
        controlling_tty,
        mut confine,
    } = setup;
    let cwd_raw = cwd.as_ref().map(AsRawFd::as_raw_fd);
    let fd3_raw = fd3.as_ref().map(AsRawFd::as_raw_fd);
    let hook = move || -> io::Result<()> {
        // Keep the owned descriptors alive until the hook is dropped.
        let _owned = (&cwd, &fd3);
        // Everything here runs in the forked child of a possibly
        // multi-threaded parent: only async-signal-safe calls, no allocation.
        // SAFETY: plain system calls on integers and on a local sigset_t.
        unsafe {
            // Start with no blocked signals: a supervisor that blocks
            // signals to read them from a signalfd must not pass that mask
            // on (a command that cannot be sent SIGTERM would be wrong).
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if parent_death_kill && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if new_session && libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if new_process_group && !new_session && libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty {
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Linux makes the new session's group the terminal's
                // foreground group with TIOCSCTTY, and so does gVisor;
                // said explicitly all the same, so that no kernel that
                // leaves it unset makes Ctrl-C signal no one.
                if libc::tcsetpgrp(0, libc::getpgrp()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = cwd_raw {
                if libc::fchdir(fd) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = fd3_raw {
                if fd == 3 {
                    // dup2 onto itself keeps close-on-exec set: clear it.
                    if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) != 3 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        cloexec_fds_from(if fd3_raw.is_some() { 4 } else { 3 })?;
        match confine.as_mut() {
            Some(step) => step(),
            None => Ok(()),
        }
    };
    // SAFETY: the hook only makes async-signal-safe system calls and does
    // not allocate, as required between fork and exec.
    unsafe {
        command.pre_exec(hook);
    }
}

/// In a freshly forked child: places `fds[i]` at descriptor `i` (clearing
/// close-on-exec there), then closes every descriptor from `fds.len()` up,
/// so the child holds nothing of its parent's but what it was given.
///
/// Sources may sit anywhere, below `fds.len()` included: each is first
/// copied above the targets.
pub fn install_fds_close_rest(fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let count = RawFd::try_from(fds.len()).map_err(io::Error::other)?;
    // Copies at `count` or above: no dup2 below can overwrite them.
    let mut high: Vec<RawFd> = Vec::with_capacity(fds.len());
    for fd in fds {
        // SAFETY: fcntl F_DUPFD_CLOEXEC on an open (borrowed) descriptor.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, count) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        high.push(copy);
    }
    for (target, copy) in (0..count).zip(&high) {
        // SAFETY: dup2 on integers: `copy` is open and `target` below every
        // copy; the new descriptor does not inherit close-on-exec.
        if unsafe { libc::dup2(*copy, target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: close_range on integers; every descriptor from `count` up
    // belongs to this process alone (it was just forked) and nothing here
    // uses them again: the caller's owned copies are never dropped (the
    // child ends with exit).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            count as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    // gVisor refuses a range past its own descriptor limit (2^20): no
    // descriptor can lie above that limit or the process's hard one, so
    // ask for the range up to them; failing that, close the open ones as
    // /proc lists them.
    let err = io::Error::last_os_error();
    // SAFETY: as above.
    if unsafe { close_range_up_to_limit(count, 0) } {
        return Ok(());
    }
    each_open_fd_from(count, |fd| {
        // SAFETY: as above, every descriptor from `count` up is ours alone
        // and unused from here on.
        unsafe { libc::close(fd) };
    })
    .map_err(|_| err)
}

/// In a child forked (without exec) from a single-threaded process to run
/// library code in place of a helper binary: empties the signal mask,
/// starts a new process group, changes into `cwd` (if given), points stdio at
/// `/dev/null`, places `fd3` at descriptor 3 and closes every other
/// descriptor. Returns descriptor 3, owned.
///
/// The caller must not drop any descriptor it owned before the fork (they
/// are closed here, and their numbers may be reused): forget them.
pub fn become_forked_helper(
    cwd: Option<std::os::fd::BorrowedFd<'_>>,
    fd3: std::os::fd::BorrowedFd<'_>,
) -> io::Result<OwnedFd> {
    become_forked_helper_keeping(cwd, fd3, None).map(|(fd3, _)| fd3)
}

/// [`become_forked_helper`], keeping `fd4` too (at descriptor 4).
pub fn become_forked_helper_keeping(
    cwd: Option<std::os::fd::BorrowedFd<'_>>,
    fd3: std::os::fd::BorrowedFd<'_>,
    fd4: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
    use std::os::fd::AsFd as _;
    // SAFETY: plain system calls on integers and on a local sigset_t.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if let Some(cwd) = cwd {
        rustix::process::fchdir(cwd)?;
    }
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let mut fds = vec![null.as_fd(), null.as_fd(), null.as_fd(), fd3];
    fds.extend(fd4);
    install_fds_close_rest(&fds)?;
    // It was closed by the step above (or replaced, if it was below 4).
    std::mem::forget(null);
    let fd3 = crate::take_inherited_fd(3)?;
    let fd4 = match fd4 {
        Some(_) => Some(crate::take_inherited_fd(4)?),
        None => None,
    };
    Ok((fd3, fd4))
}

/// Ends the calling process at once: no exit handlers run and no buffer
/// inherited from a parent is flushed (for a forked helper).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proc_listing_finds_every_open_descriptor_from_the_first_asked() {
        let files: Vec<std::fs::File> = (0..3)
            .map(|_| std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let fds: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
        let lowest = fds.iter().copied().min().unwrap_or(0);
        let mut seen = Vec::new();
        each_open_fd_from(lowest, |fd| seen.push(fd)).unwrap_or_else(|e| panic!("{e}"));
        for fd in &fds {
            assert!(seen.contains(fd), "{fd} not listed in {seen:?}");
        }
        assert!(seen.iter().all(|&fd| fd >= lowest), "{seen:?}");
        // Nothing below the first asked, stdio included.
        let mut above = Vec::new();
        each_open_fd_from(lowest + 1, |fd| above.push(fd)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!above.contains(&lowest));
    }
}
