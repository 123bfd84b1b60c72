//! The network kit: what `none`, `allow` and `host` mean, checked the same
//! way on every isolating backend through `exec` of busybox's `nc` and
//! `wget` inside.
//!
//! Nothing here sends a packet anywhere but to loopback or to a network
//! namespace the kit creates itself: a name that must be reached resolves
//! (through the proxy's own resolver, `--resolve`) to a server the kit
//! starts in a namespace of its own behind a veth pair, on a documentation
//! address (198.51.100.0/24), which the proxy treats as public; the kit
//! checks that the route to it leads into that veth before anything
//! connects. Every refusal
//! of another address (private, metadata) happens in the proxy's policy,
//! before any connection is tried. The cases that need that namespace need
//! root; the others run anywhere.
//!
//! ```ignore
//! hako_conformance::network_tests!(linux, |ws: &Path, net: NetworkPolicy| {
//!     let mut config = LinuxConfig::new(ws);
//!     config.network = net;
//!     Ok(Box::new(LinuxSandbox::new(config)?))
//! });
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hako_core::{
    Command, Error, NetDecision, NetEvent, NetworkAccess, NetworkPolicy, Output, Sandbox,
};

use crate::Outcome;

/// Builds the sandbox under test on a workspace with a network policy.
pub type NetFactory = dyn Fn(&Path, NetworkPolicy) -> Result<Box<dyn Sandbox>, Error> + Send + Sync;

/// Pins a closure's signature down as a [`NetFactory`].
pub fn net_factory<F>(f: F) -> Arc<NetFactory>
where
    F: Fn(&Path, NetworkPolicy) -> Result<Box<dyn Sandbox>, Error> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// The proxy's port inside (see `hako_guest::network::PROXY_PORT`): read
/// back from `HTTP_PROXY`, never assumed.
fn proxy_port(sb: &dyn Sandbox) -> Result<u16, String> {
    let out = run(sb, &["sh", "-c", "echo $HTTP_PROXY"])?;
    let text = stdout(&out);
    text.trim()
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("HTTP_PROXY inside is {text:?}, not http://127.0.0.1:PORT"))
}

type Res = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

