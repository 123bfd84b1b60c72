//! `hako serve --e2b` driven by the unmodified `e2b` SDK (`e2b_client.py`
//! beside this file, sync and async) on the `linux` backend (and `gvisor`
//! where `hako doctor` says it works): sandboxes,
//! commands, files, timeouts and errors as E2B programs use them; then
//! what the server left behind is checked.
//!
//! Needs the test virtualenv's Python (`HAKO_TEST_PYTHON`) with `e2b`,
//! and user namespaces (`hako` carries its guest); without them the tests
//! skip with the reason, unless `HAKO_MUST_WORK=1`, which makes that a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/mcp.rs"]
#[allow(dead_code)]
mod support;

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Whether the SDK and the linux backend are both here; prints why not.
fn ready(test: &str) -> bool {
    match support::python().args(["-c", "import e2b"]).output() {
        Err(e) => return support::skip(&format!("{test}: python cannot run ({e})")),
        Ok(out) if !out.status.success() => {
            return support::skip(&format!(
                "{test}: the Python e2b package is missing (the test command installs it into its virtualenv, HAKO_TEST_PYTHON): {}",
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

/// A `hako serve --e2b --backend linux` of a test's own, its sandboxes'
/// workspaces under `root`; stopped when dropped.
struct Server {
    child: Child,
    port: u16,
    token: String,
    root: PathBuf,
    audit: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_on("linux")
    }

    fn start_on(backend: &str) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let token = format!("e2b-token-{}", std::process::id());
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
            .args(["serve", "--e2b", "--backend", backend, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--e2b-root")
            .arg(&root)
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
        assert!(said.contains("E2B API"), "{said}");
        Server {
            child,
            port,
            token,
            root,
            audit,
            _tmp: tmp,
        }
    }

    /// Runs the client script in `mode`; panics with its output unless it
    /// passed every check.
    fn client(&self, mode: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b_client.py");
        let out = support::python()
            .arg(&script)
            .arg(mode)
            .arg(format!("http://127.0.0.1:{}", self.port))
            .arg(&self.token)
            .arg(&self.root)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "the e2b client failed in mode {mode} ({}):\n{stdout}\n--- stderr ---\n{stderr}",
            out.status
        );
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

    /// Stops the server (SIGTERM) and returns its audit log's records.
    fn stop(&mut self) -> Vec<serde_json::Map<String, serde_json::Value>> {
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn e2b_sdk_runs_commands_and_moves_files_in_linux_sandboxes_of_their_own() {
    if !ready("e2b_sdk_runs_commands_and_moves_files_in_linux_sandboxes_of_their_own") {
        return;
    }
    let mut server = Server::start();
    server.client("sync");
    server.client("async");
    // Every sandbox killed (by the client, or by its timeout) took its
    // workspace with it.
    assert_eq!(entries(&server.root), Vec::<String>::new());
    let records = server.stop();
    let opened = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "open")
        .count();
    let closed = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "close")
        .count();
    assert!(opened >= 3, "{records:?}");
    // Each effect is recorded, as for the /v1 API: commands, files
    // written, and refusals.
    let has = |kind: &str, key: &str, value: &str| {
        records
            .iter()
            .any(|r| r["kind"] == kind && r.get(key).and_then(|v| v.as_str()) == Some(value))
    };
    assert!(
        records.iter().any(|r| r["kind"] == "exec"
            && r["argv"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "echo bye; exit 7"))),
        "{records:?}"
    );
    assert!(has("file", "op", "write"), "{records:?}");
    assert!(has("file", "op", "remove"), "{records:?}");
    assert!(has("process", "op", "kill"), "{records:?}");
    assert!(has("refusal", "path", "/etc/passwd"), "{records:?}");
    assert_eq!(opened, closed, "{records:?}");
    // The root given is the caller's: kept when the server stops.
    assert!(server.root.is_dir());
}

/// Whether `hako doctor` says `backend` works; skips (or fails under
/// `HAKO_MUST_WORK=1`) when not.
fn works(test: &str, backend: &str) -> bool {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|r| r["backend"] == backend))
        .cloned()
        .unwrap_or_default();
    report["works"] == true
        || support::skip(&format!("{test}: {backend} does not work here: {report}"))
}

#[test]
fn containers_e2b_sdk_runs_commands_and_moves_files_in_gvisor_sandboxes() {
    let test = "containers_e2b_sdk_runs_commands_and_moves_files_in_gvisor_sandboxes";
    if !ready(test) || !works(test, "gvisor") {
        return;
    }
    let mut server = Server::start_on("gvisor");
    server.client("sync");
    server.client("async");
    assert_eq!(entries(&server.root), Vec::<String>::new());
    server.stop();
}

#[test]
fn e2b_in_sandbox_call_with_another_sandboxs_access_token_is_refused() {
    if !ready("e2b_in_sandbox_call_with_another_sandboxs_access_token_is_refused") {
        return;
    }
    let server = Server::start();
    let key = format!("X-API-Key: {}\r\n", server.token);
    let create = |server: &Server| {
        let (status, body) = server.request(
            "POST",
            "/v2/sandboxes",
            &key,
            r#"{"templateID":"base","timeout":60}"#,
        );
        assert_eq!(status, 201, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (
            v["sandboxID"].as_str().unwrap().to_string(),
            v["envdAccessToken"].as_str().unwrap().to_string(),
        )
    };
    let (a, a_token) = create(&server);
    let (b, _b_token) = create(&server);
    let list = r#"{"path":"/home/user"}"#;
    // B named with A's token: refused, and nothing of B is listed.
    let (status, body) = server.request(
        "POST",
        "/filesystem.Filesystem/ListDir",
        &format!("E2b-Sandbox-Id: {b}\r\nX-Access-Token: {a_token}\r\n"),
        list,
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unauthenticated"), "{body}");
    // No token at all, and the server's API key in its place: refused.
    for headers in [
        format!("E2b-Sandbox-Id: {b}\r\n"),
        format!(
            "E2b-Sandbox-Id: {b}\r\nX-Access-Token: {}\r\n",
            server.token
        ),
    ] {
        let (status, body) =
            server.request("POST", "/filesystem.Filesystem/ListDir", &headers, list);
        assert_eq!(status, 401, "{body}");
    }
    // The control API without the key: refused, nothing made.
    let (status, _) = server.request("POST", "/v2/sandboxes", "", r#"{"templateID":"base"}"#);
    assert_eq!(status, 401);
    let (status, body) = server.request("GET", "/v2/sandboxes", &key, "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A's own token still works.
    let (status, body) = server.request(
        "POST",
        "/filesystem.Filesystem/ListDir",
        &format!("E2b-Sandbox-Id: {a}\r\nX-Access-Token: {a_token}\r\n"),
        list,
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn e2b_path_escaping_the_workspace_is_refused() {
    if !ready("e2b_path_escaping_the_workspace_is_refused") {
        return;
    }
    let server = Server::start();
    let key = format!("X-API-Key: {}\r\n", server.token);
    let (status, body) = server.request("POST", "/v2/sandboxes", &key, r#"{"templateID":"base"}"#);
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let headers = format!(
        "E2b-Sandbox-Id: {}\r\nX-Access-Token: {}\r\n",
        v["sandboxID"].as_str().unwrap(),
        v["envdAccessToken"].as_str().unwrap()
    );
    std::fs::write(server.root.join("secret"), "s").unwrap();
    for path in [
        "/home/user/../secret",
        "../secret",
        "/etc",
        server.root.join("secret").to_str().unwrap(),
    ] {
        let (status, body) = server.request(
            "POST",
            "/filesystem.Filesystem/Stat",
            &headers,
            &format!(r#"{{"path":{}}}"#, serde_json::json!(path)),
        );
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("permission_denied"), "{body}");
    }
    // The sandbox still works.
    let (status, body) = server.request(
        "POST",
        "/filesystem.Filesystem/Stat",
        &headers,
        r#"{"path":"/home/user"}"#,
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn e2b_bench_measures_the_e2b_sdk_against_hakos_own() {
    let test = "e2b_bench_measures_the_e2b_sdk_against_hakos_own";
    if !ready(test) {
        return;
    }
    // hako's own SDK from this repository (pure Python in remote mode).
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let python = support::python()
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let python = String::from_utf8_lossy(&python.stdout).trim().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["bench", "--json", "--backend", "linux", "--iterations", "2"])
        .args(["--sdk-python", &python])
        .env("PYTHONPATH", &sdk)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let ratio = v["figures"]["linux"]["sdk_round_trip.ratio_vs_hako_sdk"].as_f64();
    assert!(ratio.is_some_and(|r| r > 0.0), "{v}");
    assert!(
        !v["errors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap_or("").contains("SDK")),
        "{v}"
    );
}

#[test]
fn hako_serve_e2b_refuses_a_copy_on_write_workspace_and_a_root_that_is_not_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    for (extra, named) in [
        (vec!["--cow".to_string()], "--cow"),
        (
            vec!["--e2b-root".to_string(), file.display().to_string()],
            "--e2b-root",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(["serve", "--e2b", "--listen", "127.0.0.1:0", "--workspace"])
            .arg(tmp.path())
            .args(&extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(
            stderr.contains(named) && !stderr.contains("listening"),
            "{stderr}"
        );
    }
    // --e2b-root is for --e2b.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["serve", "--listen", "127.0.0.1:0", "--e2b-root"])
        .arg(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
