//! Network policy and the record of every network decision.
//!
//! A sandbox's network is one of three modes ([`NetMode`]): `none` (loopback
//! only, in a namespace of its own), `allow` (no route out; an egress proxy
//! outside the boundary lets through only what the allowlist names, and
//! every decision it takes is a [`NetEvent`]), or `host`. The allowlist's
//! entries are kept as written here and checked by the proxy crate.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// Loopback only, in a namespace of its own (the default of every
    /// isolating backend).
    #[default]
    None,
    /// No route out; only what the allowlist names, through the egress
    /// proxy.
    Allow,
    /// The host's network, unfiltered. Must be asked for by name.
    Host,
}

impl NetMode {
    /// The mode's name, as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            NetMode::None => "none",
            NetMode::Allow => "allow",
            NetMode::Host => "host",
        }
    }
}

impl std::str::FromStr for NetMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(NetMode::None),
            "allow" => Ok(NetMode::Allow),
            "host" => Ok(NetMode::Host),
            other => Err(format!(
                "unknown network mode `{other}` (expected none, allow or host)"
            )),
        }
    }
}

/// The network a sandbox is to have.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// The mode.
    pub mode: NetMode,
    /// `allow` mode's entries, as written: `HOST`, `HOST:PORT`,
    /// `*.DOMAIN[:PORT]`, an IP literal (`10.0.0.5:8080`, `[fd00::1]:443`),
    /// or `localhost:PORT` (that port on the host's loopback, also forwarded
    /// so that `127.0.0.1:PORT` inside reaches it).
    pub allow: Vec<String>,
    /// Names the proxy resolves to fixed addresses instead of asking the
    /// system's resolver (like `curl --resolve`).
    pub resolve: Vec<(String, IpAddr)>,
}

impl NetworkPolicy {
    /// `none`.
    pub fn none() -> Self {
        NetworkPolicy::default()
    }

    /// `host`.
    pub fn host() -> Self {
        NetworkPolicy {
            mode: NetMode::Host,
            ..NetworkPolicy::default()
        }
    }

    /// `allow` with these entries.
    pub fn allow<S: Into<String>>(entries: impl IntoIterator<Item = S>) -> Self {
        NetworkPolicy {
            mode: NetMode::Allow,
            allow: entries.into_iter().map(Into::into).collect(),
            resolve: Vec::new(),
        }
    }
}

/// What the proxy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetDecision {
    /// Let through (the event is recorded when the connection ends).
    Allowed,
    /// Refused before any packet left for the destination.
    Refused,
}

/// How the connection reached the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetProtocol {
    /// A plain-HTTP request in absolute form (`GET http://host/path`).
    Http,
    /// `CONNECT host:port` (TLS and anything else tunnelled).
    Connect,
    /// SOCKS5 `CONNECT`.
    Socks5,
    /// A forwarded host port (`127.0.0.1:PORT` inside).
    Forward,
    /// The proxy could not tell (a refused, malformed first request).
    Unknown,
}

/// One decision of the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetEvent {
    /// When the request came, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Allowed or refused.
    pub decision: NetDecision,
    /// How it came.
    pub protocol: NetProtocol,
    /// The host asked for, as the client wrote it (a name or an address).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The rule that decided: the allowlist entry that matched, or the
    /// name of the refusal (`not-on-allowlist`, `port-not-allowed`,
    /// `private-address`, `metadata-address`, `resolves-to-private`, ...).
    pub rule: String,
    /// The address connected to (allowed connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the sandbox to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the sandbox.
    pub bytes_down: u64,
    /// How long the connection lasted, in milliseconds.
    pub duration_ms: u64,
    /// A readable explanation (why it was refused, or why an allowed
    /// connection failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_name_only() {
        assert_eq!("none".parse::<NetMode>(), Ok(NetMode::None));
        assert_eq!("allow".parse::<NetMode>(), Ok(NetMode::Allow));
        assert_eq!("host".parse::<NetMode>(), Ok(NetMode::Host));
        assert!("Host".parse::<NetMode>().is_err());
        assert!("".parse::<NetMode>().is_err());
        assert_eq!(NetworkPolicy::default().mode, NetMode::None);
    }
}
