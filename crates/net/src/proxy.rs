//! The proxy: one unix socket, a thread per connection, a bounded record of
//! every decision.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hako_core::{NetDecision, NetEvent, NetProtocol, NetworkPolicy};

use crate::allow::{printable, AllowError, Allowlist};
use crate::budget::{
    ConnectionBudget, Limit, Reclaim, Seat, RULE_PROCESS_CONNECTIONS, RULE_TOO_MANY_CONNECTIONS,
};
use crate::decide::{decide, Verdict, RULE_NAME_NOT_RESOLVED};
use crate::handoff::{self, First};
use crate::http::{self, BodyError, HeadError, Target};
use crate::live::{progress, touch, watch_idle, Conns, Progress};
use crate::relay::{relay_watched, Sock, RELAY_BUF};
use crate::resolve::Resolver;
use crate::socks::{self, ServerRequest};

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

/// At most this many over-the-limit connections are answered at once (each
/// on a short-lived thread); more are closed without an answer.
const MAX_REFUSING: usize = 16;
/// The longest an over-the-limit connection is waited for.
const REFUSE_DEADLINE: Duration = Duration::from_secs(2);
/// The longest [`Proxy::shutdown`] waits for connection threads to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// The client reader's buffer: holds a whole request head in most cases.
const CLIENT_BUF: usize = 64 * 1024;
/// The most allowlist entries a refusal message lists.
const SUMMARY_ENTRIES: usize = 20;
/// [`ProxyConfig::idle_timeout`]'s default.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How the proxy runs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// What may be reached.
    pub allow: Allowlist,
    /// How names are resolved.
    pub resolver: Resolver,
    /// The most events kept between two [`Proxy::take_events`]; the oldest
    /// are dropped (and counted) beyond it. Default 4096.
    pub max_events: usize,
    /// The most live connections; more are refused at once with
    /// `too-many-connections`. Default 256. The proxy's share of `budget`
    /// may be smaller.
    pub max_connections: usize,
    /// The connections this proxy shares with others, evenly among those
    /// alive: each may hold at most `budget / proxies` (and
    /// `max_connections`). Default [`ConnectionBudget::process`], shared by
    /// every proxy of this process.
    pub budget: ConnectionBudget,
    /// How long a relayed connection (a tunnel, a forwarded port, a
    /// forwarded request once sent) may move no bytes either way before the
    /// proxy closes it and records why; `None`: never. Default 10 minutes:
    /// longer than a local model server may think before it answers a
    /// request it does not stream.
    pub idle_timeout: Option<Duration>,
    /// How long a client has to send its whole request (HTTP head, SOCKS
    /// greeting and request); also how long a request body may stall
    /// between two reads. Default 30 s.
    pub handshake_timeout: Duration,
    /// How long one connection attempt to a destination address may take.
    /// Default 10 s.
    pub connect_timeout: Duration,
    /// Where the proxy's private directory is made; `None` is the system's
    /// temporary directory. A unix socket path is limited to about 100
    /// bytes, so this should be short.
    pub dir_parent: Option<PathBuf>,
}

impl ProxyConfig {
    /// This allowlist and resolver, and the default limits.
    pub fn new(allow: Allowlist, resolver: Resolver) -> ProxyConfig {
        ProxyConfig {
            allow,
            resolver,
            max_events: 4096,
            max_connections: 256,
            budget: ConnectionBudget::process(),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            handshake_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            dir_parent: None,
        }
    }

    /// The policy's allowlist, its resolve overrides over the system's
    /// resolver, and the default limits.
    pub fn from_policy(policy: &NetworkPolicy) -> Result<ProxyConfig, AllowError> {
        let allow = Allowlist::parse(&policy.allow)?;
        let resolver =
            Resolver::with_overrides(policy.resolve.iter().map(|(n, a)| (n.as_str(), *a)));
        Ok(ProxyConfig::new(allow, resolver))
    }
}

/// The environment that points a sandbox's clients at the proxy's forwarder
/// on `127.0.0.1:port`: `HTTP_PROXY`, `HTTPS_PROXY` (`http://127.0.0.1:PORT`),
/// `ALL_PROXY` (`socks5h://127.0.0.1:PORT`, so names are resolved by the
/// proxy) and `NO_PROXY` (`localhost,127.0.0.1,::1`), each in upper and lower
/// case.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut out = Vec::with_capacity(8);
    for (name, value) in [
        ("HTTP_PROXY", http.clone()),
        ("HTTPS_PROXY", http),
        ("ALL_PROXY", socks),
        ("NO_PROXY", no_proxy),
    ] {
        out.push((name.to_string(), value.clone()));
        out.push((name.to_ascii_lowercase(), value));
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Default)]
struct Events {
    queue: VecDeque<NetEvent>,
    dropped: u64,
}

