//! The direct path for forwarded host ports (`linux` only): a `connect`
//! to `127.0.0.1:PORT` inside is answered with a socket connected on the
//! host's loopback, and every other `connect` goes on into the sandbox.
//! Run from `all.rs`, so as root and, in CI, unprivileged too.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hako_core::{Command, NetDecision, NetEvent, NetProtocol, NetworkPolicy, Output, Sandbox};
use hako_linux::{LinuxConfig, LinuxSandbox};

/// Bytes the service sends, and what it reads before it closes.
const DOWN: usize = 300_000;
const UP: usize = 1234;

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    (dir, ws)
}

fn sandbox(ws: &Path, allow: &[String]) -> LinuxSandbox {
    let mut config = LinuxConfig::new(ws);
    config.network = NetworkPolicy::allow(allow.iter().cloned());
    LinuxSandbox::new(config).unwrap()
}

fn python(sb: &dyn Sandbox, script: &str) -> Output {
    let out = sb
        .exec(&Command::new(["python3", "-c", script]).timeout(Duration::from_secs(60)))
        .unwrap();
    assert!(
        out.status.success(),
        "python3 inside: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn events(sb: &LinuxSandbox) -> Vec<NetEvent> {
    sb.close().unwrap();
    sb.network_events().unwrap().take_network_events().0
}

/// A host service that, for each connection, writes the peer port it
/// sees as a line and then [`DOWN`] bytes, reads [`UP`] bytes, and
/// closes.
struct Service {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Service {
    fn start() -> Service {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let peer = conn.peer_addr().unwrap().port();
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                    let _ = conn.write_all(format!("{peer:05}\n").as_bytes());
                    let _ = conn.write_all(&vec![b'x'; DOWN - 6]);
                    let mut got = vec![0u8; UP];
                    let _ = conn.read_exact(&mut got);
                });
            }
        });
        Service { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Connects (as `connect` says), prints the socket's own port and the
/// peer port the service saw, sends UP bytes and reads to the end.
fn client(connect: &str) -> String {
    format!(
        r#"
import socket, fcntl, os
{connect}
mine = s.getsockname()[1]
s.setblocking(True)
data = b""
while len(data) < 6:
    data += s.recv(6 - len(data))
s.sendall(b"u" * {UP})
total = len(data)
while True:
    b = s.recv(65536)
    if not b:
        break
    total += len(b)
print(mine, int(data[:5]), total)
"#
    )
}

fn ports_and_total(out: &Output) -> (u16, u16, usize) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 3, "{text}");
    (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
    )
}

#[test]
fn a_forwarded_port_is_the_host_socket_itself_and_is_recorded_with_its_bytes() {
    let service = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", service.port)]);
    let connect = format!(
        "s = socket.create_connection(('127.0.0.1', {}))",
        service.port
    );
    let (mine, seen, total) = ports_and_total(&python(&sb, &client(&connect)));
    assert_eq!(total, DOWN);
    // The service's peer is the sandbox's own socket: no relay between.
    assert_eq!(mine, seen, "the connection was relayed");
    let events = events(&sb);
    let forwarded: Vec<&NetEvent> = events
        .iter()
        .filter(|e| e.protocol == NetProtocol::Forward)
        .collect();
    assert_eq!(forwarded.len(), 1, "{events:?}");
    let e = forwarded[0];
    assert_eq!(e.decision, NetDecision::Allowed);
    assert_eq!((e.host.as_str(), e.port), ("localhost", service.port));
    assert_eq!(e.rule, format!("localhost:{}", service.port));
    assert_eq!(
        e.address.as_deref(),
        Some(&*format!("127.0.0.1:{}", service.port))
    );
    assert_eq!(
        (e.bytes_up, e.bytes_down),
        (UP as u64, DOWN as u64),
        "{e:?}"
    );
    assert_eq!(e.message, None);
}

