//! The direct path for forwarded host ports on `linux`.
//!
//! A forwarded `localhost:PORT` is reached inside at `127.0.0.1:PORT`,
//! where the guest's forwarder accepts each connection and hands it to the
//! proxy, which relays its bytes to the host's service. On loopback that
//! relay costs as much CPU as the service itself. On `linux`, pid 1 also
//! installs a seccomp filter that sends every `connect` of the sandbox to
//! the proxy (see [`crate::handoff::offer_notifier`]), and the proxy
//! answers a `connect` to a forwarded port itself:
//!
//! 1. It reads the address from the caller's memory and takes a copy of
//!    the caller's socket, and goes on only if the address is `127.0.0.1`
//!    (or `::1`, or `::ffff:127.0.0.1`) on a forwarded port and the socket
//!    an unconnected, non-listening TCP socket. The decision is made on
//!    what it read: what the caller changes afterwards in its memory
//!    cannot change what is connected to.
//! 2. It applies the allowlist, as for every connection ([`decide`]),
//!    connects to the service on the host's loopback, gives the new socket
//!    the caller's file status flags and common options, and puts it in
//!    place of the caller's socket, at the same number
//!    (`SECCOMP_ADDFD_FLAG_SETFD`); `connect` returns 0.
//! 3. It keeps no copy: the connection is the caller's alone and ends when
//!    the caller closes it. The kernel's notice of the socket being freed
//!    ([`hako_sys::sockdiag`]) gives the connection's end and byte counts,
//!    and the event is recorded then.
//!
//! Anything else (another address or port, another kind of socket, a
//! caller whose memory cannot be read, the connection budget reached, no
//! destroy notices here) continues into the kernel unchanged: into the
//! sandbox's own network namespace, which stays the boundary, where a
//! forwarded port is still served by the forwarder and the relay. So this
//! path can only make an allowed connection faster, never reach more.
//!
//! Byte counts: up is the payload the sandbox's socket sent; down is the
//! payload the service's socket sent when the kernel freed that one first,
//! and otherwise what the sandbox's socket received, where a FIN it took
//! counts as one byte (the kernel counts sequence space).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Instant;

use hako_core::{NetDecision, NetEvent, NetProtocol};
use hako_sys::notify::{self, Notification};
use hako_sys::sockdiag::{self, DestroyWatch, Destroyed};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::net::sockopt;
use rustix::net::{AddressFamily, SocketType};

use crate::decide::{decide, Verdict};
use crate::proxy::{lock, now_ms, Shared};

const LOCALHOST: &str = "localhost";
const ECONNREFUSED: i32 = 111;
const O_CLOEXEC_FDINFO: u32 = 0o2_000_000;

/// What a notification asks for, when it is a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    fd: i32,
    family: AddressFamily,
    port: u16,
}

/// Serves the sandbox's `connect` notifications on `listener` until
/// `lifeline` (pid 1's connection) ends or the proxy stops. Every
/// notification is answered, so that no `connect` of the sandbox waits for
/// nothing; when this returns the listener closes, and a `connect` still
/// to come fails with `ENOSYS` (the sandbox is ending then).
pub(crate) fn serve_notifier(shared: &Arc<Shared>, lifeline: &UnixStream, listener: OwnedFd) {
    let listener = Arc::new(listener);
    let ports = shared.config.allow.forwarded_ports();
    loop {
        let mut fds = [
            PollFd::new(&*listener, PollFlags::IN),
            PollFd::new(lifeline, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "egress proxy: cannot poll the connect notifier");
                return;
            }
        }
        let (ours, life) = (fds[0].revents(), fds[1].revents());
        if !life.is_empty() || shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if !ours.contains(PollFlags::IN) {
            // HUP: no process of the sandbox is left.
            return;
        }
        match notify::recv_notification(listener.as_fd()) {
            Ok(n) => handle(shared, &listener, n, &ports),
            Err(e) if matches!(e.raw_os_error(), Some(2 | 4)) => {}
            Err(e) => {
                tracing::warn!(error = %e, "egress proxy: cannot read the connect notifier");
                return;
            }
        }
    }
}

fn carry_on(listener: &OwnedFd, id: u64) {
    // Fails only when the caller is gone (or was interrupted, and then
    // calls again).
    let _ = notify::respond_continue(listener.as_fd(), id);
}

