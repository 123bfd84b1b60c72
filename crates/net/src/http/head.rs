//! Reading a request head: the request line and the header (or trailer)
//! fields, bounded in bytes and in fields, strict about line endings and
//! field syntax.

use std::io::{self, BufRead};

use crate::allow::printable;

/// The most bytes a request head (request line and header fields) may have.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields (and, separately, trailer fields) a request may
/// have.
pub(crate) const MAX_HEADERS: usize = 100;

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
pub(super) fn read_line<R: BufRead + ?Sized>(
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
pub(super) fn read_fields<R: BufRead + ?Sized>(
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

pub(super) fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Parses a whole request head held in a string (for tests).
#[cfg(test)]
pub(super) fn parse(s: &str) -> Result<Head, HeadError> {
    read_head(&mut io::BufReader::new(io::Cursor::new(
        s.as_bytes().to_vec(),
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn head(s: &str) -> Result<Head, HeadError> {
        parse(s)
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
}
