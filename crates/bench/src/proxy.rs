//! Throughput through the `linux` backend's egress proxy, against the same
//! client reading straight over the host's loopback.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hako_core::Command;
use hako_runtime::{BackendKind, SandboxSpec};

use crate::measure::{alternate, Stats};
use crate::reference::find_in_path;
use crate::report::Throughput;

/// Bytes each transfer of the proxy benchmark moves.
const TRANSFER_BYTES: u64 = 100 << 20;

/// Serves [`TRANSFER_BYTES`] to each connection `listener` accepts, on a
/// thread of its own, until the process ends; with `unpaced`, each from a
/// socket that uses Reno, which does not pace, whatever the machine's
/// default congestion control. Returns the count of transfers written to
/// the end (each counted before its connection closes).
fn serve_transfers(listener: std::net::TcpListener, unpaced: bool) -> Arc<AtomicUsize> {
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    std::thread::spawn(move || {
        let chunk = vec![0x5au8; 1 << 20];
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if unpaced {
                let _ = hako_sys::rustix::net::sockopt::set_tcp_congestion(&conn, "reno");
            }
            let chunk = chunk.clone();
            let count = Arc::clone(&count);
            std::thread::spawn(move || {
                use std::io::Write;
                for _ in 0..TRANSFER_BYTES / chunk.len() as u64 {
                    if conn.write_all(&chunk).is_err() {
                        return;
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    served
}

/// How long the transfer in a script's output took: the script prints two
/// `$EPOCHREALTIME` readings, taken around it.
fn transfer_time(stdout: &[u8]) -> Result<Duration, String> {
    let text = String::from_utf8_lossy(stdout).replace(',', ".");
    let t: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match t[..] {
        [start, end] if end >= start => Ok(Duration::from_secs_f64(end - start)),
        _ => Err(format!("the transfer script printed {text:?}")),
    }
}

/// 100 MiB from a host service to a client inside a `linux` sandbox whose
/// allowlist forwards the service's port, against the same client reading
/// it straight over the host's loopback (the same `bash` and `cat` both
/// times, measured alternately): from `127.0.0.1:PORT` (the forwarder
/// hands the connection to the proxy, which relays it), through a
/// `CONNECT localhost:PORT` tunnel, and from a service whose socket does
/// not pace (so that neither path is held back by the machine's default
/// congestion control, and what is left is the relay's own cost). Each
/// script times its own transfer, from `connect` to the end of the
/// stream, so that starting a command in the sandbox (measured as warm
/// exec) is not counted in it.
pub(crate) fn bench_proxy_transfer(n: usize, workspace: &Path) -> Result<Vec<Throughput>, String> {
    let bash = find_in_path("bash").ok_or("bash is not installed")?;
    let listen = || {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("bind: {e}"))?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        Ok::<_, String>((l, port))
    };
    let ((paced, port), (unpaced, unpaced_port)) = (listen()?, listen()?);
    let timed =
        |transfer: &str| format!("s=$EPOCHREALTIME\n{transfer}\necho \"$s $EPOCHREALTIME\"");
    let direct = |port: u16| timed(&format!("cat </dev/tcp/127.0.0.1/{port} >/dev/null"));
    // The proxy's port from HTTP_PROXY; the reply's head read line by line.
    let tunnel = timed(&format!(
        r#"exec 3<>/dev/tcp/127.0.0.1/${{HTTP_PROXY##*:}}
printf 'CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n' >&3
IFS= read -r status <&3
case $status in *" 200 "*) ;; *) echo "$status" >&2; exit 1;; esac
while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
cat <&3 >/dev/null"#
    ));
    let mut spec = SandboxSpec::new(workspace.to_path_buf());
    spec.network = Some(hako_core::NetworkPolicy::allow([
        format!("localhost:{port}"),
        format!("localhost:{unpaced_port}"),
    ]));
    // Opened while this process has one thread, so that the guest runs in
    // a fork of it (no hako-guest binary needed); the servers start after.
    let sandbox = hako_runtime::open(BackendKind::Linux, &spec).map_err(|e| e.to_string())?;
    let served = [
        serve_transfers(paced, false),
        serve_transfers(unpaced, true),
    ];
    // Runs one transfer and returns the time its script printed. A
    // transfer cut short (a refused connection reads as an empty stream)
    // must fail the run, not count as a fast one.
    let whole = |which: usize, run: &dyn Fn() -> Result<Vec<u8>, String>| {
        let count = || served[which].load(Ordering::SeqCst);
        let before = count();
        let time = transfer_time(&run()?)?;
        if count() > before {
            Ok(time)
        } else {
            Err("a transfer ended before the service had sent all of it".to_string())
        }
    };
    let mib_s = |s: Stats| (TRANSFER_BYTES as f64 / (1 << 20) as f64) / (s.median_us / 1e6);
    let mut measured = Vec::new();
    for (figure, name, inside, reference, which) in [
        (
            "proxy_throughput.ratio_vs_loopback",
            "linux 100 MiB from a forwarded host port, through the egress proxy",
            direct(port),
            direct(port),
            0,
        ),
        (
            "proxy_connect_throughput.ratio_vs_loopback",
            "linux 100 MiB through a CONNECT tunnel of the egress proxy",
            tunnel.clone(),
            direct(port),
            0,
        ),
        (
            "proxy_unpaced_throughput.ratio_vs_loopback",
            "linux 100 MiB from a forwarded port whose service does not pace",
            direct(unpaced_port),
            direct(unpaced_port),
            1,
        ),
    ] {
        let command = Command::new([bash.display().to_string(), "-c".into(), inside]);
        let in_sandbox = || {
            whole(which, &|| {
                let out = sandbox.exec(&command).map_err(|e| e.to_string())?;
                if !out.status.success() {
                    return Err(format!(
                        "the transfer inside failed: {:?}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                Ok(out.stdout)
            })
        };
        let on_host = || {
            whole(which, &|| {
                let out = std::process::Command::new(&bash)
                    .args(["-c", &reference])
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("bash: {e}"))?;
                if !out.status.success() {
                    return Err(format!("the loopback transfer failed: {}", out.status));
                }
                Ok(out.stdout)
            })
        };
        let (through, direct) = alternate(n.clamp(3, 50), in_sandbox, on_host)?;
        measured.push(Throughput {
            figure: figure.into(),
            name: name.into(),
            backend: "linux",
            bytes: TRANSFER_BYTES,
            hako_mib_s: mib_s(through),
            reference: "direct loopback".into(),
            reference_mib_s: mib_s(direct),
            ratio: direct.median_us / through.median_us.max(f64::MIN_POSITIVE),
        });
    }
    let _ = sandbox.close();
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_is_the_gap_between_the_two_readings_in_either_locale() {
        let t = transfer_time(b"100.250000 100.750000\n");
        assert_eq!(t, Ok(Duration::from_millis(500)));
        // A locale whose decimal separator is a comma.
        let t = transfer_time(b"7,5 8,0\n");
        assert_eq!(t, Ok(Duration::from_millis(500)));
    }

    #[test]
    fn transfer_time_refuses_anything_but_two_readings_in_order() {
        for out in [&b""[..], b"1.0", b"2.0 1.0", b"1.0 2.0 3.0", b"bash: error"] {
            assert!(transfer_time(out).is_err(), "{out:?}");
        }
    }
}