fn handle(shared: &Arc<Shared>, listener: &Arc<OwnedFd>, n: Notification, ports: &[u16]) {
    let at_ms = now_ms();
    let start = Instant::now();
    let Some(target) = examine(&n, ports) else {
        return carry_on(listener, n.id);
    };
    if !notify::notification_valid(listener.as_fd(), n.id) || watch().is_none() {
        return carry_on(listener, n.id);
    }
    if !reserve(shared) {
        // The forwarder applies the limit, and records the refusal.
        return carry_on(listener, n.id);
    }
    let (for_thread, l) = (Arc::clone(shared), Arc::clone(listener));
    let spawned = thread::Builder::new()
        .name("hako-net-direct".into())
        .spawn(move || {
            let when = (at_ms, start);
            if !take_over(&for_thread, &l, &n, target, when) {
                release(&for_thread);
                carry_on(&l, n.id);
            }
        });
    if spawned.is_err() {
        release(shared);
        carry_on(listener, n.id);
    }
}

/// A `connect` to `127.0.0.1`, `::1` or `::ffff:127.0.0.1` on one of
/// `ports`, read from the caller's memory; `None` for anything else.
fn examine(n: &Notification, ports: &[u16]) -> Option<Target> {
    if n.nr != notify::SYS_CONNECT || n.arch != notify::AUDIT_ARCH {
        return None;
    }
    // The kernel reads an int and a socklen_t: the low 32 bits.
    let fd = n.args[0] as u32 as i32;
    let len = n.args[2] as u32 as usize;
    if fd < 0 || !(16..=128).contains(&len) {
        return None;
    }
    let mut buf = [0u8; 28];
    let want = len.min(buf.len());
    let got = notify::read_memory(n.tid, n.args[1], &mut buf[..want]).ok()?;
    parse_sockaddr(&buf[..got.min(want)], ports).map(|(family, port)| Target { fd, family, port })
}

/// The family and port of a loopback `sockaddr_in` / `sockaddr_in6` on
/// one of `ports`.
fn parse_sockaddr(b: &[u8], ports: &[u16]) -> Option<(AddressFamily, u16)> {
    let family = AddressFamily::from_raw(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    let loopback = if family == AddressFamily::INET {
        b.get(4..8)? == Ipv4Addr::LOCALHOST.octets()
    } else if family == AddressFamily::INET6 {
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(b.get(8..24)?).ok()?);
        ip == Ipv6Addr::LOCALHOST || ip.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)
    } else {
        false
    };
    (loopback && ports.contains(&port)).then_some((family, port))
}

/// What the caller's socket was, to be given to the new one.
#[derive(Debug, Default)]
struct Settings {
    nonblocking: bool,
    cloexec: bool,
    nodelay: bool,
    keepalive: bool,
    linger: Option<std::time::Duration>,
    recv_timeout: Option<std::time::Duration>,
    send_timeout: Option<std::time::Duration>,
}

/// The caller's socket, when it is an unconnected, non-listening TCP
/// socket of `family`: its settings.
fn settings_of(n: &Notification, target: Target) -> Option<Settings> {
    let theirs = notify::copy_fd_of(n.tid, target.fd).ok()?;
    let fd = theirs.as_fd();
    let tcp = sockopt::socket_domain(fd).ok()? == target.family
        && sockopt::socket_type(fd).ok()? == SocketType::STREAM
        && sockopt::socket_protocol(fd).ok()? == Some(rustix::net::ipproto::TCP)
        && !sockopt::socket_acceptconn(fd).ok()?;
    let unconnected = matches!(
        rustix::net::getpeername(fd),
        Err(rustix::io::Errno::NOTCONN)
    );
    if !tcp || !unconnected {
        return None;
    }
    let flags = rustix::fs::fcntl_getfl(fd).ok()?;
    Some(Settings {
        nonblocking: flags.contains(rustix::fs::OFlags::NONBLOCK),
        cloexec: cloexec_of(n.tid, target.fd).unwrap_or(true),
        nodelay: sockopt::tcp_nodelay(fd).unwrap_or(false),
        keepalive: sockopt::socket_keepalive(fd).unwrap_or(false),
        linger: sockopt::socket_linger(fd).ok().flatten(),
        recv_timeout: sockopt::socket_timeout(fd, sockopt::Timeout::Recv)
            .ok()
            .flatten(),
        send_timeout: sockopt::socket_timeout(fd, sockopt::Timeout::Send)
            .ok()
            .flatten(),
    })
}

