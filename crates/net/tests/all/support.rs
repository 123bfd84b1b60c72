use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hako_core::NetEvent;
use hako_net::{Allowlist, Proxy, ProxyConfig, Resolver};

pub const TIMEOUT: Duration = Duration::from_secs(10);

pub fn config(entries: &[String], overrides: &[(&str, &str)]) -> ProxyConfig {
    let allow = Allowlist::parse(entries).unwrap();
    let resolver = Resolver::only_overrides(
        overrides
            .iter()
            .map(|(n, a)| (*n, a.parse::<IpAddr>().unwrap())),
    );
    ProxyConfig::new(allow, resolver)
}

pub fn proxy(entries: &[String]) -> Proxy {
    Proxy::start(config(entries, &[])).unwrap()
}

pub fn proxy_with(entries: &[String], overrides: &[(&str, &str)]) -> Proxy {
    Proxy::start(config(entries, overrides)).unwrap()
}

/// A client connection to the proxy, as the sandbox's forwarder makes it.
pub fn client(p: &Proxy) -> UnixStream {
    let s = UnixStream::connect(p.socket_path()).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s
}

/// A TCP server on 127.0.0.1 that serves one connection with `f`.
pub fn server<T: Send + 'static>(
    f: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> (u16, JoinHandle<T>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        f(s)
    });
    (port, h)
}

/// A listener that must never see a connection; `assert_untouched` checks.
pub struct Untouched {
    l: TcpListener,
    pub port: u16,
}

impl Untouched {
    pub fn new() -> Untouched {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        Untouched { l, port }
    }

    pub fn assert_untouched(&self) {
        let e = self.l.accept().unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "the server was reached"
        );
    }
}

/// Reads a request or response head (through the blank line).
pub fn read_head(s: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).unwrap() {
            0 => break,
            _ => head.push(b[0]),
        }
    }
    String::from_utf8(head).unwrap()
}

pub fn read_to_end(s: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    out
}

pub fn read_string(s: &mut impl Read) -> String {
    String::from_utf8_lossy(&read_to_end(s)).into_owned()
}

/// Sends `request` and returns the whole answer (the proxy closes after
/// one request).
pub fn roundtrip(p: &Proxy, request: &[u8]) -> String {
    let mut c = client(p);
    c.write_all(request).unwrap();
    read_string(&mut c)
}

/// The value of header `name` in a response head.
pub fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Waits until the proxy has recorded `n` events in all, and returns them.
pub fn events(p: &Proxy, n: usize) -> Vec<NetEvent> {
    let deadline = Instant::now() + TIMEOUT;
    let mut all = Vec::new();
    while all.len() < n && Instant::now() < deadline {
        let (mut got, _) = p.take_events();
        all.append(&mut got);
        if all.len() < n {
            thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(all.len() >= n, "expected {n} events, got {all:?}");
    all
}

pub fn one_event(p: &Proxy) -> NetEvent {
    let mut evs = events(p, 1);
    // Nothing else should come.
    thread::sleep(Duration::from_millis(20));
    evs.append(&mut p.take_events().0);
    assert_eq!(evs.len(), 1, "{evs:?}");
    evs.remove(0)
}

pub fn entry(s: impl Into<String>) -> Vec<String> {
    vec![s.into()]
}
