//! The kernel's notice of each TCP socket it frees, with the socket's
//! final counters (`sock_diag`'s destroy groups, readable without
//! privilege in the caller's network namespace).
//!
//! The egress proxy's direct path hands a sandboxed process a socket and
//! keeps no copy of it (a copy would keep the connection open after the
//! process closed it), so this is how it learns when the connection ended
//! and how many bytes it carried.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SKNLGRP_INET_TCP_DESTROY: u32 = 1;
const SKNLGRP_INET6_TCP_DESTROY: u32 = 3;
/// Both groups, as `bind` takes them (group N is bit N - 1).
const GROUPS: u32 = (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1));
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_msg`.
const DIAG_MSG: usize = 72;
const INET_DIAG_INFO: u16 = 2;
/// Offsets in `struct tcp_info`.
const TCPI_BYTES_RECEIVED: usize = 128;
const TCPI_BYTES_SENT: usize = 200;
const TCPI_BYTES_RETRANS: usize = 208;

/// A TCP socket's counters when it was freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpCounters {
    /// Payload bytes it sent, retransmissions counted once.
    pub bytes_sent: u64,
    /// Sequence space it received: payload, plus one for a FIN it took.
    pub bytes_received: u64,
}

/// One freed TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destroyed {
    /// Its `SO_COOKIE`.
    pub cookie: u64,
    /// Its own address.
    pub local: SocketAddr,
    /// Its peer's.
    pub remote: SocketAddr,
    /// Its counters (absent from a message too short to hold them).
    pub counters: Option<TcpCounters>,
}

/// A subscription to the kernel's TCP destroy notices.
#[derive(Debug)]
pub struct DestroyWatch {
    fd: OwnedFd,
}

impl DestroyWatch {
    /// Subscribes (IPv4 and IPv6) in this process's network namespace.
    pub fn subscribe() -> io::Result<DestroyWatch> {
        // SAFETY: socket takes three integers and returns a new descriptor
        // or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        crate::check(fd.into())?;
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Room for bursts: the kernel caps it at its maximum.
        let size: libc::c_int = 8 << 20;
        // SAFETY: `size` is a valid c_int for the call, its length given.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        // SAFETY: all-zero is a valid `sockaddr_nl`.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = GROUPS;
        // SAFETY: `addr` is a valid `sockaddr_nl` of the length given.
        let ret = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        crate::check(ret.into())?;
        Ok(DestroyWatch { fd })
    }

    /// Waits for the next batch of notices and appends them to `out`.
    /// `ENOBUFS`: some were lost (the receive buffer overflowed).
    pub fn next(&self, buf: &mut [u8], out: &mut Vec<Destroyed>) -> io::Result<()> {
        // SAFETY: `buf` is valid and writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let n = crate::check(n as libc::c_long)? as usize;
        parse(&buf[..n.min(buf.len())], out);
        Ok(())
    }
}

impl DestroyWatch {
    /// Like [`DestroyWatch::next`] without waiting: `Ok(false)` when no
    /// notice is queued.
    pub fn try_next(&self, buf: &mut [u8], out: &mut Vec<Destroyed>) -> io::Result<bool> {
        // SAFETY: `buf` is valid and writable for its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match crate::check(n as libc::c_long) {
            Ok(n) => {
                parse(&buf[..(n as usize).min(buf.len())], out);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses one datagram of netlink messages; anything malformed ends it.
fn parse(mut b: &[u8], out: &mut Vec<Destroyed>) {
    while let (Some(len), Some(kind)) = (u32_at(b, 0), u16_at(b, 4)) {
        let len = len as usize;
        if len < NLMSG_HDR || len > b.len() {
            return;
        }
        if kind == SOCK_DIAG_BY_FAMILY {
            if let Some(d) = parse_one(&b[NLMSG_HDR..len]) {
                out.push(d);
            }
        }
        let next = (len + 3) & !3;
        b = b.get(next..).unwrap_or(&[]);
    }
}

fn parse_one(m: &[u8]) -> Option<Destroyed> {
    if m.len() < DIAG_MSG {
        return None;
    }
    let family = i32::from(m[0]);
    let sport = u16::from_be_bytes([m[4], m[5]]);
    let dport = u16::from_be_bytes([m[6], m[7]]);
    let ip = |at: usize| -> Option<IpAddr> {
        match family {
            libc::AF_INET => {
                let o: [u8; 4] = m.get(at..at + 4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(o)))
            }
            libc::AF_INET6 => {
                let o: [u8; 16] = m.get(at..at + 16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => None,
        }
    };
    let local = SocketAddr::new(ip(8)?, sport);
    let remote = SocketAddr::new(ip(24)?, dport);
    let cookie = u64::from(u32_at(m, 44)?) | (u64::from(u32_at(m, 48)?) << 32);
    let mut counters = None;
    let mut a = &m[DIAG_MSG..];
    while let (Some(len), Some(kind)) = (u16_at(a, 0), u16_at(a, 2)) {
        let len = usize::from(len);
        if len < 4 || len > a.len() {
            break;
        }
        if kind == INET_DIAG_INFO {
            let info = &a[4..len];
            counters = match (
                u64_at(info, TCPI_BYTES_SENT),
                u64_at(info, TCPI_BYTES_RETRANS),
                u64_at(info, TCPI_BYTES_RECEIVED),
            ) {
                (Some(sent), Some(retrans), Some(received)) => Some(TcpCounters {
                    bytes_sent: sent.saturating_sub(retrans),
                    bytes_received: received,
                }),
                _ => None,
            };
        }
        a = a.get((len + 3) & !3..).unwrap_or(&[]);
    }
    Some(Destroyed {
        cookie,
        local,
        remote,
        counters,
    })
}

/// Whether a TCP socket with this local and remote address is still a full
/// socket (not gone, not only a `TIME_WAIT` remnant) in this network
/// namespace, from `/proc/net/tcp` and `tcp6`. For after an `ENOBUFS`.
pub fn still_open(local: SocketAddr, remote: SocketAddr) -> bool {
    let file = if local.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let Ok(text) = std::fs::read_to_string(file) else {
        // Cannot tell: say open, so that nothing is counted as ended early.
        return true;
    };
    let want = (proc_addr(local), proc_addr(remote));
    text.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 3 && f[1] == want.0 && f[2] == want.1 && f[3] != "06"
    })
}

/// An address as `/proc/net/tcp` writes it: each 32-bit word of the
/// address in host order, in hex, then `:` and the port.
fn proc_addr(a: SocketAddr) -> String {
    let words: Vec<u32> = match a.ip() {
        IpAddr::V4(v4) => vec![u32::from_ne_bytes(v4.octets())],
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    let mut s: String = words.iter().map(|w| format!("{w:08X}")).collect();
    s.push_str(&format!(":{:04X}", a.port()));
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    #[test]
    fn a_closed_connection_is_reported_with_its_counters() {
        let watch = DestroyWatch::subscribe().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            c.write_all(&[7u8; 100_000]).unwrap();
            let mut got = [0u8; 5];
            c.read_exact(&mut got).unwrap();
        });
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let cookie = rustix::net::sockopt::socket_cookie(client.as_fd()).unwrap();
        let (local, remote) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
        assert!(still_open(local, remote));
        let mut got = vec![0u8; 100_000];
        client.read_exact(&mut got).unwrap();
        client.write_all(b"hello").unwrap();
        server.join().unwrap();
        drop(client);
        let mut buf = vec![0u8; 64 * 1024];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "no notice for the socket");
            let mut out = Vec::new();
            watch.next(&mut buf, &mut out).unwrap();
            if let Some(d) = out.iter().find(|d| d.cookie == cookie) {
                assert_eq!((d.local, d.remote), (local, remote));
                let c = d.counters.unwrap();
                assert_eq!(c.bytes_sent, 5);
                // 100 000 bytes, and the server's FIN if this socket took it.
                assert!((100_000..=100_001).contains(&c.bytes_received), "{c:?}");
                break;
            }
        }
        assert!(!still_open(local, remote));
    }

    #[test]
    fn malformed_messages_are_skipped() {
        let mut out = Vec::new();
        parse(&[], &mut out);
        parse(&[255; 15], &mut out);
        // A length past the end, and one below the header.
        parse(
            &[200, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &mut out,
        );
        parse(&[4, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &mut out);
        // A whole header with a body too short for a diag message.
        let mut short = vec![0u8; NLMSG_HDR + 10];
        short[0] = short.len() as u8;
        short[4] = SOCK_DIAG_BY_FAMILY as u8;
        parse(&short, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn proc_addresses_are_written_as_the_kernel_writes_them() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_addr(a), "0100007F:1F90");
    }
}
