//! The other modes and the policy itself: `none` has no proxy and reaches
//! nothing, `host` is given or refused by name, and a malformed allowlist
//! entry is refused before any sandbox starts.

use std::path::Path;

use hako_core::{Error, NetworkAccess, NetworkPolicy};

use super::support::{nc, open, opening_failed, run, stdout};
use super::{HostService, NetFactory, Skip};

pub(super) fn network_none_has_no_proxy_and_reaches_no_host_port(
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

pub(super) fn host_network_is_reported_or_refused_by_name(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
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

pub(super) fn malformed_allowlist_entry_is_refused_before_the_sandbox_starts(
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
            // A backend that cannot enforce `allow` at all refuses it by
            // name before looking at the list.
            Err(e @ Error::NetworkUnavailable { mode: "allow", .. }) => {
                return Err(Skip::Refused(e.to_string()))
            }
            Err(other) => return Err(format!("{entry:?}: {other}").into()),
            Ok(_) => return Err(format!("{entry:?} was accepted").into()),
        }
    }
    Ok(())
}
