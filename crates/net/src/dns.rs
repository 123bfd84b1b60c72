//! Name resolution for the proxy: fixed overrides, then (optionally) the
//! system's resolver.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};

use crate::allow::normalize_name;
use crate::classify::normalize;

/// Resolves host names for the proxy.
///
/// Overrides (`NAME -> address`, like `curl --resolve`) come first; names are
/// compared case-insensitively without a trailing dot, and several overrides
/// for one name accumulate in the order given. A name without an override
/// goes to the system's resolver unless the resolver was made with
/// [`Resolver::only_overrides`], which never sends a DNS query (tests use
/// it).
///
/// The proxy resolves a name once per connection, checks every address, and
/// connects only to the addresses it checked.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    overrides: HashMap<String, Vec<IpAddr>>,
    no_system: bool,
    /// The host's own addresses, if fixed; `None` asks the system each
    /// time (see [`Resolver::host_addresses`]).
    host: Option<Vec<IpAddr>>,
}

impl Resolver {
    /// The system's resolver, no overrides.
    pub fn system() -> Resolver {
        Resolver::default()
    }

    /// These overrides, then the system's resolver.
    pub fn with_overrides<S: AsRef<str>>(
        overrides: impl IntoIterator<Item = (S, IpAddr)>,
    ) -> Resolver {
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, ip) in overrides {
            let addrs = map.entry(normalize_name(name.as_ref())).or_default();
            let ip = normalize(ip);
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
        Resolver {
            overrides: map,
            no_system: false,
            host: None,
        }
    }

    /// These overrides only: a name without one does not resolve, and the
    /// system's resolver is never asked.
    pub fn only_overrides<S: AsRef<str>>(
        overrides: impl IntoIterator<Item = (S, IpAddr)>,
    ) -> Resolver {
        Resolver {
            no_system: true,
            host: Some(Vec::new()),
            ..Resolver::with_overrides(overrides)
        }
    }

    /// The same resolver, with these as the host's own addresses instead
    /// of the interfaces' (tests).
    pub fn with_host_addresses(self, addrs: Vec<IpAddr>) -> Resolver {
        Resolver {
            host: Some(addrs.into_iter().map(normalize).collect()),
            ..self
        }
    }

    /// The host's own addresses: a name that resolves to one of them would
    /// reach the host's services listening on every interface, so they are
    /// refused like loopback unless listed. Asked of the interfaces each
    /// time (they change), unless fixed.
    pub fn host_addresses(&self) -> io::Result<Vec<IpAddr>> {
        match &self.host {
            Some(addrs) => Ok(addrs.clone()),
            None => Ok(hako_sys::netif::interface_addresses()?
                .into_iter()
                .map(normalize)
                .collect()),
        }
    }

    /// Whether names without an override go to the system's resolver.
    pub fn uses_system(&self) -> bool {
        !self.no_system
    }

    /// The addresses of `name` (already validated and normalised by the
    /// caller), without duplicates, v4-mapped addresses as IPv4. `port` is
    /// passed to the system's resolver only because its interface wants one.
    pub fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        if let Some(addrs) = self.overrides.get(&normalize_name(name)) {
            return Ok(addrs.clone());
        }
        if self.no_system {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no override for this name and the system resolver is disabled",
            ));
        }
        let mut out: Vec<IpAddr> = Vec::new();
        for sa in (name, port).to_socket_addrs()? {
            let ip = normalize(sa.ip());
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        if out.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn overrides_are_case_insensitive_and_accumulate() {
        let r = Resolver::only_overrides([
            ("Pkg.Example.", "203.0.113.5".parse().unwrap()),
            ("pkg.example", "2001:db8::5".parse().unwrap()),
            ("pkg.example", "203.0.113.5".parse().unwrap()),
        ]);
        assert_eq!(
            r.resolve("PKG.example", 443).unwrap(),
            vec![
                "203.0.113.5".parse::<IpAddr>().unwrap(),
                "2001:db8::5".parse().unwrap()
            ]
        );
    }

    #[test]
    fn only_overrides_never_asks_the_system() {
        let r = Resolver::only_overrides(Vec::<(String, IpAddr)>::new());
        assert!(!r.uses_system());
        let e = r.resolve("example.org", 443).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(Resolver::system().uses_system());
    }
}
