//! What the HTTP front ends (`hako serve`, `hako mcp --http`) check the
//! same way: the bearer token a request carries, and the DNS-rebinding
//! defence on a loopback address (the `Host` must name the listen address
//! or `localhost`, and no `Origin` is accepted: browsers send one, API and
//! MCP clients do not); and what they warn about when they start.

use std::net::SocketAddr;
use std::path::Path;

use crate::token::Digested;

/// Why a request's `Authorization` was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No `Authorization` header, or one that is not `Bearer TOKEN`.
    Missing,
    /// A bearer token, not the server's.
    Wrong,
    /// More than one `Authorization` header.
    Doubled,
}

impl TokenRefusal {
    /// What the client is told (status 401).
    pub fn message(self) -> &'static str {
        match self {
            TokenRefusal::Missing => "a bearer token is required (Authorization: Bearer TOKEN)",
            TokenRefusal::Wrong => {
                "the bearer token is wrong: it is not this server's token (check --token-file, or the token printed when the server started)"
            }
            TokenRefusal::Doubled => {
                "more than one Authorization header; send the bearer token once"
            }
        }
    }
}

/// Checks the values of a request's `Authorization` headers against the
/// server's token: exactly one, of scheme `Bearer` (any case, RFC 9110),
/// whose token's digest equals the server's (compared in constant time).
pub fn check_token<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
    token: &Digested,
) -> Result<(), TokenRefusal> {
    let Some(value) = values.next() else {
        return Err(TokenRefusal::Missing);
    };
    if values.next().is_some() {
        return Err(TokenRefusal::Doubled);
    }
    let value = value.trim_ascii();
    const SCHEME: &[u8] = b"bearer";
    if value.len() <= SCHEME.len()
        || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME)
        || !value[SCHEME.len()].is_ascii_whitespace()
    {
        return Err(TokenRefusal::Missing);
    }
    let given = value[SCHEME.len()..].trim_ascii();
    if given.is_empty() {
        return Err(TokenRefusal::Missing);
    }
    if token.matches(given) {
        Ok(())
    } else {
        Err(TokenRefusal::Wrong)
    }
}

/// The `Host` values accepted when listening on `addr`: on a loopback
/// address, that address and `localhost`, each with the port (and bare too
/// on port 80, where clients leave the port out). `None` off loopback: no
/// list can be known there.
pub fn allowed_hosts(addr: SocketAddr) -> Option<Vec<String>> {
    if !addr.ip().is_loopback() {
        return None;
    }
    let ip = match addr {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    };
    let port = addr.port();
    let mut hosts = vec![format!("{ip}:{port}"), format!("localhost:{port}")];
    if port == 80 {
        hosts.push(ip);
        hosts.push("localhost".into());
    }
    Some(hosts)
}

/// The DNS-rebinding defence for a server listening on `local`: on a
/// loopback address, a `Host` that is not the listen address or
/// `localhost` (with the listen port, or none) is refused, and so is any
/// request carrying an `Origin`. Off loopback the names the server is
/// reached by are not known: nothing is checked (the token is the guard).
/// The error is what the client is told (status 403).
pub fn check_host_and_origin(
    local: SocketAddr,
    host: Option<&[u8]>,
    origin: bool,
) -> Result<(), String> {
    let Some(allowed) = allowed_hosts(local) else {
        return Ok(());
    };
    if origin {
        return Err("a request with an Origin header is refused (a browser page's request; API clients send none)".into());
    }
    let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else {
        return Err("a Host header naming this server is required".into());
    };
    let host = host.trim().to_ascii_lowercase();
    let suffix = format!(":{}", local.port());
    // With the port, or bare (the address or localhost without one).
    let bare = allowed.iter().filter_map(|a| a.strip_suffix(&suffix));
    if allowed.contains(&host) || bare.into_iter().any(|name| name == host) {
        return Ok(());
    }
    Err(format!(
        "the Host {host:?} is not this server's (on a loopback address only {} are accepted): a DNS-rebinding attempt is refused",
        allowed.join(", ")
    ))
}

