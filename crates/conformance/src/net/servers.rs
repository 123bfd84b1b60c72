//! The two servers the network cases reach: a service on the host's
//! loopback ([`HostService`]) and a web server in a network namespace of
//! the kit's own ([`TestNetwork`]).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::support::Res;

/// A TCP service on the host's loopback that answers every connection with
/// a marker and counts them.
pub struct HostService {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// What it answers.
    pub marker: String,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl HostService {
    /// Starts one on a free port.
    pub fn start(tag: &str) -> Result<HostService, String> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("bind a loopback service: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let marker = format!("hako-{tag}-service-{port}");
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt, answer) = (Arc::clone(&connections), Arc::clone(&stop), marker.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let answer = answer.clone();
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                            // Read the request head (if any), then answer.
                            let mut buf = [0u8; 4096];
                            let mut seen = Vec::new();
                            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                match conn.read(&mut buf) {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                                }
                            }
                            let body = format!("{answer}\n");
                            let _ = write!(
                                conn,
                                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(HostService {
            port,
            marker,
            connections,
            stop,
        })
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HostService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A web server in a network namespace of the kit's own, behind a veth
/// pair, on a documentation address: the "internet" an allowed name leads
/// to. Root only. Removed (namespace, veth, server) when dropped.
pub struct TestNetwork {
    namespace: String,
    server: Option<std::process::Child>,
    /// The server's address.
    pub addr: Ipv4Addr,
    /// What its page says.
    pub marker: String,
    _root: tempfile::TempDir,
}

fn ip(args: &[&str]) -> Res {
    let out = std::process::Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args:?}: {e} (install iproute2)"))?;
    ensure!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl TestNetwork {
    /// Creates the namespace and starts busybox's httpd in it; `Err` with
    /// the reason when this host cannot (not root, no `ip`).
    pub fn start() -> Result<TestNetwork, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !hako_sys::rustix::process::geteuid().is_root() {
            return Err("the test network namespace needs root".into());
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % 60;
        let pid = std::process::id();
        let namespace = format!("hako-kit-{pid}-{n}");
        let (outer, inner) = (
            format!("hk{}a{n}", pid % 100_000),
            format!("hk{}b{n}", pid % 100_000),
        );
        let base = 4 * n + 8;
        let host_addr = format!("198.51.100.{}", base + 1);
        let addr = Ipv4Addr::new(198, 51, 100, (base + 2) as u8);
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let marker = format!("hako-kit-page-{pid}-{n}");
        std::fs::write(root.path().join("index.html"), format!("{marker}\n"))
            .map_err(|e| e.to_string())?;
        ip(&["netns", "add", &namespace])?;
        let mut net = TestNetwork {
            namespace,
            server: None,
            addr,
            marker,
            _root: root,
        };
        let ns = net.namespace.clone();
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ])?;
        ip(&["link", "set", &inner, "netns", &ns])?;
        ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &outer])?;
        ip(&["link", "set", &outer, "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/30"),
            "dev",
            &inner,
        ])?;
        ip(&["-n", &ns, "link", "set", &inner, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // Nothing may leave this machine: the server's address must be
        // reached through the veth, not by some route of the host's.
        let route = std::process::Command::new("ip")
            .args(["route", "get", &addr.to_string()])
            .output()
            .map_err(|e| format!("ip route get: {e}"))?;
        let route = String::from_utf8_lossy(&route.stdout).into_owned();
        ensure!(
            route.contains(&format!("dev {outer} ")),
            "the route to {addr} does not lead into the test veth {outer}: {route}"
        );
        let server = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "busybox", "httpd", "-f"])
            .arg("-p")
            .arg(format!("{addr}:80"))
            .arg("-h")
            .arg(net._root.path())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("start busybox httpd: {e} (install busybox-static)"))?;
        net.server = Some(server);
        // Ready once it accepts.
        for _ in 0..200 {
            if std::net::TcpStream::connect_timeout(
                &(IpAddr::V4(addr), 80).into(),
                Duration::from_millis(100),
            )
            .is_ok()
            {
                return Ok(net);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("busybox httpd in the test namespace never answered".into())
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        // Deleting the namespace deletes the veth pair with it.
        let _ = ip(&["netns", "del", &self.namespace]);
    }
}
