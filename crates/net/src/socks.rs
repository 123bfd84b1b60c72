//! SOCKS5 (RFC 1928), both ends: the proxy's server side and the client
//! handshake the sandbox's port forwarder performs.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Reply: succeeded.
pub(crate) const REP_OK: u8 = 0x00;
/// Reply: general SOCKS server failure.
pub(crate) const REP_GENERAL_FAILURE: u8 = 0x01;
/// Reply: connection not allowed by ruleset.
pub(crate) const REP_NOT_ALLOWED: u8 = 0x02;
/// Reply: network unreachable.
pub(crate) const REP_NETWORK_UNREACHABLE: u8 = 0x03;
/// Reply: host unreachable.
pub(crate) const REP_HOST_UNREACHABLE: u8 = 0x04;
/// Reply: connection refused.
pub(crate) const REP_CONNECTION_REFUSED: u8 = 0x05;
/// Reply: command not supported.
pub(crate) const REP_COMMAND_NOT_SUPPORTED: u8 = 0x07;
/// Reply: address type not supported.
pub(crate) const REP_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

const VERSION: u8 = 0x05;
const METHOD_NO_AUTH: u8 = 0x00;
const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;
const CMD_CONNECT: u8 = 0x01;
const ATYP_V4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_V6: u8 = 0x04;

/// What a SOCKS reply code means, as RFC 1928 names it.
pub(crate) fn reply_text(code: u8) -> &'static str {
    match code {
        REP_OK => "succeeded",
        REP_GENERAL_FAILURE => "general SOCKS server failure",
        REP_NOT_ALLOWED => "connection not allowed by ruleset",
        REP_NETWORK_UNREACHABLE => "network unreachable",
        REP_HOST_UNREACHABLE => "host unreachable",
        REP_CONNECTION_REFUSED => "connection refused",
        0x06 => "TTL expired",
        REP_COMMAND_NOT_SUPPORTED => "command not supported",
        REP_ADDRESS_TYPE_NOT_SUPPORTED => "address type not supported",
        _ => "unassigned reply code",
    }
}

/// Performs a SOCKS5 client handshake on `stream` (no authentication,
/// `CONNECT` to `host` given as a domain name, `port`). On success the
/// stream carries the connection. A refusal is an error whose message names
/// the reply code and what it means; its kind follows the code
/// (`PermissionDenied` for "not allowed by ruleset", `ConnectionRefused`,
/// `HostUnreachable`, `NetworkUnreachable`, else `Other`).
pub fn socks5_connect<S: Read + Write + ?Sized>(
    stream: &mut S,
    host: &str,
    port: u16,
) -> io::Result<()> {
    let name = host.as_bytes();
    if name.is_empty() || name.len() > 255 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "SOCKS5 host name must be 1 to 255 bytes, got {}",
                name.len()
            ),
        ));
    }
    stream.write_all(&[VERSION, 1, METHOD_NO_AUTH])?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice)?;
    if choice[0] != VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a SOCKS5 server (version byte {:#04x})", choice[0]),
        ));
    }
    if choice[1] != METHOD_NO_AUTH {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "SOCKS5 server refused unauthenticated access (method {:#04x})",
                choice[1]
            ),
        ));
    }
    let mut request = Vec::with_capacity(7 + name.len());
    request.extend_from_slice(&[VERSION, CMD_CONNECT, 0, ATYP_DOMAIN, name.len() as u8]);
    request.extend_from_slice(name);
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request)?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head)?;
    if head[0] != VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad SOCKS5 reply (version byte {:#04x})", head[0]),
        ));
    }
    let code = head[1];
    // Read the bound address so that the stream is positioned at the data;
    // a refusing server may close early, which is fine then.
    let skipped = skip_address(stream, head[3]);
    if code != REP_OK {
        let kind = match code {
            REP_NOT_ALLOWED => io::ErrorKind::PermissionDenied,
            REP_CONNECTION_REFUSED => io::ErrorKind::ConnectionRefused,
            REP_HOST_UNREACHABLE => io::ErrorKind::HostUnreachable,
            REP_NETWORK_UNREACHABLE => io::ErrorKind::NetworkUnreachable,
            _ => io::ErrorKind::Other,
        };
        return Err(io::Error::new(
            kind,
            format!(
                "SOCKS5 proxy refused {host}:{port}: {} (reply {code:#04x})",
                reply_text(code)
            ),
        ));
    }
    skipped
}

fn skip_address<S: Read + ?Sized>(stream: &mut S, atyp: u8) -> io::Result<()> {
    let len = match atyp {
        ATYP_V4 => 4,
        ATYP_V6 => 16,
        ATYP_DOMAIN => {
            let mut l = [0u8; 1];
            stream.read_exact(&mut l)?;
            usize::from(l[0])
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad SOCKS5 reply (address type {other:#04x})"),
            ))
        }
    };
    let mut rest = vec![0u8; len + 2];
    stream.read_exact(&mut rest)
}

