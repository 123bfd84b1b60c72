//! The proxy: one unix socket, a thread per connection, a bounded record of
//! every decision.
//!
//! - `config`: how it runs, and the environment pointing clients at it;
//! - `shared`: what its threads share, and each connection's place in the
//!   connection budget;
//! - `accept`: accepting, admitting, telling protocols apart;
//! - `client`: reading the client with handshake deadlines;
//! - `connect`: HTTP requests, `CONNECT` tunnels, the proxy's own answers;
//! - `plain`: plain HTTP forwarding;
//! - `socks5`: SOCKS5;
//! - `port`: forwarded host ports;
//! - `upstream`: connecting to checked addresses, relaying tunnels;
//! - `record`: the decision log.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hako_core::NetEvent;

use crate::budget::Reclaim;
use crate::live::{watch_idle, Conns};

mod accept;
mod client;
mod config;
mod connect;
mod plain;
mod port;
mod record;
mod shared;
mod socks5;
mod upstream;

pub use config::{proxy_env, ProxyConfig};

use accept::accept_loop;
use record::Events;
use shared::Shared;

/// The name of the proxy's socket in its directory.
pub const SOCKET_NAME: &str = "proxy.sock";

/// Rule: the request was malformed or is not something a proxy serves.
pub const RULE_BAD_REQUEST: &str = "bad-request";
/// Rule: the client did not finish its request in time.
pub const RULE_HANDSHAKE_TIMEOUT: &str = "handshake-timeout";
/// Rule: an HTTP request's `Host` header names another host than its URL.
pub const RULE_HOST_HEADER_MISMATCH: &str = "host-header-mismatch";
/// Rule: a SOCKS4 client (only SOCKS5 is served).
pub const RULE_SOCKS4: &str = "socks4-unsupported";
/// Rule: a SOCKS5 client that does not offer "no authentication".
pub const RULE_SOCKS_METHOD: &str = "socks-no-acceptable-method";
/// Rule: a SOCKS5 command or address type other than `CONNECT` to an
/// IPv4 address, IPv6 address or name.
pub const RULE_SOCKS_REQUEST: &str = "socks-unsupported-request";

/// The longest [`Proxy::shutdown`] waits for connection threads to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// The most allowlist entries a refusal message lists.
const SUMMARY_ENTRIES: usize = 20;

/// Locks `m`, taking its value even from a thread that panicked holding
/// it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The egress proxy. Listens on `socket_dir()/SOCKET_NAME` from
/// [`Proxy::start`] until [`Proxy::shutdown`] (or drop).
pub struct Proxy {
    shared: Arc<Shared>,
    dir: Mutex<Option<tempfile::TempDir>>,
    dir_path: PathBuf,
    /// The socket, until [`Proxy::serve`] hands it to the accept thread.
    listener: Mutex<Option<UnixListener>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    /// The idle watch's thread (see [`ProxyConfig::idle_timeout`]).
    watch: Mutex<Option<JoinHandle<()>>>,
    shut: Mutex<bool>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("dir", &self.dir_path)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Makes a fresh private directory (mode 0700) holding the socket
    /// [`SOCKET_NAME`], starts accepting on a thread of its own, and returns.
    pub fn start(config: ProxyConfig) -> io::Result<Proxy> {
        let proxy = Proxy::bind(config)?;
        proxy.serve()?;
        Ok(proxy)
    }

