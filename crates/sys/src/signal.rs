//! `SIGCHLD` as a readable file descriptor, for a single-threaded supervisor
//! that waits on children, a deadline and a control socket in one `poll`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

/// A `signalfd` that becomes readable when a child changes state.
///
/// Creating it blocks `SIGCHLD` for the calling thread, so it is meant for a
/// single-threaded process. Children started with `std::process::Command`
/// get an empty signal mask back before they exec.
#[derive(Debug)]
pub struct ChildSignals {
    fd: OwnedFd,
}

impl ChildSignals {
    /// Blocks `SIGCHLD` and opens the descriptor (non-blocking, close-on-exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: `sigset_t` is plain data; zeroed is a valid value that
        // sigemptyset then initialises properly.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable sigset_t for these calls, and
        // pthread_sigmask only reads it (the old mask pointer is null).
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: `set` is initialised; -1 asks for a new descriptor.
        let raw = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        crate::check(raw.into())?;
        // SAFETY: signalfd returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd })
    }

    /// Consumes every pending notification; call it when the fd is readable.
    /// Several `SIGCHLD`s may be merged into one, so reap with `WNOHANG` in a
    /// loop afterwards.
    pub fn drain(&self) {
        let mut buf = [0u8; 128 * 8];
        while matches!(rustix::io::read(&self.fd, &mut buf), Ok(n) if n > 0) {}
    }
}

impl AsFd for ChildSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
