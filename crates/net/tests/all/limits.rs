//! Sandboxes of one process sharing its connections, and the idle timeout.
//!
//! Each sandbox of a process has a proxy of its own; these tests give two
//! proxies a budget of their own (`ConnectionBudget::fixed`), as the
//! process's descriptor limit gives every proxy of a process one.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use hako_core::{NetDecision, NetEvent, NetProtocol};
use hako_net::{hand_over, ConnectionBudget, Proxy};

use crate::support::*;

/// A TCP server on 127.0.0.1 that echoes every connection until its
/// client closes.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) if s.write_all(&buf[..n]).is_err() => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    port
}

/// A sandbox's proxy, allowed to reach `port` on the host's loopback by
/// CONNECT and as a forwarded port, sharing `budget`.
fn sandbox_proxy(port: u16, budget: &ConnectionBudget) -> Proxy {
    let mut cfg = config(
        &[format!("127.0.0.1:{port}"), format!("localhost:{port}")],
        &[],
    );
    cfg.budget = budget.clone();
    Proxy::start(cfg).unwrap()
}

/// Sends `ping` over `c` and checks that it comes back.
fn echoes(c: &mut (impl Read + Write)) -> bool {
    if c.write_all(b"ping").is_err() {
        return false;
    }
    let mut got = [0u8; 4];
    c.read_exact(&mut got).is_ok() && &got == b"ping"
}

/// A CONNECT tunnel to the echo server through `p`, checked to carry
/// bytes; or the proxy's whole answer if it refused.
fn tunnel(p: &Proxy, port: u16) -> Result<UnixStream, String> {
    let mut c = client(p);
    c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let head = read_head(&mut c);
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head + &read_string(&mut c));
    }
    assert!(echoes(&mut c), "an open tunnel carries nothing");
    Ok(c)
}

/// A connection to the forwarded port, handed over to `p` as the
/// sandbox's forwarder does, checked to reach the echo server.
fn forwarded_port_works(p: &Proxy, port: u16) -> bool {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut inside = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    inside.set_read_timeout(Some(TIMEOUT)).unwrap();
    let (accepted, _) = l.accept().unwrap();
    assert!(hand_over(&client(p), accepted.as_fd(), Some(port)).unwrap());
    drop(accepted);
    echoes(&mut inside)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn refusals(evs: &[NetEvent]) -> Vec<&NetEvent> {
    evs.iter()
        .filter(|e| e.decision == NetDecision::Refused)
        .collect()
}

#[test]
fn one_sandbox_holding_its_whole_share_of_idle_connections_does_not_starve_another() {
    let port = echo_server();
    let budget = ConnectionBudget::fixed(8);
    let hog = sandbox_proxy(port, &budget);
    let other = sandbox_proxy(port, &budget);

    // The attack: the first sandbox opens tunnels until it is refused, and
    // holds them idle.
    let mut held = Vec::new();
    let refusal = loop {
        match tunnel(&hog, port) {
            Ok(c) => held.push(c),
            Err(answer) => break answer,
        }
        assert!(held.len() <= 8, "never refused");
    };
    assert!(
        refusal.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refusal}"
    );
    assert_eq!(
        header(&refusal, "X-Hako-Rule"),
        Some("too-many-connections")
    );

    // The other sandbox is still served: a tunnel, and a forwarded port.
    let mut theirs = tunnel(&other, port).expect("the other sandbox was starved");
    assert!(
        forwarded_port_works(&other, port),
        "the other sandbox's forwarded port was reset"
    );
    assert!(echoes(&mut theirs));
    assert!(refusals(&other.take_events().0).is_empty());

    // The first sandbox got its share, 8 connections among 2 sandboxes,
    // kept them all, and its record names the limit it hit.
    assert_eq!(held.len(), 4);
    assert_eq!(hog.live_connections(), 4);
    let evs = events(&hog, 1);
    let refused = refusals(&evs);
    assert_eq!(refused.len(), 1, "{evs:?}");
    assert_eq!(refused[0].rule, "too-many-connections");
    let message = refused[0].message.as_deref().unwrap_or("");
    assert!(message.contains("its whole share of 4"), "{message}");

    // Once it lets go, the first sandbox is served again.
    drop(held);
    wait_until("the first sandbox's tunnels end", || {
        hog.live_connections() == 0
    });
    let mut again = tunnel(&hog, port).expect("the first sandbox is still refused");
    assert!(echoes(&mut again));
    assert!(forwarded_port_works(&hog, port));
}