struct Shared {
    config: ProxyConfig,
    /// This proxy's place in `config.budget`.
    seat: Seat,
    events: Mutex<Events>,
    conns: Mutex<Conns>,
    /// Notified when the last live connection ends.
    drained: Condvar,
    /// Wakes the idle watch (when the proxy closes).
    tick: Condvar,
    stopping: AtomicBool,
    refusing: AtomicUsize,
}

impl Reclaim for Shared {
    fn reclaim_one(&self, why: &str) -> bool {
        let mut conns = lock(&self.conns);
        !conns.closed && conns.reclaim_one(why)
    }
}

impl Shared {
    fn record(&self, ev: NetEvent) {
        tracing::info!(
            decision = ?ev.decision,
            protocol = ?ev.protocol,
            host = %ev.host,
            port = ev.port,
            rule = %ev.rule,
            address = ev.address.as_deref().unwrap_or(""),
            bytes_up = ev.bytes_up,
            bytes_down = ev.bytes_down,
            duration_ms = ev.duration_ms,
            message = ev.message.as_deref().unwrap_or(""),
            "egress proxy decision"
        );
        let mut events = lock(&self.events);
        let max = self.config.max_events;
        if max == 0 {
            events.dropped += 1;
            return;
        }
        while events.queue.len() >= max {
            events.queue.pop_front();
            events.dropped += 1;
        }
        events.queue.push_back(ev);
    }

