//! Plain HTTP forwarding (absolute-form requests).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use hako_core::{NetDecision, NetProtocol};

use crate::support::*;

const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";

#[test]
fn get_is_forwarded_in_origin_form_with_connection_close() {
    let (port, srv) = server(|mut s| {
        let head = read_head(&mut s);
        s.write_all(OK.as_bytes()).unwrap();
        head
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let request = format!(
        "GET http://127.0.0.1:{port}/path?q=1#frag HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\
         Connection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nUser-Agent: t\r\n\r\n"
    );
    let answer = roundtrip(&p, request.as_bytes());
    assert_eq!(answer, OK);
    let got = srv.join().unwrap();
    assert_eq!(
        got,
        format!(
            "GET /path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        )
    );
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Allowed);
    assert_eq!(ev.protocol, NetProtocol::Http);
    assert_eq!((ev.host.as_str(), ev.port), ("127.0.0.1", port));
    assert_eq!(ev.rule, format!("127.0.0.1:{port}"));
    assert_eq!(ev.address, Some(format!("127.0.0.1:{port}")));
    assert_eq!(ev.bytes_up, got.len() as u64);
    assert_eq!(ev.bytes_down, OK.len() as u64);
    assert_eq!(ev.message, None);
}

#[test]
fn localhost_entry_forwards_to_the_hosts_loopback_and_adds_a_missing_host() {
    let (port, srv) = server(|mut s| {
        let head = read_head(&mut s);
        s.write_all(OK.as_bytes()).unwrap();
        head
    });
    let p = proxy(&entry(format!("localhost:{port}")));
    let answer = roundtrip(
        &p,
        format!("GET http://LocalHost:{port} HTTP/1.0\r\n\r\n").as_bytes(),
    );
    assert_eq!(answer, OK);
    assert_eq!(
        srv.join().unwrap(),
        format!("GET / HTTP/1.0\r\nHost: LocalHost:{port}\r\nConnection: close\r\n\r\n")
    );
    let ev = one_event(&p);
    assert_eq!(ev.rule, format!("localhost:{port}"));
    assert_eq!(ev.address, Some(format!("127.0.0.1:{port}")));
}

#[test]
fn post_with_content_length_forwards_exactly_the_body() {
    let (port, srv) = server(|mut s| {
        let head = read_head(&mut s);
        let mut body = [0u8; 11];
        s.read_exact(&mut body).unwrap();
        s.write_all(OK.as_bytes()).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        // Nothing after the body: the proxy stops reading its client.
        (head, body, read_to_end(&mut s))
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let request = format!(
        "POST http://127.0.0.1:{port}/up HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 11\r\n\r\nhello worldEXTRA"
    );
    assert_eq!(roundtrip(&p, request.as_bytes()), OK);
    let (head, body, rest) = srv.join().unwrap();
    assert!(head.starts_with("POST /up HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nContent-Length: 11\r\n"), "{head}");
    assert_eq!(&body, b"hello world");
    assert_eq!(rest, b"");
    let ev = one_event(&p);
    assert_eq!(ev.bytes_up, head.len() as u64 + 11);
}

#[test]
fn post_with_chunked_body_is_relayed_chunk_by_chunk() {
    let (port, srv) = server(|mut s| {
        let head = read_head(&mut s);
        let mut body = Vec::new();
        let mut b = [0u8; 1];
        while !body.ends_with(b"0\r\nX-Sum: 7\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            body.push(b[0]);
        }
        s.write_all(OK.as_bytes()).unwrap();
        (head, String::from_utf8(body).unwrap())
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let request = format!(
        "POST http://127.0.0.1:{port}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
         5;name=v\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 7\r\n\r\n"
    );
    assert_eq!(roundtrip(&p, request.as_bytes()), OK);
    let (head, body) = srv.join().unwrap();
    assert!(
        head.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{head}"
    );
    assert_eq!(body, "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 7\r\n\r\n");
}

#[test]
fn expect_100_continue_gets_the_interim_response_before_the_body() {
    let (port, srv) = server(|mut s| {
        read_head(&mut s);
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").unwrap();
        let mut body = [0u8; 4];
        s.read_exact(&mut body).unwrap();
        s.write_all(OK.as_bytes()).unwrap();
        body
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let mut c = client(&p);
    c.write_all(
        format!("PUT http://127.0.0.1:{port}/ HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(read_head(&mut c), "HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(b"data").unwrap();
    assert_eq!(read_string(&mut c), OK);
    assert_eq!(&srv.join().unwrap(), b"data");
}

#[test]
fn pipelined_second_request_never_reaches_first_upstream() {
    let (port, srv) = server(|mut s| {
        let head = read_head(&mut s);
        s.write_all(OK.as_bytes()).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        (head, read_to_end(&mut s))
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let request = format!(
        "GET http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n\
         GET http://127.0.0.1:{port}/admin HTTP/1.1\r\nHost: internal.example\r\n\r\n"
    );
    assert_eq!(roundtrip(&p, request.as_bytes()), OK);
    let (head, rest) = srv.join().unwrap();
    assert!(head.starts_with("GET /a HTTP/1.1\r\n"));
    assert_eq!(rest, b"", "the pipelined request reached the upstream");
}

#[test]
fn host_header_naming_another_host_is_refused() {
    let target = Untouched::new();
    let port = target.port;
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(
        &p,
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: internal.example\r\n\r\n")
            .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("host-header-mismatch"));
    target.assert_untouched();
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Refused);
    assert_eq!(ev.rule, "host-header-mismatch");
    // The same host with another port is a mismatch too; the default port is not.
    let answer = roundtrip(
        &p,
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes(),
    );
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("host-header-mismatch"));
    target.assert_untouched();
}

#[test]
fn request_smuggling_with_both_content_length_and_chunked_is_refused() {
    let target = Untouched::new();
    let port = target.port;
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(
        &p,
        format!(
            "POST http://127.0.0.1:{port}/ HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("bad-request"));
    target.assert_untouched();
}

#[test]
fn malformed_chunked_body_is_cut_and_answered_with_400() {
    let (port, srv) = server(|mut s| {
        read_head(&mut s);
        read_to_end(&mut s)
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(
        &p,
        format!(
            "POST http://127.0.0.1:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        .as_bytes(),
    );
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("bad chunk size"), "{answer}");
    // The upstream got the head and nothing of the bad body.
    assert_eq!(srv.join().unwrap(), b"");
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Allowed);
    assert!(ev.message.unwrap().contains("bad chunk size"));
}

#[test]
fn refused_name_gets_403_naming_the_rule_and_the_allowlist() {
    let p = proxy(&["pkg.example".to_string(), "localhost:11434".to_string()]);
    let answer = roundtrip(
        &p,
        b"GET http://other.example/x HTTP/1.1\r\nHost: other.example\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("not-on-allowlist"));
    assert_eq!(header(&answer, "Content-Type"), Some("text/plain"));
    assert_eq!(header(&answer, "Connection"), Some("close"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(
        body,
        "hako egress proxy refused other.example:80: other.example is not on the allowlist \
         (rule not-on-allowlist); allowed: pkg.example, localhost:11434\n"
    );
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Refused, NetProtocol::Http)
    );
    assert_eq!(
        (ev.host.as_str(), ev.port, ev.rule.as_str()),
        ("other.example", 80, "not-on-allowlist")
    );
}

#[test]
fn https_absolute_form_is_told_to_use_connect() {
    let p = proxy(&entry("pkg.example"));
    let answer = roundtrip(&p, b"GET https://pkg.example/ HTTP/1.1\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("CONNECT"), "{answer}");
}

#[test]
fn origin_form_request_is_told_this_is_a_proxy() {
    let p = proxy(&entry("pkg.example"));
    let answer = roundtrip(&p, b"GET / HTTP/1.1\r\nHost: pkg.example\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("egress proxy, not a web server"),
        "{answer}"
    );
}

#[test]
fn malformed_request_gets_400_and_the_proxy_keeps_serving() {
    let (port, srv) = server(|mut s| {
        read_head(&mut s);
        s.write_all(OK.as_bytes()).unwrap();
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(&p, b"HELLO THERE\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    let answer = roundtrip(&p, b"GET http://x/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    let answer = roundtrip(
        &p,
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert_eq!(answer, OK);
    srv.join().unwrap();
    let evs = events(&p, 3);
    assert_eq!(evs[0].rule, "bad-request");
    assert_eq!(evs[0].protocol, NetProtocol::Unknown);
    assert_eq!(evs[2].decision, NetDecision::Allowed);
}

#[test]
fn oversized_request_head_gets_431() {
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    let big = format!(
        "GET http://pkg.example/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    // The proxy may answer and close before it has read everything.
    let _ = c.write_all(big.as_bytes());
    let answer = read_string(&mut c);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    let many = format!(
        "GET http://pkg.example/ HTTP/1.1\r\n{}\r\n",
        "X: y\r\n".repeat(101)
    );
    let answer = roundtrip(&p, many.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
}

#[test]
fn upstream_that_answers_nothing_gives_an_empty_close() {
    let (port, srv) = server(|mut s| {
        read_head(&mut s);
        std::thread::sleep(Duration::from_millis(20));
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(
        &p,
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert_eq!(answer, "");
    srv.join().unwrap();
}

#[test]
fn smuggling_heads_the_upstream_could_frame_otherwise_never_reach_it() {
    let target = Untouched::new();
    let port = target.port;
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let url = format!("http://127.0.0.1:{port}/");
    let host = format!("Host: 127.0.0.1:{port}\r\n");
    for (fields, status) in [
        // Obsolete line folding hiding a second field.
        (
            format!("{host}X: a\r\n Transfer-Encoding: chunked\r\n"),
            400,
        ),
        // Bare CR inside a field.
        (format!("{host}X: a\rTransfer-Encoding: chunked\r\n"), 400),
        // A NUL inside a value.
        (format!("{host}Content-Length: 5\0\r\n"), 400),
        // Two Host fields, either of which an upstream may pick.
        (format!("{host}Host: internal.example\r\n"), 400),
        (format!("{host}{host}"), 400),
        // Disagreeing lengths, a signed or hex length.
        (
            format!("{host}Content-Length: 4\r\nContent-Length: 40\r\n"),
            400,
        ),
        (format!("{host}Content-Length: 4, 40\r\n"), 400),
        (format!("{host}Content-Length: +4\r\n"), 400),
        (format!("{host}Content-Length: 0x4\r\n"), 400),
        // Chunked that is not last or not alone, or hidden by non-ASCII
        // whitespace the upstream would not strip.
        (
            format!("{host}Transfer-Encoding: chunked, identity\r\n"),
            400,
        ),
        (
            format!("{host}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            400,
        ),
        (format!("{host}Transfer-Encoding: \u{a0}chunked\r\n"), 400),
        (format!("{host}Transfer-Encoding: chunked\u{85}\r\n"), 400),
        (format!("{host}Content-Length: \u{3000}4\r\n"), 400),
        // A space before the colon.
        (format!("{host}Transfer-Encoding : chunked\r\n"), 400),
        // The URL's host and the Host field disagree.
        ("Host: internal.example\r\n".to_string(), 403),
        (format!("Host: 127.0.0.1:{port}@internal.example\r\n"), 403),
    ] {
        let request =
            format!("POST {url} HTTP/1.1\r\n{fields}\r\n0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n");
        let answer = roundtrip(&p, request.as_bytes());
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{fields:?}: {answer}"
        );
        assert_eq!(one_event(&p).decision, NetDecision::Refused, "{fields:?}");
    }
    // Transfer-Encoding in HTTP/1.0, which has no chunked framing.
    let answer = roundtrip(
        &p,
        format!("POST {url} HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    target.assert_untouched();
}
