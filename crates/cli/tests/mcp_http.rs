//! `hako mcp --http` driven by a client hako did not write: the official
//! Python MCP SDK's streamable HTTP client (`mcp_http_client.py` beside
//! this file), with the bearer token, on the `linux` backend; before it,
//! plain HTTP requests without the token (or with a foreign Host, an
//! Origin, an oversized body) must be refused and touch nothing. Then the
//! server is stopped with SIGTERM and the audit log it left is checked.
//!
//! Loopback only. Needs `python3` with the `mcp` package and the
//! `hako-guest` binary beside `hako` (`cargo build --workspace`); without
//! them the test skips with the reason, unless `HAKO_MUST_WORK=1`, which
//! makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/mcp.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn ready() -> bool {
    if !support::client_and_guest_ready() {
        return false;
    }
    if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
        return support::skip(&format!("the linux backend cannot run here: {reason}"));
    }
    true
}

/// The server, killed if the test ends before it was stopped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// How long the server may take to start listening, or to exit after
/// SIGTERM, before the test gives up (a hang, not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn python_mcp_client_over_http_needs_the_token_and_shares_one_sandbox() {
    if !ready() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let audit = tmp.path().join("audit.log");
    let token_file = tmp.path().join("token");
    // Not a secret worth generating well: the server listens on loopback
    // for the length of this test.
    let token = format!(
        "test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    std::fs::write(&token_file, format!("{token}\n")).unwrap();

    // Port 0: the kernel picks a free port, and the server says which.
    let child = Command::new(env!("CARGO_BIN_EXE_hako"))
        .arg("mcp")
        .args(["--http", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .args(["--backend", "linux", "--workspace"])
        .arg(&ws)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Server(child);
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stderr = server.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let url = loop {
        let line = match lines.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(e) => panic!(
                "the server did not start listening ({e}):\n{}",
                seen.join("\n")
            ),
        };
        if let Some(rest) = line.strip_prefix("hako mcp: listening on ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        seen.push(line);
    };
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    // A token from a file is not printed.
    assert!(!seen.iter().any(|l| l.contains(&token)), "{seen:?}");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_http_client.py");
    let out = support::python()
        .arg(&script)
        .arg(&url)
        .arg(&token_file)
        .arg(&ws)
        .arg(&audit)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the MCP client failed ({}):\n{stdout}\n--- stderr ---\n{stderr}\n--- server ---\n{}",
        out.status,
        lines.try_iter().collect::<Vec<_>>().join("\n")
    );

    // SIGTERM stops it cleanly.
    let pid = server.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let server_log: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "{status}:\n{}", server_log.join("\n"));

    // The sandbox was opened once, for both sessions, and closed at the
    // stop; the log verifies and ends with its closing record.
    let verified = hako_audit::verify(&audit).unwrap_or_else(|e| panic!("{e}"));
    assert!(verified.closed);
    let records = hako_audit::records(&audit).unwrap();
    let count = |kind: &str, op: &str| {
        records
            .iter()
            .filter(|r| r["kind"] == kind && r["op"] == op)
            .count()
    };
    assert_eq!(count("sandbox", "open"), 1, "{records:?}");
    assert_eq!(count("sandbox", "close"), 1, "{records:?}");
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "file" && r["op"] == "write" && r["path"] == "notes/hello.txt"),
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["kind"] == "exec"
            && r["command"]
                .as_str()
                .is_some_and(|c| c.contains("notes/ran.txt"))),
        "{records:?}"
    );
    // The refused requests left no trace.
    assert!(!ws.join("intruder.txt").exists());
    assert!(
        !records
            .iter()
            .any(|r| serde_json::to_string(r).unwrap().contains("intruder")),
        "{records:?}"
    );
}