    /// A live connection's client is now the sandbox's own socket (a
    /// handover): keep a handle on it so that shutdown can end it.
    fn replace_client(&self, id: Option<u64>, client: &Sock) {
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
    fn register_upstream(&self, id: Option<u64>, upstream: &TcpStream) -> bool {
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
    fn cut_message(&self, id: Option<u64>) -> Option<String> {
        lock(&self.conns).cut_message(id)
    }
}

/// Removes a connection from the live set when its thread ends, and gives
/// its place in the budget back (unless a reclaim already did).
struct ConnGuard {
    shared: Arc<Shared>,
    id: u64,
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

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => admit(shared, stream),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors or memory: back off instead of spinning.
                tracing::warn!(error = %e, "egress proxy: accept failed");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Per-connection facts.
struct Ctx {
    shared: Arc<Shared>,
    id: Option<u64>,
    at_ms: u64,
    start: Instant,
    /// The limit that refused the connection (it is answered and closed).
    refused: Option<Limit>,
    /// When its bytes last moved (see [`ProxyConfig::idle_timeout`]).
    progress: Progress,
}

/// Takes a connection from the budget and into the live set; the limit
/// that refused it; `Ok(None)` if the proxy is closing (or the socket
/// cannot be kept): it is then dropped.
fn register(
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

fn admit(shared: &Arc<Shared>, stream: UnixStream) {
    let at_ms = now_ms();
    let start = Instant::now();
    let progress = progress();
    match register(shared, &stream, &progress) {
        Ok(None) => {}
        Ok(Some(id)) => {
            let guard = ConnGuard {
                shared: Arc::clone(shared),
                id,
            };
            let ctx = Ctx {
                shared: Arc::clone(shared),
                id: Some(id),
                at_ms,
                start,
                refused: None,
                progress,
            };
            let spawned = thread::Builder::new()
                .name("hako-net-conn".into())
                .spawn(move || {
                    let _guard = guard;
                    serve_accepted(&ctx, stream);
                });
            if let Err(e) = spawned {
                // The closure (and the guard in it) was dropped: the
                // connection is already out of the live set.
                tracing::warn!(error = %e, "egress proxy: cannot start a connection thread");
            }
        }
        Err(limit) => {
            let (rule, message) = (limit.rule(), limit.message());
            let ctx = Ctx {
                shared: Arc::clone(shared),
                id: None,
                at_ms,
                start,
                refused: Some(limit),
                progress,
            };
            if shared.refusing.fetch_add(1, Ordering::SeqCst) >= MAX_REFUSING {
                shared.refusing.fetch_sub(1, Ordering::SeqCst);
                event_refused(&ctx, NetProtocol::Unknown, "", 0, rule, message);
                return;
            }
            let for_thread = Arc::clone(shared);
            let spawned = thread::Builder::new()
                .name("hako-net-refuse".into())
                .spawn(move || {
                    serve_accepted(&ctx, stream);
                    for_thread.refusing.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                shared.refusing.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

fn event_refused(
    ctx: &Ctx,
    protocol: NetProtocol,
    host: &str,
    port: u16,
    rule: &str,
    message: String,
) {
    ctx.shared.record(NetEvent {
        at_ms: ctx.at_ms,
        decision: NetDecision::Refused,
        protocol,
        host: printable(host),
        port,
        rule: rule.to_string(),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: duration_ms(ctx.start),
        message: Some(message),
    });
}

struct Done {
    address: Option<SocketAddr>,
    up: u64,
    down: u64,
    message: Option<String>,
}

/// Records an allowed connection as it ended; why it was ended from
/// outside (idle, reclaimed) unless it failed for a reason of its own.
fn event_allowed(ctx: &Ctx, protocol: NetProtocol, host: &str, port: u16, rule: &str, done: Done) {
    let message = done.message.or_else(|| ctx.shared.cut_message(ctx.id));
    ctx.shared.record(NetEvent {
        at_ms: ctx.at_ms,
        decision: NetDecision::Allowed,
        protocol,
        host: printable(host),
        port,
        rule: rule.to_string(),
        address: done.address.map(|a| a.to_string()),
        bytes_up: done.up,
        bytes_down: done.down,
        duration_ms: duration_ms(ctx.start),
        message,
    });
}

/// An allowed destination: how the client asked for it, and the rule that
/// let it through.
struct Dest<'a> {
    proto: NetProtocol,
    host: &'a str,
    port: u16,
    rule: &'a str,
}

impl Dest<'_> {
    /// Records the allowed connection as it ended.
    fn record(
        &self,
        ctx: &Ctx,
        address: Option<SocketAddr>,
        (up, down): (u64, u64),
        message: Option<String>,
    ) {
        let done = Done {
            address,
            up,
            down,
            message,
        };
        event_allowed(ctx, self.proto, self.host, self.port, self.rule, done);
    }
}

/// Connects to the first checked address of an allowed destination that
/// accepts, and makes the connection known to shutdown. A failure is
/// recorded here: `Err(Some(e))` when no address accepted (the caller
/// tells its client), `Err(None)` when the proxy is shutting down.
fn connect_allowed(
    ctx: &Ctx,
    dest: &Dest<'_>,
    addrs: &[SocketAddr],
) -> Result<(TcpStream, SocketAddr), Option<io::Error>> {
    let (upstream, address) = match connect(ctx, addrs) {
        Ok(c) => c,
        Err(e) => {
            dest.record(ctx, None, (0, 0), Some(format!("cannot connect: {e}")));
            return Err(Some(e));
        }
    };
    if !ctx.shared.register_upstream(ctx.id, &upstream) {
        let message = Some("the proxy shut down".to_string());
        dest.record(ctx, Some(address), (0, 0), message);
        return Err(None);
    }
    Ok((upstream, address))
}

/// A tunnel (CONNECT, SOCKS5) whose client was told it is open
/// (`answered`): relays it until both sides end and records it; an answer
/// that could not be given ends it.
fn relay_answered(
    ctx: &Ctx,
    dest: &Dest<'_>,
    (client, reader): (&Sock, Client<'_>),
    (upstream, address): (TcpStream, SocketAddr),
    answered: io::Result<()>,
) {
    if let Err(e) = answered {
        let _ = upstream.shutdown(Shutdown::Both);
        let message = Some(format!("cannot answer the client: {e}"));
        return dest.record(ctx, Some(address), (0, 0), message);
    }
    let bytes = finish_relay(client, reader, upstream, &ctx.progress);
    dest.record(ctx, Some(address), bytes, None);
}

fn duration_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Reads from the client with a deadline for the whole handshake, or (once
/// the handshake is over) an idle timeout per read.
struct ClientReader<'a> {
    stream: &'a Sock,
    deadline: Option<Instant>,
    idle: Duration,
    set: Option<Duration>,
    /// Bytes already read from the client (by the first read, which
    /// looks for a handover), served before the socket's.
    prefix: Vec<u8>,
}

impl Read for ClientReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.prefix.is_empty() {
            let n = buf.len().min(self.prefix.len());
            buf[..n].copy_from_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            return Ok(n);
        }
        let timeout = match self.deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "handshake timed out",
                    ));
                }
                left
            }
            None => self.idle,
        };
        if self.set != Some(timeout) {
            self.stream.set_read_timeout(Some(timeout))?;
            self.set = Some(timeout);
        }
        match (&mut &*self.stream).read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client read timed out",
                ))
            }
            other => other,
        }
    }
}