#[test]
fn a_sandbox_that_took_the_whole_budget_before_another_started_cannot_starve_it() {
    let port = echo_server();
    let budget = ConnectionBudget::fixed(4);
    let first = sandbox_proxy(port, &budget);
    // Alone, the first sandbox's share is the whole budget.
    let mut held: Vec<UnixStream> = (0..4).map(|_| tunnel(&first, port).unwrap()).collect();
    assert!(tunnel(&first, port).is_err());
    // Its first tunnel moves bytes again: the second and third have now
    // been quiet the longest.
    assert!(echoes(&mut held[0]));

    // A second sandbox starts: each one's share is now 2, and the first
    // holds 4. The second still gets its 2, and no more.
    let second = sandbox_proxy(port, &budget);
    let mut mine: Vec<UnixStream> = (0..2)
        .map(|_| tunnel(&second, port).expect("the second sandbox was starved"))
        .collect();
    let refusal = tunnel(&second, port).unwrap_err();
    assert_eq!(
        header(&refusal, "X-Hako-Rule"),
        Some("too-many-connections"),
        "{refusal}"
    );
    for c in &mut mine {
        assert!(echoes(c));
    }

    // The first sandbox's two quietest tunnels were closed to make room,
    // and recorded so; the others still work.
    assert_eq!(read_to_end(&mut held[1]), b"");
    assert_eq!(read_to_end(&mut held[2]), b"");
    assert!(echoes(&mut held[0]));
    assert!(echoes(&mut held[3]));
    let evs = events(&first, 3);
    let reclaimed: Vec<&NetEvent> = evs
        .iter()
        .filter(|e| e.decision == NetDecision::Allowed)
        .collect();
    assert_eq!(reclaimed.len(), 2, "{evs:?}");
    for e in reclaimed {
        let message = e.message.as_deref().unwrap_or("");
        assert!(
            message.starts_with("closed to make room for another sandbox"),
            "{message}"
        );
        assert_eq!((e.bytes_up, e.bytes_down), (4, 4));
    }
    // It is at its share now: refused, and nothing more is taken from it.
    assert!(tunnel(&first, port).is_err());
    wait_until("the closed tunnels' threads end", || {
        first.live_connections() == 2
    });
    assert!(echoes(&mut held[0]));
    assert!(echoes(&mut held[3]));
}

#[test]
fn an_idle_relayed_connection_is_closed_after_the_idle_timeout() {
    let port = echo_server();
    let mut cfg = config(
        &[format!("127.0.0.1:{port}"), format!("localhost:{port}")],
        &[],
    );
    cfg.idle_timeout = Some(Duration::from_millis(200));
    let p = Proxy::start(cfg).unwrap();

    // A tunnel and a forwarded port that carry a little, then go quiet.
    let mut tunnelled = tunnel(&p, port).unwrap();
    let mut forwarded = client(&p);
    assert!(hako_net::announce_forward(&forwarded, port).unwrap());
    assert!(echoes(&mut forwarded));

    // Each is closed by the proxy (the client's read would otherwise time
    // out and fail here).
    assert_eq!(read_to_end(&mut tunnelled), b"");
    assert_eq!(read_to_end(&mut forwarded), b"");
    let evs = events(&p, 2);
    assert_eq!(evs.len(), 2, "{evs:?}");
    for e in &evs {
        assert_eq!(e.decision, NetDecision::Allowed);
        assert_eq!((e.bytes_up, e.bytes_down), (4, 4), "{e:?}");
        assert_eq!(
            e.message.as_deref(),
            Some("closed after 200 ms with no bytes either way (the idle timeout)")
        );
    }
    let mut protocols: Vec<NetProtocol> = evs.iter().map(|e| e.protocol).collect();
    protocols.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(protocols, [NetProtocol::Connect, NetProtocol::Forward]);
    // Their threads let go of their places once they have recorded them.
    wait_until("the closed connections' threads end", || {
        p.live_connections() == 0
    });
}

#[test]
fn a_relayed_connection_that_keeps_moving_bytes_one_way_outlives_the_idle_timeout() {
    // The server sends a byte every 20 ms for five times the idle timeout;
    // the client sends nothing after its request (a download).
    let idle = Duration::from_millis(500);
    let (port, srv) = server(move |mut s| {
        for _ in 0..125 {
            s.write_all(b".").unwrap();
            thread::sleep(Duration::from_millis(20));
        }
        s.shutdown(Shutdown::Write).unwrap();
    });
    let mut cfg = config(&entry(format!("127.0.0.1:{port}")), &[]);
    cfg.idle_timeout = Some(idle);
    let p = Proxy::start(cfg).unwrap();
    let mut c = client(&p);
    c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    assert!(read_head(&mut c).starts_with("HTTP/1.1 200"));
    assert_eq!(read_to_end(&mut c).len(), 125);
    srv.join().unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let ev = one_event(&p);
    assert_eq!((ev.bytes_up, ev.bytes_down), (0, 125));
    assert_eq!(ev.message, None);
}
