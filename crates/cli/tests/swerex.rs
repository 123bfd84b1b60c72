//! `hako serve --swerex` driven by the client SWE-agent uses: the
//! `RemoteRuntime` of the `swe-rex` package, unmodified
//! (`swerex_client.py` beside this file), on the `linux` backend; then the
//! audit log the server left is checked.
//!
//! Needs the test virtualenv's Python (`HAKO_TEST_PYTHON`) with `swe-rex`
//! and `aiohttp`, and user namespaces (`hako` carries its guest); without
//! them the tests skip with the reason, unless `HAKO_MUST_WORK=1`, which
//! makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/mcp.rs"]
#[allow(dead_code)]
mod support;

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Whether the client and the linux backend are both here;
/// prints why not.
fn ready(test: &str) -> bool {
    match support::python()
        .args(["-c", "import aiohttp, swerex.runtime.remote"])
        .output()
    {
        Err(e) => return support::skip(&format!("{test}: python cannot run ({e})")),
        Ok(out) if !out.status.success() => {
            return support::skip(&format!(
                "{test}: the Python swe-rex and aiohttp packages are missing (the test command installs them into its virtualenv, HAKO_TEST_PYTHON): {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            ))
        }
        Ok(_) => {}
    }
    if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
        return support::skip(&format!(
            "{test}: the linux backend cannot run here: {reason}"
        ));
    }
    true
}

/// A `hako serve --swerex --backend linux` of a test's own, stopped (and
/// its audit log closed) when dropped.
struct Server {
    child: Child,
    port: u16,
    token: String,
    ws: PathBuf,
    audit: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let token = format!("swerex-token-{}", std::process::id());
        let token_file = tmp.path().join("token");
        std::fs::write(&token_file, &token).unwrap();
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let audit = tmp.path().join("audit.log");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(["serve", "--swerex", "--backend", "linux", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workspace")
            .arg(&ws)
            .arg("--token-file")
            .arg(&token_file)
            .arg("--audit")
            .arg(&audit)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut said = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            said.push_str(&line);
            said.push('\n');
            if line.contains("listening on") {
                break;
            }
        }
        assert!(said.contains("SWE-ReX protocol"), "{said}");
        Server {
            child,
            port,
            token,
            ws,
            audit,
            _tmp: tmp,
        }
    }

    /// Runs the client script in `mode`; panics with its output unless it
    /// passed every check.
    fn client(&self, mode: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/swerex_client.py");
        let out = support::python()
            .arg(&script)
            .arg(mode)
            .arg(self.port.to_string())
            .arg(&self.token)
            .arg(&self.ws)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "the SWE-ReX client failed in mode {mode} ({}):\n{stdout}\n--- stderr ---\n{stderr}",
            out.status
        );
    }

    /// Stops the server as a user does (SIGTERM: every sandbox closed,
    /// then the audit log) and returns the log's records.
    fn stop(mut self) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "hako serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        let verified = hako_audit::verify(&self.audit).unwrap_or_else(|e| panic!("{e}"));
        assert!(verified.closed);
        hako_audit::records(&self.audit).unwrap()
    }

    /// One raw GET (for what the client never sends): status and body.
    fn call(&self, path: &str, headers: &str) -> (u16, String) {
        self.request("GET", path, headers, "")
    }

    /// One raw request: status and body.
    fn request(&self, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        (
            status,
            raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn swerex_remote_runtime_runs_sessions_commands_files_and_uploads_in_a_linux_sandbox() {
    if !ready("swerex_remote_runtime_runs_sessions_commands_files_and_uploads_in_a_linux_sandbox") {
        return;
    }
    let server = Server::start();
    server.client("drive");
    let ws = server.ws.clone();
    let records = server.stop();
    let has = |kind: &str, key: &str, value: &str| {
        records
            .iter()
            .any(|r| r["kind"] == kind && r.get(key).and_then(|v| v.as_str()) == Some(value))
    };
    // One sandbox at a time, opened again after the client's close.
    let opened = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "open")
        .count();
    assert_eq!(opened, 2, "{records:?}");
    assert!(has("session", "op", "open"), "{records:?}");
    assert!(has("session", "op", "close"), "{records:?}");
    // A command of a session is recorded with its session.
    let in_session = records
        .iter()
        .find(|r| r["kind"] == "exec" && r["command"] == "pwd; echo \"$GREETING\"")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert!(in_session["session"].is_u64(), "{in_session:?}");
    assert_eq!(in_session["front_end"], "serve");
    assert!(records
        .iter()
        .any(|r| r["kind"] == "exec" && r["timed_out"] == true));
    // Each file of the uploaded directory, by its absolute path.
    let uploaded = ws.join("uploaded-tree/pkg/deep/data.bin");
    assert!(
        has("file", "path", uploaded.to_str().unwrap()),
        "{records:?}"
    );
    // The refused paths are refusals.
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "refusal" && r["path"] == "/etc/hostname"),
        "{records:?}"
    );
}