type Client<'a> = BufReader<ClientReader<'a>>;

/// Reads through the buffered client reader, writes to the client socket.
struct Duplex<'r, 'a, 'w> {
    r: &'r mut Client<'a>,
    w: &'w Sock,
}

impl Read for Duplex<'_, '_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.r.read(buf)
    }
}

impl Write for Duplex<'_, '_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&mut &*self.w).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// How long a client has to finish its request.
fn handshake_budget(ctx: &Ctx) -> Duration {
    let cfg = &ctx.shared.config;
    if ctx.refused.is_some() {
        cfg.handshake_timeout.min(REFUSE_DEADLINE)
    } else {
        cfg.handshake_timeout
    }
}

/// A new connection to the proxy's socket: a handover of the sandbox's
/// own connection (see [`crate::handoff`]), or a client that speaks here.
fn serve_accepted(ctx: &Ctx, unix: UnixStream) {
    let _ = unix.set_read_timeout(Some(handshake_budget(ctx)));
    match handoff::first_read(&unix) {
        Ok(First::Closed) => {
            tracing::debug!("egress proxy: a client closed without sending anything");
        }
        Ok(First::Bytes(prefix)) => serve(ctx, Sock::Unix(unix), prefix),
        Ok(First::RelayedForward(port)) => serve_port(ctx, &Sock::Unix(unix), port),
        Ok(First::HandedOver { client, forward }) => {
            drop(unix);
            crate::relay::unpaced(client.as_fd());
            let client = Sock::Tcp(client);
            ctx.shared.replace_client(ctx.id, &client);
            match forward {
                None => serve(ctx, client, Vec::new()),
                Some(port) => serve_port(ctx, &client, port),
            }
        }
        Err(e) if is_timeout(&e) => event_refused(
            ctx,
            NetProtocol::Unknown,
            "",
            0,
            RULE_HANDSHAKE_TIMEOUT,
            "the client sent nothing in time".into(),
        ),
        // A refused handover is the forwarder's cue to relay instead.
        Err(e) => tracing::debug!(error = %e, "egress proxy: a handover was not taken"),
    }
}

/// A forwarded host port (`127.0.0.1:PORT` inside): the connection goes to
/// `localhost:PORT` if the allowlist says so, and is closed otherwise.
fn serve_port(ctx: &Ctx, client: &Sock, port: u16) {
    let proto = NetProtocol::Forward;
    let host = "localhost";
    if let Some(limit) = &ctx.refused {
        return event_refused(ctx, proto, host, port, limit.rule(), limit.message());
    }
    let cfg = &ctx.shared.config;
    let (rule, addrs) = match decide(&cfg.allow, &cfg.resolver, host, port) {
        Verdict::Allow { rule, addrs } => (rule, addrs),
        Verdict::Refuse { rule, message } => {
            return event_refused(ctx, proto, host, port, rule, message)
        }
    };
    let dest = Dest {
        proto,
        host,
        port,
        rule: &rule,
    };
    let Ok((upstream, address)) = connect_allowed(ctx, &dest, &addrs) else {
        return;
    };
    // The handshake's timeouts (set on the proxy's own socket before its
    // first read) must not cut an idle relay.
    let _ = client.set_read_timeout(None);
    let _ = client.set_write_timeout(None);
    let bytes = match client.try_clone() {
        Ok(client) => relay_watched(client, upstream, Some(Arc::clone(&ctx.progress))),
        Err(_) => (0, 0),
    };
    dest.record(ctx, Some(address), bytes, None);
}

