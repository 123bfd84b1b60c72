//! SOCKS5, and the client helper the port forwarder uses.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener};

use hako_core::{NetDecision, NetProtocol};
use hako_net::socks5_connect;

use crate::support::*;

fn socks_request(c: &mut impl Write, atyp_and_addr: &[u8], port: u16) {
    let mut r = vec![5, 1, 0];
    r.extend_from_slice(atyp_and_addr);
    r.extend_from_slice(&port.to_be_bytes());
    c.write_all(&r).unwrap();
}

fn greet(c: &mut (impl Read + Write)) {
    c.write_all(&[5, 2, 0, 2]).unwrap();
    let mut m = [0u8; 2];
    c.read_exact(&mut m).unwrap();
    assert_eq!(m, [5, 0]);
}

fn reply(c: &mut impl Read) -> [u8; 10] {
    let mut r = [0u8; 10];
    c.read_exact(&mut r).unwrap();
    r
}

fn echo(mut s: std::net::TcpStream) -> usize {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    s.write_all(&buf).unwrap();
    buf.len()
}

#[test]
fn socks5_connect_to_a_listed_ipv4_address_relays() {
    let (port, srv) = server(echo);
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let mut c = client(&p);
    greet(&mut c);
    socks_request(&mut c, &[1, 127, 0, 0, 1], port);
    assert_eq!(reply(&mut c), [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    c.write_all(b"abc").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut c), b"abc");
    assert_eq!(srv.join().unwrap(), 3);
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Allowed, NetProtocol::Socks5)
    );
    assert_eq!((ev.bytes_up, ev.bytes_down), (3, 3));
}

#[test]
fn forwarder_handshake_reaches_a_forwarded_host_port() {
    let (port, srv) = server(echo);
    let p = proxy(&entry(format!("localhost:{port}")));
    let mut c = client(&p);
    socks5_connect(&mut c, "localhost", port).unwrap();
    c.write_all(b"model request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut c), b"model request");
    srv.join().unwrap();
    let ev = one_event(&p);
    assert_eq!(ev.rule, format!("localhost:{port}"));
    assert_eq!((ev.host.as_str(), ev.port), ("localhost", port));
    assert_eq!(ev.address, Some(format!("127.0.0.1:{port}")));
}

#[test]
fn socks5_refused_by_policy_gets_reply_2() {
    let target = Untouched::new();
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    let e = socks5_connect(&mut c, "localhost", target.port).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("not allowed by ruleset"), "{e}");
    target.assert_untouched();
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Refused, NetProtocol::Socks5)
    );
    assert_eq!(ev.rule, "not-on-allowlist");

    let mut c = client(&p);
    greet(&mut c);
    socks_request(
        &mut c,
        &[4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        target.port,
    );
    assert_eq!(reply(&mut c)[1], 2);
    target.assert_untouched();
}

#[test]
fn metadata_address_is_refused_even_by_name() {
    let p = proxy_with(
        &entry("*.cloud.example"),
        &[("meta.cloud.example", "169.254.169.254")],
    );
    let mut c = client(&p);
    let e = socks5_connect(&mut c, "meta.cloud.example", 80).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    let ev = one_event(&p);
    assert_eq!(ev.rule, "resolves-to-refused-address");
    assert!(ev.message.unwrap().contains("metadata-address"));
}

#[test]
fn socks5_unresolvable_name_gets_reply_4() {
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    let e = socks5_connect(&mut c, "pkg.example", 443).unwrap_err();
    assert!(e.to_string().contains("0x04"), "{e}");
}

#[test]
fn socks5_upstream_refusal_gets_reply_5() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = proxy(&entry(format!("localhost:{port}")));
    let mut c = client(&p);
    let e = socks5_connect(&mut c, "localhost", port).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

#[test]
fn socks5_without_no_auth_method_is_refused() {
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    c.write_all(&[5, 1, 2]).unwrap();
    let mut m = [0u8; 2];
    c.read_exact(&mut m).unwrap();
    assert_eq!(m, [5, 0xFF]);
    assert_eq!(read_to_end(&mut c), b"");
    assert_eq!(one_event(&p).rule, "socks-no-acceptable-method");
}

#[test]
fn socks5_bind_and_unknown_address_types_are_refused() {
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    greet(&mut c);
    c.write_all(&[5, 2, 0, 1, 127, 0, 0, 1, 0, 80]).unwrap();
    assert_eq!(reply(&mut c)[1], 7);
    let mut c = client(&p);
    greet(&mut c);
    c.write_all(&[5, 1, 0, 9, 1, 2, 3, 4]).unwrap();
    assert_eq!(reply(&mut c)[1], 8);
    let evs = events(&p, 2);
    assert!(evs.iter().all(|e| e.rule == "socks-unsupported-request"));
}

#[test]
fn socks4_is_refused() {
    let p = proxy(&entry("pkg.example"));
    let mut c = client(&p);
    c.write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).unwrap();
    let answer = read_to_end(&mut c);
    assert_eq!(answer, [0, 0x5B, 0, 0, 0, 0, 0, 0]);
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.rule.as_str()),
        (NetDecision::Refused, "socks4-unsupported")
    );
}

#[test]
fn socks5_domain_with_nul_dots_or_bad_length_and_port_zero_never_connect() {
    let target = Untouched::new();
    // The allowed name resolves to the listener, so only the checks stand
    // between each request and a connection.
    let p = proxy_with(
        &[format!("ok.example:{}", target.port), "localhost:1".into()],
        &[("ok.example", "127.0.0.1")],
    );
    let domain = |name: &[u8]| {
        let mut a = vec![3, u8::try_from(name.len()).unwrap()];
        a.extend_from_slice(name);
        a
    };
    for (addr, port) in [
        (domain(b"ok.example\0.evil.test"), target.port),
        (domain(b"ok.example\0"), target.port),
        (domain(b"\0ok.example"), target.port),
        (domain(b""), target.port),
        (domain(b"."), target.port),
        (domain(b"ok..example"), target.port),
        (domain(b"ok.example.."), target.port),
        (domain(b"ok.example:80"), target.port),
        (domain(b"127.0.0.1"), target.port),
        (domain(b"[::1]"), target.port),
        (domain(b"ok.example"), 0),
        (domain(b"localhost"), 0),
        (vec![1, 127, 0, 0, 1], 0),
        (vec![1, 0, 0, 0, 0], target.port),
        (domain(&[0xff; 255]), target.port),
    ] {
        let mut c = client(&p);
        greet(&mut c);
        socks_request(&mut c, &addr, port);
        assert_eq!(reply(&mut c)[1], 2, "{addr:?} port {port}");
        let ev = one_event(&p);
        assert_eq!(ev.decision, NetDecision::Refused, "{addr:?}");
    }
    // A domain length longer than what follows: the proxy waits for the
    // rest, then gives up at the handshake deadline, never connecting.
    let mut c = client(&p);
    greet(&mut c);
    c.write_all(&[5, 1, 0, 3, 200, b'o', b'k']).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut c), b"");
    assert_eq!(one_event(&p).decision, NetDecision::Refused);
    target.assert_untouched();
}
