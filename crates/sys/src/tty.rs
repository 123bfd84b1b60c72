//! Terminal signals for kernels that do not generate them: gVisor before
//! 2023 delivers no SIGINT when Ctrl-C is written to a pseudo-terminal's
//! master. The guest asks once whether the kernel does it
//! ([`kernel_sends_tty_signals`]), and if not, reads what the typed
//! characters stand for ([`typed_at`]) and has the signals sent itself.

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

/// A signal a terminal's line discipline sends its foreground group for a
/// character typed at it (with `ISIG` on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtySignal {
    /// `VINTR` (Ctrl-C): SIGINT.
    Interrupt,
    /// `VQUIT` (Ctrl-\\): SIGQUIT.
    Quit,
    /// `VSUSP` (Ctrl-Z): SIGTSTP.
    Suspend,
}

impl TtySignal {
    /// The signal sent.
    pub fn signal(self) -> rustix::process::Signal {
        use rustix::process::Signal;
        match self {
            TtySignal::Interrupt => Signal::INT,
            TtySignal::Quit => Signal::QUIT,
            TtySignal::Suspend => Signal::TSTP,
        }
    }
}

/// What a line discipline makes of `typed` under a terminal's settings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Typed {
    /// The signals its characters stand for, in order.
    pub signals: Vec<TtySignal>,
    /// The input left once those characters are taken out (a line
    /// discipline does not pass them on).
    pub input: Vec<u8>,
}

/// What `typed` means at the terminal `fd` (either side of it), under its
/// current settings: with `ISIG` on, each interrupt, quit or suspend
/// character is a signal for the foreground group, not input.
pub fn typed_at(fd: BorrowedFd<'_>, typed: &[u8]) -> io::Result<Typed> {
    // SAFETY: tcgetattr writes into a local.
    let termios = unsafe {
        let mut termios: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd.as_raw_fd(), &mut termios) != 0 {
            return Err(io::Error::last_os_error());
        }
        termios
    };
    Ok(split_typed(&termios, typed))
}

/// [`typed_at`] under `termios`.
fn split_typed(termios: &libc::termios, typed: &[u8]) -> Typed {
    if termios.c_lflag & libc::ISIG == 0 {
        return Typed {
            signals: Vec::new(),
            input: typed.to_vec(),
        };
    }
    let cc = termios.c_cc;
    // A special character set to 0 (`_POSIX_VDISABLE`) is disabled.
    let is = |b: u8, i: usize| b != 0 && b == cc[i];
    let mut out = Typed::default();
    for &b in typed {
        if is(b, libc::VINTR) {
            out.signals.push(TtySignal::Interrupt);
        } else if is(b, libc::VQUIT) {
            out.signals.push(TtySignal::Quit);
        } else if is(b, libc::VSUSP) {
            out.signals.push(TtySignal::Suspend);
        } else {
            out.input.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn termios(isig: bool) -> libc::termios {
        // SAFETY: termios is plain data.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if isig {
            t.c_lflag = libc::ISIG;
        }
        t.c_cc[libc::VINTR] = 0x03;
        t.c_cc[libc::VQUIT] = 0x1c;
        t.c_cc[libc::VSUSP] = 0x1a;
        t
    }

    #[test]
    fn with_isig_the_signal_characters_are_signals_and_not_input() {
        let got = split_typed(&termios(true), b"ab\x03c\x1c\x1a\r");
        assert_eq!(
            got.signals,
            [TtySignal::Interrupt, TtySignal::Quit, TtySignal::Suspend]
        );
        assert_eq!(got.input, b"abc\r");
    }

    #[test]
    fn without_isig_or_with_a_disabled_character_everything_is_input() {
        let got = split_typed(&termios(false), b"\x03\x1c");
        assert!(got.signals.is_empty());
        assert_eq!(got.input, b"\x03\x1c");
        let mut t = termios(true);
        t.c_cc[libc::VSUSP] = 0;
        let got = split_typed(&t, b"\x00\x1a");
        assert!(got.signals.is_empty());
        assert_eq!(got.input, b"\x00\x1a");
    }
}
