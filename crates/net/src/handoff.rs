//! Handing a sandbox's TCP connection itself to the proxy.
//!
//! The forwarder inside the sandbox accepts a client's connection on
//! loopback. Rather than copy every byte between that connection and the
//! proxy's socket (a second relay on the path, as costly as the proxy's
//! own), it sends the accepted socket's descriptor over the proxy's socket
//! (`SCM_RIGHTS`) with a four-byte header, and the proxy serves the
//! connection directly. Where descriptors cannot cross (gVisor's sockets
//! live in its own kernel), the proxy answers "not taken" and the
//! forwarder relays the bytes instead.
//!
//! The header: `0x00` (no HTTP method or SOCKS version starts so), then
//! the kind (`0` the proxy's own port, `1` a forwarded host port, `2` a
//! forwarded host port whose bytes the forwarder relays itself, with no
//! descriptor), then that port, big-endian. The proxy answers one byte:
//! `1` taken, `0` not.
//!
//! Anything inside the sandbox can connect to the proxy's socket and send
//! a descriptor: the proxy takes only one descriptor, and only if it is an
//! IPv4 or IPv6 stream socket that is not listening; it makes it blocking
//! (the sandbox may have left it non-blocking) and applies the same policy
//! to what it then asks for. A descriptor it does not take is closed at
//! once: a refused handover is never served.

use std::io::{self, IoSlice, IoSliceMut, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketType,
};

/// The first byte of a handover.
pub const MAGIC: u8 = 0;
const KIND_PROXY: u8 = 0;
const KIND_FORWARD: u8 = 1;
const KIND_RELAYED_FORWARD: u8 = 2;
const TAKEN: u8 = 1;
const NOT_TAKEN: u8 = 0;

/// The forwarder's side: offers `conn` to the proxy over `proxy` (a fresh
/// connection to its socket). `forward`: the host port this connection is
/// for, or `None` for the proxy's own port. `Ok(true)`: the proxy serves
/// it now (close `conn` here); `Ok(false)`: it was not handed over (the
/// descriptor could not be sent, or the proxy did not take it): relay the
/// bytes over a new connection instead. `Err`: whether the proxy took it is
/// unknown (its answer was lost): close `conn`, never relay it too.
pub fn hand_over(
    proxy: &UnixStream,
    conn: BorrowedFd<'_>,
    forward: Option<u16>,
) -> io::Result<bool> {
    let (kind, port) = match forward {
        Some(port) => (KIND_FORWARD, port),
        None => (KIND_PROXY, 0),
    };
    let [hi, lo] = port.to_be_bytes();
    let header = [MAGIC, kind, hi, lo];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    let fds = [conn];
    if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    // A descriptor that cannot cross (gVisor's) fails here, before the
    // proxy has anything.
    let Ok(sent) = sendmsg(
        proxy,
        &[IoSlice::new(&header)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    ) else {
        return Ok(false);
    };
    (&mut &*proxy).write_all(&header[sent..])?;
    let mut answer = [0u8; 1];
    match io::Read::read(&mut &*proxy, &mut answer)? {
        1 => Ok(answer[0] == TAKEN),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the proxy closed without answering the handover",
        )),
    }
}

/// The forwarder's side where descriptors cannot cross: says that the
/// bytes that follow on `proxy` are a connection to the forwarded host
/// port `port`. `Ok(true)`: the proxy took it (relay the connection's
/// bytes over `proxy` now); `Ok(false)` or `Err`: close the connection.
pub fn announce_forward(proxy: &UnixStream, port: u16) -> io::Result<bool> {
    let [hi, lo] = port.to_be_bytes();
    (&mut &*proxy).write_all(&[MAGIC, KIND_RELAYED_FORWARD, hi, lo])?;
    let mut answer = [0u8; 1];
    match io::Read::read(&mut &*proxy, &mut answer)? {
        1 => Ok(answer[0] == TAKEN),
        _ => Ok(false),
    }
}

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