fn serve(ctx: &Ctx, client: Sock, prefix: Vec<u8>) {
    let cfg = &ctx.shared.config;
    let budget = handshake_budget(ctx);
    let _ = client.set_write_timeout(Some(budget));
    let mut reader = BufReader::with_capacity(
        CLIENT_BUF,
        ClientReader {
            stream: &client,
            deadline: Some(ctx.start + budget),
            idle: cfg.handshake_timeout,
            set: None,
            prefix,
        },
    );
    let first = match reader.fill_buf() {
        Ok([]) => {
            tracing::debug!("egress proxy: a client closed without sending anything");
            return;
        }
        Ok(buf) => buf[0],
        Err(e) => {
            if is_timeout(&e) {
                event_refused(
                    ctx,
                    NetProtocol::Unknown,
                    "",
                    0,
                    RULE_HANDSHAKE_TIMEOUT,
                    "the client sent nothing in time".into(),
                );
            }
            return;
        }
    };
    match first {
        0x05 => serve_socks5(ctx, &client, reader),
        0x04 => {
            // A SOCKS4 "request rejected or failed" reply.
            let _ = (&client).write_all(&[0, 0x5B, 0, 0, 0, 0, 0, 0]);
            event_refused(
                ctx,
                NetProtocol::Unknown,
                "",
                0,
                RULE_SOCKS4,
                "SOCKS4 is not supported; use SOCKS5 (socks5h://)".into(),
            );
        }
        _ => serve_http(ctx, &client, reader),
    }
    drain_before_close(&client);
}

/// Reads and discards what the client already sent, so that closing does
/// not reset the connection (a unix socket closed with unread data makes
/// its peer's next read fail with `ECONNRESET`, which may lose the answer
/// the proxy just wrote). Never waits.
fn drain_before_close(client: &Sock) {
    const MAX_DRAIN: usize = 1 << 20;
    if client.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 16 * 1024];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match (&mut &*client).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Connects to the first address that accepts, trying them in order.
fn connect(ctx: &Ctx, addrs: &[SocketAddr]) -> io::Result<(TcpStream, SocketAddr)> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
    for addr in addrs {
        if ctx.shared.stopping.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the proxy is shutting down",
            ));
        }
        match TcpStream::connect_timeout(addr, ctx.shared.config.connect_timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                if addr.ip().is_loopback() {
                    crate::relay::unpaced(s.as_fd());
                }
                return Ok((s, *addr));
            }
            Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
        }
    }
    Err(last)
}

/// Ends the handshake and relays the rest of the connection: sends what the
/// client already sent past its request, then copies both ways. Returns the
/// bytes each way.
fn finish_relay(
    client: &Sock,
    reader: Client<'_>,
    upstream: TcpStream,
    progress: &Progress,
) -> (u64, u64) {
    let leftover = reader.buffer().to_vec();
    drop(reader);
    let _ = client.set_read_timeout(None);
    let _ = client.set_write_timeout(None);
    if !leftover.is_empty() && (&upstream).write_all(&leftover).is_err() {
        let _ = upstream.shutdown(Shutdown::Both);
        return (0, 0);
    }
    let client = match client.try_clone() {
        Ok(c) => c,
        Err(_) => {
            let _ = upstream.shutdown(Shutdown::Both);
            return (0, 0);
        }
    };
    let (up, down) = relay_watched(client, upstream, Some(Arc::clone(progress)));
    (up + leftover.len() as u64, down)
}

