//! The allowlist: parsed once, checked for every connection.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::classify::normalize;

/// The ports an entry without a port allows: HTTP and HTTPS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// An allowlist entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad allowlist entry `{entry}`: {reason}")]
pub struct AllowError {
    /// The entry as written.
    pub entry: String,
    /// Why it was refused.
    pub reason: String,
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryHost {
    /// One host name, lower case, without a trailing dot.
    Name(String),
    /// `*.SUFFIX`: every name below `SUFFIX`, at any depth, but not `SUFFIX`
    /// itself. Holds `SUFFIX`, lower case.
    Wildcard(String),
    /// One address (a v4-mapped IPv6 address is held as IPv4).
    Ip(IpAddr),
    /// `localhost:PORT`: that port on the host's loopback.
    Localhost,
}

/// One parsed allowlist entry.
///
/// The forms (names are case-insensitive; a trailing dot is ignored):
/// - `HOST` allows ports 80 and 443 of `HOST`; `HOST:PORT` that port only.
/// - `*.example.org[:PORT]` allows every subdomain of `example.org` at any
///   depth (`a.example.org`, `a.b.example.org`) but not `example.org`.
/// - An IP literal, `10.0.0.5`, `10.0.0.5:8080`, `[fd00::1]:443`, `[fd00::1]`
///   or `fd00::1` (a bare IPv6 address has no port). Listing an address
///   exempts it from the refusal of private, loopback and other special
///   addresses ([`crate::classify`]).
/// - `localhost:PORT` (the port is required): that port on the host's
///   loopback, reached when the sandbox asks for `localhost`, `127.0.0.1` or
///   `::1` with that port.
/// - A URL of one of the forms above, `http://HOST[:PORT][/]` or
///   `https://HOST[:PORT][/]`: that host, on the port written, else on 80
///   for `http` and 443 for `https` (only that one). A path, query,
///   fragment, user name or other scheme is refused: entries allow hosts
///   and ports, never paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    host: EntryHost,
    port: Option<u16>,
}

impl AllowEntry {
    /// What the entry names.
    pub fn host(&self) -> &EntryHost {
        &self.host
    }

    /// The port written, or `None` for the default ports ([`DEFAULT_PORTS`]).
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether the entry allows `port`.
    pub fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    /// Whether the entry's host part covers the name `name` (lower case,
    /// without a trailing dot).
    fn matches_name(&self, name: &str) -> bool {
        match &self.host {
            EntryHost::Name(n) => n == name,
            EntryHost::Wildcard(suffix) => name
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            EntryHost::Ip(_) | EntryHost::Localhost => false,
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (EntryHost::Name(n), None) => write!(f, "{n}"),
            (EntryHost::Name(n), Some(p)) => write!(f, "{n}:{p}"),
            (EntryHost::Wildcard(s), None) => write!(f, "*.{s}"),
            (EntryHost::Wildcard(s), Some(p)) => write!(f, "*.{s}:{p}"),
            (EntryHost::Ip(IpAddr::V4(a)), None) => write!(f, "{a}"),
            (EntryHost::Ip(IpAddr::V4(a)), Some(p)) => write!(f, "{a}:{p}"),
            (EntryHost::Ip(IpAddr::V6(a)), None) => write!(f, "[{a}]"),
            (EntryHost::Ip(IpAddr::V6(a)), Some(p)) => write!(f, "[{a}]:{p}"),
            (EntryHost::Localhost, None) => write!(f, "localhost"),
            (EntryHost::Localhost, Some(p)) => write!(f, "localhost:{p}"),
        }
    }
}

/// The parsed allowlist. Empty allows nothing.
///
/// See [`AllowEntry`] for the entry forms and [`crate::decide`] for how a
/// destination is checked against them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<AllowEntry>,
}

