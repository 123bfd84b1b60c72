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

use std::io::{self, IoSlice, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The first byte of a handover.
pub const MAGIC: u8 = 0;
/// The kind of a handover for the proxy's own port.
pub const KIND_PROXY: u8 = 0;
/// The kind of a handover for a forwarded host port.
pub const KIND_FORWARD: u8 = 1;
/// The kind of a forwarded host port's connection whose bytes the
/// forwarder relays itself (no descriptor).
pub const KIND_RELAYED_FORWARD: u8 = 2;
/// The proxy's answer: it serves the connection.
pub const TAKEN: u8 = 1;
/// The proxy's answer: it does not.
pub const NOT_TAKEN: u8 = 0;

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
