//! hako's sending end of the link to the guest.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::proto;

/// hako's sending end of the link to the guest.
pub(super) enum Wire {
    /// A socket shared with the guest (it can carry descriptors).
    Socket(UnixStream),
    /// The write end of a pipe into the guest's stdin (a guest in a
    /// container); `None` once closed.
    Pipe(Option<std::fs::File>),
}

impl Wire {
    pub(super) fn send(&self, bytes: &[u8], fd: Option<&OwnedFd>) -> std::io::Result<()> {
        match (self, fd) {
            (Wire::Socket(s), None) => (&*s).write_all(bytes),
            (Wire::Socket(s), Some(fd)) => proto::send_with_fds(s, bytes, &[fd.as_fd()]),
            (Wire::Pipe(Some(p)), None) => (&*p).write_all(bytes),
            (Wire::Pipe(Some(_)), Some(_)) => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "a guest reached through a pipe cannot receive descriptors",
            )),
            (Wire::Pipe(None), _) => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection is closed",
            )),
        }
    }

    /// Tells the guest no more commands come, and stops reading what it
    /// says: the reader thread, blocked on the socket, ends now rather
    /// than when this process exits (which would wait for it).
    pub(super) fn shut(&mut self) {
        match self {
            Wire::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Wire::Pipe(_) => self.close_write(),
        }
    }

    /// Tells the guest no more commands come: it ends the sandbox.
    pub(super) fn close_write(&mut self) {
        match self {
            Wire::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            Wire::Pipe(p) => drop(p.take()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::io::Read;

    use super::*;

    #[test]
    fn a_closed_pipe_refuses_to_send_and_no_pipe_carries_a_descriptor() {
        let (r, w) = hako_sys::rustix::pipe::pipe().unwrap();
        let r = std::fs::File::from(r);
        let fd = OwnedFd::from(std::fs::File::open(".").unwrap());
        let mut wire = Wire::Pipe(Some(std::fs::File::from(w)));
        let err = wire.send(b"x", Some(&fd)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
        wire.send(b"ok", None).unwrap();
        wire.close_write();
        let err = wire.send(b"x", None).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
        let mut got = Vec::new();
        (&r).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"ok");
    }

    #[test]
    fn closing_a_socket_for_writing_ends_the_guests_input() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut wire = Wire::Socket(ours);
        wire.send(b"hello", None).unwrap();
        wire.close_write();
        let mut got = Vec::new();
        (&theirs).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello");
    }
}
