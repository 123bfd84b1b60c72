//! Handing a sandbox's TCP connection itself to the proxy: the proxy's
//! side. The wire format and the forwarder's side are
//! [`hako_relay::handover`]'s (see there for the whole exchange).

use std::io::{self, IoSliceMut, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

pub use hako_relay::handover::{announce_forward, hand_over, MAGIC};
use hako_relay::handover::{KIND_FORWARD, KIND_PROXY, KIND_RELAYED_FORWARD, NOT_TAKEN, TAKEN};
use rustix::net::{
    recvmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SocketType,
};

/// What a connection to the proxy's socket began with.
pub(crate) enum First {
    /// It closed before sending anything.
    Closed,
    /// A handover: the sandbox's connection, and the forwarded port it is
    /// for (`None`: the proxy's own port).
    HandedOver {
        client: TcpStream,
        forward: Option<u16>,
    },
    /// A connection to a forwarded host port whose bytes follow on the
    /// proxy's socket (see [`announce_forward`]).
    RelayedForward(u16),
    /// A client speaking to the socket itself: its first bytes.
    Bytes(Vec<u8>),
}

/// The proxy's side: the first read of a connection, which may carry a
/// descriptor. A handover whose header is malformed, whose descriptor is
/// missing, or that carries more than one descriptor, or one that is not a
/// TCP stream socket or is listening, is answered "not taken" and reported
/// as `Err`; every descriptor that came with it is closed.
pub(crate) fn first_read(unix: &UnixStream) -> io::Result<First> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        unix,
        &mut [IoSliceMut::new(&mut buf)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    let bytes = &buf[..got.bytes];
    if bytes.is_empty() {
        return Ok(First::Closed);
    }
    if bytes[0] != MAGIC {
        // A client of the socket itself; a descriptor it sent is closed.
        buf.truncate(got.bytes);
        return Ok(First::Bytes(buf));
    }
    let refuse = |why: String| {
        let _ = (&mut &*unix).write_all(&[NOT_TAKEN]);
        Err(io::Error::new(io::ErrorKind::InvalidData, why))
    };
    let (kind, port) = match bytes {
        [MAGIC, kind, hi, lo] => (*kind, u16::from_be_bytes([*hi, *lo])),
        _ => return refuse(format!("a handover header of {} bytes", bytes.len())),
    };
    let forward = match kind {
        KIND_PROXY => None,
        KIND_FORWARD if port != 0 => Some(port),
        KIND_RELAYED_FORWARD if port != 0 && fds.is_empty() => {
            (&mut &*unix).write_all(&[TAKEN])?;
            return Ok(First::RelayedForward(port));
        }
        _ => return refuse(format!("a handover of kind {kind} for port {port}")),
    };
    // Descriptors beyond the room for one were closed by the kernel
    // (`MSG_CTRUNC`); those that fit are closed here.
    if fds.len() > 1 || got.flags.contains(ReturnFlags::CTRUNC) {
        return refuse("more than one descriptor came with the handover".into());
    }
    let Some(fd) = fds.pop() else {
        // gVisor's sockets cannot cross to the host: relay instead.
        return refuse("no descriptor came with the handover".into());
    };
    let stream_socket = rustix::net::sockopt::socket_type(fd.as_fd())
        .is_ok_and(|t| t == SocketType::STREAM)
        && rustix::net::sockopt::socket_domain(fd.as_fd())
            .is_ok_and(|d| d == AddressFamily::INET || d == AddressFamily::INET6);
    if !stream_socket {
        return refuse("the handed-over descriptor is not a TCP socket".into());
    }
    // A listening socket would be "served" by a proxy that never reads a
    // byte from it, yet (for a forwarded port) connects upstream.
    if !rustix::net::sockopt::socket_acceptconn(fd.as_fd()).is_ok_and(|listening| !listening) {
        return refuse("the handed-over socket is a listening socket".into());
    }
    // The sandbox shares this socket's open file description and may have
    // left it non-blocking or with timeouts of its own; the proxy's reads,
    // deadlines and relay expect a blocking socket without them.
    let client = TcpStream::from(fd);
    let normalised = client
        .set_nonblocking(false)
        .and_then(|()| client.set_read_timeout(None))
        .and_then(|()| client.set_write_timeout(None));
    if let Err(e) = normalised {
        return refuse(format!("cannot make the handed-over socket blocking: {e}"));
    }
    (&mut &*unix).write_all(&[TAKEN])?;
    Ok(First::HandedOver { client, forward })
}
