//! The connection to hako.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use hako_sys::rustix::io::Errno;

use crate::proto::{self, Frame};

/// The connection to hako: a socket (descriptors may travel with frames),
/// or a pair of pipes, the stdin and stdout of a guest started where no
/// socket reaches (a container's entrypoint, a VM's console).
pub struct Link {
    input: OwnedFd,
    output: OwnedFd,
    socket: bool,
    /// A virtio-serial port: a write to it blocks for ever once the host
    /// has gone (the kernel holds it until the host comes back), so each
    /// write waits for room first and fails on a hang-up.
    port: bool,
}

impl Link {
    /// Over a connected socket.
    pub fn socket(stream: UnixStream) -> io::Result<Link> {
        let output = OwnedFd::from(stream.try_clone()?);
        Ok(Link {
            input: OwnedFd::from(stream),
            output,
            socket: true,
            port: false,
        })
    }

    /// Over two pipes (frames are read from `input`, written to `output`).
    pub fn pipes(input: OwnedFd, output: OwnedFd) -> Link {
        Link {
            input,
            output,
            socket: false,
            port: false,
        }
    }

    /// Over a virtio-serial port (a `vm` sandbox's link), open twice.
    pub fn port(input: OwnedFd, output: OwnedFd) -> Link {
        Link {
            input,
            output,
            socket: false,
            port: true,
        }
    }

    /// For a port: waits until a write would not block, or fails if the
    /// host has hung up.
    fn wait_for_room(&self) -> io::Result<()> {
        use hako_sys::rustix::event::{poll, PollFd, PollFlags};
        loop {
            let mut fds = [PollFd::new(&self.output, PollFlags::OUT)];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = fds[0].revents();
            if ready.contains(PollFlags::OUT) {
                return Ok(());
            }
            if ready.intersects(PollFlags::HUP | PollFlags::ERR) {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "hako has closed the port",
                ));
            }
        }
    }

    /// Where frames (and, on a socket, descriptors) come in.
    pub(super) fn input(&self) -> &OwnedFd {
        &self.input
    }

    /// Writes all of `bytes`, blocking.
    pub fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.port {
                self.wait_for_room()?;
            }
            match hako_sys::rustix::io::write(&self.output, bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads one whole control message, blocking (the handshake).
    pub fn read_frame<T: serde::de::DeserializeOwned>(&self) -> io::Result<T> {
        proto::read_frame(std::fs::File::from(self.input.try_clone()?))
    }

    /// Writes one control message.
    pub fn write_frame<T: serde::Serialize>(&self, msg: &T) -> io::Result<()> {
        self.write_all(&proto::encode(&Frame::Message(msg))?)
    }

    /// Whether this is a socket (descriptors can travel on it).
    pub fn is_socket(&self) -> bool {
        self.socket
    }

    /// The socket, for a guest that hands it to a sandbox's pid 1.
    pub fn into_socket(self) -> Option<UnixStream> {
        self.socket.then(|| UnixStream::from(self.input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::FromGuest;

    #[test]
    fn a_frame_written_on_pipes_is_read_whole_on_the_other_side() {
        let (to_guest_r, to_guest_w) = crate::server::pipe().unwrap();
        let (from_guest_r, from_guest_w) = crate::server::pipe().unwrap();
        let guest = Link::pipes(to_guest_r, from_guest_w);
        let hako = Link::pipes(from_guest_r, to_guest_w);
        guest.write_frame(&FromGuest::Ready { version: 7 }).unwrap();
        match hako.read_frame::<FromGuest>().unwrap() {
            FromGuest::Ready { version } => assert_eq!(version, 7),
            other => panic!("read {other:?}"),
        }
        assert!(!guest.is_socket());
        assert!(guest.into_socket().is_none(), "pipes are no socket");
    }

    #[test]
    fn a_socket_link_is_a_socket_both_ways() {
        let (a, b) = UnixStream::pair().unwrap();
        let guest = Link::socket(a).unwrap();
        let hako = Link::socket(b).unwrap();
        hako.write_frame(&FromGuest::Bye {}).unwrap();
        assert!(matches!(
            guest.read_frame::<FromGuest>().unwrap(),
            FromGuest::Bye {}
        ));
        assert!(guest.is_socket());
        assert!(guest.into_socket().is_some());
    }

    #[test]
    fn writing_to_a_closed_reader_fails() {
        let (r, w) = crate::server::pipe().unwrap();
        drop(r);
        let link = Link::pipes(crate::server::dev_null().unwrap(), w);
        assert!(link.write_all(b"lost").is_err());
    }
}
