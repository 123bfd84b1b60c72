//! The hako egress proxy.
//!
//! A sandbox in network mode `allow` has no route out. Inside it, a small
//! forwarder listens on `127.0.0.1:PORT` and relays each TCP connection to
//! the unix socket this proxy listens on, outside the boundary. The proxy
//! speaks, on that one socket, plain HTTP forwarding (absolute-form
//! requests), HTTP `CONNECT` and SOCKS5, tells them apart by the first byte,
//! and connects only where the [`Allowlist`] says ([`decide`]). Every
//! decision is a [`NetEvent`](hako_core::NetEvent).
//!
//! Invariants:
//! - Nothing is connected to before the decision; a name is resolved once
//!   and only the addresses that were checked are connected to (no DNS
//!   rebinding between check and use).
//! - A name that resolves to loopback, private, link-local or metadata
//!   addresses is refused unless the address is itself listed ([`classify`]).
//! - Nothing is buffered without bound: request heads, chunk lines and
//!   trailers have limits, the event queue drops its oldest entries, and the
//!   number of live connections is capped.
//! - One sandbox cannot starve another of connections: the process's budget
//!   is divided evenly among its proxies ([`ConnectionBudget`]), and a
//!   relayed connection that moves no bytes for the idle timeout is closed.
//! - One request per HTTP client connection: a pipelined second request
//!   never reaches the first request's upstream.

#![cfg(unix)]

mod allow;
mod budget;
mod classify;
mod decide;
mod dns;
#[cfg(test)]
mod fuzz;
pub mod handoff;
mod http;
mod live;
mod proxy;
mod relay;
mod socks;
mod stale;

pub use allow::{AllowEntry, AllowError, Allowlist, EntryHost, DEFAULT_PORTS};
pub use budget::{ConnectionBudget, RULE_PROCESS_CONNECTIONS, RULE_TOO_MANY_CONNECTIONS};
pub use classify::classify;
pub use decide::{
    decide, Verdict, RULE_BAD_HOST, RULE_NAME_NOT_RESOLVED, RULE_NOT_ON_ALLOWLIST,
    RULE_PORT_NOT_ALLOWED, RULE_RESOLVES_TO_REFUSED,
};
pub use dns::Resolver;
pub use hako_relay::relay::{relay, RelaySocket};
pub use handoff::{announce_forward, hand_over};
pub use proxy::{
    proxy_env, Proxy, ProxyConfig, RULE_BAD_REQUEST, RULE_HANDSHAKE_TIMEOUT,
    RULE_HOST_HEADER_MISMATCH, RULE_SOCKS4, RULE_SOCKS_METHOD, RULE_SOCKS_REQUEST, SOCKET_NAME,
};
pub use socks::socks5_connect;
pub use stale::remove_stale_dirs;
