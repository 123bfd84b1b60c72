//! Reaching what the allowlist lists: a name through the HTTP proxy and
//! through a `CONNECT` tunnel, to the kit's own test network.

use std::net::IpAddr;
use std::path::Path;

use hako_core::{NetDecision, NetworkAccess, NetworkPolicy};

use super::support::{both, events_after_close, nc, open, proxy_port, run, stdout, test_network};
use super::{NetFactory, Skip};

pub(super) fn allowed_name_is_reached_through_the_http_proxy(
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

pub(super) fn connect_tunnel_to_an_allowed_name_carries_bytes_both_ways(
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