impl Allowlist {
    /// Parses every entry; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allowlist, AllowError> {
        let mut parsed: Vec<AllowEntry> = Vec::with_capacity(entries.len());
        for raw in entries {
            let raw = raw.as_ref();
            let entry = parse_entry(raw).map_err(|reason| AllowError {
                entry: raw.to_string(),
                reason,
            })?;
            if !parsed.contains(&entry) {
                parsed.push(entry);
            }
        }
        Ok(Allowlist { entries: parsed })
    }

    /// The entries, in the order written, without duplicates.
    pub fn entries(&self) -> &[AllowEntry] {
        &self.entries
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The ports of the `localhost:PORT` entries, sorted, without duplicates:
    /// the host ports to forward into the sandbox.
    pub fn forwarded_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .entries
            .iter()
            .filter(|e| e.host == EntryHost::Localhost)
            .filter_map(|e| e.port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The entries joined for a message, at most `max` of them.
    pub(crate) fn summary(&self, max: usize) -> String {
        if self.entries.is_empty() {
            return "nothing".to_string();
        }
        let mut out: Vec<String> = self
            .entries
            .iter()
            .take(max)
            .map(|e| e.to_string())
            .collect();
        if self.entries.len() > max {
            out.push(format!("and {} more", self.entries.len() - max));
        }
        out.join(", ")
    }

    /// The first name or wildcard entry covering `name` with `port`, and
    /// whether any covered the name with another port.
    pub(crate) fn match_name(
        &self,
        name: &str,
        port: u16,
    ) -> (Option<&AllowEntry>, Vec<&AllowEntry>) {
        let covering: Vec<&AllowEntry> = self
            .entries
            .iter()
            .filter(|e| e.matches_name(name))
            .collect();
        let hit = covering.iter().copied().find(|e| e.allows_port(port));
        (hit, covering)
    }

    /// The IP entry listing `ip` (normalised) with `port`.
    pub(crate) fn match_ip(&self, ip: IpAddr, port: u16) -> Option<&AllowEntry> {
        let ip = normalize(ip);
        self.entries
            .iter()
            .find(|e| e.host == EntryHost::Ip(ip) && e.allows_port(port))
    }

    /// Every IP entry listing `ip`, whatever the port.
    pub(crate) fn ip_entries(&self, ip: IpAddr) -> Vec<&AllowEntry> {
        let ip = normalize(ip);
        self.entries
            .iter()
            .filter(|e| e.host == EntryHost::Ip(ip))
            .collect()
    }

    /// The `localhost:PORT` entry for `port`.
    pub(crate) fn match_localhost(&self, port: u16) -> Option<&AllowEntry> {
        self.entries
            .iter()
            .find(|e| e.host == EntryHost::Localhost && e.port == Some(port))
    }

    /// Every `localhost:PORT` entry.
    pub(crate) fn localhost_entries(&self) -> Vec<&AllowEntry> {
        self.entries
            .iter()
            .filter(|e| e.host == EntryHost::Localhost)
            .collect()
    }
}

/// A destination host as the proxy is asked for it, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetHost {
    /// A host name: lower case, no trailing dot, every label valid.
    Name(String),
    /// A strict IP literal (normalised).
    Ip(IpAddr),
}

/// Validates a destination host: a strict IP literal (IPv6 with or without
/// brackets) or a valid host name. Anything else, including the numeric
/// spellings that `inet_aton` and `getaddrinfo` accept (`127.1`,
/// `2130706433`, `0x7f.1`), is an error, so it never reaches a resolver.
pub(crate) fn parse_target_host(host: &str) -> Result<TargetHost, String> {
    let inner = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if let Some(inner) = inner {
        return match inner.parse::<Ipv6Addr>() {
            Ok(v6) => Ok(TargetHost::Ip(normalize(IpAddr::V6(v6)))),
            Err(_) => Err(format!("`{}` is not an IPv6 address", printable(host))),
        };
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(TargetHost::Ip(normalize(ip)));
    }
    let name = normalize_name(host);
    match check_name(&name) {
        Ok(()) => Ok(TargetHost::Name(name)),
        Err(why) => Err(format!(
            "`{}` is not a valid host name or IP address: {why}",
            printable(host)
        )),
    }
}

/// Lower case, one trailing dot removed.
pub(crate) fn normalize_name(name: &str) -> String {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.to_ascii_lowercase()
}

/// Checks a normalised host name: ASCII letters, digits, `-` and `_`, labels
/// of 1 to 63 characters not starting or ending with `-`, at most 253
/// characters, and a last label that is not numeric (a numeric last label
/// is how an IPv4 address in another spelling looks).
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if !name.is_ascii() {
        return Err("not ASCII (write an internationalised name in its xn-- form)");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("bad character (allowed: letters, digits, `-`, `_`, `.`)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with `-`");
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.len() > 2
            && last[..2].eq_ignore_ascii_case("0x")
            && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err("looks like a numeric IP address but is not one in standard form");
    }
    Ok(())
}

