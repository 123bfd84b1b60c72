//! HTTP CONNECT.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};

use hako_core::{NetDecision, NetProtocol};

use crate::support::*;

const ESTABLISHED: &str = "HTTP/1.1 200 Connection established\r\n\r\n";

/// Echoes what it reads, upper-cased, until end of stream; returns the
/// bytes read.
fn echo_upper(mut s: std::net::TcpStream) -> usize {
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            s.shutdown(Shutdown::Write).unwrap();
            return total;
        }
        total += n;
        s.write_all(&buf[..n].to_ascii_uppercase()).unwrap();
    }
}

#[test]
fn connect_allowed_relays_both_ways_and_records_exact_bytes() {
    let (port, srv) = server(echo_upper);
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let mut c = client(&p);
    c.write_all(
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(read_head(&mut c), ESTABLISHED);
    c.write_all(b"ping ").unwrap();
    let mut got = [0u8; 5];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"PING ");
    c.write_all(b"pong").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut c), b"PONG");
    assert_eq!(srv.join().unwrap(), 9);
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Allowed, NetProtocol::Connect)
    );
    assert_eq!((ev.bytes_up, ev.bytes_down), (9, 9));
    assert_eq!(ev.address, Some(format!("127.0.0.1:{port}")));
    assert_eq!(ev.rule, format!("127.0.0.1:{port}"));
}

#[test]
fn bytes_sent_right_after_the_connect_request_are_not_lost() {
    let (port, srv) = server(echo_upper);
    let p = proxy(&entry(format!("localhost:{port}")));
    let mut c = client(&p);
    c.write_all(format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\nearly").as_bytes())
        .unwrap();
    assert_eq!(read_head(&mut c), ESTABLISHED);
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut c), b"EARLY");
    assert_eq!(srv.join().unwrap(), 5);
    assert_eq!(one_event(&p).bytes_up, 5);
}

#[test]
fn connect_refused_gets_403_with_rule_in_body_and_header() {
    let p = proxy(&["a.org:443".to_string(), "localhost:11434".to_string()]);
    let answer = roundtrip(
        &p,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("not-on-allowlist"));
    assert!(answer.ends_with(
        "\r\n\r\nhako egress proxy refused example.com:443: example.com is not on the allowlist \
         (rule not-on-allowlist); allowed: a.org:443, localhost:11434\n"
    ));
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Refused, NetProtocol::Connect)
    );
    assert_eq!((ev.host.as_str(), ev.port), ("example.com", 443));
    assert_eq!(ev.rule, "not-on-allowlist");
    assert!(ev.message.unwrap().contains("not on the allowlist"));
}

#[test]
fn port_not_on_the_allowlist_is_refused() {
    let target = Untouched::new();
    let p = proxy(&entry("localhost:1"));
    let answer = roundtrip(
        &p,
        format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", target.port).as_bytes(),
    );
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("port-not-allowed"));
    target.assert_untouched();
}

#[test]
fn unlisted_loopback_address_is_refused() {
    let target = Untouched::new();
    let p = proxy(&entry("pkg.example"));
    for host in ["127.0.0.1", "[::ffff:127.0.0.1]", "localhost"] {
        let answer = roundtrip(
            &p,
            format!("CONNECT {host}:{} HTTP/1.1\r\n\r\n", target.port).as_bytes(),
        );
        assert_eq!(
            header(&answer, "X-Hako-Rule"),
            Some("not-on-allowlist"),
            "{host}: {answer}"
        );
    }
    target.assert_untouched();
}

#[test]
fn dns_rebinding_to_private_address_is_refused() {
    let p = proxy_with(&entry("pkg.example"), &[("pkg.example", "10.0.0.7")]);
    let answer = roundtrip(&p, b"CONNECT pkg.example:443 HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert_eq!(
        header(&answer, "X-Hako-Rule"),
        Some("resolves-to-refused-address")
    );
    assert!(
        answer.contains("pkg.example resolves to 10.0.0.7 (private-address)"),
        "{answer}"
    );
    let ev = one_event(&p);
    assert_eq!(ev.rule, "resolves-to-refused-address");
    assert_eq!(ev.address, None);
}

#[test]
fn dns_rebinding_to_loopback_cannot_reach_a_host_service() {
    let target = Untouched::new();
    let p = proxy_with(
        &entry(format!("evil.example:{}", target.port)),
        &[("evil.example", "127.0.0.1")],
    );
    let answer = roundtrip(
        &p,
        format!("CONNECT evil.example:{} HTTP/1.1\r\n\r\n", target.port).as_bytes(),
    );
    assert_eq!(
        header(&answer, "X-Hako-Rule"),
        Some("resolves-to-refused-address")
    );
    assert!(answer.contains("loopback-address"), "{answer}");
    target.assert_untouched();
}

#[test]
fn decimal_and_short_ip_hosts_are_refused_as_bad_host() {
    let target = Untouched::new();
    let port = target.port;
    let p = proxy(&entry(format!("localhost:{port}")));
    for host in ["2130706433", "127.1", "0x7f.1", "0177.0.0.1"] {
        let answer = roundtrip(
            &p,
            format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(
            header(&answer, "X-Hako-Rule"),
            Some("bad-host"),
            "{host}: {answer}"
        );
    }
    target.assert_untouched();
}

#[test]
fn unresolvable_name_gets_502() {
    let p = proxy(&entry("pkg.example"));
    let answer = roundtrip(&p, b"CONNECT pkg.example:443 HTTP/1.1\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("name-not-resolved"));
}

#[test]
fn upstream_connection_refused_gets_502_and_an_allowed_event_with_the_error() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let answer = roundtrip(
        &p,
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Allowed);
    assert_eq!(ev.address, None);
    assert!(ev.message.unwrap().contains("cannot connect"));
}

#[test]
fn connect_without_port_is_a_bad_request() {
    let p = proxy(&entry("pkg.example"));
    let answer = roundtrip(&p, b"CONNECT pkg.example HTTP/1.1\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
}
