//! Terminal signals for kernels that do not generate them: gVisor before
//! 2023 delivers no SIGINT when Ctrl-C is written to a pseudo-terminal's
//! master. The guest asks once whether the kernel does it, and if not, does
//! it itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::ns::{fork_single_threaded, Forked, SingleThreaded};

/// Whether writing the interrupt character to a pseudo-terminal's master
/// signals the foreground process group of the terminal (Linux: yes).
/// Forks a child that waits on a fresh terminal and types Ctrl-C at it.
pub fn kernel_sends_tty_signals(proof: &SingleThreaded) -> io::Result<bool> {
    // SAFETY: plain libc calls on descriptors owned here; the child runs
    // only async-signal-safe calls before it exits.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(io::Error::last_os_error());
        }
        let close_master = |e: io::Error| {
            libc::close(master);
            e
        };
        if libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            return Err(close_master(io::Error::last_os_error()));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master, name.as_mut_ptr(), name.len()) != 0 {
            return Err(close_master(io::Error::last_os_error()));
        }
        let forked = fork_single_threaded(proof).map_err(close_master)?;
        let pid = match forked {
            Forked::Child => {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut all);
                libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::setsid();
                let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
                if slave < 0
                    || libc::ioctl(slave, libc::TIOCSCTTY, 0) != 0
                    || libc::tcsetpgrp(slave, libc::getpgrp()) != 0
                {
                    libc::_exit(3);
                }
                // The parent's signal: SIGINT, or nothing within 2 s.
                libc::write(slave, b"r".as_ptr().cast(), 1);
                let nap = libc::timespec {
                    tv_sec: 2,
                    tv_nsec: 0,
                };
                libc::nanosleep(&nap, std::ptr::null_mut());
                libc::_exit(0);
            }
            Forked::Parent(pid) => pid,
        };
        // Wait for the child to be ready (its byte), then type Ctrl-C.
        // (Bounded: a child that failed before writing must not hang the
        // guest.)
        let mut byte = 0u8;
        let mut pfd = libc::pollfd {
            fd: master,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut pfd, 1, 1000) == 1
            && libc::read(master, (&mut byte as *mut u8).cast(), 1) == 1;
        if ready {
            libc::write(master, b"\x03".as_ptr().cast(), 1);
        }
        let start = Instant::now();
        let mut status = 0;
        let mut signalled = false;
        loop {
            let r = libc::waitpid(pid, &mut status, libc::WNOHANG);
            if r == pid {
                signalled = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT;
                break;
            }
            if r < 0 || !ready || start.elapsed() > Duration::from_millis(500) {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        libc::close(master);
        Ok(signalled)
    }
}

/// Does what a terminal's line discipline does with `typed` when the
/// kernel does not: for each interrupt, quit or suspend character (with
/// ISIG on), signals the terminal's foreground process group, or, where
/// the kernel will not tell it (gVisor answers ENOTTY), `session_group`:
/// the group of the session's leader.
pub fn send_tty_signals(
    master: BorrowedFd<'_>,
    typed: &[u8],
    session_group: Option<i32>,
) -> io::Result<()> {
    // SAFETY: tcgetattr and tcgetpgrp write into locals; kill takes
    // integers.
    unsafe {
        let mut termios: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(master.as_raw_fd(), &mut termios) != 0 {
            return Err(io::Error::last_os_error());
        }
        if termios.c_lflag & libc::ISIG == 0 {
            return Ok(());
        }
        let cc = termios.c_cc;
        for &b in typed {
            let signal = match b {
                0 => continue,
                b if b == cc[libc::VINTR] => libc::SIGINT,
                b if b == cc[libc::VQUIT] => libc::SIGQUIT,
                b if b == cc[libc::VSUSP] => libc::SIGTSTP,
                _ => continue,
            };
            let group = match libc::tcgetpgrp(master.as_raw_fd()) {
                g if g > 0 => g,
                _ => session_group.unwrap_or(0),
            };
            if group > 0 {
                libc::kill(-group, signal);
            }
        }
    }
    Ok(())
}