/// Whether descriptor `fd` of thread `tid` is close-on-exec (a
/// descriptor's own flag, which a copy does not carry).
fn cloexec_of(tid: i32, fd: i32) -> Option<bool> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}")).ok()?;
    let flags = text
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
    Some(flags & O_CLOEXEC_FDINFO != 0)
}

fn apply(s: &Settings, sock: &TcpStream) -> io::Result<()> {
    sock.set_nonblocking(s.nonblocking)?;
    let fd = sock.as_fd();
    sockopt::set_tcp_nodelay(fd, s.nodelay)?;
    sockopt::set_socket_keepalive(fd, s.keepalive)?;
    sockopt::set_socket_linger(fd, s.linger)?;
    sockopt::set_socket_timeout(fd, sockopt::Timeout::Recv, s.recv_timeout)?;
    sockopt::set_socket_timeout(fd, sockopt::Timeout::Send, s.send_timeout)?;
    Ok(())
}

/// The addresses `decide` allowed, as the caller's family reaches them.
fn candidates(family: AddressFamily, addrs: &[SocketAddr]) -> Vec<SocketAddr> {
    addrs
        .iter()
        .filter_map(|a| match (family == AddressFamily::INET, a.ip()) {
            (true, IpAddr::V4(_)) => Some(*a),
            (true, IpAddr::V6(_)) => None,
            (false, IpAddr::V6(_)) => Some(*a),
            (false, IpAddr::V4(v4)) => {
                Some(SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()))
            }
        })
        .collect()
}

/// Connects for the caller and puts the socket in place of its own.
/// `false`: nothing was done (carry on into the sandbox's namespace).
fn take_over(
    shared: &Arc<Shared>,
    listener: &OwnedFd,
    n: &Notification,
    target: Target,
    (at_ms, start): (u64, Instant),
) -> bool {
    let Some(settings) = settings_of(n, target) else {
        return false;
    };
    let cfg = &shared.config;
    let (rule, addrs) = match decide(&cfg.allow, &cfg.resolver, LOCALHOST, target.port) {
        Verdict::Allow { rule, addrs } => (rule, candidates(target.family, &addrs)),
        // The forwarder records the refusal.
        Verdict::Refuse { .. } => return false,
    };
    let event = |address: Option<SocketAddr>, (up, down): (u64, u64), message: Option<String>| {
        shared.record(NetEvent {
            at_ms,
            decision: NetDecision::Allowed,
            protocol: NetProtocol::Forward,
            host: LOCALHOST.into(),
            port: target.port,
            rule: rule.clone(),
            address: address.map(|a| a.to_string()),
            bytes_up: up,
            bytes_down: down,
            duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            message,
        });
    };
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
    let mut connected = None;
    for addr in &addrs {
        if shared.stopping.load(Ordering::SeqCst) {
            return false;
        }
        match TcpStream::connect_timeout(addr, cfg.connect_timeout) {
            Ok(s) => {
                connected = Some((s, *addr));
                break;
            }
            Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
        }
    }
    let Some((upstream, address)) = connected else {
        let errno = last.raw_os_error().unwrap_or(ECONNREFUSED);
        let _ = notify::respond(listener.as_fd(), n.id, Err(errno));
        event(None, (0, 0), Some(format!("cannot connect: {last}")));
        release(shared);
        return true;
    };
    let registered = match (
        watch(),
        sockopt::socket_cookie(upstream.as_fd()),
        upstream.local_addr(),
    ) {
        (Some(w), Ok(cookie), Ok(local)) => {
            w.register(
                cookie,
                Pending {
                    shared: Arc::clone(shared),
                    at_ms,
                    start,
                    port: target.port,
                    rule: rule.clone(),
                    address,
                    local,
                    peer_sent: None,
                },
            );
            Some((w, cookie))
        }
        _ => None,
    };
    let Some((w, cookie)) = registered else {
        return false;
    };
    if let Err(e) = apply(&settings, &upstream) {
        tracing::debug!(error = %e, "egress proxy: cannot copy a socket's settings");
    }
    let installed = notify::install_fd_at(
        listener.as_fd(),
        n.id,
        upstream.as_fd(),
        target.fd,
        settings.cloexec,
    );
    if let Err(e) = installed {
        w.forget(cookie);
        drop(upstream);
        event(
            Some(address),
            (0, 0),
            Some(format!(
                "the connection was not given to the sandbox (its connect ended first: {e})"
            )),
        );
        return false;
    }
    let _ = notify::respond(listener.as_fd(), n.id, Ok(0));
    tracing::debug!(
        fd = upstream.as_raw_fd(),
        port = target.port,
        "egress proxy: direct"
    );
    true
}

