#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! `hako serve`'s API over real HTTP on loopback, with the host backend
//! behind it: the token, every route of the OpenAPI file, and a client's
//! round trip.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hako_host::{HostConfig, HostSandbox};
use hako_serve::{serve, ServeConfig, OPENAPI, ROUTES};
use serde_json::Value;

const TOKEN: &str = "test-token-0123456789";

struct Server {
    port: u16,
    ws: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let ws = ws.canonicalize().unwrap();
    let log = dir.path().join("audit.log");
    let audit = Arc::new(hako_audit::AuditLog::open(&log).unwrap());
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let root = ws.clone();
    let config = ServeConfig {
        make_sandbox: Box::new(move || {
            Ok(Box::new(HostSandbox::new(HostConfig::new(&root))?) as Box<dyn hako_core::Sandbox>)
        }),
        token: TOKEN.into(),
        audit: Some(audit),
    };
    std::thread::spawn(move || serve(server, config));
    Server {
        port,
        ws,
        log,
        _dir: dir,
    }
}

/// One request (HTTP/1.1, `Connection: close`): status, headers, body.
fn request(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + size]);
        b = &b[end + 2 + size + 2..];
    }
}

fn json(port: u16, method: &str, path: &str, body: Value) -> (u16, Value) {
    let (status, _, body) = request(port, method, path, Some(TOKEN), body.to_string().as_bytes());
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[test]
fn requests_without_the_token_get_401_and_touch_nothing() {
    let s = start();
    for (method, path, body) in [
        ("POST", "/v1/sandboxes", &b""[..]),
        ("GET", "/v1/sandboxes", b""),
        ("GET", "/v1/health", b""),
        ("PUT", "/v1/sandboxes/1/files?path=planted", b"x"),
    ] {
        for token in [None, Some("wrong"), Some("test-token-012345678"), Some("")] {
            let (status, head, body) = request(s.port, method, path, token, body);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {head}");
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["kind"], "unauthorized");
        }
    }
    let (status, v) = json(s.port, "GET", "/v1/sandboxes", Value::Null);
    assert_eq!(
        (status, v["sandboxes"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    assert!(!s.ws.join("planted").exists());
    assert!(hako_serve::constant_time_eq(b"abc", b"abc"));
    assert!(!hako_serve::constant_time_eq(b"abc", b"abd"));
    assert!(!hako_serve::constant_time_eq(b"abc", b"abcd"));
    assert_eq!(hako_serve::generate_token().unwrap().len(), 64);
}

/// The `required` fields of a 200/201 JSON response's schema.
fn required_fields(spec: &Value, op: &Value, status: u16) -> Vec<String> {
    let schema = &op["responses"][status.to_string()]["content"]["application/json"]["schema"];
    let schema = match schema["$ref"].as_str() {
        Some(r) => &spec["components"]["schemas"][r.rsplit('/').next().unwrap()],
        None => schema,
    };
    schema["required"]
        .as_array()
        .map(|r| r.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn the_openapi_file_matches_what_the_server_serves() {
    let spec: Value = serde_json::from_str(OPENAPI).unwrap();
    let documented: BTreeSet<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| *m != "parameters")
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    // Every documented operation answers (no "no such route"), and a
    // success carries what its schema requires.
    let s = start();
    std::fs::write(s.ws.join("f.txt"), b"hello").unwrap();
    let (status, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_u64().unwrap();
    let (_, session) = json(
        s.port,
        "POST",
        &format!("/v1/sandboxes/{id}/sessions"),
        Value::Null,
    );
    let session = session["session"].as_u64().unwrap();
    // In an order where each call finds what it needs.
    let mut ops: Vec<(String, String)> = documented.into_iter().collect();
    ops.sort_by_key(|(m, p)| (p.contains("sessions/{session}") || m == "delete", p.clone()));
    let order = |m: &str, p: &str| (m == "delete" && p == "/v1/sandboxes/{id}") as u8;
    ops.sort_by_key(|(m, p)| order(m, p));
    for (method, template) in ops {
        let path = template
            .replace("{id}", &id.to_string())
            .replace("{session}", &session.to_string());
        let path = if path.ends_with("/files") || path.ends_with("/dir") {
            format!("{path}?path=f.txt")
        } else {
            path
        };
        let body: &[u8] = match (method.as_str(), template.as_str()) {
            ("post", "/v1/sandboxes/{id}/exec") => br#"{"argv":["cat","f.txt"]}"#,
            ("put", _) => b"written",
            _ => b"",
        };
        let path = if template.ends_with("/dir") {
            format!("/v1/sandboxes/{id}/dir?path=.")
        } else {
            path
        };
        let (status, head, body) =
            request(s.port, &method.to_uppercase(), &path, Some(TOKEN), body);
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert!(
            matches!(status, 200 | 201),
            "{method} {path}: {status} {head} {value}"
        );
        let op = &spec["paths"][&template][&method];
        for field in required_fields(&spec, op, status) {
            assert!(
                value.get(&field).is_some(),
                "{method} {template}: no {field} in {value}"
            );
        }
    }
    let (status, v) = json(s.port, "GET", "/v1/no/such/route", Value::Null);
    assert_eq!((status, v["kind"].as_str()), (404, Some("no_such_route")));
}

#[test]
fn a_client_runs_commands_streams_output_and_uses_files_and_sessions_through_the_fence() {
    let s = start();
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let id = created["id"].as_u64().unwrap();
    assert_eq!(created["capabilities"]["backend"], "host");
    let base = format!("/v1/sandboxes/{id}");
    let (status, _, _) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=dir%2Fnotes.txt"),
        Some(TOKEN),
        b"x",
    );
    assert_eq!(status, 404, "a missing parent directory");
    let (status, _, _) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=notes.txt"),
        Some(TOKEN),
        b"line one\n",
    );
    assert_eq!(status, 200);
    let (status, _, body) = request(
        s.port,
        "GET",
        &format!("{base}/files?path=notes.txt"),
        Some(TOKEN),
        b"",
    );
    assert_eq!((status, body.as_slice()), (200, &b"line one\n"[..]));
    // The fence: nothing outside the workspace.
    for path in ["..%2Fescape", "%2Fetc%2Fpasswd"] {
        let (status, _, body) = request(
            s.port,
            "GET",
            &format!("{base}/files?path={path}"),
            Some(TOKEN),
            b"",
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, v["kind"].as_str()),
            (403, Some("refused")),
            "{path}: {v}"
        );
    }
    let (status, out) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"command": "wc -l < notes.txt; echo err >&2; exit 3"}),
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        (
            out["stdout"].as_str(),
            out["stderr"].as_str(),
            out["exit_code"].as_i64()
        ),
        (Some("1\n"), Some("err\n"), Some(3))
    );
    let (status, out) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"argv": ["sleep", "5"], "timeout_ms": 200}),
    );
    assert_eq!((status, out["timed_out"].as_bool()), (200, Some(true)));
    // Streamed: chunks as they come, numbered, then the exit.
    let (status, head, body) = request(
        s.port,
        "POST",
        &format!("{base}/exec"),
        Some(TOKEN),
        br#"{"command":"echo a; sleep 0.2; echo b >&2; echo c","stream":true}"#,
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("application/x-ndjson"),
        "{head}"
    );
    let lines: Vec<Value> = String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{lines:?}");
    let text: String = lines.iter().filter_map(|l| l["data"].as_str()).collect();
    assert_eq!(text, "a\nb\nc\n");
    assert_eq!(lines.last().unwrap()["exit"]["exit_code"], 0);
    // A session keeps its shell's state.
    let (_, opened) = json(s.port, "POST", &format!("{base}/sessions"), Value::Null);
    let session = opened["session"].as_u64().unwrap();
    json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"command": "export X=41; cd /tmp", "session": session}),
    );
    let (_, out) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"command": "echo $((X+1)) $(pwd)", "session": session}),
    );
    assert_eq!(out["stdout"], "42 /tmp\n");
    let (status, _) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"argv": ["true"], "bogus": 1}),
    );
    assert_eq!(status, 400);
    let (status, listing) = json(s.port, "GET", &format!("{base}/dir"), Value::Null);
    assert_eq!(status, 200);
    assert!(listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "notes.txt"));
    let (status, _) = json(
        s.port,
        "DELETE",
        &format!("{base}/files?path=notes.txt"),
        Value::Null,
    );
    assert_eq!(status, 200);
    assert!(!s.ws.join("notes.txt").exists());
    let (status, _) = json(s.port, "DELETE", &base, Value::Null);
    assert_eq!(status, 200);
    let (status, v) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"argv": ["true"]}),
    );
    assert_eq!((status, v["kind"].as_str()), (404, Some("no_such_sandbox")));
    // Every effect is in the audit log, whose chain holds.
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    let kinds: Vec<&str> = records.iter().filter_map(|r| r["kind"].as_str()).collect();
    for kind in ["sandbox", "write", "read", "exec", "refusal", "remove"] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
}
