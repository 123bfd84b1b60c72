//! Copying bytes both ways between two connected sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// Called each time a relay direction reads or writes something (the
/// proxy's idle timeout watches it).
pub type Progress = Arc<dyn Fn() + Send + Sync>;

/// The bytes a relay direction reads per call to start with (and the
/// proxy's other copies, always): enough for any interactive exchange in
/// one call; a bulk stream grows its buffer (see [`RELAY_BUF_MAX`]).
pub const RELAY_BUF: usize = 256 * 1024;

/// A connected stream socket the relay can copy to and from.
pub trait RelaySocket: Read + Write + Send + Sized + 'static {
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
    relay_watched(a, b, None)
}

/// [`relay`], calling `progress` each time either direction reads or
/// writes something (the proxy's idle timeout).
pub fn relay_watched<A: RelaySocket, B: RelaySocket>(
    a: A,
    b: B,
    progress: Option<Progress>,
) -> (u64, u64) {
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
    let for_thread = progress.clone();
    let up = thread::Builder::new()
        .name("hako-net-relay".into())
        .spawn(move || {
            let (mut a2, mut b2) = (a2, b2);
            pump(&mut a2, &mut b2, for_thread.as_deref())
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
    let down = pump(&mut b, &mut a, progress.as_deref());
    let up = up.join().unwrap_or(0);
    (up, down)
}

fn shut_both<A: RelaySocket, B: RelaySocket>(a: &A, b: &B) {
    let _ = a.shutdown_socket(Shutdown::Both);
    let _ = b.shutdown_socket(Shutdown::Both);
}

/// The most one relay direction reads per call once its stream has shown
/// itself to be bulk (see `Buffer`). Measured on two cores with `hako
/// bench` (100 MiB from a host service to `cat` in a `linux` sandbox
/// through a forwarded port, against the same over direct loopback):
/// splice(2) through a 1 MiB pipe, which this relay used before, 0.57 to
/// 0.61; a copy through at most 1 MiB about 0.70, 2 MiB 0.77 to 0.84,
/// 4 MiB 0.74 to 0.82. Fewer, larger calls mean fewer wake-ups of the
/// relay, which is what a relayed byte costs where busy processes
/// outnumber cores; a spliced write also hands the receiver the sender's
/// page fragments, where a copy gives it whole segments.
pub const RELAY_BUF_MAX: usize = 2 << 20;

/// Bytes of buffers grown past [`RELAY_BUF`] that every relay of this
/// process may hold at once: the bound on the relay's memory however many
/// connections stream at the same time (a relay that finds the budget
/// spent keeps reading [`RELAY_BUF`] at a time).
const GROWN_BUDGET: usize = 64 << 20;

/// Bytes of [`GROWN_BUDGET`] in use.
static GROWN: AtomicUsize = AtomicUsize::new(0);

/// One direction's buffer: [`RELAY_BUF`] to start with, doubled (up to
/// [`RELAY_BUF_MAX`]) each time a read fills it, as long as the process's
/// budget allows; what it took from the budget is given back on drop.
struct Buffer {
    bytes: Vec<u8>,
    reserved: usize,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer {
            bytes: vec![0u8; RELAY_BUF],
            reserved: 0,
        }
    }

    /// After a read of `n` bytes: a full buffer means more was waiting.
    fn grow_after(&mut self, n: usize) {
        let len = self.bytes.len();
        if n < len || len >= RELAY_BUF_MAX {
            return;
        }
        // Doubling takes `len` more bytes from the budget.
        let reserved = GROWN
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + len <= GROWN_BUDGET).then_some(used + len)
            })
            .is_ok();
        if reserved {
            self.reserved += len;
            self.bytes.resize(2 * len, 0);
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        GROWN.fetch_sub(self.reserved, Ordering::AcqRel);
    }
}

