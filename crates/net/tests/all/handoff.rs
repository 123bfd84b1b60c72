//! Handing the sandbox's own TCP connection to the proxy (what the
//! forwarder inside does where descriptors can cross).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use hako_core::{NetDecision, NetProtocol};
use hako_net::{hand_over, Proxy};

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

/// A server that answers `pong` to `ping`, reached by a CONNECT tunnel on
/// a connection handed over to the proxy (left non-blocking, and written
/// to only after the proxy's first read, when `nonblocking`); returns the
/// proxy and the sandbox's end of the connection.
fn ping_pong_through_a_handed_over_connection(nonblocking: bool) -> (Proxy, TcpStream) {
    let (port, srv) = server(|mut s| {
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"pong").unwrap();
        got
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let (mut inside, accepted) = pair();
    if nonblocking {
        accepted.set_nonblocking(true).unwrap();
    }
    assert!(hand_over(&client(&p), accepted.as_fd(), None).unwrap());
    // The forwarder's copy closes; the proxy keeps the connection.
    drop(accepted);
    if nonblocking {
        // The request comes later than the proxy's first read.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    inside
        .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping").as_bytes())
        .unwrap();
    let head = read_head(&mut inside);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut pong = [0u8; 4];
    inside.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    assert_eq!(&srv.join().unwrap(), b"ping");
    (p, inside)
}

#[test]
fn a_handed_over_connection_on_the_proxy_port_is_served_as_a_client() {
    let (p, inside) = ping_pong_through_a_handed_over_connection(false);
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

/// Sends a raw handover: `header` with `fds` attached, and returns the
/// proxy's one-byte answer.
fn raw_handover(p: &hako_net::Proxy, header: &[u8], fds: &[BorrowedFd<'_>]) -> u8 {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::io::IoSlice;
    let c = client(p);
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    assert!(ancillary.push(SendAncillaryMessage::ScmRights(fds)));
    let sent = sendmsg(
        &c,
        &[IoSlice::new(header)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    assert_eq!(sent, header.len());
    let mut answer = [9u8; 1];
    (&c).read_exact(&mut answer).unwrap();
    answer[0]
}

/// Whether the proxy let go of the connection whose other end is
/// `inside` (the handed-over end was already closed here): `inside` then
/// reads end of stream at once, where a copy kept by the proxy would leave
/// it waiting.
fn closed_by_the_proxy(inside: &mut TcpStream) -> bool {
    inside
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = [0u8; 1];
    matches!(inside.read(&mut b), Ok(0))
}

#[test]
fn handing_over_a_listening_socket_is_refused_and_nothing_is_connected() {
    let untouched = Untouched::new();
    let p = proxy(&entry(format!("localhost:{}", untouched.port)));
    let listening = TcpListener::bind("127.0.0.1:0").unwrap();
    assert!(!hand_over(&client(&p), listening.as_fd(), Some(untouched.port)).unwrap());
    assert!(!hand_over(&client(&p), listening.as_fd(), None).unwrap());
    untouched.assert_untouched();
}

#[test]
fn handing_over_a_udp_socket_is_refused() {
    let p = proxy(&entry("localhost:1"));
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.connect("127.0.0.1:9").unwrap();
    assert!(!hand_over(&client(&p), udp.as_fd(), None).unwrap());
    assert!(!hand_over(&client(&p), udp.as_fd(), Some(1)).unwrap());
}

#[test]
fn a_handover_carrying_several_descriptors_is_refused_and_closes_them_all() {
    let p = proxy(&entry("localhost:1"));
    for n in [2, 3, 4] {
        let pairs: Vec<(TcpStream, TcpStream)> = (0..n).map(|_| pair()).collect();
        let fds: Vec<BorrowedFd<'_>> = pairs.iter().map(|(_, a)| a.as_fd()).collect();
        assert_eq!(raw_handover(&p, &[0, 0, 0, 0], &fds), 0, "{n} descriptors");
        drop(fds);
        for (mut inside, accepted) in pairs {
            drop(accepted);
            assert!(closed_by_the_proxy(&mut inside), "{n} descriptors");
        }
    }
}

#[test]
fn a_truncated_or_malformed_handover_header_is_refused_and_closes_the_descriptor() {
    let p = proxy(&entry("localhost:1"));
    for header in [
        &[0u8][..],
        &[0, 0],
        &[0, 0, 0],
        &[0, 0, 0, 0, b'G'],
        &[0, 9, 0, 1],
        &[0, 1, 0, 0],
        &[0, 2, 0, 1],
    ] {
        let (mut inside, accepted) = pair();
        assert_eq!(
            raw_handover(&p, header, &[accepted.as_fd()]),
            0,
            "{header:?}"
        );
        drop(accepted);
        assert!(closed_by_the_proxy(&mut inside), "{header:?}");
    }
    // The proxy still serves the next client.
    let answer = roundtrip(
        &p,
        b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

#[test]
fn a_handed_over_socket_left_nonblocking_is_still_served() {
    ping_pong_through_a_handed_over_connection(true);
}

#[test]
fn a_relayed_forwarded_port_is_not_cut_by_the_handshake_timeout_once_relaying() {
    let (port, srv) = server(|mut s| {
        let mut got = [0u8; 3];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"ok").unwrap();
        got
    });
    let mut cfg = config(&entry(format!("localhost:{port}")), &[]);
    cfg.handshake_timeout = std::time::Duration::from_millis(200);
    let p = hako_net::Proxy::start(cfg).unwrap();
    let mut c = client(&p);
    assert!(hako_net::announce_forward(&c, port).unwrap());
    // A client waiting longer than the handshake timeout (a slow model
    // server's answer, say) before it sends.
    std::thread::sleep(std::time::Duration::from_millis(600));
    c.write_all(b"abc").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_string(&mut c), "ok");
    assert_eq!(&srv.join().unwrap(), b"abc");
}

#[test]
fn a_handed_over_connection_is_not_paced_by_the_machines_congestion_control() {
    let (port, srv) = server(|mut s| {
        s.write_all(b"ok").unwrap();
    });
    let p = proxy(&entry(format!("localhost:{port}")));
    let (mut inside, accepted) = pair();
    // A second descriptor of the same socket, to look at it once the proxy
    // has it.
    let ours = accepted.try_clone().unwrap();
    assert!(hand_over(&client(&p), accepted.as_fd(), Some(port)).unwrap());
    drop(accepted);
    let mut got = [0u8; 2];
    inside.read_exact(&mut got).unwrap();
    srv.join().unwrap();
    assert_eq!(rustix::net::sockopt::tcp_congestion(&ours).unwrap(), "reno");
}
