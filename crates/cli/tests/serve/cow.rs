//! `hako serve --cow` on linux, spoken to over HTTP: each sandbox on
//! layers of its own (temporary, or named by the create request), the
//! review routes, `403` for an agent's commit without
//! `--allow-agent-commit`, and a commit with it.

use std::path::Path;
use std::process::{Child, Stdio};

use serde_json::{json, Value};

use super::{call, free_port};

const TOKEN: &str = "cow-token-0123456789";

struct CowServer {
    child: Child,
    port: u16,
}

impl CowServer {
    fn start(tmp: &Path, ws: &Path, state: &Path, log: &Path, extra: &[&str]) -> CowServer {
        let token = tmp.join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let port = free_port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(["serve", "--backend", "linux", "--cow", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workspace")
            .arg(ws)
            .arg("--state")
            .arg(state)
            .arg("--token-file")
            .arg(&token)
            .arg("--audit")
            .arg(log)
            .args(extra)
            .env("TMPDIR", tmp.join("tmp"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        CowServer { child, port }
    }

    fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, text) = call(self.port, method, path, Some(TOKEN), &body);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn exec(&self, id: u64, command: &str) -> String {
        let (status, out) = self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": command }),
        );
        assert_eq!(status, 200, "{out}");
        out["stdout"].as_str().unwrap().to_owned()
    }

    /// SIGTERM, so that it closes its sandboxes and its audit log.
    fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().unwrap();
    }
}

fn temporary_layers(tmp: &Path) -> usize {
    std::fs::read_dir(tmp.join("tmp"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hako-cow-"))
        .count()
}

#[test]
fn serve_cow_gives_each_sandbox_its_own_layers_and_refuses_an_agent_commit_without_the_flag() {
    if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
        assert!(
            std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
            "the linux backend cannot run here: {reason}"
        );
        eprintln!("SKIPPED: the linux backend cannot run here: {reason}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    std::fs::create_dir_all(tmp.join("tmp")).unwrap();
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("base.txt"), "base\n").unwrap();
    let state = tmp.join("state");
    let log = tmp.join("one.log");
    let s = CowServer::start(tmp, &ws, &state, &log, &[]);

    // Two sandboxes: a temporary layer and a named one; the name is
    // locked while that sandbox is open, and checked.
    let (status, a) = s.call("POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{a}");
    assert_eq!(a["cow"], json!({ "name": null }));
    let a = a["id"].as_u64().unwrap();
    let (status, b) = s.call("POST", "/v1/sandboxes", json!({"name": "fix-1"}));
    assert_eq!(status, 201, "{b}");
    assert_eq!(b["cow"]["name"], "fix-1");
    let b = b["id"].as_u64().unwrap();
    let (status, v) = s.call("POST", "/v1/sandboxes", json!({"name": "fix-1"}));
    assert_eq!(
        (status, v["kind"].as_str()),
        (409, Some("name_in_use")),
        "{v}"
    );
    let (status, v) = s.call("POST", "/v1/sandboxes", json!({"name": "../x"}));
    assert_eq!((status, v["kind"].as_str()), (400, Some("bad_name")), "{v}");
    assert_eq!(temporary_layers(tmp), 1);

    // Each sandbox's changes are its own; the workspace has none.
    s.exec(a, "echo a > a.txt");
    s.exec(b, "echo b > b.txt && rm base.txt");
    let (status, ca) = s.call("GET", &format!("/v1/sandboxes/{a}/changes"), Value::Null);
    assert_eq!(status, 200, "{ca}");
    let (_, cb) = s.call("GET", &format!("/v1/sandboxes/{b}/changes"), Value::Null);
    let paths = |v: &Value| -> Vec<String> {
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(paths(&ca), ["a.txt"], "{ca}");
    assert_eq!(paths(&cb), ["b.txt", "base.txt"], "{cb}");
    assert!(cb["diff"].as_str().unwrap().contains("+b\n"), "{cb}");
    assert_eq!(cb["hash"].as_str().unwrap().len(), 64);
    let (_, one) = s.call(
        "GET",
        &format!("/v1/sandboxes/{b}/changes?path=b.txt"),
        Value::Null,
    );
    assert_eq!(paths(&one), ["b.txt"], "{one}");
    assert!(!ws.join("a.txt").exists() && !ws.join("b.txt").exists());
    assert!(ws.join("base.txt").exists());

    // A checkpoint, another write, a rollback: the write is gone, the
    // sandbox (same id) usable, the workspace untouched.
    let (status, cp) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/checkpoints"),
        json!({"label": "t1"}),
    );
    assert_eq!(status, 201, "{cp}");
    assert_eq!(cp["id"], 1);
    s.exec(b, "echo later > c.txt");
    let (_, list) = s.call(
        "GET",
        &format!("/v1/sandboxes/{b}/checkpoints"),
        Value::Null,
    );
    assert_eq!(list["checkpoints"][0]["label"], "t1", "{list}");
    let (status, rb) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/rollback"),
        json!({"checkpoint": "t1"}),
    );
    assert_eq!(status, 200, "{rb}");
    assert_eq!(rb["sandbox"]["reopened"], true, "{rb}");
    assert_eq!(s.exec(b, "ls"), "b.txt\n");
    let (status, v) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/rollback"),
        json!({"checkpoint": 7}),
    );
    assert_eq!(
        (status, v["kind"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    assert!(!ws.join("c.txt").exists() && ws.join("base.txt").exists());

    // An agent's commit (or discard) is refused without the flag.
    for op in ["commit", "discard"] {
        let (status, v) = s.call("POST", &format!("/v1/sandboxes/{b}/{op}"), Value::Null);
        assert_eq!(status, 403, "{v}");
        assert_eq!(v["kind"], "agent_commit_refused");
        let message = v["error"].as_str().unwrap();
        assert!(
            message.contains("--allow-agent-commit") && message.contains("hako commit fix-1"),
            "{message}"
        );
    }
    assert!(!ws.join("b.txt").exists() && ws.join("base.txt").exists());
    assert_eq!(s.exec(b, "cat b.txt"), "b\n", "the sandbox is still usable");

    // Deleting the sandbox removes its temporary layer; the named one is
    // kept for review, and free once its sandbox is gone.
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{a}"), Value::Null);
    assert_eq!(status, 200);
    assert_eq!(temporary_layers(tmp), 0);
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{b}"), Value::Null);
    assert_eq!(status, 200);
    s.stop();
    let diff = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["diff", "fix-1", "--stat", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        text.contains("b.txt") && !text.contains("c.txt"),
        "{diff:?}"
    );
    let records = hako_audit::records(&log).unwrap();
    let rollback = records
        .iter()
        .find(|r| r["kind"] == "review" && r["op"] == "rollback")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(
        (
            &rollback["front_end"],
            &rollback["name"],
            &rollback["sandbox"]
        ),
        (&json!("serve"), &json!("fix-1"), &json!(b))
    );

    // A server with --allow-agent-commit: the named sandbox again, its
    // changes committed exactly as reviewed.
    let log = tmp.join("two.log");
    let s = CowServer::start(tmp, &ws, &state, &log, &["--allow-agent-commit"]);
    let (status, c) = s.call("POST", "/v1/sandboxes", json!({"name": "fix-1"}));
    assert_eq!(status, 201, "{c}");
    let c = c["id"].as_u64().unwrap();
    let (_, changes) = s.call("GET", &format!("/v1/sandboxes/{c}/changes"), Value::Null);
    let hash = changes["hash"].as_str().unwrap().to_owned();
    let (status, v) = s.call(
        "POST",
        &format!("/v1/sandboxes/{c}/commit"),
        json!({"expect": "0".repeat(64)}),
    );
    assert_eq!((status, v["kind"].as_str()), (409, Some("refused")), "{v}");
    assert!(!ws.join("b.txt").exists());
    let (status, v) = s.call(
        "POST",
        &format!("/v1/sandboxes/{c}/commit"),
        json!({"expect": hash}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");
    assert!(!ws.join("base.txt").exists());
    s.exec(c, "echo scratch > d.txt");
    let (status, v) = s.call(
        "POST",
        &format!("/v1/sandboxes/{c}/discard"),
        json!({"paths": ["d.txt"]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["discarded"], json!(["d.txt"]));
    assert_eq!(s.exec(c, "ls"), "b.txt\n");
    s.stop();
    let records = hako_audit::records(&log).unwrap();
    let commit = records
        .iter()
        .find(|r| r["kind"] == "review" && r["op"] == "commit")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(commit["front_end"], "serve");
    assert_eq!(commit["sandbox"], c);
    let b_txt = commit["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == "b.txt")
        .unwrap();
    assert_eq!(b_txt["sha256"], hako_audit::sha256_hex(b"b\n"));
}

#[test]
fn serve_and_mcp_refuse_a_server_wide_name_or_agent_commits_without_cow_before_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let hako = || std::process::Command::new(env!("CARGO_BIN_EXE_hako"));
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let ws = tmp.path().to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "serve",
                "--listen",
                &listen,
                "--workspace",
                ws,
                "--backend",
                "linux",
                "--cow",
                "--name",
                "n",
            ],
            "create request",
        ),
        (
            vec![
                "serve",
                "--listen",
                &listen,
                "--workspace",
                ws,
                "--allow-agent-commit",
            ],
            "give --cow",
        ),
        (
            vec!["mcp", "--workspace", ws, "--allow-agent-commit"],
            "give --cow",
        ),
        (
            vec!["mcp", "--workspace", ws, "--backend", "host", "--cow"],
            "--cow",
        ),
    ] {
        let out = hako().args(&args).stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(125), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