fn serve_socks5(ctx: &Ctx, client: &Sock, mut reader: Client<'_>) {
    let proto = NetProtocol::Socks5;
    let io_refusal = |e: io::Error, what: &str| {
        if is_timeout(&e) {
            event_refused(
                ctx,
                proto,
                "",
                0,
                RULE_HANDSHAKE_TIMEOUT,
                format!("SOCKS5 {what} not received in time"),
            );
        } else {
            event_refused(
                ctx,
                proto,
                "",
                0,
                RULE_BAD_REQUEST,
                format!("bad SOCKS5 {what}: {e}"),
            );
        }
    };
    let mut d = Duplex {
        r: &mut reader,
        w: client,
    };
    match socks::server_greeting(&mut d) {
        Ok(true) => {}
        Ok(false) => {
            event_refused(
                ctx,
                proto,
                "",
                0,
                RULE_SOCKS_METHOD,
                "the SOCKS5 client did not offer \"no authentication\"".into(),
            );
            return;
        }
        Err(e) => return io_refusal(e, "greeting"),
    }
    let (host, port) = match socks::server_request(&mut d) {
        Ok(ServerRequest::Connect { host, port }) => (host, port),
        Ok(ServerRequest::Unsupported { code, why }) => {
            let _ = socks::server_reply(&mut d, code);
            event_refused(ctx, proto, "", 0, RULE_SOCKS_REQUEST, why);
            return;
        }
        Err(e) => return io_refusal(e, "request"),
    };
    if let Some(limit) = &ctx.refused {
        let _ = socks::server_reply(&mut d, socks::REP_GENERAL_FAILURE);
        event_refused(ctx, proto, &host, port, limit.rule(), limit.message());
        return;
    }
    let cfg = &ctx.shared.config;
    let (rule, addrs) = match decide(&cfg.allow, &cfg.resolver, &host, port) {
        Verdict::Allow { rule, addrs } => (rule, addrs),
        Verdict::Refuse { rule, message } => {
            let code = if rule == RULE_NAME_NOT_RESOLVED {
                socks::REP_HOST_UNREACHABLE
            } else {
                socks::REP_NOT_ALLOWED
            };
            let _ = socks::server_reply(&mut d, code);
            event_refused(ctx, proto, &host, port, rule, message);
            return;
        }
    };
    let dest = Dest {
        proto,
        host: &host,
        port,
        rule: &rule,
    };
    let upstream = match connect_allowed(ctx, &dest, &addrs) {
        Ok(c) => c,
        Err(e) => {
            if let Some(e) = e {
                let _ = socks::server_reply(&mut d, socks::reply_for_connect_error(&e));
            }
            return;
        }
    };
    let answered = socks::server_reply(&mut d, socks::REP_OK);
    relay_answered(ctx, &dest, (client, reader), upstream, answered);
}

/// Answers an HTTP client with the proxy's own short response.
fn respond(client: &Sock, status: u16, reason: &str, rule: &str, body: &str) {
    let mut w = client;
    let _ = w.write_all(&http::proxy_response(status, reason, rule, body));
    let _ = client.shutdown(Shutdown::Write);
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{}]:{port}", printable(host))
    } else {
        format!("{}:{port}", printable(host))
    }
}

/// Answers a refused HTTP or CONNECT request and records it.
fn refuse_http(
    ctx: &Ctx,
    client: &Sock,
    proto: NetProtocol,
    host: &str,
    port: u16,
    rule: &str,
    message: String,
) {
    let (status, reason) = match rule {
        RULE_NAME_NOT_RESOLVED => (502, "Bad Gateway"),
        RULE_TOO_MANY_CONNECTIONS | RULE_PROCESS_CONNECTIONS => (503, "Service Unavailable"),
        RULE_BAD_REQUEST => (400, "Bad Request"),
        _ => (403, "Forbidden"),
    };
    let body = format!(
        "hako egress proxy refused {}: {message} (rule {rule}); allowed: {}",
        host_port(host, port),
        ctx.shared.config.allow.summary(SUMMARY_ENTRIES)
    );
    // Recorded first, so that the event exists once the client has its
    // answer.
    event_refused(ctx, proto, host, port, rule, message);
    respond(client, status, reason, rule, &body);
}

/// Answers a request the proxy cannot make sense of and records it.
fn bad_request(ctx: &Ctx, client: &Sock, proto: NetProtocol, status: u16, why: String) {
    let reason = match status {
        431 => "Request Header Fields Too Large",
        408 => "Request Timeout",
        _ => "Bad Request",
    };
    let rule = if status == 408 {
        RULE_HANDSHAKE_TIMEOUT
    } else {
        RULE_BAD_REQUEST
    };
    let body = format!("hako egress proxy: {why} (rule {rule})");
    event_refused(ctx, proto, "", 0, rule, why);
    respond(client, status, reason, rule, &body);
}

fn serve_http(ctx: &Ctx, client: &Sock, mut reader: Client<'_>) {
    let head = match http::read_head(&mut reader) {
        Ok(h) => h,
        Err(HeadError::TooLarge(what)) => {
            return bad_request(ctx, client, NetProtocol::Unknown, 431, what.to_string())
        }
        Err(HeadError::Bad(why)) => {
            return bad_request(ctx, client, NetProtocol::Unknown, 400, why)
        }
        Err(HeadError::Eof) => {
            let why = "the client closed before sending a complete request head".to_string();
            return event_refused(ctx, NetProtocol::Unknown, "", 0, RULE_BAD_REQUEST, why);
        }
        Err(HeadError::Io(e)) if is_timeout(&e) => {
            let why = "the request head was not received in time".to_string();
            return bad_request(ctx, client, NetProtocol::Unknown, 408, why);
        }
        Err(HeadError::Io(e)) => {
            let why = format!("cannot read the request head: {e}");
            return event_refused(ctx, NetProtocol::Unknown, "", 0, RULE_BAD_REQUEST, why);
        }
    };
    if head.method == "CONNECT" {
        serve_connect(ctx, client, reader, &head.target);
    } else {
        serve_forward(ctx, client, reader, &head);
    }
}

