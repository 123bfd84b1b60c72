//! The HTTP/1.x pieces the proxy needs: a bounded request-head parser,
//! authority and URL parsing, the upstream head rewrite, and body framing.
//!
//! The parser is strict where leniency would let the proxy and the upstream
//! disagree about where a request ends (request smuggling): obsolete line
//! folding, bare CR, both `Content-Length` and `Transfer-Encoding`, and
//! disagreeing `Content-Length`s are all refused.

use std::io::{self, BufRead, Write};
use std::net::Ipv6Addr;

use crate::allow::printable;

/// The most bytes a request head (request line and header fields) may have.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields (and, separately, trailer fields) a request may
/// have.
pub(crate) const MAX_HEADERS: usize = 100;
/// The longest chunk-size line.
const MAX_CHUNK_LINE: usize = 4096;

/// Why a request head could not be read.
#[derive(Debug)]
pub(crate) enum HeadError {
    /// Over the size or field-count limit (431).
    TooLarge(&'static str),
    /// Malformed (400).
    Bad(String),
    /// The client closed before a complete head.
    Eof,
    /// Reading failed (a timeout included).
    Io(io::Error),
}

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) version: &'static str,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// Every value of the header `name` (case-insensitive).
    pub(crate) fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Reads one line of at most `limit` bytes (terminator included), without
/// its `\n` or `\r\n`.
fn read_line<R: BufRead + ?Sized>(
    r: &mut R,
    line: &mut Vec<u8>,
    limit: usize,
    what: &'static str,
) -> Result<(), HeadError> {
    line.clear();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Io(e)),
        };
        if buf.is_empty() {
            return Err(HeadError::Eof);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                if line.len() + i + 1 > limit {
                    return Err(HeadError::TooLarge(what));
                }
                line.extend_from_slice(&buf[..i]);
                r.consume(i + 1);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.contains(&b'\r') {
                    return Err(HeadError::Bad("bare CR in the request head".into()));
                }
                return Ok(());
            }
            None => {
                let n = buf.len();
                if line.len() + n > limit {
                    return Err(HeadError::TooLarge(what));
                }
                line.extend_from_slice(buf);
                r.consume(n);
            }
        }
    }
}

/// Reads a request head: at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`]
/// fields.
pub(crate) fn read_head<R: BufRead + ?Sized>(r: &mut R) -> Result<Head, HeadError> {
    let mut budget = MAX_HEAD_BYTES;
    let mut line = Vec::new();
    // A client may send CRLFs before the request line (RFC 9112, 2.2).
    loop {
        read_line(r, &mut line, budget, "request head too large")?;
        budget -= line.len() + 1;
        if !line.is_empty() {
            break;
        }
    }
    let text = std::str::from_utf8(&line)
        .map_err(|_| HeadError::Bad("request line is not ASCII".into()))?;
    let parts: Vec<&str> = text.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(HeadError::Bad(format!(
            "malformed request line `{}`",
            printable(text)
        )));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(HeadError::Bad(format!(
            "bad method `{}`",
            printable(method)
        )));
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HeadError::Bad(format!(
            "bad request target `{}`",
            printable(target)
        )));
    }
    let version = match version {
        "HTTP/1.1" => "HTTP/1.1",
        "HTTP/1.0" => "HTTP/1.0",
        other => {
            return Err(HeadError::Bad(format!(
                "unsupported HTTP version `{}` (HTTP/1.0 or HTTP/1.1 only)",
                printable(other)
            )))
        }
    };
    let (method, target) = (method.to_string(), target.to_string());
    let headers = read_fields(r, &mut budget, "request head too large")?;
    Ok(Head {
        method,
        target,
        version,
        headers,
    })
}

