//! Copying bytes both ways between two connected sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::thread;

/// The bytes read per `read` call of a relay direction. Large buffers matter
/// for throughput: loopback and unix sockets deliver hundreds of kilobytes
/// per call, and every call is a system call on each side. (Measured: 64 KiB
/// gives about 0.6 of direct loopback, 256 KiB about 0.8 to 0.95; splice(2)
/// through a pipe was no faster than this copy.)
pub(crate) const RELAY_BUF: usize = 256 * 1024;

/// A connected stream socket the relay can copy to and from.
pub trait RelaySocket: Read + Write + AsFd + Send + Sized + 'static {
    /// A second handle to the same socket (for the second direction).
    fn try_clone_socket(&self) -> io::Result<Self>;
    /// `shutdown(2)`.
    fn shutdown_socket(&self, how: Shutdown) -> io::Result<()>;
}

impl RelaySocket for TcpStream {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

impl RelaySocket for UnixStream {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

/// Copies `a` to `b` and `b` to `a` until both directions end, and returns
/// the bytes copied `(a to b, b to a)`.
///
/// End of stream on one side is passed on as `shutdown(Write)` of the other
/// (a half-close), and the other direction goes on. An error in either
/// direction shuts both sockets down completely, which ends the other
/// direction too. The second direction runs on a thread of its own; if that
/// thread cannot be started, both sockets are shut down and nothing is
/// copied.
pub fn relay<A: RelaySocket, B: RelaySocket>(a: A, b: B) -> (u64, u64) {
    let clones = a
        .try_clone_socket()
        .and_then(|a2| Ok((a2, b.try_clone_socket()?)));
    let (a2, b2) = match clones {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "relay cannot clone a socket");
            shut_both(&a, &b);
            return (0, 0);
        }
    };
    let up = thread::Builder::new()
        .name("hako-net-relay".into())
        .spawn(move || {
            let (mut a2, mut b2) = (a2, b2);
            pump(&mut a2, &mut b2)
        });
    let up = match up {
        Ok(handle) => handle,
        Err(e) => {
            tracing::warn!(error = %e, "relay cannot start a thread");
            shut_both(&a, &b);
            return (0, 0);
        }
    };
    let (mut a, mut b) = (a, b);
    let down = pump(&mut b, &mut a);
    let up = up.join().unwrap_or(0);
    (up, down)
}

fn shut_both<A: RelaySocket, B: RelaySocket>(a: &A, b: &B) {
    let _ = a.shutdown_socket(Shutdown::Both);
    let _ = b.shutdown_socket(Shutdown::Both);
}

/// Bytes a splice through the relay's pipe moves at most per call.
const SPLICE_CHUNK: usize = 1 << 20;

/// How a spliced copy ended.
enum Spliced {
    /// End of stream, after this many bytes.
    Eof(u64),
    /// An error after this many bytes.
    Failed(u64),
    /// The kernel cannot splice between these sockets (nothing was moved).
    Unsupported,
}

/// Copies `src` to `dst` through a pipe with `splice(2)`: the bytes move
/// from one socket's buffers to the other's without being copied through
/// the proxy's memory, which on a busy machine is most of a relay's cost.
fn splice_all(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Spliced {
    use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
    let Ok((r, w)) = pipe_with(PipeFlags::CLOEXEC) else {
        return Spliced::Unsupported;
    };
    // A bigger pipe moves more per call; the default (64 KiB) still works.
    let _ = rustix::pipe::fcntl_setpipe_size(&w, SPLICE_CHUNK);
    let mut total: u64 = 0;
    loop {
        let n = match splice(src, None, &w, None, SPLICE_CHUNK, SpliceFlags::MOVE) {
            Ok(0) => return Spliced::Eof(total),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(
                rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP,
            ) if total == 0 => return Spliced::Unsupported,
            Err(_) => return Spliced::Failed(total),
        };
        let mut left = n;
        while left > 0 {
            match splice(&r, None, dst, None, left, SpliceFlags::MOVE) {
                Ok(0) => return Spliced::Failed(total),
                Ok(m) => {
                    left -= m;
                    total += m as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return Spliced::Failed(total),
            }
        }
    }
}

/// Copies `src` to `dst` until end of stream (then half-closes `dst`) or an
/// error (then shuts both down). Returns the bytes written to `dst`.
fn pump<R: RelaySocket, W: RelaySocket>(src: &mut R, dst: &mut W) -> u64 {
    match splice_all(src.as_fd(), dst.as_fd()) {
        Spliced::Eof(total) => {
            let _ = dst.shutdown_socket(Shutdown::Write);
            return total;
        }
        Spliced::Failed(total) => {
            shut_both(src, dst);
            return total;
        }
        Spliced::Unsupported => {}
    }
    let mut buf = vec![0u8; RELAY_BUF];
    let mut total: u64 = 0;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => {
                let _ = dst.shutdown_socket(Shutdown::Write);
                return total;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                shut_both(src, dst);
                return total;
            }
        };
        if dst.write_all(&buf[..n]).is_err() {
            shut_both(src, dst);
            return total;
        }
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn relay_copies_both_ways_and_propagates_half_close() {
        let (a_outer, a_inner) = UnixStream::pair().unwrap();
        let (b_inner, b_outer) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || relay(a_inner, b_inner));
        let mut a = a_outer;
        let mut b = b_outer;
        a.write_all(b"hello").unwrap();
        a.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello");
        // The other direction still works after the half-close.
        b.write_all(b"world!").unwrap();
        b.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"world!");
        assert_eq!(t.join().unwrap(), (5, 6));
    }
}

/// The client side of a proxied connection: the proxy's own unix socket
/// (bytes relayed by the sandbox's forwarder), or the sandbox's TCP
/// connection itself, handed over by the forwarder (see
/// [`crate::handoff`]).
#[derive(Debug)]
pub(crate) enum Sock {
    /// A connection to the proxy's socket.
    Unix(UnixStream),
    /// A TCP connection accepted inside the sandbox.
    Tcp(TcpStream),
}

impl Sock {
    pub(crate) fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.shutdown(how),
            Sock::Tcp(s) => s.shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
        }
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_nonblocking(on),
            Sock::Tcp(s) => s.set_nonblocking(on),
        }
    }
}

impl Read for &Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&mut &*s).read(buf),
            Sock::Tcp(s) => (&mut &*s).read(buf),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&mut &*s).write(buf),
            Sock::Tcp(s) => (&mut &*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Unix(s) => s.as_fd(),
            Sock::Tcp(s) => s.as_fd(),
        }
    }
}

impl RelaySocket for Sock {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}
