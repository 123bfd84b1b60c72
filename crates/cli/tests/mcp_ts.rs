//! `hako mcp` driven over stdio by the official TypeScript MCP SDK (npm
//! `@modelcontextprotocol/sdk`, used unmodified: its `Client` and
//! `StdioClientTransport`), through `mcp_ts_client.mjs` beside this file:
//! initialize, the tool list, a file round trip, commands, and refused
//! paths after which the server still answers.
//!
//! Needs Node (`HAKO_TEST_NODE`, else `node` on `PATH`), the SDK installed
//! in a directory's `node_modules` (`HAKO_TEST_NPM`, which the test
//! command sets; else the workspace's `target/test-npm`). Without them the
//! test skips with the reason, unless `HAKO_MUST_WORK=1`, which makes that
//! a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn skip(test: &str, reason: &str) {
    assert!(
        std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
        "{test}: {reason} and HAKO_MUST_WORK=1"
    );
    eprintln!("SKIPPED {test}: {reason}");
}

fn node() -> Command {
    Command::new(std::env::var_os("HAKO_TEST_NODE").unwrap_or_else(|| "node".into()))
}

fn sdk_dir() -> PathBuf {
    std::env::var_os("HAKO_TEST_NPM").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-npm"),
        PathBuf::from,
    )
}

/// Why the client cannot run here, if it cannot.
fn missing() -> Option<String> {
    match node().arg("--version").output() {
        Err(e) => return Some(format!("node cannot run ({e}); set HAKO_TEST_NODE")),
        Ok(out) if !out.status.success() => {
            return Some(format!("node --version failed ({})", out.status))
        }
        Ok(_) => {}
    }
    let sdk = sdk_dir().join("node_modules/@modelcontextprotocol/sdk/package.json");
    if !sdk.is_file() {
        return Some(format!(
            "{} is missing (the test command installs @modelcontextprotocol/sdk there; HAKO_TEST_NPM names the directory)",
            sdk.display()
        ));
    }
    None
}

fn drive(test: &str, backend: &str) {
    if let Some(reason) = missing() {
        return skip(test, &reason);
    }
    if backend == "linux" {
        if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
            return skip(
                test,
                &format!("the linux backend cannot run here: {reason}"),
            );
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_ts_client.mjs");
    let out = node()
        .arg(&script)
        .arg(sdk_dir())
        .arg(env!("CARGO_BIN_EXE_hako"))
        .arg(backend)
        .arg(&ws)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the TypeScript MCP client failed on {backend} ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
    // What the client wrote is in the workspace, and nothing beside it.
    assert_eq!(
        std::fs::read_to_string(ws.join("ts/hello.txt")).unwrap(),
        "from typescript\nsecond line\n"
    );
    assert!(!tmp.path().join("ts-outside-target").exists());
}

#[test]
fn typescript_mcp_client_drives_hako_mcp_over_stdio_on_linux() {
    drive(
        "typescript_mcp_client_drives_hako_mcp_over_stdio_on_linux",
        "linux",
    );
}
