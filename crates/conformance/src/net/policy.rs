//! What the proxy's policy refuses before it connects anywhere: names and
//! addresses not listed, ports not listed, listed names resolving to
//! private, loopback or cloud-metadata addresses.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use hako_core::{NetDecision, NetEvent, NetworkPolicy};

use super::support::{events_after_close, nc, open, proxy_port};
use super::{NetFactory, Skip};

pub(super) fn name_not_on_the_allowlist_is_refused_naming_the_rule(
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

pub(super) fn ip_literal_not_on_the_allowlist_is_refused(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
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

pub(super) fn dns_rebinding_a_listed_name_to_a_private_address_is_refused(
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

pub(super) fn cloud_metadata_addresses_are_refused_by_the_proxy_policy(
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
