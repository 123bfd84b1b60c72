//! Commands on a pseudo-terminal: opening one, resizing it, and the Ctrl-C
//! (Ctrl-\\, Ctrl-Z) typed at it, signalled by the command's supervisor
//! where the kernel does not (gVisor before 2023): the supervisor leads the
//! terminal's session, so that it may ask which group is in the
//! foreground (see [`supervise`](crate::supervise)). Whether the kernel
//! does is found out by the zygote, once, at the first signal character
//! typed at a terminal: finding out forks, and no fork of pid 1 may be
//! alive while a command runs (see [`zygote`](crate::zygote)).

use std::borrow::Cow;
use std::os::fd::{AsFd, OwnedFd};

use hako_sys::rustix::termios::Winsize;
use hako_sys::tty::TtySignal;

use super::Server;
use crate::error::failed;
use crate::supervise::terminal_signal_byte;
use crate::GuestError;

impl Server<'_> {
    /// Sets the window size of command `id`'s terminal (ignored for a
    /// command without one, or gone).
    pub(super) fn resize(&mut self, id: u64, rows: u16, cols: u16) {
        if let Some(fd) = self.position(id).and_then(|i| self.execs[i].pty.as_ref()) {
            let _ = hako_sys::rustix::termios::tcsetwinsize(fd, winsize(rows, cols));
        }
    }

    /// What typed `input` at command `i`'s terminal is to be written: all
    /// of it, but where the kernel does not send a terminal's signals
    /// (gVisor before 2023), the signal characters (with `ISIG` on) are
    /// taken out, as a line discipline does, and returned to be sent by
    /// [`Server::send_tty_signals`].
    pub(super) fn typed<'a>(
        &mut self,
        i: usize,
        input: &'a [u8],
    ) -> (Cow<'a, [u8]>, Vec<TtySignal>) {
        let Some(master) = self.execs[i].pty.as_ref() else {
            return (Cow::Borrowed(input), Vec::new());
        };
        let typed = match hako_sys::tty::typed_at(master.as_fd(), input) {
            Ok(typed) if !typed.signals.is_empty() => typed,
            _ => return (Cow::Borrowed(input), Vec::new()),
        };
        // Found out by the zygote, at the first signal character typed:
        // finding out forks, and no fork of this process may be alive
        // while a command runs (see `zygote`).
        if self.kernel_tty_signals.is_none() {
            self.kernel_tty_signals = self
                .zygote
                .as_ref()
                .and_then(|z| z.kernel_sends_tty_signals().ok());
        }
        if self.kernel_tty_signals.unwrap_or(true) {
            return (Cow::Borrowed(input), Vec::new());
        }
        (Cow::Owned(typed.input), typed.signals)
    }

    /// Has command `i`'s supervisor, which leads its terminal's session,
    /// send `signals` to the terminal's foreground group (only it may ask
    /// gVisor which group that is). Never blocks: a supervisor a command
    /// stopped, with its socket full, misses them.
    pub(super) fn send_tty_signals(&mut self, i: usize, signals: &[TtySignal]) {
        use hako_sys::rustix::net::{send, SendFlags};
        let Some(sup) = self.execs[i].sup.as_ref() else {
            return;
        };
        let bytes: Vec<u8> = signals.iter().map(|&s| terminal_signal_byte(s)).collect();
        if !bytes.is_empty() {
            let _ = send(sup, &bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
        }
    }
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
    fn a_new_terminal_has_the_size_asked_for() {
        let (master, slave) = open_pty(33, 101).unwrap();
        for fd in [&master, &slave] {
            let size = hako_sys::rustix::termios::tcgetwinsize(fd).unwrap();
            assert_eq!((size.ws_row, size.ws_col), (33, 101));
        }
    }
}