/// Reads header (or trailer) fields up to the empty line.
fn read_fields<R: BufRead + ?Sized>(
    r: &mut R,
    budget: &mut usize,
    what: &'static str,
) -> Result<Vec<(String, Vec<u8>)>, HeadError> {
    let mut fields = Vec::new();
    let mut line = Vec::new();
    loop {
        read_line(r, &mut line, *budget, what)?;
        *budget -= line.len() + 1;
        if line.is_empty() {
            return Ok(fields);
        }
        if fields.len() == MAX_HEADERS {
            return Err(HeadError::TooLarge("too many header fields"));
        }
        fields.push(parse_field(&line)?);
    }
}

fn parse_field(line: &[u8]) -> Result<(String, Vec<u8>), HeadError> {
    if line[0] == b' ' || line[0] == b'\t' {
        return Err(HeadError::Bad(
            "obsolete line folding in a header field".into(),
        ));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| HeadError::Bad("header field without `:`".into()))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(HeadError::Bad(format!(
            "bad header field name `{}`",
            printable(&String::from_utf8_lossy(name))
        )));
    }
    let value = trim_ows(&line[colon + 1..]);
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HeadError::Bad(
            "control character in a header field value".into(),
        ));
    }
    // `name` is all tchar, hence ASCII.
    Ok((String::from_utf8_lossy(name).into_owned(), value.to_vec()))
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

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

/// How a request body is delimited.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The elements of a comma-separated field value, each without the
/// optional whitespace (space and tab only) around it. Nothing else is
/// trimmed: what the proxy reads must be what the upstream reads.
fn list_elements(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(trim_ows)
}

/// The request's body framing, or why it is ambiguous.
pub(crate) fn framing(head: &Head) -> Result<Framing, String> {
    let te: Vec<&[u8]> = head.values("transfer-encoding").collect();
    let cl: Vec<&[u8]> = head.values("content-length").collect();
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err("both Content-Length and Transfer-Encoding".into());
        }
        if head.version == "HTTP/1.0" {
            return Err("Transfer-Encoding in an HTTP/1.0 request".into());
        }
        let codings: Vec<String> = te
            .iter()
            .flat_map(|v| list_elements(v))
            .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase())
            .collect();
        let chunked = codings.iter().filter(|c| *c == "chunked").count();
        if chunked != 1 || codings.last().map(String::as_str) != Some("chunked") {
            return Err("Transfer-Encoding must end in a single `chunked`".into());
        }
        return Ok(Framing::Chunked);
    }
    let mut length: Option<u64> = None;
    for v in cl {
        for part in list_elements(v) {
            let part = String::from_utf8_lossy(part);
            if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("bad Content-Length `{}`", printable(&part)));
            }
            let n: u64 = part
                .parse()
                .map_err(|_| format!("bad Content-Length `{}`", printable(&part)))?;
            if length.is_some_and(|l| l != n) {
                return Err("disagreeing Content-Length values".into());
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(n) => Framing::Length(n),
        None => Framing::None,
    })
}

/// Why a request body could not be forwarded.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Malformed chunked framing.
    Bad(String),
    /// Reading the client or writing upstream failed.
    Io(io::Error),
}

impl From<io::Error> for BodyError {
    fn from(e: io::Error) -> Self {
        BodyError::Io(e)
    }
}

/// Copies `n` bytes from `r` to `w`.
fn copy_exact<R: BufRead + ?Sized, W: Write + ?Sized>(
    r: &mut R,
    w: &mut W,
    mut n: u64,
) -> io::Result<()> {
    while n > 0 {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed in the middle of the request body",
            ));
        }
        let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        w.write_all(&buf[..take])?;
        r.consume(take);
        n -= take as u64;
    }
    Ok(())
}

/// Forwards the body `framing` describes from `r` to `w`, and nothing
/// after it. Returns the bytes written.
pub(crate) fn forward_body<R: BufRead + ?Sized, W: Write + ?Sized>(
    r: &mut R,
    w: &mut W,
    framing: &Framing,
) -> Result<u64, BodyError> {
    match *framing {
        Framing::None => Ok(0),
        Framing::Length(n) => {
            copy_exact(r, w, n)?;
            Ok(n)
        }
        Framing::Chunked => forward_chunked(r, w),
    }
}

