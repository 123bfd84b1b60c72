//! A SOCKS5 client: the greeting ("no authentication" only), a `CONNECT`
//! request, the decision, the reply, the tunnel.

use std::io;

use hako_core::NetProtocol;

use super::accept::Ctx;
use super::client::{is_timeout, Client, Duplex};
use super::record::{event_refused, Dest};
use super::upstream::{connect_allowed, relay_answered};
use super::{RULE_BAD_REQUEST, RULE_HANDSHAKE_TIMEOUT, RULE_SOCKS_METHOD, RULE_SOCKS_REQUEST};
use crate::decide::{decide, Verdict, RULE_NAME_NOT_RESOLVED};
use crate::relay::Sock;
use crate::socks::{self, ServerRequest};

/// A SOCKS5 client: greeting, request, decision, reply, tunnel; every
/// refusal is answered with the matching reply code where there is one,
/// and recorded.
pub(super) fn serve_socks5(ctx: &Ctx, client: &Sock, mut reader: Client<'_>) {
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
