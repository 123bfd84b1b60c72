//! A minimal HTTP/1.1 client for the load benchmark: one kept-alive
//! connection per client thread, bodies framed by `Content-Length` (what
//! `hako serve` answers every non-streamed request with), reconnecting
//! when the server closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The most bytes of an answer's headers or body the client reads: the
/// benchmark's answers are small, and a server gone wrong must not make
/// the benchmark grow.
const MAX_ANSWER: usize = 1 << 20;

/// One client of `hako serve`, on loopback.
pub(crate) struct Client {
    port: u16,
    token: String,
    conn: Option<BufReader<TcpStream>>,
}

/// An answer: its status and body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Client {
    pub(crate) fn new(port: u16, token: &str) -> Self {
        Client {
            port,
            token: token.to_string(),
            conn: None,
        }
    }

    /// Sends one request and reads its answer; on a connection the server
    /// closed meanwhile, tries once more on a new one.
    pub(crate) fn call(&mut self, method: &str, path: &str, body: &str) -> Result<Answer, String> {
        match self.try_call(method, path, body) {
            Ok(a) => Ok(a),
            Err(_) if self.conn.is_none() => self.try_call(method, path, body),
            Err(e) => Err(e),
        }
    }

    fn try_call(&mut self, method: &str, path: &str, body: &str) -> Result<Answer, String> {
        let conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let s = TcpStream::connect(("127.0.0.1", self.port))
                    .map_err(|e| format!("connect to 127.0.0.1:{}: {e}", self.port))?;
                s.set_read_timeout(Some(Duration::from_secs(120)))
                    .map_err(|e| e.to_string())?;
                let _ = s.set_nodelay(true);
                BufReader::new(s)
            }
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.port,
            self.token,
            body.len()
        );
        let mut conn = conn;
        let sent = conn
            .get_mut()
            .write_all(head.as_bytes())
            .and_then(|()| conn.get_mut().write_all(body.as_bytes()));
        if let Err(e) = sent {
            return Err(format!("{method} {path}: send: {e}"));
        }
        let (answer, keep) = read_answer(&mut conn).map_err(|e| format!("{method} {path}: {e}"))?;
        if keep {
            self.conn = Some(conn);
        }
        Ok(answer)
    }
}

/// Reads one answer; whether the connection may carry another.
fn read_answer(conn: &mut impl BufRead) -> Result<(Answer, bool), String> {
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<(), String> {
        line.clear();
        let n = conn
            .by_ref()
            .take(MAX_ANSWER as u64)
            .read_line(line)
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(())
    };
    read_line(&mut line)?;
    let status = parse_status(&line)?;
    let mut length = None;
    let mut keep = true;
    let mut total = 0usize;
    loop {
        read_line(&mut line)?;
        total += line.len();
        if total > MAX_ANSWER {
            return Err("the answer's headers are too long".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| format!("bad Content-Length {value:?}"))?,
                );
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep = false;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err("a chunked answer (not expected here)".into());
            }
        }
    }
    let Some(length) = length else {
        return Err("an answer without Content-Length".into());
    };
    if length > MAX_ANSWER {
        return Err(format!("an answer of {length} bytes"));
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body)
        .map_err(|e| format!("read body: {e}"))?;
    Ok((Answer { status, body }, keep))
}

/// The status of `HTTP/1.1 200 OK`.
fn parse_status(line: &str) -> Result<u16, String> {
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| format!("not an HTTP status line: {:?}", line.trim_end()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn an_answer_is_read_by_its_content_length_and_close_ends_the_connection() {
        let raw = b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\nhello";
        let (a, keep) = read_answer(&mut &raw[..]).unwrap();
        assert_eq!((a.status, &a.body[..], keep), (201, &b"hello"[..], true));
        let raw = b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        let (a, keep) = read_answer(&mut &raw[..]).unwrap();
        assert_eq!((a.status, keep), (429, false));
    }

    #[test]
    fn a_truncated_or_unframed_answer_is_an_error_not_a_hang() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\n\r\nno length",
            b"garbage\r\n\r\n",
            b"",
        ] {
            assert!(read_answer(&mut &raw[..]).is_err(), "{raw:?}");
        }
    }
}