fn head_to_body(e: HeadError) -> BodyError {
    match e {
        HeadError::TooLarge(what) => BodyError::Bad(what.to_string()),
        HeadError::Bad(why) => BodyError::Bad(why),
        HeadError::Eof => BodyError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "client closed in the middle of the chunked body",
        )),
        HeadError::Io(e) => BodyError::Io(e),
    }
}

/// Relays a chunked body chunk by chunk: each size line is parsed and
/// written again in canonical form (extensions dropped), each chunk's data
/// copied exactly, and the trailer fields after the last chunk checked and
/// passed on.
fn forward_chunked<R: BufRead + ?Sized, W: Write + ?Sized>(
    r: &mut R,
    w: &mut W,
) -> Result<u64, BodyError> {
    let mut total: u64 = 0;
    let mut line = Vec::new();
    loop {
        read_line(r, &mut line, MAX_CHUNK_LINE, "chunk-size line too long")
            .map_err(head_to_body)?;
        let size_part = line
            .iter()
            .position(|&b| b == b';')
            .map_or(&line[..], |i| &line[..i]);
        let size_part = trim_ows(size_part);
        if size_part.is_empty()
            || size_part.len() > 15
            || !size_part.iter().all(u8::is_ascii_hexdigit)
        {
            return Err(BodyError::Bad(format!(
                "bad chunk size `{}`",
                printable(&String::from_utf8_lossy(size_part))
            )));
        }
        let size = u64::from_str_radix(&String::from_utf8_lossy(size_part), 16)
            .map_err(|_| BodyError::Bad("bad chunk size".into()))?;
        let size_line = format!("{size:x}\r\n");
        w.write_all(size_line.as_bytes())?;
        total += size_line.len() as u64;
        if size == 0 {
            break;
        }
        copy_exact(r, w, size)?;
        read_line(r, &mut line, 2, "missing CRLF after chunk data").map_err(head_to_body)?;
        if !line.is_empty() {
            return Err(BodyError::Bad("missing CRLF after chunk data".into()));
        }
        w.write_all(b"\r\n")?;
        total += size + 2;
    }
    let mut budget = MAX_HEAD_BYTES;
    let trailers =
        read_fields(r, &mut budget, "trailer section too large").map_err(head_to_body)?;
    let mut out = Vec::new();
    for (name, value) in trailers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    w.write_all(&out)?;
    Ok(total + out.len() as u64)
}

