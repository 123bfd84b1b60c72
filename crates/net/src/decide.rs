//! The decision for one destination: policy plus resolution, no I/O but the
//! resolver's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::allow::{parse_target_host, printable, Allowlist, TargetHost};
use crate::classify::classify;
use crate::dns::Resolver;

/// Rule: nothing on the allowlist names the destination.
pub const RULE_NOT_ON_ALLOWLIST: &str = "not-on-allowlist";
/// Rule: the host is on the allowlist, but not with this port.
pub const RULE_PORT_NOT_ALLOWED: &str = "port-not-allowed";
/// Rule: every address the name resolves to is refused by [`classify`].
pub const RULE_RESOLVES_TO_REFUSED: &str = "resolves-to-refused-address";
/// Rule: the name does not resolve.
pub const RULE_NAME_NOT_RESOLVED: &str = "name-not-resolved";
/// Rule: the host is neither a valid name nor a strict IP literal.
pub const RULE_BAD_HOST: &str = "bad-host";

/// What the proxy is to do with one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Connect, trying these addresses in order (and no others: they are the
    /// ones that were checked).
    Allow {
        /// The allowlist entry that matched, as displayed.
        rule: String,
        /// The checked addresses, with the port.
        addrs: Vec<SocketAddr>,
    },
    /// Do not connect.
    Refuse {
        /// The refusal's name (`not-on-allowlist`, `port-not-allowed`,
        /// `resolves-to-refused-address`, `name-not-resolved`, `bad-host`).
        rule: &'static str,
        /// A readable explanation.
        message: String,
    },
}

impl Verdict {
    fn refuse(rule: &'static str, message: String) -> Verdict {
        Verdict::Refuse { rule, message }
    }
}

/// Decides whether the sandbox may reach `host:port`.
///
/// - An IP literal (IPv4, IPv6 with or without brackets; a v4-mapped IPv6
///   address counts as its IPv4 address) is allowed only when an IP entry
///   lists it with the port, or, for `127.0.0.1` and `::1`, when a
///   `localhost:PORT` entry has the port. Any other literal is refused with
///   `not-on-allowlist` (or `port-not-allowed` when listed with other
///   ports), even a public one: an address must be listed itself.
/// - `localhost` is allowed only by a `localhost:PORT` entry.
/// - Any other name must be covered by a name or wildcard entry with the port
///   (else `port-not-allowed` or `not-on-allowlist`); it is then resolved, and
///   every address that [`classify`] refuses, and every address of the host
///   itself ([`Resolver::host_addresses`]), is dropped unless an IP entry
///   lists that address with the port. None left: `resolves-to-refused-address`
///   (the DNS-rebinding defence). No address at all: `name-not-resolved`.
/// - A host that is neither a valid name nor a strict IP literal (`127.1`,
///   `2130706433`, `0x7f.1`) is refused with `bad-host` and never resolved.
///
/// A `localhost:PORT` destination is connected at `127.0.0.1:PORT`, then
/// `[::1]:PORT`.
pub fn decide(allow: &Allowlist, resolver: &Resolver, host: &str, port: u16) -> Verdict {
    let target = match parse_target_host(host) {
        Ok(t) => t,
        Err(message) => return Verdict::refuse(RULE_BAD_HOST, message),
    };
    let shown = printable(host);
    match target {
        TargetHost::Ip(ip) => decide_ip(allow, ip, port),
        TargetHost::Name(name) if name == "localhost" => decide_localhost(allow, port, &shown),
        TargetHost::Name(name) => decide_name(allow, resolver, &name, port),
    }
}

fn localhost_addrs(port: u16) -> Vec<SocketAddr> {
    vec![
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
    ]
}

fn decide_localhost(allow: &Allowlist, port: u16, shown: &str) -> Verdict {
    if let Some(entry) = allow.match_localhost(port) {
        return Verdict::Allow {
            rule: entry.to_string(),
            addrs: localhost_addrs(port),
        };
    }
    let others = allow.localhost_entries();
    if others.is_empty() {
        Verdict::refuse(
            RULE_NOT_ON_ALLOWLIST,
            format!("{shown} is not on the allowlist"),
        )
    } else {
        let ports: Vec<String> = others.iter().map(|e| e.to_string()).collect();
        Verdict::refuse(
            RULE_PORT_NOT_ALLOWED,
            format!(
                "port {port} of {shown} is not allowed (allowed: {})",
                ports.join(", ")
            ),
        )
    }
}

