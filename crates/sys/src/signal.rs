//! Signals as a readable file descriptor, for a single-threaded supervisor
//! that waits on children, signals, a deadline and a control socket in one
//! `poll`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

/// Signal numbers, for callers that do not link libc themselves.
pub mod signum {
    /// A child changed state.
    pub const SIGCHLD: i32 = libc::SIGCHLD;
    /// Interrupt (Ctrl-C).
    pub const SIGINT: i32 = libc::SIGINT;
    /// Termination request.
    pub const SIGTERM: i32 = libc::SIGTERM;
    /// Hang-up (the terminal went away).
    pub const SIGHUP: i32 = libc::SIGHUP;
    /// The terminal's window changed size.
    pub const SIGWINCH: i32 = libc::SIGWINCH;
    /// Quit (Ctrl-\\).
    pub const SIGQUIT: i32 = libc::SIGQUIT;
    /// Stop from the terminal (Ctrl-Z).
    pub const SIGTSTP: i32 = libc::SIGTSTP;
    /// A background process read its terminal.
    pub const SIGTTIN: i32 = libc::SIGTTIN;
    /// A background process wrote to (or set) its terminal.
    pub const SIGTTOU: i32 = libc::SIGTTOU;
}

/// Blocks every signal whose default action ends the process (SIGKILL and
/// SIGSTOP cannot be): for an init process that a kernel (gVisor) does not
/// shield from its own namespace's signals. Children started with
/// `std::process::Command` get an empty mask back before they exec, and a
/// fork's child starts with no pending signal.
pub fn block_terminating_signals() -> io::Result<()> {
    const SIGNALS: &[i32] = &[
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ];
    // SAFETY: as in `SignalFd::new`: a zeroed sigset_t, initialised by
    // sigemptyset, read by pthread_sigmask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in SIGNALS {
            if libc::sigaddset(&mut set, sig) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Size of one `struct signalfd_siginfo`.
const SIGINFO_SIZE: usize = 128;

/// A `signalfd` for a set of signals, which are blocked for the calling
/// thread so that they arrive only through the descriptor.
///
/// Meant for a single-threaded process. Children started with
/// `std::process::Command` get an empty signal mask back before they exec.
#[derive(Debug)]
pub struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    /// Blocks `signals` and opens the descriptor (non-blocking,
    /// close-on-exec).
    pub fn new(signals: &[i32]) -> io::Result<Self> {
        // SAFETY: `sigset_t` is plain data; zeroed is a valid value that
        // sigemptyset then initialises properly.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable sigset_t for these calls, and
        // pthread_sigmask only reads it (the old mask pointer is null).
        unsafe {
            libc::sigemptyset(&mut set);
            for &sig in signals {
                if libc::sigaddset(&mut set, sig) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
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

    /// Consumes every pending signal and returns their numbers, in order.
    /// Several `SIGCHLD`s may be merged into one: reap with `WNOHANG` in a
    /// loop afterwards.
    pub fn drain(&self) -> Vec<i32> {
        let mut seen = Vec::new();
        let mut buf = [0u8; SIGINFO_SIZE * 16];
        while let Ok(n) = rustix::io::read(&self.fd, &mut buf) {
            if n == 0 {
                break;
            }
            for info in buf[..n].chunks_exact(SIGINFO_SIZE) {
                // ssi_signo is the first field, a u32 in native byte order.
                let mut signo = [0u8; 4];
                signo.copy_from_slice(&info[..4]);
                seen.push(i32::try_from(u32::from_ne_bytes(signo)).unwrap_or(0));
            }
        }
        seen
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Gives `signal` its default action again in this process: undoes an
/// inherited "ignore" (a program started in the background by a shell
/// inherits SIGINT and SIGQUIT ignored, and keeps that across exec).
pub fn restore_default(signal: i32) -> io::Result<()> {
    // SAFETY: signal() with SIG_DFL installs no handler and touches no
    // memory of ours.
    if unsafe { libc::signal(signal, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives every signal this process ignores its default action back, except
/// SIGPIPE (a writer to a closed pipe or socket gets EPIPE instead of
/// dying; programs started with `std::process::Command` get SIGPIPE's
/// default back anyway).
///
/// An ignored disposition survives fork and exec: called once where a
/// process tree starts (a sandbox's guest), it spares every command started
/// below an "ignore" inherited from whoever started hako (a shell's
/// background job ignores SIGINT and SIGQUIT). Handlers are left alone:
/// exec resets them by itself.
pub fn restore_ignored_signals() -> io::Result<()> {
    for sig in 1..libc::SIGRTMIN() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || sig == libc::SIGPIPE {
            continue;
        }
        // SAFETY: `old` is a zeroed sigaction (plain data) that sigaction
        // fills; a null new action only reads the current one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `sig` is a valid signal number.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction == libc::SIG_IGN {
            restore_default(sig)?;
        }
    }
    Ok(())
}
