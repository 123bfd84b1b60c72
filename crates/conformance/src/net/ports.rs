//! The host's loopback ports: a forwarded port is reached at
//! `127.0.0.1:PORT` inside only when the allowlist lists `localhost:PORT`;
//! no other host port is reached, directly or through the proxy.

use std::path::Path;

use hako_core::{NetDecision, NetworkPolicy};

use super::support::{events_after_close, nc, open, proxy_port};
use super::{HostService, NetFactory, Skip};

pub(super) fn forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed(
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

pub(super) fn direct_connection_to_a_host_loopback_port_not_allowed_fails(
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