fn decide_ip(allow: &Allowlist, ip: IpAddr, port: u16) -> Verdict {
    if let Some(entry) = allow.match_ip(ip, port) {
        return Verdict::Allow {
            rule: entry.to_string(),
            addrs: vec![SocketAddr::new(ip, port)],
        };
    }
    let loopback = ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST);
    if loopback && !allow.localhost_entries().is_empty() {
        return decide_localhost(allow, port, &ip.to_string());
    }
    let listed = allow.ip_entries(ip);
    if !listed.is_empty() {
        let entries: Vec<String> = listed.iter().map(|e| e.to_string()).collect();
        return Verdict::refuse(
            RULE_PORT_NOT_ALLOWED,
            format!(
                "port {port} of {ip} is not allowed (allowed: {})",
                entries.join(", ")
            ),
        );
    }
    let class = match classify(ip) {
        Some(class) => format!(" ({class}; an address must be listed itself)"),
        None => " (an address must be listed itself)".to_string(),
    };
    Verdict::refuse(
        RULE_NOT_ON_ALLOWLIST,
        format!("{ip} is not on the allowlist{class}"),
    )
}

fn decide_name(allow: &Allowlist, resolver: &Resolver, name: &str, port: u16) -> Verdict {
    let (hit, covering) = allow.match_name(name, port);
    let Some(entry) = hit else {
        if covering.is_empty() {
            return Verdict::refuse(
                RULE_NOT_ON_ALLOWLIST,
                format!("{name} is not on the allowlist"),
            );
        }
        let entries: Vec<String> = covering.iter().map(|e| e.to_string()).collect();
        return Verdict::refuse(
            RULE_PORT_NOT_ALLOWED,
            format!(
                "port {port} of {name} is not allowed (allowed: {})",
                entries.join(", ")
            ),
        );
    };
    let resolved = match resolver.resolve(name, port) {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => {
            return Verdict::refuse(
                RULE_NAME_NOT_RESOLVED,
                format!("{name} resolves to no address"),
            )
        }
        Err(e) => {
            return Verdict::refuse(
                RULE_NAME_NOT_RESOLVED,
                format!("cannot resolve {name}: {e}"),
            )
        }
    };
    // Fail closed: without the host's own addresses, none can be told
    // apart from them.
    let host = match resolver.host_addresses() {
        Ok(host) => host,
        Err(e) => {
            return Verdict::refuse(
                RULE_RESOLVES_TO_REFUSED,
                format!("cannot list the host's own addresses to check {name} against: {e}"),
            )
        }
    };
    let mut kept: Vec<SocketAddr> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    for ip in resolved {
        let class = classify(ip).or_else(|| host.contains(&ip).then_some("host-address"));
        match class {
            Some(class) if allow.match_ip(ip, port).is_none() => {
                dropped.push(format!("{ip} ({class})"));
            }
            _ => kept.push(SocketAddr::new(ip, port)),
        }
    }
    if kept.is_empty() {
        return Verdict::refuse(
            RULE_RESOLVES_TO_REFUSED,
            format!("{name} resolves to {}", dropped.join(", ")),
        );
    }
    if !dropped.is_empty() {
        tracing::warn!(
            name,
            dropped = %dropped.join(", "),
            "egress proxy dropped refused addresses of an allowed name"
        );
    }
    Verdict::Allow {
        rule: entry.to_string(),
        addrs: kept,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn dns_rebinding_to_the_hosts_own_public_address_is_refused() {
        let r = resolver(&[
            ("self.test", "203.0.113.50"),
            ("mixed.test", "203.0.113.50"),
        ])
        .with_host_addresses(vec!["203.0.113.50".parse().unwrap()]);
        match decide(&list(&["self.test"]), &r, "self.test", 443) {
            Verdict::Refuse { rule, message } => {
                assert_eq!(rule, RULE_RESOLVES_TO_REFUSED);
                assert!(message.contains("host-address"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Listed as an address itself, it is allowed.
        assert!(matches!(
            decide(
                &list(&["self.test", "203.0.113.50:443"]),
                &r,
                "self.test",
                443
            ),
            Verdict::Allow { .. }
        ));
    }

    #[test]
    fn the_system_resolver_checks_against_the_interfaces_addresses() {
        let host = Resolver::system().host_addresses().unwrap();
        assert!(host.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{host:?}");
    }

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    fn no_dns() -> Resolver {
        Resolver::only_overrides(Vec::<(String, IpAddr)>::new())
    }

    fn resolver(pairs: &[(&str, &str)]) -> Resolver {
        Resolver::only_overrides(
            pairs
                .iter()
                .map(|(n, a)| (*n, a.parse::<IpAddr>().unwrap())),
        )
    }

    fn rule(v: &Verdict) -> String {
        match v {
            Verdict::Allow { rule, .. } => format!("allow {rule}"),
            Verdict::Refuse { rule, .. } => rule.to_string(),
        }
    }

    fn addrs(v: &Verdict) -> Vec<String> {
        match v {
            Verdict::Allow { addrs, .. } => addrs.iter().map(|a| a.to_string()).collect(),
            Verdict::Refuse { message, .. } => panic!("refused: {message}"),
        }
    }

    fn message(v: &Verdict) -> String {
        match v {
            Verdict::Allow { .. } => panic!("allowed"),
            Verdict::Refuse { message, .. } => message.clone(),
        }
    }

    #[test]
    fn listed_name_with_default_ports_resolves_and_is_allowed() {
        let l = list(&["pkg.example"]);
        let r = resolver(&[("pkg.example", "203.0.113.7")]);
        let v = decide(&l, &r, "PKG.example.", 443);
        assert_eq!(rule(&v), "allow pkg.example");
        assert_eq!(addrs(&v), vec!["203.0.113.7:443"]);
        assert_eq!(
            rule(&decide(&l, &r, "pkg.example", 80)),
            "allow pkg.example"
        );
        assert_eq!(
            rule(&decide(&l, &r, "pkg.example", 22)),
            RULE_PORT_NOT_ALLOWED
        );
        assert_eq!(
            rule(&decide(&l, &r, "other.example", 443)),
            RULE_NOT_ON_ALLOWLIST
        );
        assert_eq!(
            rule(&decide(&l, &r, "a.pkg.example", 443)),
            RULE_NOT_ON_ALLOWLIST
        );
    }

    #[test]
    fn wildcard_entry_allows_subdomains_not_the_apex() {
        let l = list(&["*.example.org:8443"]);
        let r = resolver(&[
            ("a.example.org", "203.0.113.1"),
            ("a.b.example.org", "203.0.113.2"),
            ("example.org", "203.0.113.3"),
        ]);
        assert_eq!(
            rule(&decide(&l, &r, "a.example.org", 8443)),
            "allow *.example.org:8443"
        );
        assert_eq!(
            rule(&decide(&l, &r, "a.b.example.org", 8443)),
            "allow *.example.org:8443"
        );
        assert_eq!(
            rule(&decide(&l, &r, "example.org", 8443)),
            RULE_NOT_ON_ALLOWLIST
        );
        assert_eq!(
            rule(&decide(&l, &r, "a.example.org", 443)),
            RULE_PORT_NOT_ALLOWED
        );
    }

    #[test]
    fn ip_literal_must_be_listed_itself_even_when_public() {
        let l = list(&["pkg.example", "203.0.113.9:8080"]);
        let r = no_dns();
        let v = decide(&l, &r, "203.0.113.10", 443);
        assert_eq!(rule(&v), RULE_NOT_ON_ALLOWLIST);
        assert!(message(&v).contains("must be listed"));
        assert_eq!(
            rule(&decide(&l, &r, "203.0.113.9", 8080)),
            "allow 203.0.113.9:8080"
        );
        assert_eq!(
            rule(&decide(&l, &r, "203.0.113.9", 443)),
            RULE_PORT_NOT_ALLOWED
        );
        assert_eq!(
            rule(&decide(&l, &r, "::ffff:203.0.113.9", 8080)),
            "allow 203.0.113.9:8080"
        );
    }

    #[test]
    fn listed_private_ip_is_allowed() {
        let l = list(&["10.0.0.5:5432", "[fd00::1]:443", "fd00::2"]);
        let r = no_dns();
        assert_eq!(
            addrs(&decide(&l, &r, "10.0.0.5", 5432)),
            vec!["10.0.0.5:5432"]
        );
        assert_eq!(
            addrs(&decide(&l, &r, "[fd00::1]", 443)),
            vec!["[fd00::1]:443"]
        );
        assert_eq!(
            addrs(&decide(&l, &r, "fd00::1", 443)),
            vec!["[fd00::1]:443"]
        );
        assert_eq!(addrs(&decide(&l, &r, "fd00::2", 80)), vec!["[fd00::2]:80"]);
        assert_eq!(
            rule(&decide(&l, &r, "10.0.0.6", 5432)),
            RULE_NOT_ON_ALLOWLIST
        );
    }

    #[test]
    fn localhost_entry_maps_loopback_spellings_to_the_hosts_loopback() {
        let l = list(&["localhost:11434"]);
        let r = no_dns();
        for host in [
            "localhost",
            "LOCALHOST.",
            "127.0.0.1",
            "::1",
            "[::1]",
            "::ffff:127.0.0.1",
        ] {
            let v = decide(&l, &r, host, 11434);
            assert_eq!(rule(&v), "allow localhost:11434", "{host}");
            assert_eq!(addrs(&v), vec!["127.0.0.1:11434", "[::1]:11434"], "{host}");
        }
        assert_eq!(
            rule(&decide(&l, &r, "localhost", 11435)),
            RULE_PORT_NOT_ALLOWED
        );
        assert_eq!(
            rule(&decide(&l, &r, "127.0.0.2", 11434)),
            RULE_NOT_ON_ALLOWLIST
        );
        assert_eq!(
            rule(&decide(&list(&[]), &r, "localhost", 80)),
            RULE_NOT_ON_ALLOWLIST
        );
    }

    #[test]
    fn dns_rebinding_to_private_address_is_refused() {
        let l = list(&["pkg.example"]);
        let r = resolver(&[("pkg.example", "10.0.0.7")]);
        let v = decide(&l, &r, "pkg.example", 443);
        assert_eq!(rule(&v), RULE_RESOLVES_TO_REFUSED);
        assert_eq!(
            message(&v),
            "pkg.example resolves to 10.0.0.7 (private-address)"
        );
    }

    #[test]
    fn dns_rebinding_keeps_only_the_public_addresses() {
        let l = list(&["pkg.example"]);
        let r = resolver(&[
            ("pkg.example", "203.0.113.7"),
            ("pkg.example", "127.0.0.1"),
            ("pkg.example", "::ffff:169.254.169.254"),
            ("pkg.example", "2001:db8::7"),
        ]);
        let v = decide(&l, &r, "pkg.example", 443);
        assert_eq!(addrs(&v), vec!["203.0.113.7:443", "[2001:db8::7]:443"]);
    }

    #[test]
    fn metadata_address_is_refused_even_by_name() {
        let l = list(&["metadata.example", "*.internal.example"]);
        for addr in [
            "169.254.169.254",
            "fd00:ec2::254",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
        ] {
            let r = resolver(&[("metadata.example", addr), ("x.internal.example", addr)]);
            for name in ["metadata.example", "x.internal.example"] {
                let v = decide(&l, &r, name, 80);
                assert_eq!(rule(&v), RULE_RESOLVES_TO_REFUSED, "{name} {addr}");
                assert!(message(&v).contains("metadata-address"), "{}", message(&v));
            }
            assert_eq!(rule(&decide(&l, &r, addr, 80)), RULE_NOT_ON_ALLOWLIST);
        }
    }

    #[test]
    fn resolved_address_listed_as_ip_entry_is_exempt() {
        let l = list(&["db.example:5432", "10.0.0.8:5432"]);
        let r = resolver(&[("db.example", "10.0.0.8"), ("db.example", "10.0.0.9")]);
        assert_eq!(
            addrs(&decide(&l, &r, "db.example", 5432)),
            vec!["10.0.0.8:5432"]
        );
        // The listing is per port.
        let l = list(&["db.example:5432", "10.0.0.8:80"]);
        assert_eq!(
            rule(&decide(&l, &r, "db.example", 5432)),
            RULE_RESOLVES_TO_REFUSED
        );
    }

    #[test]
    fn loopback_by_name_is_refused_even_with_a_localhost_entry() {
        let l = list(&["evil.example", "localhost:443"]);
        let r = resolver(&[("evil.example", "127.0.0.1")]);
        let v = decide(&l, &r, "evil.example", 443);
        assert_eq!(rule(&v), RULE_RESOLVES_TO_REFUSED);
        assert!(message(&v).contains("loopback-address"));
    }

    #[test]
    fn odd_numeric_hosts_are_refused_without_resolution() {
        // The overrides would make them resolve if they were ever looked up.
        let odd = [
            "0x7f.1",
            "2130706433",
            "127.1",
            "0177.0.0.1",
            "127.0.0.1.",
            "1.2.3.4.5",
        ];
        let pairs: Vec<(&str, &str)> = odd.iter().map(|h| (*h, "203.0.113.1")).collect();
        let r = resolver(&pairs);
        let mut entries: Vec<String> = vec!["*.example.org".into()];
        entries.extend(
            odd.iter()
                .map(|h| format!("*.{h}"))
                .filter(|e| Allowlist::parse(&[e.as_str()]).is_ok()),
        );
        let l = Allowlist::parse(&entries).unwrap();
        for host in odd {
            let v = decide(&l, &r, host, 443);
            assert_eq!(rule(&v), RULE_BAD_HOST, "{host}");
        }
        for host in [
            "",
            "a b",
            "a\r\nHost: x",
            "exämple.org",
            "[127.0.0.1]",
            "*.example.org",
        ] {
            assert_eq!(rule(&decide(&l, &r, host, 443)), RULE_BAD_HOST, "{host:?}");
        }
    }

    #[test]
    fn spellings_that_try_to_slip_past_the_allowlist_are_refused() {
        let l = list(&["*.example.org", "pkg.example", "localhost:80"]);
        // Every name resolves, so a refusal is the policy's, not DNS's.
        let names = [
            "evilexample.org",
            "example.org.evil.test",
            "a.example.org.evil.test",
            "example.org",
            "pkg.example.evil.test",
            "evilpkg.example",
            "localhost.localdomain",
            "a.localhost",
        ];
        let pairs: Vec<(&str, &str)> = names.iter().map(|n| (*n, "203.0.113.1")).collect();
        let r = resolver(&pairs);
        for host in names {
            assert_eq!(
                rule(&decide(&l, &r, host, 80)),
                RULE_NOT_ON_ALLOWLIST,
                "{host}"
            );
        }
        for host in [
            "a.example.org..",
            ".a.example.org",
            "a%2eexample.org",
            "a.example.org%00",
            "a.example.org\0",
            "user@a.example.org",
            "a.example.org:80",
            "a.example.org/",
            "a.example.org\\",
            "*.example.org",
            "\u{ff41}.example.org",
            "a.exa\u{301}mple.org",
            "fe80::1%eth0",
            "[fe80::1%25eth0]",
            "[fe80::1%eth0]",
            "127.1",
            "0177.0.0.1",
            "0x7f000001",
            "0",
            "0x0",
            "[127.0.0.1]",
            "[::1",
            "::1]",
        ] {
            assert_eq!(rule(&decide(&l, &r, host, 80)), RULE_BAD_HOST, "{host:?}");
        }
        // The host's own addresses other than 127.0.0.1 and ::1 by the
        // localhost entry: unspecified, other loopback, embeddings.
        for host in [
            "0.0.0.0",
            "::",
            "[::]",
            "::ffff:0.0.0.0",
            "127.0.0.2",
            "::127.0.0.1",
            "::ffff:0:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "169.254.169.254",
            "[fd00:ec2::254]",
        ] {
            assert_eq!(
                rule(&decide(&l, &r, host, 80)),
                RULE_NOT_ON_ALLOWLIST,
                "{host}"
            );
        }
        // Case and one trailing dot are the same name.
        assert_eq!(
            rule(&decide(&l, &r, "A.Example.ORG.", 80)),
            RULE_NAME_NOT_RESOLVED
        );
    }

    #[test]
    fn unresolvable_name_is_refused() {
        let l = list(&["pkg.example"]);
        let v = decide(&l, &no_dns(), "pkg.example", 443);
        assert_eq!(rule(&v), RULE_NAME_NOT_RESOLVED);
        assert!(message(&v).contains("pkg.example"));
    }
}
