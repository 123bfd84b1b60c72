//! Accepting: each connection to the proxy's socket takes a place in the
//! budget (or is refused with the limit's reason), gets a thread of its
//! own, and is told apart by its first bytes: a handover of the sandbox's
//! own connection, a forwarded port, SOCKS4, SOCKS5 or HTTP.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hako_core::NetProtocol;

use super::client::{is_timeout, ClientReader};
use super::connect::serve_http;
use super::port::serve_port;
use super::record::{event_refused, now_ms};
use super::shared::{register, ConnGuard, Shared};
use super::socks5::serve_socks5;
use super::{RULE_HANDSHAKE_TIMEOUT, RULE_SOCKS4};
use crate::budget::Limit;
use crate::handoff::{self, First};
use crate::live::{progress, Progress};
use crate::relay::Sock;

/// At most this many over-the-limit connections are answered at once (each
/// on a short-lived thread); more are closed without an answer.
const MAX_REFUSING: usize = 16;
/// The longest an over-the-limit connection is waited for.
const REFUSE_DEADLINE: Duration = Duration::from_secs(2);
/// The client reader's buffer: holds a whole request head in most cases.
const CLIENT_BUF: usize = 64 * 1024;

/// Accepts until the proxy stops, admitting each connection.
pub(super) fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
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
pub(super) struct Ctx {
    pub(super) shared: Arc<Shared>,
    pub(super) id: Option<u64>,
    pub(super) at_ms: u64,
    pub(super) start: Instant,
    /// The limit that refused the connection (it is answered and closed).
    pub(super) refused: Option<Limit>,
    /// When its bytes last moved (see [`ProxyConfig::idle_timeout`](super::ProxyConfig::idle_timeout)).
    pub(super) progress: Progress,
}

/// Admits an accepted connection: a place in the budget and a thread of
/// its own; or, over the limit, a short-lived thread that answers it with
/// the limit's reason (at most `MAX_REFUSING` at once; beyond that it is
/// recorded and closed unanswered).
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

/// A client that speaks here, told apart by its first byte: SOCKS5,
/// SOCKS4 (refused), or HTTP; what it sent past its request is drained
/// before the close.
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