/// What a server listening on `local` over plain HTTP warns about: a
/// listen address beyond loopback (anyone on the network can reach it,
/// and the token crosses the network in clear).
pub fn listen_warning(local: SocketAddr) -> Option<String> {
    (!local.ip().is_loopback()).then(|| {
        format!(
            "listening on {local}, beyond loopback, over plain HTTP: the bearer token and everything else cross the network unencrypted; listen on 127.0.0.1, or put TLS in front"
        )
    })
}

/// What a server warns about its token file: readable or writable by
/// group or others (another user could read the token and act as you).
pub fn token_file_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o077 != 0).then(|| {
        format!(
            "the token file {} is open to group or others (mode {:04o}): another user could read the token; chmod 600 it",
            path.display(),
            mode & 0o7777
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn token(values: &[&str]) -> Result<(), TokenRefusal> {
        check_token(
            values.iter().map(|v| v.as_bytes()),
            &Digested::new(b"s3cret"),
        )
    }

    #[test]
    fn a_wrong_token_is_told_apart_from_a_missing_one() {
        for ok in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret "] {
            assert_eq!(token(&[ok]), Ok(()), "{ok}");
        }
        for missing in [
            "",
            "Bearer",
            "Bearer ",
            "Basic s3cret",
            "s3cret",
            "Bearers3cret",
        ] {
            assert_eq!(token(&[missing]), Err(TokenRefusal::Missing), "{missing}");
        }
        assert_eq!(token(&[]), Err(TokenRefusal::Missing));
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "Bearer x"] {
            assert_eq!(token(&[wrong]), Err(TokenRefusal::Wrong), "{wrong}");
        }
        assert_eq!(
            token(&["Bearer s3cret", "Bearer s3cret"]),
            Err(TokenRefusal::Doubled)
        );
        assert!(TokenRefusal::Wrong.message().contains("wrong"));
        assert!(!TokenRefusal::Wrong.message().contains("required"));
    }

    #[test]
    fn loopback_allows_only_its_own_address_and_localhost_with_the_port() {
        let v4: SocketAddr = "127.0.0.1:8700".parse().unwrap();
        assert_eq!(
            allowed_hosts(v4).unwrap(),
            ["127.0.0.1:8700", "localhost:8700"]
        );
        let v6: SocketAddr = "[::1]:8700".parse().unwrap();
        assert_eq!(allowed_hosts(v6).unwrap(), ["[::1]:8700", "localhost:8700"]);
        let port80: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(
            allowed_hosts(port80).unwrap(),
            ["127.0.0.1:80", "localhost:80", "127.0.0.1", "localhost"]
        );
        for addr in ["0.0.0.0:8700", "192.0.2.7:8700", "[::]:8700"] {
            assert_eq!(allowed_hosts(addr.parse().unwrap()), None, "{addr}");
        }
    }

    #[test]
    fn a_foreign_host_or_an_origin_on_loopback_is_refused() {
        let local: SocketAddr = "127.0.0.1:8700".parse().unwrap();
        let check = |host: Option<&str>, origin| {
            check_host_and_origin(local, host.map(str::as_bytes), origin)
        };
        for ok in [
            "127.0.0.1:8700",
            "localhost:8700",
            "LOCALHOST:8700",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(check(Some(ok), false).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8700",
            "127.0.0.1.evil.example:8700",
            "localhost:1",
            "evil.example",
            "",
        ] {
            assert!(check(Some(bad), false).is_err(), "{bad}");
        }
        assert!(check(None, false).is_err());
        assert!(check(Some("localhost:8700"), true).is_err());
        // Off loopback, nothing is checked.
        let open: SocketAddr = "0.0.0.0:8700".parse().unwrap();
        assert!(check_host_and_origin(open, Some(b"anything"), true).is_ok());
    }

    #[test]
    fn listening_beyond_loopback_and_a_token_file_open_to_others_are_warned_about() {
        assert!(listen_warning("127.0.0.1:1".parse().unwrap()).is_none());
        assert!(listen_warning("[::1]:1".parse().unwrap()).is_none());
        assert!(listen_warning("0.0.0.0:1".parse().unwrap())
            .unwrap()
            .contains("plain HTTP"));
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "t").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(token_file_warning(&path).is_none());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(token_file_warning(&path).unwrap().contains("0644"));
    }
}
