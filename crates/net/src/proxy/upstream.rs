//! The upstream side of an allowed connection: connecting to the checked
//! addresses only, making the connection known to shutdown, and relaying
//! a tunnel once its client was answered.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::accept::Ctx;
use super::client::Client;
use super::record::Dest;
use crate::live::Progress;
use crate::relay::{relay_watched, Sock};

/// Connects to the first checked address of an allowed destination that
/// accepts, and makes the connection known to shutdown. A failure is
/// recorded here: `Err(Some(e))` when no address accepted (the caller
/// tells its client), `Err(None)` when the proxy is shutting down.
pub(super) fn connect_allowed(
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
pub(super) fn relay_answered(
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
