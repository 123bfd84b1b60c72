//! Start, limits, timeouts, events, shutdown.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::thread;
use std::time::{Duration, Instant};

use hako_core::{NetDecision, NetworkPolicy};
use hako_net::{Proxy, ProxyConfig, SOCKET_NAME};

use crate::support::*;

#[test]
fn socket_lives_in_a_private_directory_removed_by_shutdown() {
    let p = proxy(&entry("pkg.example"));
    let dir = p.socket_dir().to_path_buf();
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(p.socket_path(), dir.join(SOCKET_NAME));
    assert!(std::fs::metadata(p.socket_path())
        .unwrap()
        .file_type()
        .is_socket());
    p.shutdown();
    assert!(!dir.exists());
    p.shutdown();
    drop(p);
}

#[test]
fn drop_removes_the_directory() {
    let p = proxy(&entry("pkg.example"));
    let dir = p.socket_dir().to_path_buf();
    drop(p);
    assert!(!dir.exists());
}

#[test]
fn config_from_policy_uses_its_entries_and_overrides() {
    let mut policy = NetworkPolicy::allow(["pkg.example", "localhost:11434"]);
    policy
        .resolve
        .push(("pkg.example".into(), "10.0.0.7".parse().unwrap()));
    let cfg = ProxyConfig::from_policy(&policy).unwrap();
    assert_eq!(cfg.allow.forwarded_ports(), vec![11434]);
    assert_eq!(cfg.max_connections, 256);
    assert_eq!(cfg.idle_timeout, Some(Duration::from_secs(600)));
    assert_eq!(cfg.max_events, 4096);
    let bad = NetworkPolicy::allow(["localhost"]);
    let e = ProxyConfig::from_policy(&bad).unwrap_err();
    assert!(e.to_string().contains("`localhost`"), "{e}");
}

#[test]
fn shutdown_ends_live_relays_and_records_them() {
    let (port, srv) = server(|mut s| {
        let mut held = [0u8; 4];
        s.read_exact(&mut held).unwrap();
        s.write_all(b"ok").unwrap();
        // Holds the connection open until the proxy ends it.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        held.len() + rest.len()
    });
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let dir = p.socket_dir().to_path_buf();
    let mut c = client(&p);
    c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    read_head(&mut c);
    c.write_all(b"held").unwrap();
    let mut ok = [0u8; 2];
    c.read_exact(&mut ok).unwrap();
    assert_eq!(p.live_connections(), 1);
    let t = Instant::now();
    p.shutdown();
    assert!(t.elapsed() < TIMEOUT);
    assert_eq!(read_to_end(&mut c), b"");
    assert_eq!(srv.join().unwrap(), 4);
    assert!(!dir.exists());
    let (evs, dropped) = p.take_events();
    assert_eq!(dropped, 0);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].decision, NetDecision::Allowed);
    assert_eq!((evs[0].bytes_up, evs[0].bytes_down), (4, 2));
    assert_eq!(p.live_connections(), 0);
}