fn run(sb: &dyn Sandbox, argv: &[&str]) -> Result<Output, String> {
    sb.exec(&Command::new(argv.iter().copied()).timeout(Duration::from_secs(30)))
        .map_err(|e| format!("exec {argv:?}: {e}"))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Sends `request` to `host:port` from inside with busybox `nc` and
/// returns everything (stdout and stderr) and whether nc succeeded.
fn nc(sb: &dyn Sandbox, host: &str, port: u16, request: &str) -> Result<(String, bool), String> {
    let script = format!(
        "printf '{}' | busybox nc -w 5 {host} {port}",
        request.replace('\r', "\\r").replace('\n', "\\n")
    );
    let out = run(sb, &["sh", "-c", &script])?;
    Ok((both(&out), out.status.success()))
}

/// Closes the sandbox (every connection from inside ends, and is recorded)
/// and returns the proxy's record.
fn events_after_close(sb: &dyn Sandbox) -> Result<Vec<NetEvent>, String> {
    let _ = sb.close();
    let events = sb
        .network_events()
        .ok_or("an `allow` sandbox offers no network record")?;
    Ok(events.take_network_events().0)
}

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

/// One network case.
#[derive(Debug, Clone, Copy)]
pub struct NetCase {
    /// Its name (and the generated test's).
    pub name: &'static str,
    /// Runs it.
    pub run: fn(&Path, &NetFactory) -> Result<(), Skip>,
}

/// Why a case did not pass.
#[derive(Debug)]
pub enum Skip {
    /// A check failed.
    Failed(String),
    /// The case cannot run here.
    Skipped(String),
}

impl From<String> for Skip {
    fn from(s: String) -> Self {
        Skip::Failed(s)
    }
}

impl From<&str> for Skip {
    fn from(s: &str) -> Self {
        Skip::Failed(s.to_string())
    }
}

fn open(make: &NetFactory, ws: &Path, policy: NetworkPolicy) -> Result<Box<dyn Sandbox>, Skip> {
    make(ws, policy).map_err(opening_failed)
}

/// A factory that says the backend cannot run here skips the case (as
/// in the main kit); any other error fails it.
fn opening_failed(e: Error) -> Skip {
    match e {
        Error::Unsupported { .. } => Skip::Skipped(format!("the backend cannot run here: {e}")),
        e => Skip::Failed(format!("cannot open the sandbox: {e}")),
    }
}

fn test_network() -> Result<TestNetwork, Skip> {
    TestNetwork::start().map_err(Skip::Skipped)
}

fn allowed_name_is_reached_through_the_http_proxy(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let net = test_network()?;
    let mut policy = NetworkPolicy::allow(["pkg.test"]);
    policy.resolve = vec![("pkg.test".into(), IpAddr::V4(net.addr))];
    let sb = open(make, ws, policy)?;
    ensure!(
        sb.capabilities().network == NetworkAccess::Allowlist,
        "capabilities say {:?}",
        sb.capabilities().network
    );
    let out = run(
        sb.as_ref(),
        &["busybox", "wget", "-q", "-O", "-", "http://pkg.test/"],
    )?;
    ensure!(
        out.status.success() && stdout(&out).contains(&net.marker),
        "wget through the proxy: {:?} {}",
        out.status,
        both(&out)
    );
    let events = events_after_close(sb.as_ref())?;
    let hit = events
        .iter()
        .find(|e| e.host == "pkg.test" && e.decision == NetDecision::Allowed)
        .ok_or_else(|| format!("no allowed event for pkg.test in {events:?}"))?;
    ensure!(
        hit.port == 80 && hit.bytes_down > net.marker.len() as u64 && hit.bytes_up > 0,
        "{hit:?}"
    );
    ensure!(
        hit.address.as_deref() == Some(&*format!("{}:80", net.addr)),
        "{hit:?}"
    );
    Ok(())
}

fn connect_tunnel_to_an_allowed_name_carries_bytes_both_ways(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let net = test_network()?;
    let mut policy = NetworkPolicy::allow(["pkg.test:80"]);
    policy.resolve = vec![("pkg.test".into(), IpAddr::V4(net.addr))];
    let sb = open(make, ws, policy)?;
    let port = proxy_port(sb.as_ref())?;
    let (text, _) = nc(
        sb.as_ref(),
        "127.0.0.1",
        port,
        "CONNECT pkg.test:80 HTTP/1.1\r\nHost: pkg.test:80\r\n\r\nGET / HTTP/1.0\r\n\r\n",
    )?;
    ensure!(
        text.contains(" 200 ") && text.contains(&net.marker),
        "CONNECT then GET: {text}"
    );
    Ok(())
}

fn name_not_on_the_allowlist_is_refused_naming_the_rule(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let sb = open(make, ws, NetworkPolicy::allow(["pkg.test"]))?;
    let port = proxy_port(sb.as_ref())?;
    let (text, _) = nc(
        sb.as_ref(),
        "127.0.0.1",
        port,
        "GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
    )?;
    ensure!(
        text.contains("403") && text.contains("not-on-allowlist") && text.contains("other.test"),
        "plain HTTP: {text}"
    );
    let (text, _) = nc(
        sb.as_ref(),
        "127.0.0.1",
        port,
        "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n",
    )?;
    ensure!(
        text.contains("403") && text.contains("not-on-allowlist"),
        "CONNECT: {text}"
    );
    // A listed name on a port not listed.
    let (text, _) = nc(
        sb.as_ref(),
        "127.0.0.1",
        port,
        "CONNECT pkg.test:22 HTTP/1.1\r\nHost: pkg.test:22\r\n\r\n",
    )?;
    ensure!(
        text.contains("403") && text.contains("port-not-allowed"),
        "a port not listed: {text}"
    );
    let events = events_after_close(sb.as_ref())?;
    let refused: Vec<&NetEvent> = events
        .iter()
        .filter(|e| e.decision == NetDecision::Refused)
        .collect();
    ensure!(
        refused
            .iter()
            .any(|e| e.host == "other.test" && e.rule == "not-on-allowlist")
            && refused
                .iter()
                .any(|e| e.host == "pkg.test" && e.port == 22 && e.rule == "port-not-allowed"),
        "{events:?}"
    );
    Ok(())
}

fn ip_literal_not_on_the_allowlist_is_refused(ws: &Path, make: &NetFactory) -> Result<(), Skip> {
    let sb = open(make, ws, NetworkPolicy::allow(["pkg.test"]))?;
    let port = proxy_port(sb.as_ref())?;
    for (request, what) in [
        (
            "GET http://198.51.100.77/ HTTP/1.1\r\nHost: 198.51.100.77\r\n\r\n",
            "198.51.100.77",
        ),
        (
            "CONNECT 203.0.113.9:443 HTTP/1.1\r\nHost: 203.0.113.9:443\r\n\r\n",
            "203.0.113.9",
        ),
        (
            "CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
            "2001:db8::1",
        ),
    ] {
        let (text, _) = nc(sb.as_ref(), "127.0.0.1", port, request)?;
        ensure!(
            text.contains("403") && text.contains("not-on-allowlist"),
            "{what}: {text}"
        );
    }
    Ok(())
}

fn dns_rebinding_a_listed_name_to_a_private_address_is_refused(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let mut policy = NetworkPolicy::allow(["private.test", "loop.test"]);
    policy.resolve = vec![
        (
            "private.test".into(),
            "10.0.0.7".parse().map_err(|_| "addr")?,
        ),
        ("loop.test".into(), IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    let sb = open(make, ws, policy)?;
    let port = proxy_port(sb.as_ref())?;
    for name in ["private.test", "loop.test"] {
        let (text, _) = nc(
            sb.as_ref(),
            "127.0.0.1",
            port,
            &format!("GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\n\r\n"),
        )?;
        ensure!(
            text.contains("403") && text.contains("resolves-to-refused-address"),
            "{name}: {text}"
        );
    }
    Ok(())
}

fn cloud_metadata_addresses_are_refused_by_the_proxy_policy(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let mut policy = NetworkPolicy::allow(["meta.test", "meta6.test"]);
    policy.resolve = vec![
        (
            "meta.test".into(),
            "169.254.169.254".parse().map_err(|_| "addr")?,
        ),
        (
            "meta6.test".into(),
            "fd00:ec2::254".parse().map_err(|_| "addr")?,
        ),
    ];
    let sb = open(make, ws, policy)?;
    let port = proxy_port(sb.as_ref())?;
    for (request, rule) in [
        (
            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
            "not-on-allowlist",
        ),
        (
            "GET http://meta.test/latest/meta-data/ HTTP/1.1\r\nHost: meta.test\r\n\r\n",
            "metadata-address",
        ),
        (
            "CONNECT meta6.test:443 HTTP/1.1\r\nHost: meta6.test:443\r\n\r\n",
            "metadata-address",
        ),
    ] {
        let (text, _) = nc(sb.as_ref(), "127.0.0.1", port, request)?;
        ensure!(text.contains("403") && text.contains(rule), "{request:?}: {text}");
    }
    Ok(())
}

fn forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let service = HostService::start("forwarded")?;
    let sb = open(
        make,
        ws,
        NetworkPolicy::allow([format!("localhost:{}", service.port)]),
    )?;
    let request = "GET / HTTP/1.0\r\n\r\n";
    let (text, ok) = nc(sb.as_ref(), "127.0.0.1", service.port, request)?;
    ensure!(
        ok && text.contains(&service.marker),
        "127.0.0.1:{} with localhost:{} allowed: {text}",
        service.port,
        service.port
    );
    let events = events_after_close(sb.as_ref())?;
    ensure!(
        events.iter().any(|e| e.decision == NetDecision::Allowed
            && e.port == service.port
            && e.bytes_down > 0),
        "{events:?}"
    );
    drop(sb);
    // The same port, not allowed.
    let sb = open(make, ws, NetworkPolicy::allow(["pkg.test"]))?;
    let before = service.connections();
    let (text, ok) = nc(sb.as_ref(), "127.0.0.1", service.port, request)?;
    ensure!(
        !ok && !text.contains(&service.marker),
        "127.0.0.1:{} reached without being allowed: {text}",
        service.port
    );
    ensure!(
        service.connections() == before,
        "the host service was reached"
    );
    Ok(())
}

fn direct_connection_to_a_host_loopback_port_not_allowed_fails(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let allowed = HostService::start("allowed")?;
    let other = HostService::start("other")?;
    let sb = open(
        make,
        ws,
        NetworkPolicy::allow([format!("localhost:{}", allowed.port)]),
    )?;
    let (text, ok) = nc(
        sb.as_ref(),
        "127.0.0.1",
        other.port,
        "GET / HTTP/1.0\r\n\r\n",
    )?;
    ensure!(
        !ok && !text.contains(&other.marker),
        "127.0.0.1:{} (not allowed) answered: {text}",
        other.port
    );
    // Nor through the proxy.
    let port = proxy_port(sb.as_ref())?;
    let (text, _) = nc(
        sb.as_ref(),
        "127.0.0.1",
        port,
        &format!(
            "CONNECT localhost:{0} HTTP/1.1\r\nHost: localhost:{0}\r\n\r\n",
            other.port
        ),
    )?;
    ensure!(
        text.contains("403"),
        "CONNECT localhost:{}: {text}",
        other.port
    );
    ensure!(other.connections() == 0, "the host service was reached");
    Ok(())
}

fn direct_connection_that_bypasses_the_proxy_has_no_route(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let net = test_network()?;
    let mut policy = NetworkPolicy::allow(["pkg.test"]);
    policy.resolve = vec![("pkg.test".into(), IpAddr::V4(net.addr))];
    let sb = open(make, ws, policy)?;
    let (text, ok) = nc(
        sb.as_ref(),
        &net.addr.to_string(),
        80,
        "GET / HTTP/1.0\r\n\r\n",
    )?;
    ensure!(
        !ok && !text.contains(&net.marker),
        "a direct connection to {}:80 got through: {text}",
        net.addr
    );
    Ok(())
}

fn raw_and_packet_sockets_are_refused_inside(ws: &Path, make: &NetFactory) -> Result<(), Skip> {
    let sb = open(make, ws, NetworkPolicy::allow(["pkg.test"]))?;
    for argv in [
        [
            "busybox",
            "arping",
            "-c",
            "1",
            "-w",
            "1",
            "-I",
            "lo",
            "127.0.0.1",
        ]
        .as_slice(),
        [
            "busybox",
            "traceroute",
            "-n",
            "-m",
            "1",
            "-w",
            "1",
            "127.0.0.1",
        ]
        .as_slice(),
    ] {
        let out = run(sb.as_ref(), argv)?;
        let text = both(&out);
        ensure!(
            !out.status.success() && text.contains("socket"),
            "{argv:?} got a socket: {:?} {text}",
            out.status
        );
    }
    Ok(())
}

fn network_none_has_no_proxy_and_reaches_no_host_port(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let service = HostService::start("none")?;
    let sb = open(make, ws, NetworkPolicy::none())?;
    ensure!(
        sb.capabilities().network == NetworkAccess::None,
        "capabilities say {:?}",
        sb.capabilities().network
    );
    ensure!(sb.network_events().is_none(), "a record without a proxy");
    let out = run(
        sb.as_ref(),
        &["sh", "-c", "echo \"[$HTTP_PROXY$ALL_PROXY]\""],
    )?;
    ensure!(
        stdout(&out).trim() == "[]",
        "proxy variables: {}",
        stdout(&out)
    );
    let (text, ok) = nc(
        sb.as_ref(),
        "127.0.0.1",
        service.port,
        "GET / HTTP/1.0\r\n\r\n",
    )?;
    ensure!(!ok && !text.contains(&service.marker), "reached: {text}");
    ensure!(service.connections() == 0, "the host service was reached");
    Ok(())
}

fn host_network_is_reported_or_refused_by_name(ws: &Path, make: &NetFactory) -> Result<(), Skip> {
    let service = HostService::start("host")?;
    let sb = match make(ws, NetworkPolicy::host()) {
        Ok(sb) => sb,
        // Fail closed: a backend that cannot share the host's network
        // says so, by name, and starts nothing.
        Err(Error::NetworkUnavailable { mode: "host", .. }) => return Ok(()),
        Err(e) => return Err(opening_failed(e)),
    };
    ensure!(
        sb.capabilities().network == NetworkAccess::Host,
        "capabilities say {:?}",
        sb.capabilities().network
    );
    let (text, ok) = nc(
        sb.as_ref(),
        "127.0.0.1",
        service.port,
        "GET / HTTP/1.0\r\n\r\n",
    )?;
    ensure!(
        ok && text.contains(&service.marker),
        "the host's loopback from a host-network sandbox: {text}"
    );
    Ok(())
}

fn malformed_allowlist_entry_is_refused_before_the_sandbox_starts(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    for entry in [
        "*",
        "exa mple.org",
        "localhost",
        "pkg.test:99999",
        "*.*.org",
    ] {
        match make(ws, NetworkPolicy::allow([entry])) {
            Err(Error::BadNetworkPolicy { message }) => {
                ensure!(message.contains(entry), "{entry:?}: {message}")
            }
            Err(e @ Error::Unsupported { .. }) => return Err(opening_failed(e)),
            Err(other) => return Err(format!("{entry:?}: {other}").into()),
            Ok(_) => return Err(format!("{entry:?} was accepted").into()),
        }
    }
    Ok(())
}

/// Every network case.
pub const NET_CASES: &[NetCase] = &[
    NetCase {
        name: "allowed_name_is_reached_through_the_http_proxy",
        run: allowed_name_is_reached_through_the_http_proxy,
    },
    NetCase {
        name: "connect_tunnel_to_an_allowed_name_carries_bytes_both_ways",
        run: connect_tunnel_to_an_allowed_name_carries_bytes_both_ways,
    },
    NetCase {
        name: "name_not_on_the_allowlist_is_refused_naming_the_rule",
        run: name_not_on_the_allowlist_is_refused_naming_the_rule,
    },
    NetCase {
        name: "ip_literal_not_on_the_allowlist_is_refused",
        run: ip_literal_not_on_the_allowlist_is_refused,
    },
    NetCase {
        name: "dns_rebinding_a_listed_name_to_a_private_address_is_refused",
        run: dns_rebinding_a_listed_name_to_a_private_address_is_refused,
    },
    NetCase {
        name: "cloud_metadata_addresses_are_refused_by_the_proxy_policy",
        run: cloud_metadata_addresses_are_refused_by_the_proxy_policy,
    },
    NetCase {
        name: "forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed",
        run: forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed,
    },
    NetCase {
        name: "direct_connection_to_a_host_loopback_port_not_allowed_fails",
        run: direct_connection_to_a_host_loopback_port_not_allowed_fails,
    },
    NetCase {
        name: "direct_connection_that_bypasses_the_proxy_has_no_route",
        run: direct_connection_that_bypasses_the_proxy_has_no_route,
    },
    NetCase {
        name: "raw_and_packet_sockets_are_refused_inside",
        run: raw_and_packet_sockets_are_refused_inside,
    },
    NetCase {
        name: "network_none_has_no_proxy_and_reaches_no_host_port",
        run: network_none_has_no_proxy_and_reaches_no_host_port,
    },
    NetCase {
        name: "host_network_is_reported_or_refused_by_name",
        run: host_network_is_reported_or_refused_by_name,
    },
    NetCase {
        name: "malformed_allowlist_entry_is_refused_before_the_sandbox_starts",
        run: malformed_allowlist_entry_is_refused_before_the_sandbox_starts,
    },
];

/// Runs one network case by name on a fresh workspace.
pub fn run_net_case(name: &str, make: &NetFactory) -> Outcome {
    let Some(case) = NET_CASES.iter().find(|c| c.name == name) else {
        return Outcome::Failed(format!("no network case named {name:?}"));
    };
    let ws = match tempfile::tempdir() {
        Ok(ws) => ws,
        Err(e) => return Outcome::Failed(format!("cannot make a workspace: {e}")),
    };
    let ws_path: PathBuf = match ws.path().canonicalize() {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match (case.run)(&ws_path, make) {
        Ok(()) => Outcome::Passed,
        Err(Skip::Failed(m)) => Outcome::Failed(m),
        Err(Skip::Skipped(m)) => Outcome::Skipped(m),
    }
}

/// Runs one network case as a test (see [`crate::run_test`]).
pub fn run_net_test(name: &str, make: &NetFactory) {
    match run_net_case(name, make) {
        Outcome::Passed => {}
        Outcome::Failed(message) => panic!("{name} failed: {message}"),
        Outcome::Skipped(reason) if crate::must_work() => {
            panic!("{name} was skipped but HAKO_MUST_WORK=1: {reason}")
        }
        Outcome::Skipped(reason) => eprintln!("SKIPPED {name}: {reason}"),
    }
}

/// Expands to a module `$name` with one `#[test]` per network case, each
/// building its sandboxes with `$factory` (a closure `|&Path,
/// NetworkPolicy| -> Result<Box<dyn Sandbox>, Error>`).
#[macro_export]
macro_rules! network_tests {
    ($name:ident, $factory:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn make() -> std::sync::Arc<$crate::net::NetFactory> {
                $crate::net::net_factory($factory)
            }

            $crate::__hako_net_case!(allowed_name_is_reached_through_the_http_proxy);
            $crate::__hako_net_case!(connect_tunnel_to_an_allowed_name_carries_bytes_both_ways);
            $crate::__hako_net_case!(name_not_on_the_allowlist_is_refused_naming_the_rule);
            $crate::__hako_net_case!(ip_literal_not_on_the_allowlist_is_refused);
            $crate::__hako_net_case!(dns_rebinding_a_listed_name_to_a_private_address_is_refused);
            $crate::__hako_net_case!(cloud_metadata_addresses_are_refused_by_the_proxy_policy);
            $crate::__hako_net_case!(forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed);
            $crate::__hako_net_case!(direct_connection_to_a_host_loopback_port_not_allowed_fails);
            $crate::__hako_net_case!(direct_connection_that_bypasses_the_proxy_has_no_route);
            $crate::__hako_net_case!(raw_and_packet_sockets_are_refused_inside);
            $crate::__hako_net_case!(network_none_has_no_proxy_and_reaches_no_host_port);
            $crate::__hako_net_case!(host_network_is_reported_or_refused_by_name);
            $crate::__hako_net_case!(
                malformed_allowlist_entry_is_refused_before_the_sandbox_starts
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hako_net_case {
    ($case:ident) => {
        #[test]
        fn $case() {
            $crate::net::run_net_test(stringify!($case), make().as_ref());
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_in_the_macro() {
        // Without whitespace: rustfmt may break a long invocation.
        let source: String = include_str!("net.rs").split_whitespace().collect();
        for case in NET_CASES {
            let line = format!("__hako_net_case!({});", case.name);
            assert!(
                source.contains(&line),
                "{} is not in network_tests!",
                case.name
            );
        }
    }
}
