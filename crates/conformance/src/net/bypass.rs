//! Getting around the proxy: a direct connection has no route, and raw
//! and packet sockets are refused inside.

use std::net::IpAddr;
use std::path::Path;

use hako_core::NetworkPolicy;

use super::support::{both, nc, open, run, test_network};
use super::{NetFactory, Skip};

pub(super) fn direct_connection_that_bypasses_the_proxy_has_no_route(
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

pub(super) fn raw_and_packet_sockets_are_refused_inside(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
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
