//! An HTTP client: its request head, `CONNECT` tunnels, and the proxy's
//! own answers (refusals, bad requests, failed connections) with the
//! decision each records.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};

use hako_core::NetProtocol;

use super::accept::Ctx;
use super::client::{is_timeout, Client};
use super::plain::serve_forward;
use super::record::{event_refused, Dest};
use super::upstream::{connect_allowed, relay_answered};
use super::{RULE_BAD_REQUEST, RULE_HANDSHAKE_TIMEOUT, SUMMARY_ENTRIES};
use crate::allow::printable;
use crate::budget::{RULE_PROCESS_CONNECTIONS, RULE_TOO_MANY_CONNECTIONS};
use crate::decide::{decide, Verdict, RULE_NAME_NOT_RESOLVED};
use crate::http::{self, HeadError};
use crate::relay::Sock;

/// Answers an HTTP client with the proxy's own short response.
pub(super) fn respond(client: &Sock, status: u16, reason: &str, rule: &str, body: &str) {
    let mut w = client;
    let _ = w.write_all(&http::proxy_response(status, reason, rule, body));
    let _ = client.shutdown(Shutdown::Write);
}

/// `host:port` as a message shows it: an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{}]:{port}", printable(host))
    } else {
        format!("{}:{port}", printable(host))
    }
}

/// The status a refusal by `rule` is answered with: a name that did not
/// resolve is the gateway's failure, a full proxy is unavailable, a
/// malformed request is bad, anything else is forbidden.
fn refusal_status(rule: &str) -> (u16, &'static str) {
    match rule {
        RULE_NAME_NOT_RESOLVED => (502, "Bad Gateway"),
        RULE_TOO_MANY_CONNECTIONS | RULE_PROCESS_CONNECTIONS => (503, "Service Unavailable"),
        RULE_BAD_REQUEST => (400, "Bad Request"),
        _ => (403, "Forbidden"),
    }
}

/// Answers a refused HTTP or CONNECT request and records it.
pub(super) fn refuse_http(
    ctx: &Ctx,
    client: &Sock,
    proto: NetProtocol,
    host: &str,
    port: u16,
    rule: &str,
    message: String,
) {
    let (status, reason) = refusal_status(rule);
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
pub(super) fn bad_request(ctx: &Ctx, client: &Sock, proto: NetProtocol, status: u16, why: String) {
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

/// An HTTP client: reads its request head, then serves a `CONNECT` or
/// forwards a plain request; a head that cannot be read is answered and
/// recorded.
pub(super) fn serve_http(ctx: &Ctx, client: &Sock, mut reader: Client<'_>) {
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
pub(super) fn open_upstream(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{RULE_NOT_ON_ALLOWLIST, RULE_RESOLVES_TO_REFUSED};

    #[test]
    fn ipv6_hosts_are_shown_in_brackets_and_others_as_they_are() {
        assert_eq!(host_port("a.org", 443), "a.org:443");
        assert_eq!(host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(host_port("::1", 8080), "[::1]:8080");
        assert_eq!(host_port("[::1]", 8080), "[::1]:8080");
        assert_eq!(host_port("a\nb", 1), "a\\nb:1");
    }

    #[test]
    fn each_refusal_rule_has_its_status() {
        assert_eq!(refusal_status(RULE_NAME_NOT_RESOLVED).0, 502);
        assert_eq!(refusal_status(RULE_TOO_MANY_CONNECTIONS).0, 503);
        assert_eq!(refusal_status(RULE_PROCESS_CONNECTIONS).0, 503);
        assert_eq!(refusal_status(RULE_BAD_REQUEST).0, 400);
        assert_eq!(refusal_status(RULE_NOT_ON_ALLOWLIST), (403, "Forbidden"));
        assert_eq!(refusal_status(RULE_RESOLVES_TO_REFUSED).0, 403);
    }
}