    /// [`Proxy::start`] without the accept thread: the socket exists and
    /// connections wait in its backlog until [`Proxy::serve`]. For a
    /// caller that must stay single-threaded a little longer (one that
    /// forks the sandbox's guest from itself).
    pub fn bind(config: ProxyConfig) -> io::Result<Proxy> {
        // Named after this process, so that what a killed hako leaves is
        // found and removed (see `remove_stale_dirs`).
        let prefix = crate::stale::own_prefix();
        let mut builder = tempfile::Builder::new();
        builder
            .prefix(&prefix)
            .permissions(std::fs::Permissions::from_mode(0o700));
        let dir = match &config.dir_parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }?;
        let dir_path = dir.path().to_path_buf();
        let path = dir_path.join(SOCKET_NAME);
        let listener = UnixListener::bind(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {}: {e}", path.display()),
            )
        })?;
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            let holder: Weak<dyn Reclaim> = me.clone();
            let seat = config.budget.join(config.max_connections, holder);
            Shared {
                config,
                seat,
                events: Mutex::new(Events::default()),
                conns: Mutex::new(Conns::default()),
                drained: Condvar::new(),
                tick: Condvar::new(),
                stopping: AtomicBool::new(false),
                refusing: AtomicUsize::new(0),
            }
        });
        Ok(Proxy {
            shared,
            dir: Mutex::new(Some(dir)),
            dir_path,
            listener: Mutex::new(Some(listener)),
            accept: Mutex::new(None),
            watch: Mutex::new(None),
            shut: Mutex::new(false),
        })
    }

    /// Starts accepting, and watching for idle connections (once; later
    /// calls do nothing).
    pub fn serve(&self) -> io::Result<()> {
        let mut listener = lock(&self.listener);
        if listener.is_none() {
            return Ok(());
        }
        if let Some(idle) = self.shared.config.idle_timeout {
            let for_thread = Arc::clone(&self.shared);
            let watch = thread::Builder::new()
                .name("hako-net-idle".into())
                .spawn(move || watch_idle(&for_thread.conns, &for_thread.tick, idle))?;
            *lock(&self.watch) = Some(watch);
        }
        let Some(listener) = listener.take() else {
            return Ok(());
        };
        let for_thread = Arc::clone(&self.shared);
        let accept = thread::Builder::new()
            .name("hako-net-accept".into())
            .spawn(move || accept_loop(&listener, &for_thread))?;
        *lock(&self.accept) = Some(accept);
        Ok(())
    }

    /// The proxy's private directory (to bind-mount into the sandbox).
    pub fn socket_dir(&self) -> &Path {
        &self.dir_path
    }

    /// The socket's path.
    pub fn socket_path(&self) -> PathBuf {
        self.dir_path.join(SOCKET_NAME)
    }

    /// The events recorded since the last call, oldest first, and how many
    /// were dropped since then because the queue was full.
    pub fn take_events(&self) -> (Vec<NetEvent>, u64) {
        let mut events = lock(&self.shared.events);
        let taken: Vec<NetEvent> = events.queue.drain(..).collect();
        let dropped = std::mem::take(&mut events.dropped);
        (taken, dropped)
    }

    /// How many connections are being served.
    pub fn live_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Stops accepting, shuts down every live connection (both ends), waits
    /// a little for their threads to record their events, and removes the
    /// directory. Idempotent; drop calls it.
    pub fn shutdown(&self) {
        let mut shut = lock(&self.shut);
        if *shut {
            return;
        }
        *shut = true;
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Never served: nothing accepts; the backlog goes with the socket.
        // Closed before the wake-up below, which would otherwise wait
        // forever for room in a backlog the sandbox filled.
        lock(&self.listener).take();
        // Wake the accept thread: it sees `stopping` on its next connection.
        let woke = UnixStream::connect(self.socket_path()).is_ok();
        if let Some(handle) = lock(&self.accept).take() {
            if woke {
                let _ = handle.join();
            } else {
                tracing::warn!("egress proxy: cannot wake the accept thread; leaving it");
            }
        }
        {
            let mut conns = lock(&self.shared.conns);
            conns.closed = true;
            self.shared.tick.notify_all();
            conns.shut_all();
            let deadline = Instant::now() + SHUTDOWN_WAIT;
            while !conns.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    tracing::warn!(
                        live = conns.len(),
                        "egress proxy: connection threads still running after shutdown"
                    );
                    break;
                }
                conns = match self.shared.drained.wait_timeout(conns, left) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        }
        if let Some(watch) = lock(&self.watch).take() {
            let _ = watch.join();
        }
        // The other proxies' shares grow now; connections still ending
        // give their places back as they end.
        self.shared.seat.leave();
        if let Some(dir) = lock(&self.dir).take() {
            if let Err(e) = dir.close() {
                tracing::warn!(error = %e, "egress proxy: cannot remove its directory");
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}