/// `s` with everything but printable ASCII escaped, at most 300 characters:
/// safe to put in a message or a log line.
pub(crate) fn printable(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if out.len() >= 300 {
            out.push_str("...");
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

fn parse_port(p: &str) -> Result<u16, String> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{}` is not a port number", printable(p)));
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
        _ => Err(format!("port {p} is out of range (1 to 65535)")),
    }
}

/// An entry written as a URL, `SCHEME://HOST[:PORT][/]`: the host and the
/// port, 80 for `http` and 443 for `https` when none is written. A path,
/// query or fragment is refused (the proxy allows hosts and ports, and
/// cannot see the path of an HTTPS request), as are credentials and other
/// schemes.
fn parse_url_entry(scheme: &str, rest: &str) -> Result<AllowEntry, String> {
    let default_port: u16 = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => {
            return Err(format!(
                "`{}://` is not a scheme an allow entry takes: write the host (`example.org` or \
                 `example.org:PORT`), or an http:// or https:// URL of it",
                printable(scheme)
            ))
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if !tail.is_empty() && tail != "/" {
        return Err(format!(
            "allow entries are hosts, not URLs with a path (`{}`): write `{}://{}` \
             (a host is allowed whole; the proxy cannot see the path of an HTTPS request)",
            printable(tail),
            printable(scheme),
            printable(authority)
        ));
    }
    if authority.contains('@') {
        return Err(
            "a URL with a user name or password is not an allow entry: write its host".to_string(),
        );
    }
    if authority.is_empty() {
        return Err("no host in the URL".to_string());
    }
    let has_port = match authority.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .is_some_and(|(_, after)| !after.is_empty()),
        None => match authority.bytes().filter(|&b| b == b':').count() {
            0 => false,
            1 => true,
            _ => {
                return Err(
                    "an IPv6 address in a URL is written in brackets (`http://[ADDR]:PORT`)"
                        .to_string(),
                )
            }
        },
    };
    if has_port {
        parse_entry(authority)
    } else {
        parse_entry(&format!("{authority}:{default_port}"))
    }
}

fn parse_entry(raw: &str) -> Result<AllowEntry, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("empty entry".to_string());
    }
    if !s.is_ascii() {
        return Err("not ASCII (write an internationalised name in its xn-- form)".to_string());
    }
    if let Some((scheme, rest)) = s.split_once("://") {
        return parse_url_entry(scheme, rest);
    }
    // Bracketed IPv6, with or without a port.
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| "`[` without `]`".to_string())?;
        let v6: Ipv6Addr = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(p) => Some(parse_port(p)?),
                None => return Err("expected `:PORT` after `]`".to_string()),
            },
        };
        return Ok(AllowEntry {
            host: EntryHost::Ip(normalize(IpAddr::V6(v6))),
            port,
        });
    }
    // A bare IPv6 address (two colons or more) has no port.
    if s.bytes().filter(|&b| b == b':').count() > 1 {
        let v6: Ipv6Addr = s.parse().map_err(|_| {
            "not an IPv6 address (write an IPv6 address with a port as `[ADDR]:PORT`)".to_string()
        })?;
        return Ok(AllowEntry {
            host: EntryHost::Ip(normalize(IpAddr::V6(v6))),
            port: None,
        });
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_port(p)?)),
        None => (s, None),
    };
    if host.is_empty() {
        return Err("no host before the port".to_string());
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(AllowEntry {
            host: EntryHost::Ip(normalize(ip)),
            port,
        });
    }
    let name = normalize_name(host);
    if name == "localhost" {
        if port.is_none() {
            return Err("`localhost` needs a port (`localhost:PORT`)".to_string());
        }
        return Ok(AllowEntry {
            host: EntryHost::Localhost,
            port,
        });
    }
    if name == "*" {
        return Err("a bare `*` is not allowed (list domains, e.g. `*.example.org`)".to_string());
    }
    if let Some(suffix) = name.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(
                "`*` is allowed only as a whole leading label (`*.example.org`)".to_string(),
            );
        }
        check_name(suffix).map_err(|why| format!("bad domain after `*.`: {why}"))?;
        return Ok(AllowEntry {
            host: EntryHost::Wildcard(suffix.to_string()),
            port,
        });
    }
    if name.contains('*') {
        return Err("`*` is allowed only as a whole leading label (`*.example.org`)".to_string());
    }
    check_name(&name)?;
    Ok(AllowEntry {
        host: EntryHost::Name(name),
        port,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn one(s: &str) -> AllowEntry {
        Allowlist::parse(&[s]).unwrap().entries()[0].clone()
    }

    fn bad(s: &str) -> String {
        let e = Allowlist::parse(&[s]).unwrap_err();
        assert_eq!(e.entry, s);
        e.to_string()
    }

    #[test]
    fn good_entries_parse_and_display_normalised() {
        for (input, shown) in [
            ("example.org", "example.org"),
            ("Example.ORG.", "example.org"),
            ("example.org:8443", "example.org:8443"),
            ("*.Example.org", "*.example.org"),
            ("*.example.org:22", "*.example.org:22"),
            ("10.0.0.5", "10.0.0.5"),
            ("10.0.0.5:8080", "10.0.0.5:8080"),
            ("[fd00::1]:443", "[fd00::1]:443"),
            ("[fd00::1]", "[fd00::1]"),
            ("fd00::1", "[fd00::1]"),
            ("[::ffff:10.0.0.5]:80", "10.0.0.5:80"),
            ("localhost:11434", "localhost:11434"),
            ("LOCALHOST.:1", "localhost:1"),
            ("_srv.example.org", "_srv.example.org"),
            ("  a.org  ", "a.org"),
            ("a.org:65535", "a.org:65535"),
        ] {
            assert_eq!(one(input).to_string(), shown, "{input}");
        }
    }

    #[test]
    fn bad_entries_name_the_entry_and_the_reason() {
        for (input, why) in [
            ("", "empty"),
            ("   ", "empty"),
            ("exämple.org", "ASCII"),
            ("exa mple.org", "bad character"),
            ("exa/mple.org", "bad character"),
            ("a..org", "empty label"),
            (".org", "empty label"),
            ("a.org..", "empty label"),
            ("-a.org", "starts or ends"),
            ("a.org:0", "out of range"),
            ("a.org:65536", "out of range"),
            ("a.org:99999999", "not a port"),
            ("a.org:", "not a port"),
            ("a.org:8x", "not a port"),
            ("a.org:-1", "not a port"),
            (":80", "no host"),
            ("*", "bare `*`"),
            ("*:443", "bare `*`"),
            ("*.", "bare `*`"),
            ("*..", "bad domain after"),
            ("a.*.org", "`*` is allowed only"),
            ("*a.org", "`*` is allowed only"),
            ("*.*.org", "`*` is allowed only"),
            ("a*.org", "`*` is allowed only"),
            ("localhost", "needs a port"),
            ("[fd00::1", "without `]`"),
            ("[nope]:1", "not an IPv6"),
            ("[fd00::1]80", "expected `:PORT`"),
            ("fd00::1:x:y", "not an IPv6"),
            ("127.1", "numeric"),
            ("2130706433", "numeric"),
            ("0x7f.1", "numeric"),
            ("a.0x1F", "numeric"),
        ] {
            let msg = bad(input);
            assert!(msg.contains(why), "{input:?}: {msg}");
            assert!(msg.contains(&format!("`{input}`")), "{msg}");
        }
        let long_label = format!("{}.org", "a".repeat(64));
        assert!(bad(&long_label).contains("63"));
        let long_name = format!("{}.org", vec!["a".repeat(60); 5].join("."));
        assert!(bad(&long_name).contains("253"));
        // 63 and 253 are fine.
        one(&format!("{}.org", "a".repeat(63)));
        let (a63, a61) = ("a".repeat(63), "a".repeat(61));
        assert_eq!(
            one(&format!("{a63}.{a63}.{a63}.{a61}")).to_string().len(),
            253
        );
        assert!(bad(&format!("{a63}.{a63}.{a63}.{a61}a")).contains("253"));
    }

    #[test]
    fn url_entries_allow_their_host_and_the_port_of_their_scheme() {
        for (input, shown) in [
            ("http://x", "x:80"),
            ("https://example.org", "example.org:443"),
            ("HTTPS://Example.ORG/", "example.org:443"),
            ("http://example.org:8080", "example.org:8080"),
            ("https://example.org:8443/", "example.org:8443"),
            ("https://*.example.org", "*.example.org:443"),
            ("http://10.0.0.5", "10.0.0.5:80"),
            ("https://[fd00::1]", "[fd00::1]:443"),
            ("http://[fd00::1]:8080", "[fd00::1]:8080"),
            ("http://localhost", "localhost:80"),
            ("http://localhost:11434/", "localhost:11434"),
        ] {
            assert_eq!(one(input).to_string(), shown, "{input}");
        }
        // Only the port of the scheme, not both defaults.
        let e = one("https://example.org");
        assert!(e.allows_port(443) && !e.allows_port(80));
    }

    #[test]
    fn url_entries_with_a_path_or_more_are_refused_with_the_reason() {
        for (input, why) in [
            ("https://example.org/repo", "hosts, not URLs with a path"),
            ("https://example.org/repo", "write `https://example.org`"),
            ("http://x/a/b", "hosts, not URLs with a path"),
            ("http://x?q=1", "hosts, not URLs with a path"),
            ("http://x#frag", "hosts, not URLs with a path"),
            ("http://x//", "hosts, not URLs with a path"),
            ("ftp://example.org", "not a scheme"),
            ("://example.org", "not a scheme"),
            ("http://user:pw@example.org", "user name or password"),
            ("http://", "no host"),
            ("http:///path", "hosts, not URLs with a path"),
            ("http://fd00::1", "in brackets"),
            ("http://x:0", "out of range"),
            ("http://x:http", "not a port"),
            ("http://a..org", "empty label"),
            ("http://127.1", "numeric"),
            ("http://localhost:", "not a port"),
        ] {
            let msg = bad(input);
            assert!(msg.contains(why), "{input:?}: {msg}");
            assert!(msg.contains(&format!("`{input}`")), "{msg}");
        }
    }

    #[test]
    fn default_ports_are_http_and_https() {
        let e = one("example.org");
        assert!(e.allows_port(80) && e.allows_port(443));
        assert!(!e.allows_port(8080) && !e.allows_port(22));
        let e = one("example.org:22");
        assert!(e.allows_port(22) && !e.allows_port(443));
    }

    #[test]
    fn wildcard_matches_any_depth_but_not_the_apex() {
        let list = Allowlist::parse(&["*.example.org"]).unwrap();
        assert!(list.match_name("a.example.org", 443).0.is_some());
        assert!(list.match_name("a.b.example.org", 443).0.is_some());
        assert!(list.match_name("example.org", 443).0.is_none());
        assert!(list.match_name("badexample.org", 443).0.is_none());
        assert!(list.match_name("a.example.org.evil", 443).0.is_none());
        assert!(list.match_name("a.example.org", 8080).0.is_none());
        assert_eq!(list.match_name("a.example.org", 8080).1.len(), 1);
    }

    #[test]
    fn forwarded_ports_are_sorted_and_deduplicated() {
        let list = Allowlist::parse(&[
            "localhost:9000",
            "a.org",
            "localhost:11434",
            "LocalHost:9000",
            "127.0.0.1:5",
        ])
        .unwrap();
        assert_eq!(list.forwarded_ports(), vec![9000, 11434]);
        assert_eq!(list.entries().len(), 4);
    }

    #[test]
    fn target_hosts_are_strict() {
        assert_eq!(
            parse_target_host("Example.org.").unwrap(),
            TargetHost::Name("example.org".into())
        );
        assert_eq!(
            parse_target_host("[::1]").unwrap(),
            TargetHost::Ip("::1".parse().unwrap())
        );
        assert_eq!(
            parse_target_host("::ffff:127.0.0.1").unwrap(),
            TargetHost::Ip("127.0.0.1".parse().unwrap())
        );
        for odd in [
            "127.1",
            "2130706433",
            "0x7f.1",
            "0x7f000001",
            "017700000001",
            "127.0.0.01",
            "1.2.3.4.5",
            "[127.0.0.1]",
            "a b",
            "",
            "exa\r\nmple",
            "a@b.org",
        ] {
            assert!(parse_target_host(odd).is_err(), "{odd:?}");
        }
    }
}