#[test]
fn a_non_blocking_or_ipv6_connect_keeps_its_socket_flags_on_the_direct_path() {
    let service = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", service.port)]);
    let port = service.port;
    // Non-blocking, close-on-exec off, TCP_NODELAY on: all kept.
    let connect = format!(
        r#"
import select
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.set_inheritable(s.fileno(), True)
s.setblocking(False)
r = s.connect_ex(('127.0.0.1', {port}))
assert r in (0, 115), r
select.select([], [s], [], 10)
assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
assert fcntl.fcntl(s.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
assert os.get_inheritable(s.fileno())
assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
assert s.getpeername() == ('127.0.0.1', {port}), s.getpeername()
"#
    );
    let (mine, seen, total) = ports_and_total(&python(&sb, &client(&connect)));
    assert_eq!((mine, total), (seen, DOWN));
    // IPv6 loopback, where the sandbox has it, reaches the IPv4 service.
    let has_v6 = python(
        &sb,
        "import socket\ntry:\n    socket.socket(socket.AF_INET6).bind(('::1', 0))\n    print('yes')\nexcept OSError:\n    print('no')",
    );
    if String::from_utf8_lossy(&has_v6.stdout).contains("yes") {
        let connect = format!("s = socket.create_connection(('::1', {port}))");
        let (mine, seen, total) = ports_and_total(&python(&sb, &client(&connect)));
        assert_eq!((mine, total), (seen, DOWN));
    }
}

#[test]
fn a_udp_socket_connecting_to_a_forwarded_port_is_left_to_the_kernel() {
    let service = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", service.port)]);
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.connect(('127.0.0.1', {}))\nprint(s.type == socket.SOCK_DGRAM, s.getpeername()[1])",
        service.port
    );
    let out = python(&sb, &script);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("True {}", service.port)
    );
    assert_eq!(service.accepted(), 0);
}

#[test]
fn a_connection_that_bypasses_connect_with_tcp_fast_open_goes_through_the_forwarder() {
    let service = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", service.port)]);
    // sendto(MSG_FASTOPEN) connects without connect(2): the filter never
    // sees it, and the sandbox's own loopback (the forwarder) answers.
    let connect = format!(
        "s = socket.socket()\ns.sendto(b'', socket.MSG_FASTOPEN, ('127.0.0.1', {}))",
        service.port
    );
    let (mine, seen, total) = ports_and_total(&python(&sb, &client(&connect)));
    assert_eq!(total, DOWN);
    assert_ne!(mine, seen, "a fast-open connection was not relayed");
    let events = events(&sb);
    assert!(
        events.iter().any(|e| e.protocol == NetProtocol::Forward
            && e.decision == NetDecision::Allowed
            && e.bytes_down == DOWN as u64),
        "{events:?}"
    );
}

#[test]
fn flipping_the_connect_address_mid_call_never_reaches_a_port_not_allowed() {
    let allowed = Service::start();
    let other = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", allowed.port)]);
    // One thread rewrites the sockaddr between the allowed port and
    // another host port while the other calls connect with it: the
    // proxy connects only what it read and checked, and a call it
    // leaves to the kernel stays in the sandbox's namespace.
    let script = format!(
        r#"
import ctypes, socket, struct, threading
libc = ctypes.CDLL(None, use_errno=True)
def addr(port):
    return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + bytes([127, 0, 0, 1]) + bytes(8)
a, b = addr({}), addr({})
buf = ctypes.create_string_buffer(a, 16)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, a, 16)
        ctypes.memmove(buf, b, 16)
t = threading.Thread(target=flip)
t.start()
ok = 0
for i in range(300):
    s = socket.socket()
    if libc.connect(s.fileno(), buf, 16) == 0:
        ok += 1
    s.close()
stop = True
t.join()
print(ok)
"#,
        allowed.port, other.port
    );
    let out = python(&sb, &script);
    let ok: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(ok > 0, "no connect succeeded");
    assert_eq!(other.accepted(), 0, "the port not allowed was reached");
}