/// Copies `src` to `dst` until end of stream (then half-closes `dst`) or an
/// error (then shuts both down), calling `progress` on each read and each
/// write, partial ones included (a slow reader still moves bytes). Returns
/// the bytes written to `dst`.
fn pump<R: RelaySocket, W: RelaySocket>(
    src: &mut R,
    dst: &mut W,
    progress: Option<&(dyn Fn() + Send + Sync)>,
) -> u64 {
    let mut buf = Buffer::new();
    let mut total: u64 = 0;
    loop {
        let n = match src.read(&mut buf.bytes) {
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
        touch(progress);
        let mut written = 0;
        while written < n {
            match dst.write(&buf.bytes[written..n]) {
                Ok(0) => {
                    shut_both(src, dst);
                    return total;
                }
                Ok(k) => {
                    written += k;
                    total += k as u64;
                    touch(progress);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    shut_both(src, dst);
                    return total;
                }
            }
        }
        buf.grow_after(n);
    }
}

fn touch(progress: Option<&(dyn Fn() + Send + Sync)>) {
    if let Some(progress) = progress {
        progress();
    }
}

/// Makes a TCP socket of a loopback hop use Reno, which never paces.
///
/// The machine's default congestion control may pace every segment (BBR
/// does, from its estimate of the path's bandwidth), which on loopback is
/// all cost and no gain: on a two-core machine whose default is BBR, a
/// relay whose sandbox side paced moved 100 MiB at 0.67 to 0.86 of direct
/// loopback, and at 0.75 to 1.05 without. Reno is in every kernel and, by
/// default, allowed to unprivileged processes (see
/// `tcp_allowed_congestion_control`). Used for the sandbox's side of a
/// relayed connection (always a loopback hop, in the sandbox's own
/// namespace) and for an upstream on the host's loopback; an upstream
/// elsewhere keeps the machine's choice. A failure changes nothing else.
pub fn unpaced(socket: std::os::fd::BorrowedFd<'_>) {
    if let Err(e) = rustix::net::sockopt::set_tcp_congestion(socket, "reno") {
        tracing::debug!(error = %e, "relay: cannot set a loopback socket's congestion control");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The two budget tests must not run at once: one spends it all.
    static BUDGET: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_bulk_stream_grows_its_buffer_to_the_cap_and_a_trickle_does_not() {
        let _one = BUDGET.lock().unwrap_or_else(|e| e.into_inner());
        let mut bulk = Buffer::new();
        let mut trickle = Buffer::new();
        for _ in 0..20 {
            let full = bulk.bytes.len();
            bulk.grow_after(full);
            trickle.grow_after(100);
        }
        assert_eq!(trickle.bytes.len(), RELAY_BUF);
        // Other tests' relays may hold part of the budget; this one alone
        // needs far less than all of it.
        assert_eq!(bulk.bytes.len(), RELAY_BUF_MAX);
        assert_eq!(bulk.reserved, RELAY_BUF_MAX - RELAY_BUF);
    }

    #[test]
    fn grown_buffers_never_hold_more_than_the_process_budget() {
        let _one = BUDGET.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = Vec::new();
        // More buffers than the budget can grow: the last ones stay small.
        for _ in 0..(GROWN_BUDGET / (RELAY_BUF_MAX - RELAY_BUF) + 4) {
            let mut b = Buffer::new();
            while b.bytes.len() < RELAY_BUF_MAX {
                let before = b.bytes.len();
                b.grow_after(before);
                if b.bytes.len() == before {
                    break;
                }
            }
            held.push(b);
        }
        let reserved: usize = held.iter().map(|b| b.reserved).sum();
        assert!(reserved <= GROWN_BUDGET, "{reserved}");
        assert!(
            held.iter().any(|b| b.bytes.len() < RELAY_BUF_MAX),
            "some buffer was refused growth"
        );
        assert!(GROWN.load(Ordering::Acquire) <= GROWN_BUDGET);
        drop(held);
        // What these held is given back (other tests' relays may still
        // hold a little).
        assert!(GROWN.load(Ordering::Acquire) < GROWN_BUDGET / 2);
    }

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