#[test]
fn too_many_connections_are_refused_at_once() {
    let (port, srv) = server(|mut s| {
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    });
    let mut cfg = config(&entry(format!("127.0.0.1:{port}")), &[]);
    cfg.max_connections = 1;
    let p = Proxy::start(cfg).unwrap();
    let mut first = client(&p);
    first
        .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    read_head(&mut first);
    assert!(p.take_events().0.is_empty());

    let answer = roundtrip(
        &p,
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert_eq!(header(&answer, "X-Hako-Rule"), Some("too-many-connections"));
    let mut c = client(&p);
    let e = hako_net::socks5_connect(&mut c, "localhost", 1).unwrap_err();
    assert!(
        e.to_string().contains("general SOCKS server failure"),
        "{e}"
    );
    let evs = events(&p, 2);
    assert!(evs
        .iter()
        .all(|e| e.rule == "too-many-connections" && e.decision == NetDecision::Refused));

    first.shutdown(Shutdown::Write).unwrap();
    read_to_end(&mut first);
    srv.join().unwrap();
    // The slot frees when the first connection's thread ends.
    let deadline = Instant::now() + TIMEOUT;
    while p.live_connections() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let answer = roundtrip(&p, b"CONNECT other.example:443 HTTP/1.1\r\n\r\n");
    assert_eq!(
        header(&answer, "X-Hako-Rule"),
        Some("not-on-allowlist"),
        "{answer}"
    );
}

#[test]
fn silent_client_is_cut_at_the_handshake_timeout() {
    let mut cfg = config(&entry("pkg.example"), &[]);
    cfg.handshake_timeout = Duration::from_millis(200);
    let p = Proxy::start(cfg).unwrap();
    let mut c = client(&p);
    let t = Instant::now();
    assert_eq!(read_to_end(&mut c), b"");
    assert!(t.elapsed() < TIMEOUT);
    let ev = one_event(&p);
    assert_eq!(ev.rule, "handshake-timeout");
}

#[test]
fn slowloris_request_head_is_cut_at_the_handshake_deadline() {
    let mut cfg = config(&entry("pkg.example"), &[]);
    cfg.handshake_timeout = Duration::from_millis(300);
    let p = Proxy::start(cfg).unwrap();
    let mut c = client(&p);
    // One byte every 100 ms never finishes a head; the deadline is for the
    // whole handshake, not per read.
    let mut answer = Vec::new();
    for b in b"GET http://pkg.example/ HTTP/1.1\r\nX: " {
        if c.write_all(&[*b]).is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
        c.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1024];
        if let Ok(n) = c.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
        }
        c.set_nonblocking(false).unwrap();
        if !answer.is_empty() {
            break;
        }
    }
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    assert_eq!(one_event(&p).rule, "handshake-timeout");
}

#[test]
fn event_queue_is_bounded_and_counts_what_it_dropped() {
    let mut cfg = config(&entry("pkg.example"), &[]);
    cfg.max_events = 2;
    let p = Proxy::start(cfg).unwrap();
    for i in 0..5 {
        roundtrip(
            &p,
            format!("CONNECT host{i}.example:443 HTTP/1.1\r\n\r\n").as_bytes(),
        );
    }
    // Every refusal was recorded before its answer was read.
    let deadline = Instant::now() + TIMEOUT;
    let (evs, dropped) = loop {
        let (evs, dropped) = p.take_events();
        if dropped == 3 || Instant::now() > deadline {
            break (evs, dropped);
        }
        thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(dropped, 3);
    let hosts: Vec<&str> = evs.iter().map(|e| e.host.as_str()).collect();
    assert_eq!(hosts, ["host3.example", "host4.example"]);
    assert_eq!(p.take_events(), (vec![], 0));
}

#[test]
fn a_backlog_flooded_before_serving_cannot_hang_shutdown() {
    use rustix::net::{
        connect, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType,
    };
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let p = Proxy::bind(config(&entry("pkg.example"), &[])).unwrap();
    // The backlog is as long as the kernel allows (`somaxconn`): make room
    // for that many descriptors.
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    let addr = SocketAddrUnix::new(p.socket_path()).unwrap();
    let mut held = Vec::new();
    loop {
        let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
        let fd = match socket_with(AddressFamily::UNIX, SocketType::STREAM, flags, None) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!(
                    "skipped: cannot fill the backlog ({e} after {} sockets)",
                    held.len()
                );
                return;
            }
        };
        match connect(&fd, &addr) {
            Ok(()) => held.push(fd),
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("connect: {e}"),
        }
        assert!(held.len() < 1 << 20, "the backlog never filled");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        p.shutdown();
        let _ = tx.send(());
    });
    rx.recv_timeout(TIMEOUT)
        .expect("shutdown hung waking an accept thread that never ran");
    drop(held);
}