/// A complete short response the proxy answers with itself: the status,
/// `X-Hako-Rule`, `Content-Type: text/plain`, `Connection: close`, and a
/// one-line body.
pub(crate) fn proxy_response(status: u16, reason: &str, rule: &str, body: &str) -> Vec<u8> {
    let body = format!("{}\n", printable(body));
    format!(
        "HTTP/1.1 {status} {reason}\r\nX-Hako-Rule: {rule}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{BufReader, Cursor, Read};

    fn head(s: &str) -> Result<Head, HeadError> {
        read_head(&mut BufReader::new(Cursor::new(s.as_bytes().to_vec())))
    }

    #[test]
    fn heads_parse_and_bad_ones_are_refused() {
        let h = head("\r\nGET http://a.org/x HTTP/1.1\r\nHost: a.org\r\nX: y \r\n\r\n").unwrap();
        assert_eq!(
            (h.method.as_str(), h.target.as_str(), h.version),
            ("GET", "http://a.org/x", "HTTP/1.1")
        );
        assert_eq!(
            h.headers,
            vec![
                ("Host".into(), b"a.org".to_vec()),
                ("X".into(), b"y".to_vec())
            ]
        );
        for bad in [
            "GET  http://a.org/ HTTP/1.1\r\n\r\n",
            "GET http://a.org/ HTTP/2\r\n\r\n",
            "GET http://a.org/\r\n\r\n",
            "G(T http://a.org/ HTTP/1.1\r\n\r\n",
            "GET http://a.org/ HTTP/1.1\r\nHost : a.org\r\n\r\n",
            "GET http://a.org/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            "GET http://a.org/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            "GET http://a.org/ HTTP/1.1\r\nX: a\0b\r\n\r\n",
            "GET http://a.org/ HTTP/1.1\r\nnocolon\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
        assert!(matches!(
            head("GET http://a.org/ HTTP/1.1\r\n"),
            Err(HeadError::Eof)
        ));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(101));
        assert!(matches!(head(&many), Err(HeadError::TooLarge(_))));
        let big = format!(
            "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(MAX_HEAD_BYTES)
        );
        assert!(matches!(head(&big), Err(HeadError::TooLarge(_))));
    }

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

    #[test]
    fn framing_refuses_ambiguity() {
        let f = |s: &str| framing(&head(s).unwrap());
        assert_eq!(f("GET / HTTP/1.1\r\n\r\n").unwrap(), Framing::None);
        assert_eq!(
            f("GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\n").unwrap(),
            Framing::Length(5)
        );
        assert_eq!(
            f("GET / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").unwrap(),
            Framing::Chunked
        );
        for bad in [
            "GET / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
            "GET / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(f(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn smuggling_with_non_ascii_whitespace_around_framing_values_is_refused() {
        // `str::trim` would strip these (NBSP, NEL, ideographic space) and
        // read `chunked` or `5`, while the upstream sees other bytes and
        // may frame the body differently.
        for ws in ["\u{a0}", "\u{85}", "\u{3000}", "\u{b}", "\u{c}"] {
            for bad in [
                format!("POST / HTTP/1.1\r\nTransfer-Encoding: {ws}chunked\r\n\r\n"),
                format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked{ws}\r\n\r\n"),
                format!("POST / HTTP/1.1\r\nContent-Length: {ws}5\r\n\r\n"),
                format!("POST / HTTP/1.1\r\nContent-Length: 5, {ws}5\r\n\r\n"),
            ] {
                // A control character is refused by the head parser already.
                if let Ok(h) = head(&bad) {
                    assert!(framing(&h).is_err(), "{bad:?}");
                }
            }
        }
        // Spaces and tabs around list elements are fine.
        let h = head("POST / HTTP/1.1\r\nTransfer-Encoding: gzip ,\tchunked\r\n\r\n").unwrap();
        assert_eq!(framing(&h).unwrap(), Framing::Chunked);
        let h = head("POST / HTTP/1.1\r\nContent-Length: 5 ,\t5\r\n\r\n").unwrap();
        assert_eq!(framing(&h).unwrap(), Framing::Length(5));
    }

    #[test]
    fn chunked_body_is_forwarded_canonically_and_stops_at_its_end() {
        let input = b"5;ext=1\r\nhello\r\n0A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET http://evil/ HTTP/1.1\r\n\r\n";
        let mut r = BufReader::new(Cursor::new(input.to_vec()));
        let mut out = Vec::new();
        let n = forward_body(&mut r, &mut out, &Framing::Chunked).unwrap();
        assert_eq!(out, b"5\r\nhello\r\na\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n");
        assert_eq!(n, out.len() as u64);
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "GET http://evil/ HTTP/1.1\r\n\r\n");
        for bad in [
            "x\r\n",
            "5\r\nhelloXXX\r\n",
            "\r\n",
            "10000000000000000\r\n",
            "-1\r\n",
        ] {
            let mut r = BufReader::new(Cursor::new(bad.as_bytes().to_vec()));
            assert!(
                matches!(
                    forward_body(&mut r, &mut Vec::new(), &Framing::Chunked),
                    Err(BodyError::Bad(_))
                ),
                "{bad:?}"
            );
        }
    }
}
