//! A request body: its framing (`Content-Length`, `chunked`, none, or
//! ambiguous and refused) and forwarding exactly that body, nothing after.

use std::io::{self, BufRead, Write};

use super::head::{read_fields, read_line, trim_ows, Head, HeadError, MAX_HEAD_BYTES};
use crate::allow::printable;

/// The longest chunk-size line.
const MAX_CHUNK_LINE: usize = 4096;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::http::head::parse as head;
    use std::io::{BufReader, Cursor, Read};

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
