//! What a proxy's threads share: its configuration, its seat in the
//! connection budget, the event queue and the live connections; how a
//! connection takes its place in the budget and gives it back.

use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};

use super::config::ProxyConfig;
use super::lock;
use super::record::Events;
use crate::budget::{Limit, Reclaim, Seat};
use crate::live::{Conns, Progress};
use crate::relay::Sock;

/// The state a proxy's accept, connection and idle-watch threads share.
pub(super) struct Shared {
    pub(super) config: ProxyConfig,
    /// This proxy's place in `config.budget`.
    pub(super) seat: Seat,
    pub(super) events: Mutex<Events>,
    pub(super) conns: Mutex<Conns>,
    /// Notified when the last live connection ends.
    pub(super) drained: Condvar,
    /// Wakes the idle watch (when the proxy closes).
    pub(super) tick: Condvar,
    /// Set by [`Proxy::shutdown`](super::Proxy::shutdown): accept no more.
    pub(super) stopping: AtomicBool,
    /// Over-the-limit connections being answered now (at most
    /// `MAX_REFUSING`).
    pub(super) refusing: AtomicUsize,
}

impl Reclaim for Shared {
    fn reclaim_one(&self, why: &str) -> bool {
        let mut conns = lock(&self.conns);
        !conns.closed && conns.reclaim_one(why)
    }
}

impl Shared {
    /// A live connection's client is now the sandbox's own socket (a
    /// handover): keep a handle on it so that shutdown can end it.
    pub(super) fn replace_client(&self, id: Option<u64>, client: &Sock) {
        let mut conns = lock(&self.conns);
        if conns.closed {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        if let Some(live) = conns.get_mut(id) {
            if let Ok(clone) = client.try_clone() {
                live.client = clone;
            }
        }
    }

    /// Adds the upstream end to a live connection, which relays from now
    /// on (the idle timeout applies); false if the proxy is shutting down
    /// (the upstream is then shut down here).
    pub(super) fn register_upstream(&self, id: Option<u64>, upstream: &TcpStream) -> bool {
        let mut conns = lock(&self.conns);
        if conns.closed {
            let _ = upstream.shutdown(Shutdown::Both);
            return false;
        }
        if let Some(live) = conns.get_mut(id) {
            let clone = upstream
                .try_clone()
                .inspect_err(
                    |e| tracing::warn!(error = %e, "cannot keep a handle on an upstream socket"),
                )
                .ok();
            live.start_relaying(clone);
        }
        true
    }

    /// Why connection `id` was ended from outside (idle, reclaimed).
    pub(super) fn cut_message(&self, id: Option<u64>) -> Option<String> {
        lock(&self.conns).cut_message(id)
    }
}

/// Removes a connection from the live set when its thread ends, and gives
/// its place in the budget back (unless a reclaim already did).
pub(super) struct ConnGuard {
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let give_back = {
            let mut conns = lock(&self.shared.conns);
            let give_back = conns.remove(self.id);
            if conns.is_empty() {
                self.shared.drained.notify_all();
            }
            give_back
        };
        // Not under the connections' lock: the budget's is taken first
        // where both are (a reclaim).
        if give_back {
            self.shared.seat.release();
        }
    }
}

/// Takes a connection from the budget and into the live set; the limit
/// that refused it; `Ok(None)` if the proxy is closing (or the socket
/// cannot be kept): it is then dropped.
pub(super) fn register(
    shared: &Shared,
    stream: &UnixStream,
    progress: &Progress,
) -> Result<Option<u64>, Limit> {
    if lock(&shared.conns).closed {
        return Ok(None);
    }
    // Before the connections' lock: a reclaim takes another proxy's.
    shared.seat.admit()?;
    let mut conns = lock(&shared.conns);
    let client = match stream.try_clone() {
        Ok(client) if !conns.closed => Some(client),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "egress proxy: cannot clone a client socket");
            None
        }
    };
    match client {
        Some(client) => Ok(Some(conns.insert(Sock::Unix(client), Arc::clone(progress)))),
        None => {
            drop(conns);
            shared.seat.release();
            Ok(None)
        }
    }
}
