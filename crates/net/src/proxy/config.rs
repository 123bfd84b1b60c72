//! How a proxy runs ([`ProxyConfig`]), and the environment that points a
//! sandbox's clients at it ([`proxy_env`]).

use std::path::PathBuf;
use std::time::Duration;

use hako_core::NetworkPolicy;

use crate::allow::{AllowError, Allowlist};
use crate::budget::ConnectionBudget;
use crate::dns::Resolver;

/// [`ProxyConfig::idle_timeout`]'s default.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How the proxy runs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// What may be reached.
    pub allow: Allowlist,
    /// How names are resolved.
    pub resolver: Resolver,
    /// The most events kept between two [`Proxy::take_events`](super::Proxy::take_events); the oldest
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
