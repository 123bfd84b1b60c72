//! The SDKs' round trip (`hako bench --sdk-python PYTHON`): one
//! `commands.run("true")` through E2B's `e2b` SDK against `hako serve
//! --e2b`, against `Sandbox.run("true")` through hako's own Python SDK
//! against `hako serve`, both on the same backend, measured alternately
//! by one Python process (`sdk_bench.py`).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hako_runtime::BackendKind;

use crate::measure::stats;
use crate::report::{compare, Comparison};

/// The script the Python runs.
const SCRIPT: &str = include_str!("sdk_bench.py");

/// A `hako serve` of the benchmark's own, stopped (its stdin closed, then
/// killed) when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(
    hako: &Path,
    kind: BackendKind,
    flags: &[&str],
    token_file: &Path,
) -> Result<Server, String> {
    let mut child = Command::new(hako)
        .args(["serve", "--backend", kind.name(), "--listen", "127.0.0.1:0"])
        .args(["--ready-json", "--exit-on-stdin-eof", "--token-file"])
        .arg(token_file)
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start hako serve: {e}"))?;
    let mut line = String::new();
    let read = child
        .stdout
        .take()
        .map(|out| BufReader::new(out).read_line(&mut line));
    let url = serde_json::from_str::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v["url"].as_str().map(str::to_string));
    match (read, url) {
        (Some(Ok(_)), Some(url)) => Ok(Server { child, url }),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("hako serve {} did not start", flags.join(" ")))
        }
    }
}

/// Measures the two SDKs' round trip `n` times each on `kind`.
pub(crate) fn bench_sdks(
    kind: BackendKind,
    hako: &Path,
    python: &Path,
    n: usize,
    scratch: &Path,
) -> Result<Comparison, String> {
    let dir = scratch.join("sdk");
    let root = dir.join("e2b-root");
    let ws = dir.join("ws");
    for d in [&root, &ws] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let token = format!("hako-bench-{}", std::process::id());
    let token_file = dir.join("token");
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&token_file)
            .map_err(|e| format!("cannot write the token: {e}"))?;
        f.write_all(token.as_bytes())
            .map_err(|e| format!("cannot write the token: {e}"))?;
    }
    let (Some(root_s), Some(ws_s)) = (root.to_str(), ws.to_str()) else {
        return Err("the scratch directory's path is not UTF-8".into());
    };
    let e2b = serve(hako, kind, &["--e2b", "--e2b-root", root_s], &token_file)?;
    let plain = serve(hako, kind, &["--workspace", ws_s], &token_file)?;
    let out = Command::new(python)
        .args([
            "-c",
            SCRIPT,
            &n.max(1).to_string(),
            &e2b.url,
            &plain.url,
            &token,
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    drop((e2b, plain));
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "the SDK benchmark failed (does {} have the e2b and hako packages?): {}",
            python.display(),
            stderr.lines().last().unwrap_or_default()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the SDK benchmark's answer is not JSON: {e}"))?;
    let samples = |name: &str| -> Result<Vec<Duration>, String> {
        let all: Vec<Duration> = v[name]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(serde_json::Value::as_f64)
                    .map(|us| Duration::from_secs_f64(us / 1e6))
                    .collect()
            })
            .unwrap_or_default();
        if all.is_empty() {
            Err(format!("the SDK benchmark gave no {name} runs"))
        } else {
            Ok(all)
        }
    };
    Ok(compare(
        "sdk_round_trip.ratio_vs_hako_sdk".into(),
        "commands.run(\"true\") through the e2b SDK (hako serve --e2b)".into(),
        Some(kind.name()),
        stats(samples("e2b")?),
        "Sandbox.run(\"true\") through hako's Python SDK (hako serve)",
        stats(samples("hako")?),
    ))
}