/// Counts a direct connection against the proxy's limit; `false` when the
/// limit is reached or the proxy is closing.
fn reserve(shared: &Shared) -> bool {
    let mut conns = lock(&shared.conns);
    if conns.closed || conns.direct >= shared.config.max_connections {
        return false;
    }
    conns.direct += 1;
    true
}

fn release(shared: &Shared) {
    let mut conns = lock(&shared.conns);
    conns.direct = conns.direct.saturating_sub(1);
    if conns.direct == 0 && conns.live.is_empty() {
        shared.idle.notify_all();
    }
}

/// A direct connection whose socket the kernel has not freed yet.
struct Pending {
    shared: Arc<Shared>,
    at_ms: u64,
    start: Instant,
    port: u16,
    rule: String,
    /// The service's address.
    address: SocketAddr,
    /// The sandbox's socket's own address (on the host's loopback).
    local: SocketAddr,
    /// What the service's socket sent, if the kernel freed it first.
    peer_sent: Option<u64>,
}

#[derive(Default)]
struct Table {
    by_cookie: HashMap<u64, Pending>,
    /// The service's socket (its own address, its peer's) → the cookie.
    by_peer: HashMap<(SocketAddr, SocketAddr), u64>,
}

/// The process's one subscription to destroy notices, and the direct
/// connections waiting for theirs.
struct Watch {
    table: Mutex<Table>,
}

/// The watch, started on first use; `None` where this kernel gives no
/// destroy notices (then nothing takes the direct path).
fn watch() -> Option<&'static Watch> {
    static WATCH: OnceLock<Option<&'static Watch>> = OnceLock::new();
    *WATCH.get_or_init(|| {
        let subscription = match DestroyWatch::subscribe() {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(error = %e, "egress proxy: no socket destroy notices; forwarded ports are relayed");
                return None;
            }
        };
        let watch: &'static Watch = Box::leak(Box::new(Watch {
            table: Mutex::new(Table::default()),
        }));
        let spawned = thread::Builder::new()
            .name("hako-net-destroyed".into())
            .spawn(move || watch.run(&subscription));
        spawned.ok().map(|_| watch)
    })
}

impl Watch {
    fn register(&self, cookie: u64, p: Pending) {
        let mut t = lock(&self.table);
        t.by_peer.insert((p.address, p.local), cookie);
        t.by_cookie.insert(cookie, p);
    }

    fn forget(&self, cookie: u64) -> Option<Pending> {
        let mut t = lock(&self.table);
        let p = t.by_cookie.remove(&cookie)?;
        t.by_peer.remove(&(p.address, p.local));
        Some(p)
    }

    fn run(&self, subscription: &DestroyWatch) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut batch = Vec::new();
        loop {
            batch.clear();
            match subscription.next(&mut buf, &mut batch) {
                Ok(()) => self.take(&batch),
                Err(e) if e.raw_os_error() == Some(105) => self.recover(subscription, &mut buf),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "egress proxy: cannot read socket destroy notices");
                    thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }

    /// Records every connection of `batch` that ended.
    fn take(&self, batch: &[Destroyed]) {
        let mut ended = Vec::new();
        {
            let mut t = lock(&self.table);
            for d in batch {
                if let Some(p) = t.by_cookie.remove(&d.cookie) {
                    t.by_peer.remove(&(p.address, p.local));
                    ended.push((p, Some(*d)));
                } else if let Some(cookie) = t.by_peer.get(&(d.local, d.remote)).copied() {
                    if let Some(p) = t.by_cookie.get_mut(&cookie) {
                        p.peer_sent = d.counters.map(|c| c.bytes_sent);
                    }
                }
            }
        }
        for (p, d) in ended {
            let counters = d.and_then(|d| d.counters);
            let message = counters
                .is_none()
                .then(|| "the kernel's notice had no byte counts".to_string());
            finish(
                p,
                counters.map(|c| (c.bytes_sent, c.bytes_received)),
                message,
            );
        }
    }

