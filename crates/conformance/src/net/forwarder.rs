//! The forwarder (the sandbox's end of the egress proxy, see
//! `hako_guest::forward`) killed with SIGKILL: a connection through it
//! ends or goes on, never hangs; later connections to the proxy's port
//! are refused at once (the port's listener died with it, and the guest
//! does not start another: a sandbox whose command killed its own way out
//! is not given a new one behind its back); the sandbox's commands go on
//! and it closes cleanly. A command can reach the forwarder on every
//! backend (it is the guest's child, of the sandbox's user), so the kill
//! is made from inside.

use std::path::Path;
use std::time::Duration;

use hako_core::{Command, NetworkPolicy, SpawnOptions};

use super::support::{both, nc, open, proxy_port, run, stdout};
use super::{NetFactory, Skip};

/// Kills the forwarder from inside: the process whose threads are named
/// after it; says what it killed.
const KILL_FORWARDER: &str = r#"for t in /proc/[0-9]*/task/*/comm; do
  case "$(cat "$t" 2>/dev/null)" in
    hako-forward*) p=${t#/proc/}; p=${p%%/*}; kill -9 "$p" && echo "killed $p"; break ;;
  esac
done"#;

pub(super) fn the_forwarder_killed_refuses_later_connections_at_once_and_the_sandbox_goes_on(
    ws: &Path,
    make: &NetFactory,
) -> Result<(), Skip> {
    let sb = open(make, ws, NetworkPolicy::allow(["pkg.test"]))?;
    let port = proxy_port(sb.as_ref())?;
    // Through the forwarder, the proxy answers (it refuses this name).
    let request = "GET http://other.test/ HTTP/1.0\r\nHost: other.test\r\n\r\n";
    let (text, _) = nc(sb.as_ref(), "127.0.0.1", port, request)?;
    ensure!(
        text.contains("HTTP/1."),
        "the proxy's answer before: {text}"
    );
    // A connection open across the kill: it sends its request after.
    let processes = sb.processes().ok_or("this sandbox has no processes")?;
    let in_flight = processes
        .spawn(
            &Command::shell(format!(
                "(sleep 2; printf 'GET http://other.test/ HTTP/1.0\\r\\n\\r\\n') | busybox nc -w 5 127.0.0.1 {port}; echo ended"
            )),
            &SpawnOptions::default(),
        )
        .map_err(|e| format!("spawn a connection: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let out = run(sb.as_ref(), &["sh", "-c", KILL_FORWARDER])?;
    ensure!(
        stdout(&out).starts_with("killed "),
        "the forwarder was not killed from inside: {}",
        both(&out)
    );
    // The connection in flight ends (handed to the proxy, it is answered;
    // relayed, it is cut), within nc's own bound: it never hangs.
    let state = processes
        .wait(in_flight, Some(Duration::from_secs(60)))
        .map_err(|e| format!("wait for the connection in flight: {e}"))?;
    ensure!(
        state.finished(),
        "the connection in flight hangs: {state:?}"
    );
    // Later connections are refused at once.
    let out = run(
        sb.as_ref(),
        &[
            "sh",
            "-c",
            &format!("busybox nc -w 5 127.0.0.1 {port} </dev/null; echo status $?"),
        ],
    )?;
    ensure!(
        !stdout(&out).contains("status 0") && both(&out).contains("refused"),
        "a connection after the forwarder was killed: {}",
        both(&out)
    );
    // The sandbox goes on, and closes.
    let out = run(sb.as_ref(), &["echo", "alive"])?;
    ensure!(stdout(&out) == "alive\n", "a command after: {}", both(&out));
    sb.close()
        .map_err(|e| format!("close after the forwarder was killed: {e}"))?;
    Ok(())
}