/// The decision and the connection of an HTTP request (plain or
/// `CONNECT`) to `host:port`: refused (answered and recorded) when the
/// proxy is full or the policy says no, answered `502` (and recorded) when
/// no checked address accepts; otherwise the rule that allowed it, the
/// upstream connection (known to shutdown) and its address.
fn open_upstream(
    ctx: &Ctx,
    client: &Sock,
    proto: NetProtocol,
    host: &str,
    port: u16,
) -> Option<(String, TcpStream, SocketAddr)> {
    if let Some(limit) = &ctx.refused {
        refuse_http(
            ctx,
            client,
            proto,
            host,
            port,
            limit.rule(),
            limit.message(),
        );
        return None;
    }
    let cfg = &ctx.shared.config;
    let (rule, addrs) = match decide(&cfg.allow, &cfg.resolver, host, port) {
        Verdict::Allow { rule, addrs } => (rule, addrs),
        Verdict::Refuse { rule, message } => {
            refuse_http(ctx, client, proto, host, port, rule, message);
            return None;
        }
    };
    let dest = Dest {
        proto,
        host,
        port,
        rule: &rule,
    };
    match connect_allowed(ctx, &dest, &addrs) {
        Ok((upstream, address)) => Some((rule, upstream, address)),
        Err(e) => {
            if let Some(e) = e {
                respond(
                    client,
                    502,
                    "Bad Gateway",
                    "connect-failed",
                    &format!(
                        "hako egress proxy could not connect to {}: {e}",
                        host_port(host, port)
                    ),
                );
            }
            None
        }
    }
}

fn serve_connect(ctx: &Ctx, client: &Sock, reader: Client<'_>, target: &str) {
    let proto = NetProtocol::Connect;
    let (host, port) = match http::split_authority(target) {
        Ok((host, Some(port))) => (host, port),
        Ok((_, None)) => {
            let why = format!("CONNECT target `{}` has no port", printable(target));
            return bad_request(ctx, client, proto, 400, why);
        }
        Err(why) => {
            return bad_request(
                ctx,
                client,
                proto,
                400,
                format!("bad CONNECT target: {why}"),
            )
        }
    };
    let Some((rule, upstream, address)) = open_upstream(ctx, client, proto, &host, port) else {
        return;
    };
    let dest = Dest {
        proto,
        host: &host,
        port,
        rule: &rule,
    };
    let answered = (&mut &*client).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    relay_answered(ctx, &dest, (client, reader), (upstream, address), answered);
}

/// Counts the bytes written through it, and notes them in the
/// connection's progress.
struct Counting<'a> {
    inner: &'a TcpStream,
    n: u64,
    progress: &'a AtomicU64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (&mut &*self.inner).write(buf)?;
        self.n += n as u64;
        touch(Some(self.progress));
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies the upstream's response to the client until the upstream's end of
/// stream, noting it in `progress`, and returns the bytes copied. The client is
/// half-closed only if something was copied, so that the proxy can still
/// answer when nothing came; if the client goes away, the upstream is shut
/// down.
fn copy_response(upstream: &TcpStream, client: &Sock, progress: &AtomicU64) -> u64 {
    let mut buf = vec![0u8; RELAY_BUF];
    let mut total: u64 = 0;
    loop {
        let n = match (&mut &*upstream).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        touch(Some(progress));
        if (&mut &*client).write_all(&buf[..n]).is_err() {
            let _ = upstream.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return total;
        }
        total += n as u64;
        touch(Some(progress));
    }
    if total > 0 {
        let _ = client.shutdown(Shutdown::Write);
    }
    total
}

