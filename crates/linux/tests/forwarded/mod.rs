//! A forwarded host port, attacked from inside: whatever the sandbox does
//! with its end of a forwarded connection, it stays a socket of the
//! sandbox's own network namespace. (A design that gave the sandbox a
//! socket of the host's namespace, connected to the service, would fail
//! these: TCP lets a connected socket be disconnected and used again.)
//! Run from `all.rs`, so as root and, in CI, unprivileged too.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::workspace;
use hako_core::{Command, NetworkPolicy, Output, Sandbox};
use hako_linux::{LinuxConfig, LinuxSandbox};

fn sandbox(ws: &Path, allow: &[String]) -> LinuxSandbox {
    let mut config = LinuxConfig::new(ws);
    config.spec.network = Some(NetworkPolicy::allow(allow.iter().cloned()));
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

/// A host service that greets each connection and counts them.
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
                let _ = conn.write_all(b"hello\n");
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Service { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Connects to the forwarded port, reads the greeting, then disconnects
/// the socket (`connect` with `AF_UNSPEC`).
const DISCONNECTED: &str = r#"
import ctypes, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def disconnected(port):
    s = socket.create_connection(("127.0.0.1", port))
    assert s.recv(6) == b"hello\n"
    unspec = struct.pack("=H", socket.AF_UNSPEC) + bytes(14)
    assert libc.connect(s.fileno(), unspec, 16) == 0, ctypes.get_errno()
    return s
"#;

#[test]
fn disconnecting_a_forwarded_connection_and_reconnecting_it_reaches_no_other_host_port() {
    let allowed = Service::start();
    let other = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", allowed.port)]);
    let script = format!(
        "{DISCONNECTED}
s = disconnected({})
try:
    s.connect(('127.0.0.1', {}))
    print('reached')
except OSError as e:
    print('refused', e.errno)
",
        allowed.port, other.port
    );
    let out = python(&sb, &script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("refused"), "{text}");
    assert_eq!(other.accepted(), 0, "the port not allowed was reached");
    assert!(allowed.accepted() >= 1);
}

#[test]
fn disconnecting_a_forwarded_connection_and_listening_on_it_is_not_reachable_from_the_host() {
    let allowed = Service::start();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws, &[format!("localhost:{}", allowed.port)]);
    let port_file = ws.join("port");
    // The attack may be refused at any step: the kernel may refuse to
    // bind or to listen on a disconnected socket (6.18 answers `listen`
    // with EINVAL), which says "refused at ..." and writes no port. Only
    // a connection from the host reaching the sandbox's listener fails
    // the test.
    let script = format!(
        "{DISCONNECTED}
import os
s = disconnected({})
def publish(text):
    open({file:?} + '.tmp', 'w').write(text)
    os.rename({file:?} + '.tmp', {file:?})
step = 'bind'
try:
    s.bind(('0.0.0.0', 0))
    step = 'listen'
    s.listen(4)
except OSError as e:
    publish('refused')
    print('refused at', step, e.errno)
    raise SystemExit(0)
s.settimeout(3)
publish(str(s.getsockname()[1]))
try:
    c, peer = s.accept()
    print('accepted', peer)
except socket.timeout:
    print('nothing came')
",
        allowed.port,
        file = port_file.display().to_string(),
    );
    let knock = {
        let port_file = port_file.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(p) = std::fs::read_to_string(&port_file) {
                    let Ok(port) = p.trim().parse::<u16>() else {
                        // Refused inside: nothing listens to knock on.
                        return;
                    };
                    // Whatever answers on the host, it is not the sandbox.
                    let _ = TcpStream::connect_timeout(
                        &([127, 0, 0, 1], port).into(),
                        Duration::from_secs(1),
                    );
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("the sandbox neither listened nor was refused");
        })
    };
    let out = python(&sb, &script);
    knock.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let text = text.trim();
    assert!(
        text == "nothing came" || text.starts_with("refused at "),
        "{text}"
    );
    // The sandbox is still usable after the attack, the forwarded port
    // included.
    let again = python(
        &sb,
        &format!(
            "import socket\nprint(socket.create_connection(('127.0.0.1', {})).recv(6).decode().strip())",
            allowed.port
        ),
    );
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), "hello");
}
