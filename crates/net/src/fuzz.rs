//! Fuzzing with a fixed budget (run by plain `cargo test`): the allowlist
//! parser, the proxy's HTTP request-head parser, target parsing and body
//! framing, and both sides of the SOCKS5 handshake, each fed inputs built
//! from its grammar's pieces and random bytes. Each must answer every input
//! (a value or an error), never panic; inputs are finite and bounded in
//! size, so a parser that loops past its input's end cannot hang them.
//!
//! `HAKO_FUZZ_CASES` sets the cases per target (default [`CASES`]) and
//! `HAKO_FUZZ_SEED` the first seed; a failure names the seed and the input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{self, Cursor, Read, Write};

use crate::allow::Allowlist;
use crate::http::{
    forward_body, framing, host_header_matches, parse_target, read_head, split_authority,
};
use crate::socks;

/// Cases per target by default: a few seconds in a debug build.
const CASES: u64 = 3000;

/// The most bytes one input has (past the parsers' own bounds, so the
/// bounds are exercised too).
const MAX_INPUT: usize = 80 << 10;

fn cases() -> u64 {
    std::env::var("HAKO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn first_seed() -> u64 {
    std::env::var("HAKO_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6861_6b6f)
}

/// An input: pieces of the grammar, random bytes, long runs and big
/// numbers, up to `max` bytes.
fn input(rng: &mut fastrand::Rng, pieces: &[&[u8]], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let parts = rng.usize(0..64);
    for _ in 0..parts {
        match rng.u8(0..100) {
            0..=59 => out.extend_from_slice(pieces[rng.usize(0..pieces.len())]),
            60..=84 => out.push(rng.u8(..)),
            85..=89 => {
                let b = if rng.bool() { rng.u8(..) } else { b'a' };
                out.extend(std::iter::repeat_n(b, rng.usize(0..max.min(70_000))));
            }
            90..=94 => out.extend_from_slice(rng.u64(..).to_string().as_bytes()),
            _ => out.extend(std::iter::repeat_n(b'9', rng.usize(1..40))),
        }
        if out.len() >= max {
            out.truncate(max);
            break;
        }
    }
    out
}

/// Runs `case` on `cases()` inputs; a panic fails with its seed and input.
fn fuzz(name: &str, pieces: &[&[u8]], max: usize, case: impl Fn(&[u8])) {
    let first = first_seed();
    for seed in first..first + cases() {
        let mut rng = fastrand::Rng::with_seed(seed);
        let data = input(&mut rng, pieces, max);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&data)));
        if caught.is_err() {
            panic!(
                "{name}: panicked on seed {seed}, input {:?}",
                String::from_utf8_lossy(&data[..data.len().min(400)])
            );
        }
    }
}

const HTTP: &[&[u8]] = &[
    b"GET ",
    b"POST ",
    b"CONNECT ",
    b"PUT ",
    b"get ",
    b" ",
    b"  ",
    b"\r\n",
    b"\n",
    b"\r",
    b"\r\n\r\n",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/2",
    b"http://",
    b"https://",
    b"[::1]",
    b"example.com",
    b":80",
    b":",
    b":65536",
    b"/",
    b"/path?q=1",
    b"%00",
    b"Host: ",
    b"Content-Length: ",
    b"content-length:",
    b"Transfer-Encoding: ",
    b"chunked",
    b"gzip, chunked",
    b", ",
    b"0",
    b"5",
    b"ffffffffffffffffff",
    b";ext=1",
    b"\t",
    b"\0",
    b"\xff",
    b"\xc3\xa9",
    b"Connection: close",
    b"Proxy-Authorization: x",
    b"@",
    b"user:pw@",
];

#[test]
fn fuzz_http_request_heads_and_bodies_never_panic() {
    fuzz("http head", HTTP, MAX_INPUT, |data| {
        let mut r = Cursor::new(data);
        let Ok(head) = read_head(&mut r) else { return };
        let _ = parse_target(&head.target);
        if let Some(host) = head.values("host").next() {
            let _ = host_header_matches(host, "example.com", 80);
        }
        if let Ok(f) = framing(&head) {
            let mut sink = Vec::new();
            let _ = forward_body(&mut r, &mut sink, &f);
            assert!(
                sink.len() <= data.len() * 2 + 16,
                "the body grew past its input"
            );
        }
    });
}

#[test]
fn fuzz_http_targets_and_authorities_never_panic() {
    fuzz("http target", HTTP, 4096, |data| {
        let s = String::from_utf8_lossy(data);
        let _ = parse_target(&s);
        let _ = split_authority(&s);
        let _ = host_header_matches(data, &s, 443);
    });
}

const ALLOW: &[&[u8]] = &[
    b"example.com",
    b"*.",
    b"*",
    b".",
    b"..",
    b":",
    b":443",
    b":0",
    b":65535",
    b":99999",
    b"[",
    b"]",
    b"::1",
    b"127.0.0.1",
    b"10.0.0.0/8",
    b"/",
    b"/33",
    b"xn--",
    b"-",
    b"_",
    b"localhost",
    b"\xc3\xa9",
    b"\0",
    b" ",
    b"port:",
    b"tcp:",
    b"https://",
    b"a",
    b"0x7f",
];

#[test]
fn fuzz_allowlist_entries_never_panic() {
    fuzz("allowlist", ALLOW, 2048, |data| {
        let text = String::from_utf8_lossy(data);
        let entries: Vec<&str> = text.split(',').collect();
        if let Ok(list) = Allowlist::parse(&entries) {
            let _ = list.forwarded_ports();
            for e in list.entries() {
                let _ = e.allows_port(443);
            }
        }
    });
}

/// A stream that reads `input` and keeps what is written.
struct Duplex<'a> {
    input: Cursor<&'a [u8]>,
    output: Vec<u8>,
}

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.output.len() > 1 << 20 {
            return Err(io::Error::other("the handshake wrote without bound"));
        }
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const SOCKS: &[&[u8]] = &[
    b"\x05",
    b"\x04",
    b"\x01",
    b"\x00",
    b"\x02",
    b"\x03",
    b"\x04",
    b"\xff",
    b"\x05\x01\x00",
    b"\x05\x02\x00\x02",
    b"\x05\x01\x00\x01",
    b"\x05\x01\x00\x03",
    b"\x05\x01\x00\x04",
    b"\x7f\x00\x00\x01",
    b"\x01\xbb",
    b"\x00\x50",
    b"\x0bexample.com",
    b"\x00",
    b"\xff\xff",
];

#[test]
fn fuzz_socks5_handshake_server_side_never_panics() {
    fuzz("socks5 server", SOCKS, 4096, |data| {
        let mut s = Duplex {
            input: Cursor::new(data),
            output: Vec::new(),
        };
        if let Ok(true) = socks::server_greeting(&mut s) {
            let _ = socks::server_request(&mut s);
        }
    });
}

#[test]
fn fuzz_socks5_handshake_client_side_never_panics() {
    fuzz("socks5 client", SOCKS, 4096, |data| {
        let mut s = Duplex {
            input: Cursor::new(data),
            output: Vec::new(),
        };
        let _ = socks::socks5_connect(&mut s, "example.com", 443);
    });
}