fn serve_forward(ctx: &Ctx, client: &Sock, mut reader: Client<'_>, head: &http::Head) {
    let proto = NetProtocol::Http;
    let (authority, host, port, path) = match http::parse_target(&head.target) {
        Ok(Target::Http {
            authority,
            host,
            port,
            path,
        }) => (authority, host, port, path),
        Ok(Target::Https) => {
            let why = "https:// URLs go through CONNECT, not plain forwarding (set HTTPS_PROXY)"
                .to_string();
            return bad_request(ctx, client, proto, 400, why);
        }
        Ok(Target::Origin) => {
            let why =
                "this is the hako egress proxy, not a web server: send absolute-form requests \
                       (GET http://host/path) or CONNECT host:port"
                    .to_string();
            return bad_request(ctx, client, NetProtocol::Unknown, 400, why);
        }
        Ok(Target::Other) => {
            let why = "only http:// URLs are forwarded; use CONNECT for anything else".to_string();
            return bad_request(ctx, client, proto, 400, why);
        }
        Err(why) => return bad_request(ctx, client, proto, 400, format!("bad URL: {why}")),
    };
    let hosts: Vec<&[u8]> = head.values("host").collect();
    if hosts.len() > 1 {
        return bad_request(ctx, client, proto, 400, "more than one Host header".into());
    }
    if let Some(value) = hosts.first() {
        if !http::host_header_matches(value, &host, port) {
            let message = format!(
                "the Host header `{}` does not name the URL's host",
                printable(&String::from_utf8_lossy(value))
            );
            return refuse_http(
                ctx,
                client,
                proto,
                &host,
                port,
                RULE_HOST_HEADER_MISMATCH,
                message,
            );
        }
    }
    let framing = match http::framing(head) {
        Ok(f) => f,
        Err(why) => {
            return bad_request(
                ctx,
                client,
                proto,
                400,
                format!("ambiguous request body: {why}"),
            )
        }
    };
    let Some((rule, upstream, address)) = open_upstream(ctx, client, proto, &host, port) else {
        return;
    };
    // The response flows back while the body goes up (so `Expect:
    // 100-continue` and early answers work).
    let _ = client.set_write_timeout(None);
    reader.get_mut().deadline = None;
    let progress = Arc::clone(&ctx.progress);
    let response = match (upstream.try_clone(), client.try_clone()) {
        (Ok(up), Ok(down)) => thread::Builder::new()
            .name("hako-net-response".into())
            .spawn(move || copy_response(&up, &down, &progress)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let response = match response {
        Ok(handle) => handle,
        Err(e) => {
            let _ = upstream.shutdown(Shutdown::Both);
            respond(
                client,
                502,
                "Bad Gateway",
                "proxy-error",
                &format!("hako egress proxy: {e}"),
            );
            let done = Done {
                address: Some(address),
                up: 0,
                down: 0,
                message: Some(format!("proxy error: {e}")),
            };
            return event_allowed(ctx, proto, &host, port, &rule, done);
        }
    };
    let upstream_head = http::upstream_head(head, &path, &authority);
    let mut w = Counting {
        inner: &upstream,
        n: 0,
        progress: &ctx.progress,
    };
    let sent = w
        .write_all(&upstream_head)
        .map_err(BodyError::Io)
        .and_then(|()| http::forward_body(&mut reader, &mut w, &framing));
    let up = w.n;
    // One request per connection: nothing the client sends after this body
    // is read, so a pipelined request never reaches this upstream.
    drop(reader);
    let message = match sent {
        Ok(_) => None,
        Err(e) => {
            let _ = upstream.shutdown(Shutdown::Both);
            let why = match &e {
                BodyError::Bad(why) => format!("bad request body: {why}"),
                BodyError::Io(e) => format!("request not forwarded: {e}"),
            };
            Some((why, matches!(e, BodyError::Bad(_))))
        }
    };
    let down = response.join().unwrap_or(0);
    let message = match message {
        None => None,
        Some((why, bad)) => {
            if bad && down == 0 {
                respond(
                    client,
                    400,
                    "Bad Request",
                    RULE_BAD_REQUEST,
                    &format!("hako egress proxy: {why} (rule {RULE_BAD_REQUEST})"),
                );
            }
            Some(why)
        }
    };
    let _ = client.shutdown(Shutdown::Write);
    event_allowed(
        ctx,
        proto,
        &host,
        port,
        &rule,
        Done {
            address: Some(address),
            up,
            down,
            message,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_env_sets_both_cases() {
        let env = proxy_env(3128);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(env.len(), 8);
        for k in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"] {
            assert_eq!(get(k), Some("http://127.0.0.1:3128"), "{k}");
        }
        assert_eq!(get("ALL_PROXY"), Some("socks5h://127.0.0.1:3128"));
        assert_eq!(get("all_proxy"), Some("socks5h://127.0.0.1:3128"));
        assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
    }
}
