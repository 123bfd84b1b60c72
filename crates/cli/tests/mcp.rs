//! `hako mcp` driven by a client hako did not write: the official Python
//! MCP SDK (`mcp_client.py` beside this file), on the `linux` and `host`
//! backends; then the audit log it left is checked.
//!
//! Needs `python3` with the `mcp` package and the `hako-guest` binary
//! beside `hako` (`cargo build --workspace`); without them the tests skip
//! with the reason, unless `HAKO_MUST_WORK=1`, which makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/mcp.rs"]
mod support;

use std::path::{Path, PathBuf};

/// One client at a time: the check that nothing outlives a server looks
/// for the script's commands among every process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn drive(backend: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !support::client_and_guest_ready() {
        return;
    }
    if backend == "linux" {
        if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
            support::skip(&format!("the linux backend cannot run here: {reason}"));
            return;
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let audit: PathBuf = tmp.path().join("audit.log");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let out = support::python()
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_hako"))
        .arg(backend)
        .arg(&ws)
        .arg(&audit)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the MCP client failed on {backend} ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );

    // The server closed its log when the client went away: the chain
    // verifies and ends with its closing record.
    let verified = hako_audit::verify(&audit).unwrap_or_else(|e| panic!("{e}"));
    assert!(verified.closed);
    let records = hako_audit::records(&audit).unwrap();
    let has = |kind: &str, key: &str, value: &str| {
        records
            .iter()
            .any(|r| r["kind"] == kind && r.get(key).and_then(|v| v.as_str()) == Some(value))
    };
    assert!(has("sandbox", "op", "open"), "{records:?}");
    assert!(has("exec", "command", "echo still here"), "{records:?}");
    assert!(has("file", "op", "write"), "{records:?}");
    assert!(has("file", "op", "edit"), "{records:?}");
    assert!(has("refusal", "tool", "read_file"), "{records:?}");
    assert!(has("sandbox", "op", "close"), "{records:?}");
    let write = records
        .iter()
        .find(|r| r["kind"] == "file" && r["op"] == "write" && r["path"] == "src/hello.txt")
        .expect("the write of src/hello.txt is recorded");
    assert_eq!(
        write["sha256"],
        hako_audit::sha256_hex(b"one\ntwo\nthree\n")
    );
    let timed_out = records
        .iter()
        .find(|r| r["kind"] == "exec" && r["command"] == "sleep 30" && r["timed_out"] == true);
    assert!(timed_out.is_some(), "{records:?}");
    // Every command's record has the fields every front end writes.
    for exec in records.iter().filter(|r| r["kind"] == "exec") {
        assert_eq!(exec["front_end"], "mcp", "{exec:?}");
        assert_eq!(exec["tool"], "run_command", "{exec:?}");
        assert_eq!(exec["backend"], backend, "{exec:?}");
        assert!(exec["command"].is_string(), "{exec:?}");
    }
    // Nothing the sandbox started outlives the server.
    let leftover = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("echo started; sleep 30") || c.contains("read line; echo got"))
        .collect::<Vec<_>>();
    assert!(leftover.is_empty(), "{leftover:?}");
}

#[test]
fn python_mcp_client_drives_every_tool_on_linux() {
    drive("linux");
}

#[test]
fn python_mcp_client_drives_every_tool_on_host() {
    drive("host");
}

/// `hako mcp --cow` on linux, driven by the Python client
/// (`mcp_cow_client.py`): the review tools, a rollback that ends the
/// sandbox's processes, commit refused without `--allow-agent-commit` and
/// done with it; then each server's audit log.
#[test]
fn python_mcp_client_reviews_checkpoints_rolls_back_and_commits_a_cow_sandbox_on_linux() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !support::client_and_guest_ready() {
        return;
    }
    if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
        support::skip(&format!("the linux backend cannot run here: {reason}"));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let state = tmp.path().join("state");
    let (audit1, audit2) = (tmp.path().join("one.log"), tmp.path().join("two.log"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_cow_client.py");
    let out = support::python()
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_hako"))
        .args([&ws, &state, &audit1, &audit2])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the MCP client failed ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
    let reviews = |log: &Path| {
        assert!(hako_audit::verify(log).unwrap().closed);
        hako_audit::records(log).unwrap()
    };
    // The first server: the rollback and the refused commit.
    let records = reviews(&audit1);
    let rollback = records
        .iter()
        .find(|r| r["kind"] == "review" && r["op"] == "rollback")
        .unwrap_or_else(|| panic!("no rollback record: {records:?}"));
    assert_eq!(rollback["front_end"], "mcp");
    assert_eq!(rollback["name"], "agent");
    assert_eq!(rollback["checkpoint"], 1);
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "refusal" && r["tool"] == "commit"),
        "{records:?}"
    );
    assert!(
        !records
            .iter()
            .any(|r| r["kind"] == "review" && r["op"] == "commit"),
        "{records:?}"
    );
    // The sandbox was closed for the rollback and opened again.
    let opened = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "open")
        .count();
    assert!(opened >= 2, "{records:?}");
    // The second: the commit, with the SHA-256 of what was written, and
    // the discard.
    let records = reviews(&audit2);
    let commit = records
        .iter()
        .find(|r| r["kind"] == "review" && r["op"] == "commit")
        .unwrap_or_else(|| panic!("no commit record: {records:?}"));
    assert_eq!(commit["front_end"], "mcp");
    assert_eq!(commit["complete"], true);
    let a = &commit["changes"][0];
    assert_eq!(a["path"], "a.txt");
    assert_eq!(a["sha256"], hako_audit::sha256_hex(b"one\n"));
    let discard = records
        .iter()
        .find(|r| r["kind"] == "review" && r["op"] == "discard")
        .unwrap_or_else(|| panic!("no discard record: {records:?}"));
    assert_eq!(discard["paths"], serde_json::json!(["d.txt"]));
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
    // Nothing the sandboxes started outlives the servers.
    let leftover = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| {
            String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains("cow-left-running")
        });
    assert!(!leftover);
}
