//! A forwarded host port: the sandbox's `127.0.0.1:PORT` reaching the
//! host's `localhost:PORT` when the allowlist lists it.

use std::sync::Arc;

use hako_core::NetProtocol;

use super::accept::Ctx;
use super::record::{event_refused, Dest};
use super::upstream::connect_allowed;
use crate::decide::{decide, Verdict};
use crate::relay::{relay_watched, Sock};

/// A forwarded host port (`127.0.0.1:PORT` inside): the connection goes to
/// `localhost:PORT` if the allowlist says so, and is closed otherwise.
pub(super) fn serve_port(ctx: &Ctx, client: &Sock, port: u16) {
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
