//! Copying bytes both ways between two connected sockets: the relay
//! itself is `hako_relay`'s (the forwarder inside uses it too); here, the
//! proxy's client socket and its idle-timeout watch.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

pub(crate) use hako_relay::relay::{unpaced, RELAY_BUF};
use hako_relay::RelaySocket;

use crate::live::{touch, Progress};

/// [`hako_relay::relay`], noting in `progress` each time either direction
/// reads or writes something (see [`crate::live`]: the proxy's idle
/// timeout).
pub(crate) fn relay_watched<A: RelaySocket, B: RelaySocket>(
    a: A,
    b: B,
    progress: Option<Progress>,
) -> (u64, u64) {
    let progress =
        progress.map(|p| -> hako_relay::relay::Progress { Arc::new(move || touch(Some(&p))) });
    hako_relay::relay_watched(a, b, progress)
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

impl RelaySocket for Sock {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}