    /// After notices were lost: those connections whose socket was already
    /// gone before the queue was drained, and whose notice the queue did
    /// not hold, are recorded without byte counts.
    fn recover(&self, subscription: &DestroyWatch, buf: &mut [u8]) {
        let gone: Vec<u64> = lock(&self.table)
            .by_cookie
            .iter()
            .filter(|(_, p)| !sockdiag::still_open(p.local, p.address))
            .map(|(c, _)| *c)
            .collect();
        let mut batch = Vec::new();
        while let Ok(true) = subscription.try_next(buf, &mut batch) {
            self.take(&batch);
            batch.clear();
        }
        for cookie in gone {
            if let Some(p) = self.forget(cookie) {
                let message = "the kernel's notices of closed sockets overflowed: this connection's byte counts were lost";
                finish(p, None, Some(message.into()));
            }
        }
    }
}

/// Records a direct connection that ended and frees its place.
fn finish(p: Pending, counters: Option<(u64, u64)>, message: Option<String>) {
    let (up, received) = counters.unwrap_or((0, 0));
    let down = p.peer_sent.unwrap_or(received);
    p.shared.record(NetEvent {
        at_ms: p.at_ms,
        decision: NetDecision::Allowed,
        protocol: NetProtocol::Forward,
        host: LOCALHOST.into(),
        port: p.port,
        rule: p.rule,
        address: Some(p.address.to_string()),
        bytes_up: up,
        bytes_down: down,
        duration_ms: u64::try_from(p.start.elapsed().as_millis()).unwrap_or(u64::MAX),
        message,
    });
    release(&p.shared);
}

/// At shutdown, once the wait is over: the direct connections of `shared`
/// whose socket is still open are recorded as they stand, without byte
/// counts.
pub(crate) fn abandon(shared: &Arc<Shared>) {
    let Some(w) = watch() else { return };
    let cookies: Vec<u64> = lock(&w.table)
        .by_cookie
        .iter()
        .filter(|(_, p)| Arc::ptr_eq(&p.shared, shared))
        .map(|(c, _)| *c)
        .collect();
    for cookie in cookies {
        if let Some(p) = w.forget(cookie) {
            let message = "still open when the sandbox closed: its byte counts are not known";
            finish(p, None, Some(message.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn sockaddr_in(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&AddressFamily::INET.as_raw().to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&ip);
        b
    }

    fn sockaddr_in6(ip: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 28];
        b[..2].copy_from_slice(&AddressFamily::INET6.as_raw().to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[8..24].copy_from_slice(&ip.octets());
        b
    }

    #[test]
    fn only_loopback_on_a_forwarded_port_is_a_candidate() {
        let ports = [11434, 8080];
        let v4 = |ip, port| parse_sockaddr(&sockaddr_in(ip, port), &ports);
        assert_eq!(
            v4([127, 0, 0, 1], 11434),
            Some((AddressFamily::INET, 11434))
        );
        assert_eq!(v4([127, 0, 0, 1], 22), None);
        assert_eq!(v4([127, 0, 0, 2], 11434), None);
        assert_eq!(v4([10, 0, 0, 1], 8080), None);
        let v6 = |ip, port| parse_sockaddr(&sockaddr_in6(ip, port), &ports);
        assert_eq!(
            v6(Ipv6Addr::LOCALHOST, 8080),
            Some((AddressFamily::INET6, 8080))
        );
        assert_eq!(
            v6(Ipv4Addr::LOCALHOST.to_ipv6_mapped(), 8080),
            Some((AddressFamily::INET6, 8080))
        );
        assert_eq!(v6(Ipv6Addr::UNSPECIFIED, 8080), None);
        // Truncated, or another family (a unix socket's path).
        assert_eq!(
            parse_sockaddr(&sockaddr_in([127, 0, 0, 1], 8080)[..6], &ports),
            None
        );
        assert_eq!(
            parse_sockaddr(&sockaddr_in6(Ipv6Addr::LOCALHOST, 8080)[..20], &ports),
            None
        );
        let mut unix = sockaddr_in([127, 0, 0, 1], 8080);
        unix[..2].copy_from_slice(&AddressFamily::UNIX.as_raw().to_ne_bytes());
        assert_eq!(parse_sockaddr(&unix, &ports), None);
    }

    #[test]
    fn an_ipv6_caller_reaches_ipv4_addresses_mapped_and_an_ipv4_one_only_ipv4() {
        let addrs: Vec<SocketAddr> =
            vec!["127.0.0.1:80".parse().unwrap(), "[::1]:80".parse().unwrap()];
        assert_eq!(candidates(AddressFamily::INET, &addrs), [addrs[0]]);
        assert_eq!(
            candidates(AddressFamily::INET6, &addrs),
            [
                "[::ffff:127.0.0.1]:80".parse::<SocketAddr>().unwrap(),
                addrs[1]
            ]
        );
    }
}
