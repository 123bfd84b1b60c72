//! Where a request goes: authorities (`host[:port]`, `[v6][:port]`),
//! absolute-form targets, the `Host` header's agreement with the URL, and
//! the head rewritten for the upstream.

use std::net::Ipv6Addr;

use super::head::Head;
use crate::allow::printable;

/// Splits `host[:port]` or `[v6][:port]` into the host (an IPv6 address
/// without its brackets) and the port.
pub(crate) fn split_authority(s: &str) -> Result<(String, Option<u16>), String> {
    if s.contains('@') {
        return Err("user information in the URL is not supported".into());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("bad authority `{}`", printable(s)))?;
        inner
            .parse::<Ipv6Addr>()
            .map_err(|_| format!("`{}` is not an IPv6 address", printable(inner)))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("bad authority `{}`", printable(s)))?,
            ),
        };
        (inner, port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => {
                if p.contains(':') {
                    return Err("an IPv6 address must be written in brackets".into());
                }
                (h, Some(p))
            }
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port = match port {
        None => None,
        Some(p) => {
            let ok = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            match p.parse::<u16>() {
                Ok(n) if ok && n != 0 => Some(n),
                _ => return Err(format!("bad port `{}`", printable(p))),
            }
        }
    };
    Ok((host.to_string(), port))
}

/// What a request target asks of a proxy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `http://authority/path`.
    Http {
        /// The authority as written.
        authority: String,
        /// Host (an IPv6 address without brackets).
        host: String,
        /// Port (80 unless written).
        port: u16,
        /// The origin-form target to send upstream (`/` at least, no
        /// fragment).
        path: String,
    },
    /// `https://...`: must use CONNECT.
    Https,
    /// Origin form (`/path`) or `*`: a request for a server, not a proxy.
    Origin,
    /// Another scheme.
    Other,
}

/// Parses an absolute-form request target.
pub(crate) fn parse_target(target: &str) -> Result<Target, String> {
    if target.starts_with('/') || target == "*" {
        return Ok(Target::Origin);
    }
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Ok(Target::Https);
    }
    if !lower.starts_with("http://") {
        return Ok(Target::Other);
    }
    let rest = &target[7..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let (host, port) = split_authority(authority)?;
    let mut path = rest[end..].to_string();
    if let Some(i) = path.find('#') {
        path.truncate(i);
    }
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    Ok(Target::Http {
        authority: authority.to_string(),
        host,
        port: port.unwrap_or(80),
        path,
    })
}

/// Whether a `Host` header value names the same host and port as the URL
/// (case-insensitive, trailing dot ignored, port 80 when absent).
pub(crate) fn host_header_matches(value: &[u8], host: &str, port: u16) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let Ok((h, p)) = split_authority(value) else {
        return false;
    };
    let norm = |s: &str| s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    norm(&h) == norm(host) && p.unwrap_or(80) == port
}

/// The head sent upstream: origin-form target, the client's `Host` (or the
/// URL's authority), the client's other fields minus the hop-by-hop ones
/// (`Proxy-Authorization`, `Proxy-Connection`, `Connection`, `Keep-Alive`
/// and the fields `Connection` names, never `Host` or the framing fields),
/// and `Connection: close`.
pub(crate) fn upstream_head(head: &Head, path: &str, authority: &str) -> Vec<u8> {
    let mut named: Vec<String> = Vec::new();
    for v in head.values("connection") {
        for token in String::from_utf8_lossy(v).split(',') {
            let t = token.trim().to_ascii_lowercase();
            if !t.is_empty()
                && !matches!(t.as_str(), "host" | "content-length" | "transfer-encoding")
            {
                named.push(t);
            }
        }
    }
    let hop = |n: &str| {
        let n = n.to_ascii_lowercase();
        matches!(
            n.as_str(),
            "proxy-authorization" | "proxy-connection" | "connection" | "keep-alive" | "host"
        ) || named.contains(&n)
    };
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(format!("{} {} {}\r\n", head.method, path, head.version).as_bytes());
    out.extend_from_slice(b"Host: ");
    match head.values("host").next() {
        Some(v) => out.extend_from_slice(v),
        None => out.extend_from_slice(authority.as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    for (name, value) in &head.headers {
        if hop(name) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::http::head::parse as head;

    #[test]
    fn targets_parse() {
        assert_eq!(
            parse_target("http://A.org:8080/p?q#frag").unwrap(),
            Target::Http {
                authority: "A.org:8080".into(),
                host: "A.org".into(),
                port: 8080,
                path: "/p?q".into()
            }
        );
        assert_eq!(
            parse_target("HTTP://[::1]?x").unwrap(),
            Target::Http {
                authority: "[::1]".into(),
                host: "::1".into(),
                port: 80,
                path: "/?x".into()
            }
        );
        assert_eq!(parse_target("https://a.org/").unwrap(), Target::Https);
        assert_eq!(parse_target("/x").unwrap(), Target::Origin);
        assert_eq!(parse_target("*").unwrap(), Target::Origin);
        assert_eq!(parse_target("ftp://a.org/").unwrap(), Target::Other);
        for bad in [
            "http://u@a.org/",
            "http://a.org:0/",
            "http://a.org:x/",
            "http://:80/",
            "http://[nope]/",
            "http://::1/",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_header_comparison_normalises_case_dot_and_port() {
        assert!(host_header_matches(b"A.org", "a.org", 80));
        assert!(host_header_matches(b"a.org.:80", "a.org", 80));
        assert!(host_header_matches(b"[::1]:8080", "::1", 8080));
        assert!(!host_header_matches(b"b.org", "a.org", 80));
        assert!(!host_header_matches(b"a.org:81", "a.org", 80));
        assert!(!host_header_matches(b"a.org", "a.org", 8080));
    }

    #[test]
    fn upstream_head_drops_hop_by_hop_fields() {
        let h = head(
            "POST http://a.org/x HTTP/1.1\r\nProxy-Authorization: secret\r\nConnection: keep-alive, X-Drop, Content-Length\r\nX-Drop: 1\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\nContent-Length: 3\r\nX-Keep: 2\r\n\r\n",
        )
        .unwrap();
        let out = String::from_utf8(upstream_head(&h, "/x", "a.org")).unwrap();
        assert_eq!(
            out,
            "POST /x HTTP/1.1\r\nHost: a.org\r\nContent-Length: 3\r\nX-Keep: 2\r\nConnection: close\r\n\r\n"
        );
    }
}
