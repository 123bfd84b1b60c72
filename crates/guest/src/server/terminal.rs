//! Commands on a pseudo-terminal: opening one, resizing it, and the Ctrl-C
//! (Ctrl-\\, Ctrl-Z) typed at it, signalled here where the kernel does not
//! (gVisor before 2023). Whether it does is found out by the zygote, once,
//! at the first control byte typed at a terminal: finding out forks, and
//! no fork of pid 1 may be alive while a command runs (see
//! [`zygote`](crate::zygote)).

use std::os::fd::{AsFd, OwnedFd};

use hako_sys::rustix::termios::Winsize;

use super::Server;
use crate::error::failed;
use crate::GuestError;

impl Server<'_> {
    /// Sets the window size of command `id`'s terminal (ignored for a
    /// command without one, or gone).
    pub(super) fn resize(&mut self, id: u64, rows: u16, cols: u16) {
        if let Some(fd) = self.position(id).and_then(|i| self.execs[i].pty.as_ref()) {
            let _ = hako_sys::rustix::termios::tcsetwinsize(fd, winsize(rows, cols));
        }
    }

    /// Where the kernel does not (gVisor before 2023), signals a terminal's
    /// foreground group for the Ctrl-C (and Ctrl-\\, Ctrl-Z) typed at it.
    pub(super) fn tty_signals(&mut self, i: usize, typed: &[u8]) {
        if self.execs[i].pty.is_none() || !has_control_byte(typed) {
            return;
        }
        // Found out by the zygote: finding out forks, and no fork of this
        // process may be alive while a command runs (see `zygote`).
        if self.kernel_tty_signals.is_none() {
            self.kernel_tty_signals = self
                .zygote
                .as_ref()
                .and_then(|z| z.kernel_sends_tty_signals().ok());
        }
        let by_kernel = self.kernel_tty_signals.unwrap_or(true);
        if let (false, Some(master)) = (by_kernel, self.execs[i].pty.as_ref()) {
            // The command is the supervisor's child and leads its session.
            let leader = hako_sys::proc::children_of(self.execs[i].supervisor)
                .ok()
                .and_then(|c| c.first().map(|p| p.as_raw_nonzero().get()));
            let _ = hako_sys::tty::send_tty_signals(master.as_fd(), typed, leader);
        }
    }
}

/// Whether `typed` holds a control byte (one that may be Ctrl-C, Ctrl-\\
/// or Ctrl-Z under the terminal's settings).
fn has_control_byte(typed: &[u8]) -> bool {
    typed.iter().any(|&b| b < 0x20)
}

fn winsize(rows: u16, cols: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A new pseudo-terminal of `rows` x `cols`: (master, slave), both
/// close-on-exec; the slave is not made anyone's controlling terminal here.
pub(super) fn open_pty(rows: u16, cols: u16) -> Result<(OwnedFd, OwnedFd), GuestError> {
    use hako_sys::rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(failed("open a pseudo-terminal"))?;
    grantpt(&master).map_err(failed("grant the pseudo-terminal"))?;
    unlockpt(&master).map_err(failed("unlock the pseudo-terminal"))?;
    let name = ptsname(&master, Vec::new()).map_err(failed("name the pseudo-terminal"))?;
    let slave = hako_sys::rustix::fs::open(
        name.as_c_str(),
        hako_sys::rustix::fs::OFlags::RDWR
            | hako_sys::rustix::fs::OFlags::NOCTTY
            | hako_sys::rustix::fs::OFlags::CLOEXEC,
        hako_sys::rustix::fs::Mode::empty(),
    )
    .map_err(failed("open the terminal"))?;
    hako_sys::rustix::termios::tcsetwinsize(&master, winsize(rows, cols))
        .map_err(failed("size the terminal"))?;
    Ok((master, slave))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_control_bytes_can_be_a_terminals_signal() {
        assert!(has_control_byte(b"\x03"), "Ctrl-C");
        assert!(has_control_byte(b"ls\r"), "Enter is a control byte too");
        assert!(!has_control_byte(b"plain text"));
        assert!(!has_control_byte(b""));
    }

    #[test]
    fn a_new_terminal_has_the_size_asked_for() {
        let (master, slave) = open_pty(33, 101).unwrap();
        for fd in [&master, &slave] {
            let size = hako_sys::rustix::termios::tcgetwinsize(fd).unwrap();
            assert_eq!((size.ws_row, size.ws_col), (33, 101));
        }
    }
}
