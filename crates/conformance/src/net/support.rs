//! What every network case uses: opening a sandbox (a backend that cannot
//! run here skips), running a command inside, `nc` from inside, the
//! proxy's port and record.

use std::path::Path;
use std::time::Duration;

use hako_core::{Command, Error, NetEvent, NetworkPolicy, Output, Sandbox};

use super::servers::TestNetwork;
use super::{NetFactory, Skip};

/// The proxy's port inside (see `hako_driver::network::PROXY_PORT`): read
/// back from `HTTP_PROXY`, never assumed.
pub(super) fn proxy_port(sb: &dyn Sandbox) -> Result<u16, String> {
    let out = run(sb, &["sh", "-c", "echo $HTTP_PROXY"])?;
    let text = stdout(&out);
    text.trim()
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("HTTP_PROXY inside is {text:?}, not http://127.0.0.1:PORT"))
}

/// A check's result: the failure's message.
pub(super) type Res = Result<(), String>;

/// Runs `argv` inside, with a 30 s timeout.
pub(super) fn run(sb: &dyn Sandbox, argv: &[&str]) -> Result<Output, String> {
    sb.exec(&Command::new(argv.iter().copied()).timeout(Duration::from_secs(30)))
        .map_err(|e| format!("exec {argv:?}: {e}"))
}

/// The command's standard output, as text.
pub(super) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command's standard output then its standard error, as text.
pub(super) fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Sends `request` to `host:port` from inside with busybox `nc` and
/// returns everything (stdout and stderr) and whether nc succeeded.
pub(super) fn nc(
    sb: &dyn Sandbox,
    host: &str,
    port: u16,
    request: &str,
) -> Result<(String, bool), String> {
    let script = format!(
        "printf '{}' | busybox nc -w 5 {host} {port}",
        request.replace('\r', "\\r").replace('\n', "\\n")
    );
    let out = run(sb, &["sh", "-c", &script])?;
    Ok((both(&out), out.status.success()))
}

/// Closes the sandbox (every connection from inside ends, and is recorded)
/// and returns the proxy's record.
pub(super) fn events_after_close(sb: &dyn Sandbox) -> Result<Vec<NetEvent>, String> {
    let _ = sb.close();
    let events = sb
        .network_events()
        .ok_or("an `allow` sandbox offers no network record")?;
    Ok(events.take_network_events().0)
}

/// Opens the sandbox under test with `policy`.
pub(super) fn open(
    make: &NetFactory,
    ws: &Path,
    policy: NetworkPolicy,
) -> Result<Box<dyn Sandbox>, Skip> {
    let mode = policy.mode.name();
    make(ws, policy).map_err(|e| match e {
        Error::NetworkUnavailable { mode: refused, .. } if refused == mode => {
            Skip::Refused(e.to_string())
        }
        e => opening_failed(e),
    })
}

/// A factory that says the backend cannot run here skips the case (as
/// in the main kit); any other error fails it.
pub(super) fn opening_failed(e: Error) -> Skip {
    match e {
        Error::Unsupported { .. } => Skip::Skipped(format!("the backend cannot run here: {e}")),
        e => Skip::Failed(format!("cannot open the sandbox: {e}")),
    }
}

/// Starts the kit's test network, or skips the case saying why not.
pub(super) fn test_network() -> Result<TestNetwork, Skip> {
    TestNetwork::start().map_err(Skip::Skipped)
}