#[test]
fn swerex_upload_of_a_zip_slip_archive_is_refused_whole_and_the_sandbox_still_works() {
    if !ready("swerex_upload_of_a_zip_slip_archive_is_refused_whole_and_the_sandbox_still_works") {
        return;
    }
    let server = Server::start();
    server.client("zip-slip");
    let outside = server.ws.parent().unwrap().join("escaped.txt");
    assert!(!outside.exists());
    server.stop();
}

#[test]
fn swerex_requests_with_a_wrong_or_missing_token_are_refused_and_touch_nothing() {
    if !ready("swerex_requests_with_a_wrong_or_missing_token_are_refused_and_touch_nothing") {
        return;
    }
    let server = Server::start();
    server.client("wrong-token");
    // The bearer token works as well as X-API-Key; a key sent twice, or
    // a bearer token that is not the server's, does not.
    let token = server.token.clone();
    let (status, body) = server.call("/is_alive", &format!("Authorization: Bearer {token}\r\n"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"is_alive\":true"), "{body}");
    let twice = format!("X-API-Key: {token}\r\nX-API-Key: {token}\r\n");
    assert_eq!(server.call("/is_alive", &twice).0, 401);
    let wrong_bearer = format!("Authorization: Bearer {token}x\r\n");
    assert_eq!(server.call("/is_alive", &wrong_bearer).0, 401);
    // A wrong key is refused even beside the right bearer token.
    let mixed = format!("X-API-Key: wrong\r\nAuthorization: Bearer {token}\r\n");
    assert_eq!(server.call("/is_alive", &mixed).0, 401);
    // Only SWE-ReX's routes are served.
    let key = format!("X-API-Key: {token}\r\n");
    let (status, body) = server.call("/v1/sandboxes", &key);
    assert_eq!(status, 404, "{body}");
    server.stop();
}

#[test]
fn swerex_a_retried_request_is_answered_again_not_run_twice() {
    if !ready("swerex_a_retried_request_is_answered_again_not_run_twice") {
        return;
    }
    let server = Server::start();
    let key = format!("X-API-Key: {}\r\n", server.token);
    let append = r#"{"command": "echo x >> count; wc -l < count", "shell": true}"#;
    let with_id = |id: &str| format!("{key}X-Request-ID: {id}\r\n");
    let first = server.request("POST", "/execute", &with_id("retry-1"), append);
    assert_eq!(first.0, 200, "{}", first.1);
    // The same request again (its answer lost on the way, say): the
    // answer it had, and the command not run a second time.
    let again = server.request("POST", "/execute", &with_id("retry-1"), append);
    assert_eq!(again, first);
    let count = std::fs::read_to_string(server.ws.join("count")).unwrap();
    assert_eq!(count, "x\n");
    // Another request runs.
    let next = server.request("POST", "/execute", &with_id("retry-2"), append);
    assert_eq!(next.0, 200, "{}", next.1);
    assert!(next.1.contains(r#""stdout":"2\n""#), "{}", next.1);
    // Bad JSON is the client's error (422, as FastAPI answers), and the
    // server goes on.
    let bad = server.request("POST", "/execute", &key, "{not json");
    assert_eq!(bad.0, 422, "{}", bad.1);
    assert!(bad.1.contains("detail"), "{}", bad.1);
    let ok = server.request("POST", "/execute", &key, r#"{"command": ["true"]}"#);
    assert_eq!(ok.0, 200, "{}", ok.1);
    server.stop();
}

#[test]
fn swerex_a_body_past_the_bound_is_refused_unread_and_the_server_goes_on() {
    if !ready("swerex_a_body_past_the_bound_is_refused_unread_and_the_server_goes_on") {
        return;
    }
    let server = Server::start();
    let huge = |key: &str, length: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        write!(
            s,
            "POST /upload HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{key}Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {length}\r\n\r\n",
            server.port,
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        raw
    };
    // The token first: without it, 401 whatever the body.
    let key = format!("X-API-Key: {}\r\n", server.token);
    let past = ((64u64 << 20) + 1).to_string();
    let answer = huge("", &past);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let answer = huge(&key, &past);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("67108864"), "{answer}");
    // A length past what HTTP parsing takes is answered the same way.
    let beyond = "99999999999999999999";
    assert!(huge("", beyond).starts_with("HTTP/1.1 401"));
    let answer = huge(&key, beyond);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let ok = server.request("POST", "/execute", &key, r#"{"command": ["true"]}"#);
    assert_eq!(ok.0, 200, "{}", ok.1);
    assert!(std::fs::read_dir(&server.ws).unwrap().next().is_none());
    server.stop();
}

#[test]
fn hako_serve_swerex_refuses_a_copy_on_write_workspace_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["serve", "--swerex", "--cow", "--listen", "127.0.0.1:0"])
        .arg("--workspace")
        .arg(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("--swerex") && stderr.contains("--cow") && !stderr.contains("listening"),
        "{stderr}"
    );
}
