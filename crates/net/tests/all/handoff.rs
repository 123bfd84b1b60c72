//! Handing the sandbox's own TCP connection to the proxy (what the
//! forwarder inside does where descriptors can cross).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use hako_core::{NetDecision, NetProtocol};
use hako_net::hand_over;

use crate::support::*;

/// A connected pair on loopback, as a client inside and the forwarder's
/// accepted end would be.
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (accepted, _) = l.accept().unwrap();
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    (c, accepted)
}

#[test]
fn a_handed_over_connection_on_the_proxy_port_is_served_as_a_client() {
    let (port, srv) = server(|mut s| {
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"pong").unwrap();
        got
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let (mut inside, accepted) = pair();
    assert!(hand_over(&client(&p), accepted.as_fd(), None).unwrap());
    // The forwarder's copy closes; the proxy keeps the connection.
    drop(accepted);
    inside
        .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping").as_bytes())
        .unwrap();
    let head = read_head(&mut inside);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut pong = [0u8; 4];
    inside.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    assert_eq!(&srv.join().unwrap(), b"ping");
    inside.shutdown(Shutdown::Write).unwrap();
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol, ev.bytes_up, ev.bytes_down),
        (NetDecision::Allowed, NetProtocol::Connect, 4, 4)
    );
}

#[test]
fn a_handed_over_forwarded_port_reaches_the_hosts_loopback_when_allowed() {
    let (port, srv) = server(|mut s| {
        s.write_all(b"model-server").unwrap();
    });
    let p = proxy(&entry(format!("localhost:{port}")));
    let (mut inside, accepted) = pair();
    assert!(hand_over(&client(&p), accepted.as_fd(), Some(port)).unwrap());
    drop(accepted);
    srv.join().unwrap();
    assert_eq!(read_string(&mut inside), "model-server");
    // The connection ends (and is recorded) when both sides are done.
    drop(inside);
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Allowed);
    assert_eq!(ev.protocol, NetProtocol::Forward);
    assert_eq!((ev.host.as_str(), ev.port), ("localhost", port));
    assert_eq!(ev.address, Some(format!("127.0.0.1:{port}")));
    assert_eq!(ev.bytes_down, 12);
}

#[test]
fn a_handed_over_forwarded_port_not_on_the_allowlist_is_closed_unreached() {
    let untouched = Untouched::new();
    let p = proxy(&entry("localhost:1"));
    let (mut inside, accepted) = pair();
    assert!(hand_over(&client(&p), accepted.as_fd(), Some(untouched.port)).unwrap());
    drop(accepted);
    assert_eq!(read_string(&mut inside), "");
    let ev = one_event(&p);
    assert_eq!(ev.decision, NetDecision::Refused);
    assert_eq!(ev.protocol, NetProtocol::Forward);
    assert_eq!(ev.rule, "port-not-allowed");
    untouched.assert_untouched();
}

#[test]
fn handing_over_a_descriptor_that_is_not_a_tcp_socket_is_refused() {
    let p = proxy(&entry("localhost:1"));
    // A unix socket (one end of a pair the sandbox holds) and a pipe.
    let (held, passed) = UnixStream::pair().unwrap();
    assert!(!hand_over(&client(&p), passed.as_fd(), None).unwrap());
    drop(held);
    let (r, _w) = pipe_pair();
    assert!(!hand_over(&client(&p), r.as_fd(), Some(1)).unwrap());
    // A header with no descriptor at all.
    let mut c = client(&p);
    c.write_all(&[0, 1, 0, 1]).unwrap();
    let mut answer = [9u8; 1];
    c.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [0]);
    // The proxy still serves the next client.
    let answer = roundtrip(
        &p,
        b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

/// A pipe, as a descriptor of the wrong kind.
fn pipe_pair() -> (std::fs::File, std::fs::File) {
    let (r, w) = rustix::pipe::pipe().unwrap();
    (std::fs::File::from(r), std::fs::File::from(w))
}

#[test]
fn a_forwarded_port_relayed_without_a_descriptor_is_recorded_as_a_forward() {
    let (port, srv) = server(|mut s| {
        let mut got = [0u8; 3];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"ok").unwrap();
        got
    });
    let p = proxy(&entry(format!("localhost:{port}")));
    let mut c = client(&p);
    assert!(hako_net::announce_forward(&c, port).unwrap());
    c.write_all(b"abc").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_string(&mut c), "ok");
    assert_eq!(&srv.join().unwrap(), b"abc");
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol, ev.bytes_up, ev.bytes_down),
        (NetDecision::Allowed, NetProtocol::Forward, 3, 2)
    );
    // Not allowed: the proxy takes it and closes, recording the refusal.
    let untouched = Untouched::new();
    let mut c = client(&p);
    assert!(hako_net::announce_forward(&c, untouched.port).unwrap());
    assert_eq!(read_string(&mut c), "");
    let ev = one_event(&p);
    assert_eq!(
        (ev.decision, ev.protocol),
        (NetDecision::Refused, NetProtocol::Forward)
    );
    untouched.assert_untouched();
}