/// The server side of the method negotiation: reads the greeting (after the
/// version byte was seen) and answers. Returns whether "no authentication"
/// was offered (if not, the refusal was sent).
pub(crate) fn server_greeting<S: Read + Write + ?Sized>(stream: &mut S) -> io::Result<bool> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head)?;
    if head[0] != VERSION {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not SOCKS5"));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut methods)?;
    if methods.contains(&METHOD_NO_AUTH) {
        stream.write_all(&[VERSION, METHOD_NO_AUTH])?;
        Ok(true)
    } else {
        stream.write_all(&[VERSION, METHOD_NONE_ACCEPTABLE])?;
        Ok(false)
    }
}

/// A SOCKS5 request as the server read it.
pub(crate) enum ServerRequest {
    /// `CONNECT` to this host (a name, or an address written out) and port.
    Connect {
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
    /// A request the proxy does not serve; the reply code to send.
    Unsupported {
        /// Reply code.
        code: u8,
        /// Why.
        why: String,
    },
}

/// Reads the request after the greeting.
pub(crate) fn server_request<S: Read + ?Sized>(stream: &mut S) -> io::Result<ServerRequest> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head)?;
    if head[0] != VERSION {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not SOCKS5"));
    }
    if head[1] != CMD_CONNECT {
        return Ok(ServerRequest::Unsupported {
            code: REP_COMMAND_NOT_SUPPORTED,
            why: format!(
                "SOCKS5 command {:#04x} is not supported (only CONNECT)",
                head[1]
            ),
        });
    }
    let host = match head[3] {
        ATYP_V4 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        ATYP_V6 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a)?;
            Ipv6Addr::from(a).to_string()
        }
        ATYP_DOMAIN => {
            let mut l = [0u8; 1];
            stream.read_exact(&mut l)?;
            let mut name = vec![0u8; usize::from(l[0])];
            stream.read_exact(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        other => {
            return Ok(ServerRequest::Unsupported {
                code: REP_ADDRESS_TYPE_NOT_SUPPORTED,
                why: format!("SOCKS5 address type {other:#04x} is not supported"),
            })
        }
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port)?;
    Ok(ServerRequest::Connect {
        host,
        port: u16::from_be_bytes(port),
    })
}

/// Sends a reply. The bound address is always `0.0.0.0:0`: clients do not
/// need it for `CONNECT`, and the host's own addresses are none of the
/// sandbox's business.
pub(crate) fn server_reply<S: Write + ?Sized>(stream: &mut S, code: u8) -> io::Result<()> {
    stream.write_all(&[VERSION, code, 0, ATYP_V4, 0, 0, 0, 0, 0, 0])
}

/// The reply code for a failed upstream connection.
pub(crate) fn reply_for_connect_error(e: &io::Error) -> u8 {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => REP_CONNECTION_REFUSED,
        io::ErrorKind::NetworkUnreachable => REP_NETWORK_UNREACHABLE,
        io::ErrorKind::HostUnreachable | io::ErrorKind::TimedOut => REP_HOST_UNREACHABLE,
        _ => REP_GENERAL_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::thread;

    #[test]
    fn client_and_server_agree() {
        let (mut c, mut s) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || {
            assert!(server_greeting(&mut s).unwrap());
            let ServerRequest::Connect { host, port } = server_request(&mut s).unwrap() else {
                panic!("unsupported")
            };
            server_reply(&mut s, REP_OK).unwrap();
            s.write_all(b"data").unwrap();
            (host, port)
        });
        socks5_connect(&mut c, "localhost", 11434).unwrap();
        let mut d = [0u8; 4];
        c.read_exact(&mut d).unwrap();
        assert_eq!(&d, b"data");
        assert_eq!(server.join().unwrap(), ("localhost".to_string(), 11434));
    }

    #[test]
    fn client_error_names_the_reply_code() {
        let (mut c, mut s) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || {
            server_greeting(&mut s).unwrap();
            server_request(&mut s).unwrap();
            server_reply(&mut s, REP_NOT_ALLOWED).unwrap();
        });
        let e = socks5_connect(&mut c, "example.org", 443).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let msg = e.to_string();
        assert!(
            msg.contains("not allowed by ruleset") && msg.contains("0x02"),
            "{msg}"
        );
        server.join().unwrap();
    }

    #[test]
    fn client_rejects_overlong_names() {
        let (mut c, _s) = UnixStream::pair().unwrap();
        let e = socks5_connect(&mut c, &"a".repeat(256), 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
