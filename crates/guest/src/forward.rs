//! The sandbox's end of the egress proxy (network mode `allow`).
//!
//! The sandbox has no route out. The guest binds the loopback ports of the
//! [`NetSpec`] (so a port that cannot be bound fails the sandbox with the
//! reason), then forks a **forwarder** that relays every connection to the
//! proxy's unix socket, which hako serves outside the boundary and whose
//! directory is bound into the view. On the proxy's own port the bytes go
//! as they come (the proxy reads HTTP or SOCKS5 from them); on a forwarded
//! host port the forwarder first tells the proxy which port it is for, and
//! the proxy's policy and its record treat it as `localhost:PORT`.
//!
//! Where it can, the forwarder hands the accepted connection itself to the
//! proxy (its descriptor, over the proxy's socket) instead of relaying its
//! bytes: the proxy then serves the sandbox's socket directly, and the
//! path has one relay, not two.
//!
//! The forwarder is a fork of the guest that never forks again, so it may
//! use threads (one per connection and direction). It keeps nothing of the
//! guest's but its listeners, holds no capability, cannot gain any
//! (`no_new_privs`), cannot be traced or read through `/proc` (not
//! dumpable), and dies with the guest.
//!
//! Killed (a command of the sandbox can: it runs as the sandbox's user),
//! it is not started again: its listeners die with it, so a later
//! connection to the proxy's ports is refused at once (never left waiting
//! in a backlog nobody accepts), a connection already handed to the proxy
//! goes on, and one being relayed is cut; the sandbox's commands go on.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use hako_sys::ns::{self, Forked, SingleThreaded};
use hako_sys::rustix::process::Pid;

use crate::error::failed;
use crate::proto::NetSpec;
use crate::{GuestError, GuestExit};

/// A bound listener and what its connections are relayed to.
struct Bound {
    listener: TcpListener,
    forward: Option<u16>,
}

/// Binds the spec's ports on loopback and forks the forwarder. Returns
/// its pid (the caller reaps it, and must not count it among the
/// commands' orphans).
pub(crate) fn start(spec: &NetSpec, proof: &SingleThreaded) -> Result<Pid, GuestError> {
    let mut bound = Vec::new();
    for l in &spec.listeners {
        let v4 = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, l.port))).map_err(
            |source| GuestError::Listen {
                port: l.port,
                source,
            },
        )?;
        bound.push(Bound {
            listener: v4,
            forward: l.forward,
        });
        // Where the sandbox has IPv6 loopback, clients that try ::1 first
        // for `localhost` find the port there too.
        if let Ok(v6) = TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, l.port))) {
            bound.push(Bound {
                listener: v6,
                forward: l.forward,
            });
        }
    }
    match ns::fork_single_threaded(proof) {
        Err(e) => Err(failed("start the network forwarder")(e)),
        Ok(Forked::Parent(pid)) => Pid::from_raw(pid).ok_or(GuestError::ZeroPid),
        Ok(Forked::Child) => {
            let code = match become_forwarder(bound) {
                Ok(bound) => serve(bound, &spec.socket),
                Err(_) => GuestExit::Failed,
            };
            hako_sys::spawn::exit_now(code.into())
        }
    }
}

/// In the forked child: keep only the listeners (at 3, 4, ...), drop every
/// privilege, and die with the guest.
fn become_forwarder(bound: Vec<Bound>) -> std::io::Result<Vec<Bound>> {
    ns::die_with_parent()?;
    ns::set_not_dumpable()?;
    let null = hako_sys::rustix::fs::open(
        "/dev/null",
        hako_sys::rustix::fs::OFlags::RDWR | hako_sys::rustix::fs::OFlags::CLOEXEC,
        hako_sys::rustix::fs::Mode::empty(),
    )?;
    let forwards: Vec<Option<u16>> = bound.iter().map(|b| b.forward).collect();
    {
        let mut fds = vec![null.as_fd(), null.as_fd(), null.as_fd()];
        fds.extend(bound.iter().map(|b| b.listener.as_fd()));
        hako_sys::spawn::install_fds_close_rest(&fds)?;
    }
    // Their numbers were closed or reused by the step above.
    std::mem::forget(null);
    std::mem::forget(bound);
    hako_sys::confine::set_no_new_privs().map_err(std::io::Error::other)?;
    hako_sys::confine::drop_all_capabilities().map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(forwards.len());
    for (i, forward) in forwards.into_iter().enumerate() {
        let fd: OwnedFd = hako_sys::take_inherited_fd(3 + i as i32)?;
        let listener = TcpListener::from(fd);
        listener.set_nonblocking(false)?;
        out.push(Bound { listener, forward });
    }
    Ok(out)
}

/// Accepts on every listener until the process is killed.
fn serve(bound: Vec<Bound>, socket: &Path) -> GuestExit {
    let mut threads = Vec::new();
    for b in bound {
        let socket = socket.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("hako-forward-accept".into())
            .spawn(move || accept_loop(b, socket));
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => return GuestExit::Failed,
        }
    }
    for t in threads {
        let _ = t.join();
    }
    GuestExit::Success
}

fn accept_loop(bound: Bound, socket: PathBuf) {
    loop {
        let client = match bound.listener.accept() {
            Ok((client, _)) => client,
            // Out of descriptors or memory for a moment: do not spin.
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let socket = socket.clone();
        let forward = bound.forward;
        let _ = std::thread::Builder::new()
            .name("hako-forward".into())
            .spawn(move || relay_one(client, &socket, forward));
    }
}

/// Whether the proxy can be handed connections (not where the sandbox's
/// sockets live in another kernel, gVisor's): learnt at the first try.
static HANDOVER: AtomicBool = AtomicBool::new(true);

/// Hands one connection to the proxy (see [`hako_relay::handover`]), or, where
/// that cannot be done, relays it to the proxy (after asking it for the
/// forwarded port, if this is one). A refusal closes the client's
/// connection.
fn relay_one(client: TcpStream, socket: &Path, forward: Option<u16>) {
    if HANDOVER.load(Ordering::Relaxed) {
        let Ok(proxy) = UnixStream::connect(socket) else {
            return;
        };
        match hako_relay::hand_over(&proxy, client.as_fd(), forward) {
            // The proxy serves it now; this copy closes.
            Ok(true) | Err(_) => return,
            Ok(false) => HANDOVER.store(false, Ordering::Relaxed),
        }
    }
    let Ok(proxy) = UnixStream::connect(socket) else {
        return;
    };
    if let Some(port) = forward {
        if !matches!(hako_relay::announce_forward(&proxy, port), Ok(true)) {
            return;
        }
    }
    let _ = client.set_nodelay(true);
    hako_relay::relay(client, proxy);
}
