#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! `hako serve`'s API over real HTTP on loopback, with the host backend
//! behind it: the token, every route of the OpenAPI file, and a client's
//! round trip.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// A linux sandbox over `root`.
fn linux(root: &Path) -> hako_core::Result<Box<dyn hako_core::Sandbox>> {
    Ok(Box::new(hako_linux::LinuxSandbox::new(
        hako_linux::LinuxConfig::new(root),
    )?) as Box<dyn hako_core::Sandbox>)
}

fn start() -> Server {
    start_with(|root| {
        Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>)
    })
}

/// A server whose sandboxes `make` opens over the workspace.
fn start_with(
    make: impl Fn(&Path) -> hako_core::Result<Box<dyn hako_core::Sandbox>> + Send + Sync + 'static,
) -> Server {
    start_config(make, |_| {})
}

/// A server whose sandboxes `make` opens, with `tweak` applied to its
/// configuration.
fn start_config(
    make: impl Fn(&Path) -> hako_core::Result<Box<dyn hako_core::Sandbox>> + Send + Sync + 'static,
    tweak: impl FnOnce(&mut ServeConfig),
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let ws = ws.canonicalize().unwrap();
    let log = dir.path().join("audit.log");
    let audit = Arc::new(hako_audit::AuditLog::open(&log, &[]).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = ws.clone();
    let mut config = ServeConfig::new(Box::new(move || make(&root)), TOKEN.into(), Some(audit));
    tweak(&mut config);
    std::thread::spawn(move || serve(listener, config));
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
    assert!(hako_runtime::token::constant_time_eq(b"abc", b"abc"));
    assert!(!hako_runtime::token::constant_time_eq(b"abc", b"abd"));
    assert!(!hako_runtime::token::constant_time_eq(b"abc", b"abcd"));
    assert!(hako_runtime::token::matches(b"abc", b"abc"));
    assert!(!hako_runtime::token::matches(b"abc", b"abcd"));
    assert!(!hako_runtime::token::matches(b"", b"abc"));
    assert_eq!(hako_runtime::token::generate().unwrap().len(), 64);
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
    // success carries what its schema requires: on linux, which has
    // every capability a route needs (processes, stat, mkdir).
    let s = start_with(linux);
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
    let (status, process) = json(
        s.port,
        "POST",
        &format!("/v1/sandboxes/{id}/processes"),
        serde_json::json!({"argv": ["cat"]}),
    );
    assert_eq!(status, 201, "{process}");
    let process = process["process"].as_u64().unwrap();
    // In an order where each call finds what it needs.
    let mut ops: Vec<(String, String)> = documented.into_iter().collect();
    ops.sort_by_key(|(m, p)| {
        (
            p.contains("sessions/{session}") || m == "delete" || p.ends_with("/kill"),
            p.clone(),
        )
    });
    let order = |m: &str, p: &str| (m == "delete" && p == "/v1/sandboxes/{id}") as u8;
    ops.sort_by_key(|(m, p)| order(m, p));
    for (method, template) in ops {
        let path = template
            .replace("{id}", &id.to_string())
            .replace("{session}", &session.to_string())
            .replace("{process}", &process.to_string());
        let path = if path.ends_with("/files") || path.ends_with("/dir") || path.ends_with("/stat")
        {
            format!("{path}?path=f.txt")
        } else if path.ends_with("/output") {
            format!("{path}?wait_ms=0")
        } else if path.ends_with("/wait") {
            format!("{path}?timeout_ms=10")
        } else {
            path
        };
        let body: &[u8] = match (method.as_str(), template.as_str()) {
            ("post", "/v1/sandboxes/{id}/exec") => br#"{"argv":["cat","f.txt"]}"#,
            ("post", "/v1/sandboxes/{id}/processes") => br#"{"argv":["true"]}"#,
            ("post", "/v1/sandboxes/{id}/processes/{process}/stdin") => br#"{"data":"x"}"#,
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
        // The review routes need a copy-on-write sandbox, which this
        // server (the host backend) has not: they say so. They answer on
        // linux in the CLI's serve tests.
        let review = [
            "/changes",
            "/checkpoints",
            "/rollback",
            "/commit",
            "/discard",
        ];
        if review.iter().any(|r| template.ends_with(r)) {
            assert_eq!(
                (status, value["kind"].as_str()),
                (400, Some("not_cow")),
                "{method} {path}: {head} {value}"
            );
            continue;
        }
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
    let (status, _, body) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=dir%2Fnotes.txt"),
        Some(TOKEN),
        b"x",
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, v["created_dirs"].as_bool()),
        (200, Some(true)),
        "a missing parent directory is made: {v}"
    );
    assert_eq!(std::fs::read(s.ws.join("dir/notes.txt")).unwrap(), b"x");
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
    // In order within each stream (two pipes give no order between them:
    // `b` and `c` are written a moment apart and may be read together).
    let text = |stream: &str| -> String {
        lines
            .iter()
            .filter(|l| l["stream"] == stream)
            .filter_map(|l| l["data"].as_str())
            .collect()
    };
    assert_eq!(
        (text("stdout"), text("stderr")),
        ("a\nc\n".into(), "b\n".into())
    );
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
    // The file operations are `file` records, their `op` saying which.
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    let kinds: Vec<(&str, &str)> = records
        .iter()
        .filter_map(|r| {
            let op = r.get("op").and_then(Value::as_str).unwrap_or("");
            Some((r["kind"].as_str()?, op))
        })
        .collect();
    for kind in [
        ("sandbox", "open"),
        ("file", "write"),
        ("file", "read"),
        ("exec", ""),
        ("refusal", ""),
        ("file", "remove"),
        ("session", "open"),
        ("sandbox", "close"),
    ] {
        assert!(kinds.contains(&kind), "no {kind:?} in {kinds:?}");
    }
    // Every exec record says which sandbox and backend it ran in.
    for exec in records.iter().filter(|r| r["kind"] == "exec") {
        assert_eq!(exec["front_end"], "serve", "{exec:?}");
        assert_eq!(exec["backend"], "host", "{exec:?}");
        assert_eq!(exec["sandbox"].as_u64(), Some(id), "{exec:?}");
    }
}

/// Sends raw bytes on a new connection (kept open) and returns it.
fn send_raw(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    s
}

/// Reads the status line and headers of an answer (and no more).
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!(
                "no answer: {other:?} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn healthy(port: u16) {
    let (status, v) = json(port, "GET", "/v1/health", Value::Null);
    assert_eq!((status, &v["ok"]), (200, &Value::Bool(true)), "{v}");
}

#[test]
fn a_declared_body_of_a_terabyte_neither_aborts_the_server_nor_is_read() {
    // tiny_http drained such a body with one buffer of the declared size
    // when the request was dropped: the allocation failed and aborted the
    // process (or panicked past isize::MAX), before any token check. hyper
    // refuses a length past u64::MAX - 2 itself; the server answers that
    // one too, the token first.
    let s = start();
    for len in [
        "1000000000000",
        "9223372036854775807",
        "18446744073709551615",
    ] {
        for (token, want) in [(None, 401), (Some(TOKEN), 413)] {
            let auth = token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default();
            let mut c = send_raw(
                s.port,
                format!("PUT /v1/sandboxes/1/files?path=big HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {len}\r\n\r\nabc").as_bytes(),
            );
            // The client gives up early, as an attacker would.
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let head = read_head(&mut c);
            assert_eq!(status_of(&head), want, "{len} {token:?}: {head}");
            // Then the error, as JSON on one line (the connection is not
            // read from again, and ends when the client closes it).
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while c.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            let v: Value = serde_json::from_slice(&line).unwrap();
            let kind = if want == 401 {
                "unauthorized"
            } else {
                "too_large"
            };
            assert_eq!(v["kind"], kind, "{v}");
        }
    }
    healthy(s.port);
    assert!(!s.ws.join("big").exists());
}

#[test]
fn unauthenticated_slow_bodies_do_not_lock_authorized_clients_out() {
    // Each request declares a body it never sends: answering 401 is quick,
    // but the server must not then wait for the body. Those waits must not use up
    // what authorized requests need (they used to stop the accept loop
    // after 64).
    let s = start();
    let stuck: Vec<TcpStream> = (0..80)
        .map(|_| {
            let mut c = send_raw(
                s.port,
                b"PUT /v1/sandboxes/1/files?path=x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n",
            );
            assert_eq!(status_of(&read_head(&mut c)), 401);
            c
        })
        .collect();
    let mut c = send_raw(
        s.port,
        format!("GET /v1/sandboxes HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&read_head(&mut c)), 200);
    drop(stuck);
}

/// A sandbox with nothing behind it, slow to open, counting how many are
/// open at once.
struct Counted {
    caps: hako_core::Capabilities,
    live: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl hako_core::Sandbox for Counted {
    fn capabilities(&self) -> &hako_core::Capabilities {
        &self.caps
    }
    fn exec(&self, _: &hako_core::Command) -> hako_core::Result<hako_core::Output> {
        Err(hako_core::Error::Closed)
    }
    fn read_file(&self, _: &Path) -> hako_core::Result<Vec<u8>> {
        Err(hako_core::Error::Closed)
    }
    fn write_file(&self, _: &Path, _: &[u8]) -> hako_core::Result<()> {
        Err(hako_core::Error::Closed)
    }
    fn remove(&self, _: &Path) -> hako_core::Result<()> {
        Err(hako_core::Error::Closed)
    }
    fn list_dir(&self, _: &Path) -> hako_core::Result<hako_core::DirListing> {
        Err(hako_core::Error::Closed)
    }
    fn close(&self) -> hako_core::Result<()> {
        Ok(())
    }
}

#[test]
fn concurrent_creates_cannot_open_more_sandboxes_than_the_limit() {
    let live = Arc::new(AtomicUsize::new(0));
    let counter = live.clone();
    let s = start_with(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        Ok(Box::new(Counted {
            caps: hako_core::Capabilities {
                backend: "counted".into(),
                isolation: hako_core::Isolation::None,
                network: hako_core::NetworkAccess::None,
                fence: hako_core::FenceResolver::ComponentWalk,
                limits: Vec::new(),
                env_sanitised: true,
                fds_closed: true,
                landlock_abi: None,
                accelerator: None,
                seccomp: false,
                shared: Vec::new(),
                defects: Vec::new(),
                optional: hako_core::Optional::default(),
            },
            live: counter.clone(),
        }) as Box<dyn hako_core::Sandbox>)
    });
    let port = s.port;
    let statuses: Vec<u16> = (0..2 * hako_serve::MAX_SANDBOXES)
        .map(|_| std::thread::spawn(move || json(port, "POST", "/v1/sandboxes", Value::Null).0))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let created = statuses.iter().filter(|&&s| s == 201).count();
    assert_eq!(created, hako_serve::MAX_SANDBOXES, "{statuses:?}");
    assert!(
        statuses.iter().all(|&s| s == 201 || s == 429),
        "{statuses:?}"
    );
    assert_eq!(live.load(Ordering::SeqCst), hako_serve::MAX_SANDBOXES);
}

#[test]
fn past_max_sandboxes_a_create_is_refused_429_naming_the_flag_and_a_close_makes_room() {
    let s = start_config(
        |root| Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>),
        |c| c.max_sandboxes = 3,
    );
    let ids: Vec<Value> = (0..3)
        .map(|_| {
            let (status, body) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
            assert_eq!(status, 201, "{body}");
            body["id"].clone()
        })
        .collect();
    let (status, body) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["kind"], "too_many_sandboxes", "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains("--max-sandboxes"), "{body}");
    // The open ones are untouched, and closing one makes room for another.
    let (status, _) = json(
        s.port,
        "GET",
        &format!("/v1/sandboxes/{}", ids[0]),
        Value::Null,
    );
    assert_eq!(status, 200);
    let (status, _) = json(
        s.port,
        "DELETE",
        &format!("/v1/sandboxes/{}", ids[1]),
        Value::Null,
    );
    assert_eq!(status, 200);
    let (status, body) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{body}");
}

#[test]
fn a_query_path_that_is_malformed_not_utf8_or_has_a_nul_is_refused_never_rewritten() {
    let s = start();
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let base = format!("/v1/sandboxes/{}", created["id"]);
    // Each path written to: the status and error kind the server answers.
    let put = |path: &str| {
        let (status, _, body) = request(
            s.port,
            "PUT",
            &format!("{base}/files?path={path}"),
            Some(TOKEN),
            b"x",
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        (status, v["kind"].as_str().map(str::to_string), v)
    };
    for path in ["a%ff", "a%00b", "a%2", "a%+1", "%zz"] {
        let (status, kind, v) = put(path);
        assert_eq!(
            (status, kind.as_deref()),
            (400, Some("bad_path")),
            "{path}: {v}"
        );
    }
    // Nothing was written under a name the client did not send.
    assert_eq!(std::fs::read_dir(&s.ws).unwrap().count(), 0);
    // Encoded dots are decoded, then refused by the fence like plain ones.
    for path in ["%2e%2e%2fescape", "%2E%2E", "sub%2f..%2f..%2fescape"] {
        let (status, kind, v) = put(path);
        assert_eq!(
            (status, kind.as_deref()),
            (403, Some("refused")),
            "{path}: {v}"
        );
    }
    assert!(!s.ws.parent().unwrap().join("escape").exists());
    // A name with an encoded space and a non-ASCII letter is the name sent.
    let (status, _, _) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=caf%C3%A9+noir.txt"),
        Some(TOKEN),
        b"ok",
    );
    assert_eq!(status, 200);
    assert_eq!(std::fs::read(s.ws.join("café noir.txt")).unwrap(), b"ok");
}

#[test]
fn a_body_cut_short_does_not_replace_the_file() {
    let s = start();
    std::fs::write(s.ws.join("precious.txt"), b"the user's work").unwrap();
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let base = format!("/v1/sandboxes/{}", created["id"]);
    let mut c = send_raw(
        s.port,
        format!("PUT {base}/files?path=precious.txt HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 5000\r\n\r\n").as_bytes(),
    );
    c.write_all(&[b'x'; 2000]).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(raw.contains("body_cut_short"), "{raw}");
    // Chunked: an early end cannot be told from a whole body, so refused.
    let mut c = send_raw(
        s.port,
        format!("PUT {base}/files?path=precious.txt HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n").as_bytes(),
    );
    let head = read_head(&mut c);
    assert_eq!(status_of(&head), 411, "{head}");
    assert_eq!(
        std::fs::read(s.ws.join("precious.txt")).unwrap(),
        b"the user's work"
    );
}

#[test]
fn an_exec_deadline_past_the_maximum_is_refused() {
    let s = start();
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let base = format!("/v1/sandboxes/{}", created["id"]);
    let too_long = hako_serve::MAX_EXEC_TIMEOUT.as_millis() as u64 + 1;
    let (status, v) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"argv": ["true"], "timeout_ms": too_long}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("timeout_ms"), "{v}");
    // No deadline given: the server's default applies, and the command runs.
    let (status, v) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"argv": ["true"]}),
    );
    assert_eq!((status, v["exit_code"].as_i64()), (200, Some(0)), "{v}");
}

#[test]
fn a_stream_reader_that_stops_reading_neither_stalls_the_command_nor_grows_the_buffer() {
    let s = start_config(
        |root| {
            let mut config = HostConfig::new(root);
            config.spec.max_output = 256 << 20;
            Ok(Box::new(HostSandbox::new(config)?) as Box<dyn hako_core::Sandbox>)
        },
        // The client reads nothing until the command has ended, which on a
        // loaded machine can take longer than the default write deadline
        // (whose own test is a_client_that_never_reads_its_answer_...).
        |c| c.write_timeout = Duration::from_secs(600),
    );
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let base = format!("/v1/sandboxes/{}", created["id"]);
    // More than the kernel's socket buffers on both ends can hold (the
    // client's receive buffer may grow to 32 MiB here), so the server's
    // own bounded buffer must fill and drop.
    let body =
        br#"{"command":"head -c 160000000 /dev/zero | tr '\\0' a; touch done","stream":true}"#;
    let mut c = send_raw(
        s.port,
        format!("POST {base}/exec HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).as_bytes(),
    );
    c.write_all(body).unwrap();
    // Not reading: the command still runs to its end.
    let done = s.ws.join("done");
    for _ in 0..600 {
        if done.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        done.exists(),
        "the command was stalled by a client that does not read"
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let body = dechunk(&raw[split + 4..]);
    let lines: Vec<Value> = String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sent: usize = lines
        .iter()
        .filter_map(|l| l["data"].as_str())
        .map(str::len)
        .sum();
    let dropped: u64 = lines.iter().filter_map(|l| l["dropped"].as_u64()).sum();
    assert!(dropped > 0, "nothing dropped: {} lines", lines.len());
    assert_eq!(sent as u64 + dropped, 160_000_000);
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(lines.last().unwrap()["exit"]["exit_code"], 0);
}

#[test]
fn an_empty_token_is_refused_before_serving() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ServeConfig::new(
        Box::new(|| Err(hako_core::Error::Closed)),
        " \n".into(),
        None,
    );
    let err = serve(listener, config).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn the_bearer_scheme_is_matched_without_regard_to_case() {
    let s = start();
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let mut c = send_raw(
            s.port,
            format!("GET /v1/sandboxes HTTP/1.1\r\nHost: localhost\r\nAuthorization: {scheme} {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&read_head(&mut c)), 200, "{scheme}");
    }
    let mut c = send_raw(
        s.port,
        format!("GET /v1/sandboxes HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&read_head(&mut c)), 401);
}

#[test]
fn a_factory_that_panics_gives_its_sandbox_place_back() {
    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let s = start_with(move |root| {
        if n.fetch_add(1, Ordering::SeqCst) <= hako_serve::MAX_SANDBOXES {
            panic!("the backend failed");
        }
        Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>)
    });
    for _ in 0..=hako_serve::MAX_SANDBOXES {
        let (status, _) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
        assert_eq!(status, 500);
    }
    let (status, v) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{v}");
    healthy(s.port);
}

#[test]
fn idle_connections_past_the_cap_do_not_stop_the_server() {
    // Clients that connect and send nothing used to hold a tiny_http
    // thread each, with no deadline; an accept error (out of descriptors)
    // then stopped the accept loop for good. Now connections are capped
    // (one past the cap is closed at once), an idle one is closed after the
    // header timeout, and the server keeps serving.
    const CAP: usize = 8;
    let s = start_config(
        |root| Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>),
        |c| {
            c.max_connections = CAP;
            c.header_timeout = Duration::from_secs(5);
        },
    );
    healthy(s.port);
    let idle: Vec<TcpStream> = (0..CAP + 4)
        .map(|_| TcpStream::connect(("127.0.0.1", s.port)).unwrap())
        .collect();
    // Once the server has accepted them all (the ones past the cap are
    // closed), and while they are open, a request is refused (closed by
    // the server), never left hanging: the read ends with the server's
    // end of file, not the client's own timeout. Until it has accepted
    // them (a loaded machine may take a while), a request is served; the
    // header timeout is long enough to see the refusal before the idle
    // ones are closed, and the deadline is a hang guard only.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let _ = write!(
            c,
            "GET /v1/health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        );
        let mut raw = Vec::new();
        let ended = c.read_to_end(&mut raw);
        // (Closed with the request unread, the connection may be reset.)
        let hanging = ended.as_ref().is_err_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        });
        assert!(!hanging, "the server left the request hanging: {ended:?}");
        if raw.is_empty() {
            break;
        }
        assert!(
            raw.starts_with(b"HTTP/1.1 200") && std::time::Instant::now() < deadline,
            "a request past the cap of idle connections was never refused: {}",
            String::from_utf8_lossy(&raw)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server closes them itself once they have been idle for the
    // header timeout, without their clients doing anything; then it serves
    // again, as many times as asked.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !try_health(s.port).starts_with(b"HTTP/1.1 200") {
        assert!(std::time::Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(50));
    }
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }
    for _ in 0..3 * CAP {
        healthy(s.port);
    }
}

#[test]
fn a_stalled_body_gets_408_and_frees_its_slot() {
    let s = start_config(
        |root| Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>),
        |c| c.body_timeout = Duration::from_millis(300),
    );
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let base = format!("/v1/sandboxes/{}", created["id"]);
    // More stalled writes than there are transfer slots (8) one after
    // another, then as many as there are at once: each gets 408, and none
    // keeps its slot.
    let stall = |port: u16| {
        let mut c = send_raw(
            port,
            format!("PUT {base}/files?path=stalled.txt HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n0123456789").as_bytes(),
        );
        let head = read_head(&mut c);
        assert_eq!(status_of(&head), 408, "{head}");
        c
    };
    for _ in 0..10 {
        stall(s.port);
    }
    let port = s.port;
    let held: Vec<TcpStream> = std::thread::scope(|scope| {
        let stall = &stall;
        (0..8)
            .map(|_| scope.spawn(move || stall(port)))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect()
    });
    assert!(!s.ws.join("stalled.txt").exists());
    let (status, _, _) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=whole.txt"),
        Some(TOKEN),
        b"all of it",
    );
    assert_eq!(status, 200);
    assert_eq!(std::fs::read(s.ws.join("whole.txt")).unwrap(), b"all of it");
    drop(held);
    healthy(s.port);
}

/// An authorized health check on a new connection: whatever came back
/// (nothing if the server closed the connection), never an error.
fn try_health(port: u16) -> Vec<u8> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = write!(
        c,
        "GET /v1/health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    raw
}

#[test]
fn a_wrong_token_is_answered_that_the_token_is_wrong() {
    let s = start();
    let (status, _, body) = request(s.port, "GET", "/v1/sandboxes", Some("not-it"), b"");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, v["kind"].as_str()), (401, Some("unauthorized")));
    let message = v["error"].as_str().unwrap();
    assert!(message.contains("wrong"), "{message}");
    assert!(!message.contains("is required"), "{message}");
    let (status, _, body) = request(s.port, "GET", "/v1/sandboxes", None, b"");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 401);
    assert!(v["error"].as_str().unwrap().contains("required"), "{v}");
    healthy(s.port);
}

/// A request with the token and the given extra header lines.
fn with_headers(port: u16, headers: &str) -> (u16, Value) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        c,
        "GET /v1/sandboxes HTTP/1.1\r\n{headers}Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        serde_json::from_slice(&raw[split + 4..]).unwrap_or(Value::Null),
    )
}

#[test]
fn a_foreign_host_or_an_origin_on_loopback_is_refused_with_403_and_touches_nothing() {
    let s = start();
    let port = s.port;
    for ok in [
        format!("Host: 127.0.0.1:{port}\r\n"),
        format!("Host: localhost:{port}\r\n"),
        "Host: localhost\r\n".to_string(),
    ] {
        assert_eq!(with_headers(port, &ok).0, 200, "{ok}");
    }
    // DNS rebinding: a page of evil.example whose name now resolves to
    // 127.0.0.1; and a browser page's request, which carries an Origin.
    for bad in [
        format!("Host: evil.example:{port}\r\n"),
        format!("Host: 127.0.0.1.evil.example:{port}\r\n"),
        "Host: localhost:1\r\n".to_string(),
        format!("Host: localhost:{port}\r\nOrigin: http://evil.example\r\n"),
    ] {
        let (status, v) = with_headers(port, &bad);
        assert_eq!(
            (status, v["kind"].as_str()),
            (403, Some("forbidden_host")),
            "{bad}: {v}"
        );
    }
    let (status, v) = json(port, "GET", "/v1/sandboxes", Value::Null);
    assert_eq!(
        (status, v["sandboxes"].as_array().map(Vec::len)),
        (200, Some(0))
    );
}

#[test]
fn a_client_that_never_reads_its_answer_does_not_stall_the_server() {
    // The one connection slot held by a client that asked for a large file
    // and reads none of it: without a write deadline they would hold
    // their slots (and the answers' memory) for ever, and every other
    // client would be turned away.
    const CAP: usize = 1;
    const SIZE: usize = hako_serve::MAX_BODY as usize;
    let s = start_config(
        |root| Ok(Box::new(HostSandbox::new(HostConfig::new(root))?) as Box<dyn hako_core::Sandbox>),
        |c| {
            c.max_connections = CAP;
            c.write_timeout = Duration::from_millis(500);
            // Long enough that only the write deadline can free a slot
            // held by a client that reads nothing.
            c.header_timeout = Duration::from_secs(300);
        },
    );
    let (status, v) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_u64().unwrap();
    // More than the socket buffers of both ends hold.
    std::fs::write(s.ws.join("big"), vec![b'x'; SIZE]).unwrap();
    let stuck: Vec<TcpStream> = (0..CAP)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            write!(
                c,
                "GET /v1/sandboxes/{id}/files?path=big HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            c
        })
        .collect();
    // The server drops them once their answers stop moving, and serves
    // others again (a bound on the wait, not a measure of it).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !try_health(s.port).starts_with(b"HTTP/1.1 200") {
        assert!(std::time::Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each stuck client finds its connection closed: what was in flight,
    // then the end.
    for mut c in stuck {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }
    while !try_health(s.port).starts_with(b"HTTP/1.1 200") {
        assert!(std::time::Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The sandbox and the server are still usable (the one slot is
    // given back a moment after each answer: a refused connection is
    // tried again).
    let body = r#"{"argv": ["echo", "still here"]}"#;
    let exec = format!(
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    loop {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = c.write_all(exec.as_bytes());
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw);
        if raw.starts_with(b"HTTP/1.1 200") {
            let text = String::from_utf8_lossy(&raw);
            assert!(text.contains("still here"), "{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ran again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_sandbox_that_cannot_be_opened_is_recorded_in_the_audit_log() {
    let s = start_with(|_| {
        Err(hako_core::Error::Backend {
            backend: "test".into(),
            op: "open",
            message: "no room".into(),
        })
    });
    let (status, _) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 502);
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    assert!(
        records.iter().any(|r| r["kind"] == "error"
            && r["front_end"] == "serve"
            && r["error"].as_str().unwrap_or("").contains("no room")),
        "{records:?}"
    );
}

/// Host processes with an argument equal to `arg`.
fn pids_with_arg(arg: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// The parent of host process `pid`.
fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_sandbox_whose_guest_is_killed_mid_command_answers_sandbox_lost_and_is_recorded_lost_once() {
    let s = start();
    let (_, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    let id = created["id"].as_u64().unwrap();
    let base = format!("/v1/sandboxes/{id}");
    let marker = format!("{}", 720_000_000 + std::process::id());
    let port = s.port;
    let exec_path = format!("{base}/exec");
    let running = std::thread::spawn({
        let marker = marker.clone();
        let exec_path = exec_path.clone();
        move || {
            json(
                port,
                "POST",
                &exec_path,
                serde_json::json!({"argv": ["sleep", "600", marker]}),
            )
        }
    });
    let start = std::time::Instant::now();
    let command = loop {
        if let Some(pid) = pids_with_arg(&marker).first() {
            break *pid;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The command's parent is its supervisor, whose parent is the guest.
    let guest = parent(parent(command));
    let killed = std::process::Command::new("kill")
        .args(["-9", &guest.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, body) = running.join().unwrap();
    assert_eq!(
        (status, body["kind"].as_str()),
        (502, Some("sandbox_lost")),
        "{body}"
    );
    let (status, body) = json(
        s.port,
        "POST",
        &exec_path,
        serde_json::json!({"argv": ["true"]}),
    );
    assert_eq!(
        (status, body["kind"].as_str()),
        (502, Some("sandbox_lost")),
        "{body}"
    );
    let (status, _) = json(s.port, "DELETE", &base, Value::Null);
    assert_eq!(status, 200, "a lost sandbox closes");
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    let lost: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "sandbox" && r["op"] == "lost")
        .collect();
    assert_eq!(lost.len(), 1, "recorded once: {records:?}");
    assert_eq!(lost[0]["sandbox"], id);
    assert_eq!(lost[0]["backend"], "host");
    assert_eq!(lost[0]["during"], "run command");
    assert!(
        lost[0]["reason"].as_str().unwrap().contains("guest ended"),
        "{:?}",
        lost[0]
    );
    assert!(records
        .iter()
        .any(|r| r["kind"] == "sandbox" && r["op"] == "close" && r["sandbox"] == id));
    let start = std::time::Instant::now();
    while !pids_with_arg(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the command outlived its guest"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[path = "api/fuzz.rs"]
mod fuzz;

/// A command the sandbox's memory limit kills: the result, and a streamed
/// exec's end event, say `oom_killed`; the sandbox runs the next command.
#[test]
fn the_api_says_a_command_over_the_memory_limit_was_killed_for_memory() {
    let s = start_with(|root| {
        let mut config = hako_linux::LinuxConfig::new(root);
        config.spec.limits.memory = Some(64 << 20);
        Ok(Box::new(hako_linux::LinuxSandbox::new(config)?) as Box<dyn hako_core::Sandbox>)
    });
    let (status, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{created}");
    let base = format!("/v1/sandboxes/{}", created["id"]);
    let dd = serde_json::json!(["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    let (status, out) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({ "argv": dd }),
    );
    assert_eq!(
        (status, out["oom_killed"].as_bool(), out["signal"].as_i64()),
        (200, Some(true), Some(9)),
        "{out}"
    );
    let body = serde_json::json!({ "argv": dd, "stream": true }).to_string();
    let (status, _, body) = request(
        s.port,
        "POST",
        &format!("{base}/exec"),
        Some(TOKEN),
        body.as_bytes(),
    );
    assert_eq!(status, 200);
    let last: Value =
        serde_json::from_str(String::from_utf8(body).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(last["exit"]["oom_killed"].as_bool(), Some(true), "{last}");
    let (status, out) = json(
        s.port,
        "POST",
        &format!("{base}/exec"),
        serde_json::json!({"command": "echo again"}),
    );
    assert_eq!(
        (status, out["stdout"].as_str(), out["oom_killed"].as_bool()),
        (200, Some("again\n"), Some(false)),
        "{out}"
    );
}

/// A real sandbox offering only what every backend must: none of the
/// optional capabilities (processes, stat, mkdir, ...).
struct Plain(Box<dyn hako_core::Sandbox>);

impl hako_core::Sandbox for Plain {
    fn capabilities(&self) -> &hako_core::Capabilities {
        self.0.capabilities()
    }
    fn exec(&self, command: &hako_core::Command) -> hako_core::Result<hako_core::Output> {
        self.0.exec(command)
    }
    fn read_file(&self, path: &Path) -> hako_core::Result<Vec<u8>> {
        self.0.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> hako_core::Result<()> {
        self.0.write_file(path, data)
    }
    fn remove(&self, path: &Path) -> hako_core::Result<()> {
        self.0.remove(path)
    }
    fn list_dir(&self, path: &Path) -> hako_core::Result<hako_core::DirListing> {
        self.0.list_dir(path)
    }
    fn close(&self) -> hako_core::Result<()> {
        self.0.close()
    }
}

/// A `GET` of `path`: status and JSON body.
fn get(port: u16, path: &str) -> (u16, Value) {
    let (status, _, body) = request(port, "GET", path, Some(TOKEN), b"");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Opens a sandbox on `s`; its base path.
fn open(s: &Server) -> String {
    let (status, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{created}");
    format!("/v1/sandboxes/{}", created["id"])
}

fn b64(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn to_b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn exec_takes_env_and_binary_stdin_and_answers_raw_bytes_in_base64_within_max_output() {
    let s = start_with(linux);
    let base = open(&s);
    let exec = format!("{base}/exec");
    let raw: &[u8] = &[0, 0xff, 0xfe, b'\n', 0xc3];
    let (status, out) = json(
        s.port,
        "POST",
        &exec,
        serde_json::json!({"argv": ["cat"], "stdin_base64": to_b64(raw), "encoding": "base64"}),
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(b64(out["stdout"].as_str().unwrap()), raw);
    let (_, out) = json(
        s.port,
        "POST",
        &exec,
        serde_json::json!({"command": "printf %s \"$GREETING\"; printf 123456789 >&2", "env": {"GREETING": "hello there"}, "max_output": 4}),
    );
    assert_eq!(
        (out["stdout"].as_str(), out["stderr"].as_str()),
        (Some("hell"), Some("1234")),
        "{out}"
    );
    assert_eq!(
        (
            out["stdout_truncated"].as_bool(),
            out["stderr_bytes"].as_u64()
        ),
        (Some(true), Some(9)),
        "{out}"
    );
    // Refused, naming what: past the cap, two stdins, env in a session, a
    // bad name, bad base64, an unknown encoding.
    let (_, opened) = json(s.port, "POST", &format!("{base}/sessions"), Value::Null);
    let session = opened["session"].as_u64().unwrap();
    for (body, says) in [
        (
            // Past the server's --max-output (1 MiB, the default).
            serde_json::json!({"argv": ["true"], "max_output": (1 << 20) + 1}),
            "--max-output",
        ),
        (
            serde_json::json!({"argv": ["cat"], "stdin": "a", "stdin_base64": "YQ=="}),
            "stdin",
        ),
        (
            serde_json::json!({"command": "true", "session": session, "env": {"A": "1"}}),
            "session",
        ),
        (
            serde_json::json!({"argv": ["true"], "env": {"A=B": "1"}}),
            "env",
        ),
        (
            serde_json::json!({"argv": ["cat"], "stdin_base64": "not base64!"}),
            "base64",
        ),
        (
            serde_json::json!({"argv": ["true"], "encoding": "latin1"}),
            "latin1",
        ),
    ] {
        let (status, v) = json(s.port, "POST", &exec, body.clone());
        assert_eq!(
            (status, v["kind"].as_str()),
            (400, Some("bad_request")),
            "{body}: {v}"
        );
        assert!(v["error"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    // Streamed in base64; a command that cannot run ends the stream with
    // an error line carrying its kind.
    let (status, _, body) = request(
        s.port,
        "POST",
        &exec,
        Some(TOKEN),
        br#"{"command":"printf '\\377\\000'","stream":true,"encoding":"base64"}"#,
    );
    assert_eq!(status, 200);
    let lines: Vec<Value> = String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let data: Vec<u8> = lines
        .iter()
        .filter(|l| l["stream"] == "stdout")
        .flat_map(|l| b64(l["data"].as_str().unwrap()))
        .collect();
    assert_eq!(data, [0xff, 0], "{lines:?}");
    assert_eq!(lines.last().unwrap()["exit"]["exit_code"], 0, "{lines:?}");
    let (status, _, body) = request(
        s.port,
        "POST",
        &exec,
        Some(TOKEN),
        br#"{"argv":["no-such-command-here"],"stream":true}"#,
    );
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "command_not_found", "{text}");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("no-such-command-here"),
        "{last}"
    );
    // A deadline passed is a result, not an error.
    let (status, out) = json(
        s.port,
        "POST",
        &exec,
        serde_json::json!({"argv": ["sleep", "5"], "timeout_ms": 100}),
    );
    assert_eq!(
        (status, out["timed_out"].as_bool()),
        (200, Some(true)),
        "{out}"
    );
}

#[test]
fn stat_and_mkdir_answer_through_the_fence() {
    let s = start_with(linux);
    let base = open(&s);
    std::fs::write(s.ws.join("f.txt"), b"12345").unwrap();
    std::os::unix::fs::symlink("f.txt", s.ws.join("ln")).unwrap();
    let (status, v) = json(
        s.port,
        "POST",
        &format!("{base}/dir?path=a%2Fb%2Fc"),
        Value::Null,
    );
    assert_eq!((status, v["ok"].as_bool()), (200, Some(true)), "{v}");
    assert!(s.ws.join("a/b/c").is_dir());
    let (status, v) = get(s.port, &format!("{base}/stat?path=a%2Fb"));
    assert_eq!((status, v["kind"].as_str()), (200, Some("dir")), "{v}");
    let (_, v) = get(s.port, &format!("{base}/stat?path=f.txt"));
    assert_eq!(
        (v["kind"].as_str(), v["size"].as_u64(), v["path"].as_str()),
        (Some("file"), Some(5), Some("f.txt")),
        "{v}"
    );
    assert!(v["modified_ms"].as_i64().unwrap() > 0, "{v}");
    assert!(v["mode"].as_u64().is_some(), "{v}");
    let (_, v) = get(s.port, &format!("{base}/stat?path=ln"));
    assert_eq!(
        (v["kind"].as_str(), v["symlink_target"].as_str()),
        (Some("symlink"), Some("f.txt")),
        "{v}"
    );
    let (status, v) = get(s.port, &format!("{base}/stat?path=missing"));
    assert_eq!(
        (status, v["kind"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    for path in ["..%2Fescape", "%2Fetc%2Fpasswd"] {
        let (status, v) = get(s.port, &format!("{base}/stat?path={path}"));
        assert_eq!(
            (status, v["kind"].as_str()),
            (403, Some("refused")),
            "{path}: {v}"
        );
        let (status, v) = json(
            s.port,
            "POST",
            &format!("{base}/dir?path={path}"),
            Value::Null,
        );
        assert_eq!(
            (status, v["kind"].as_str()),
            (403, Some("refused")),
            "{path}: {v}"
        );
    }
    // A PUT makes the directories a file needs.
    let (status, _, body) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=new%2Fdeep%2Fx.txt"),
        Some(TOKEN),
        b"made",
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, v["created_dirs"].as_bool()),
        (200, Some(true)),
        "{v}"
    );
    assert_eq!(std::fs::read(s.ws.join("new/deep/x.txt")).unwrap(), b"made");
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    let made: Vec<&str> = records
        .iter()
        .filter(|r| r["kind"] == "file" && r["op"] == "make_dir")
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert_eq!(made, ["a/b/c", "new/deep"], "{records:?}");
    // A sandbox without the capabilities: 501, typed.
    let plain = start_with(|root| Ok(Box::new(Plain(linux(root)?)) as Box<dyn hako_core::Sandbox>));
    let base = open(&plain);
    let (status, v) = get(plain.port, &format!("{base}/stat?path=."));
    assert_eq!(
        (status, v["kind"].as_str()),
        (501, Some("unsupported")),
        "{v}"
    );
    let (status, v) = json(
        plain.port,
        "POST",
        &format!("{base}/dir?path=d"),
        Value::Null,
    );
    assert_eq!(
        (status, v["kind"].as_str()),
        (501, Some("unsupported")),
        "{v}"
    );
    // And its PUT into a missing directory is what the sandbox answered.
    let (status, _, _) = request(
        plain.port,
        "PUT",
        &format!("{base}/files?path=d%2Fx"),
        Some(TOKEN),
        b"x",
    );
    assert_eq!(status, 404);
    assert!(!plain.ws.join("d").exists());
}

#[test]
fn a_put_or_mkdir_through_a_symlinked_parent_pointing_outside_is_refused_and_makes_nothing() {
    let s = start_with(linux);
    let outside = s._dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, s.ws.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("not-yet"), s.ws.join("dangling")).unwrap();
    let base = open(&s);
    for path in [
        "link%2Fsub%2Fx.txt",
        "link%2Fx.txt",
        "dangling%2Fx.txt",
        "link%2F..%2F..%2Fx.txt",
    ] {
        let (status, _, body) = request(
            s.port,
            "PUT",
            &format!("{base}/files?path={path}"),
            Some(TOKEN),
            b"planted",
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, v["kind"].as_str()),
            (403, Some("refused")),
            "{path}: {v}"
        );
    }
    for path in ["link%2Fsub", "dangling%2Fsub", "dangling"] {
        let (status, v) = json(
            s.port,
            "POST",
            &format!("{base}/dir?path={path}"),
            Value::Null,
        );
        assert!(
            matches!(v["kind"].as_str(), Some("refused")),
            "{path}: {status} {v}"
        );
    }
    // Nothing was made outside.
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    assert!(!outside.join("not-yet").exists());
    // Each refusal is recorded, and the sandbox still works.
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    assert!(
        records.iter().filter(|r| r["kind"] == "refusal").count() >= 7,
        "{records:?}"
    );
    let (status, _, _) = request(
        s.port,
        "PUT",
        &format!("{base}/files?path=real%2Fx.txt"),
        Some(TOKEN),
        b"fine",
    );
    assert_eq!(status, 200);
    assert_eq!(std::fs::read(s.ws.join("real/x.txt")).unwrap(), b"fine");
}

#[test]
fn processes_take_stdin_give_output_from_offsets_end_and_die_with_their_sandbox() {
    let s = start_with(linux);
    let base = open(&s);
    let procs = format!("{base}/processes");
    let (status, v) = json(s.port, "POST", &procs, serde_json::json!({"argv": ["cat"]}));
    assert_eq!(status, 201, "{v}");
    let cat = v["process"].as_u64().unwrap();
    let (status, v) = json(
        s.port,
        "POST",
        &format!("{procs}/{cat}/stdin"),
        serde_json::json!({"data": "hello "}),
    );
    assert_eq!((status, v["ok"].as_bool()), (200, Some(true)), "{v}");
    let (status, _) = json(
        s.port,
        "POST",
        &format!("{procs}/{cat}/stdin"),
        serde_json::json!({"data_base64": to_b64(&[0xff, b'!']), "close": true}),
    );
    assert_eq!(status, 200);
    let (status, st) = json(
        s.port,
        "POST",
        &format!("{procs}/{cat}/wait?timeout_ms=20000"),
        Value::Null,
    );
    assert_eq!(
        (status, st["running"].as_bool(), st["exit_code"].as_i64()),
        (200, Some(false), Some(0)),
        "{st}"
    );
    let (status, out) = get(s.port, &format!("{procs}/{cat}/output?encoding=base64"));
    assert_eq!(status, 200, "{out}");
    assert_eq!(b64(out["stdout"].as_str().unwrap()), b"hello \xff!");
    assert_eq!(
        (out["offset"].as_u64(), out["ended"].as_bool()),
        (Some(8), Some(true)),
        "{out}"
    );
    let (_, out) = get(s.port, &format!("{procs}/{cat}/output?offset=6"));
    assert_eq!(out["stdout"].as_str(), Some("\u{fffd}!"), "{out}");
    // Output as it comes, read on from the offset given.
    let marker = format!("{}", 730_000_000 + std::process::id());
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"command": format!("echo one; echo two >&2; read x; echo got $x; sleep {marker}")}),
    );
    assert_eq!(status, 201, "{v}");
    let p = v["process"].as_u64().unwrap();
    let mut seen = String::new();
    let mut offset = 0;
    while !seen.contains("one") {
        let (_, out) = get(
            s.port,
            &format!("{procs}/{p}/output?offset={offset}&wait_ms=5000"),
        );
        seen.push_str(out["stdout"].as_str().unwrap());
        offset = out["offset"].as_u64().unwrap();
        assert_eq!(out["running"].as_bool(), Some(true), "{out}");
    }
    json(
        s.port,
        "POST",
        &format!("{procs}/{p}/stdin"),
        serde_json::json!({"data": "it\n"}),
    );
    while !seen.contains("got it") {
        let (_, out) = get(
            s.port,
            &format!("{procs}/{p}/output?offset={offset}&wait_ms=5000"),
        );
        seen.push_str(out["stdout"].as_str().unwrap());
        offset = out["offset"].as_u64().unwrap();
    }
    assert_eq!(seen, "one\ngot it\n");
    let (_, out) = get(s.port, &format!("{procs}/{p}/output?offset={offset}"));
    assert_eq!(out["stderr"].as_str(), Some("two\n"), "{out}");
    // A wait that ends first says so.
    let (_, st) = json(
        s.port,
        "POST",
        &format!("{procs}/{p}/wait?timeout_ms=50"),
        Value::Null,
    );
    assert_eq!(st["running"].as_bool(), Some(true), "{st}");
    let (status, listed) = get(s.port, &procs);
    assert_eq!(status, 200);
    let ids: Vec<u64> = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["process"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [cat, p], "{listed}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pids_with_arg(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "sleep never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, v) = json(s.port, "POST", &format!("{procs}/{p}/kill"), Value::Null);
    assert_eq!(
        (
            status,
            v["state"]["running"].as_bool(),
            v["state"]["signal"].as_i64()
        ),
        (200, Some(false), Some(9)),
        "{v}"
    );
    assert!(pids_with_arg(&marker).is_empty());
    // On a terminal: the process sees one of the size asked for.
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"command": "stty size; test -t 0 && echo tty", "tty": {"rows": 33, "cols": 101}}),
    );
    assert_eq!(status, 201, "{v}");
    let t = v["process"].as_u64().unwrap();
    json(
        s.port,
        "POST",
        &format!("{procs}/{t}/wait?timeout_ms=20000"),
        Value::Null,
    );
    let (_, out) = get(s.port, &format!("{procs}/{t}/output"));
    assert!(out["stdout"].as_str().unwrap().contains("33 101"), "{out}");
    assert!(out["stdout"].as_str().unwrap().contains("tty"), "{out}");
    // Its own environment; a stdin that ends at once when asked.
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"command": "printf %s \"$V\"; cat", "env": {"V": "from-env"}, "keep_stdin_open": false}),
    );
    assert_eq!(status, 201, "{v}");
    let e = v["process"].as_u64().unwrap();
    let (_, st) = json(
        s.port,
        "POST",
        &format!("{procs}/{e}/wait?timeout_ms=20000"),
        Value::Null,
    );
    assert_eq!(st["exit_code"].as_i64(), Some(0), "{st}");
    let (_, out) = get(s.port, &format!("{procs}/{e}/output"));
    assert_eq!(out["stdout"].as_str(), Some("from-env"), "{out}");
    // Another sandbox's process numbers name nothing here.
    let other = open(&s);
    let (status, v) = get(s.port, &format!("{other}/processes/{e}"));
    assert_eq!(
        (status, v["kind"].as_str()),
        (404, Some("no_such_process")),
        "{v}"
    );
    // Unknown or malformed processes, refused paths.
    let (status, v) = get(s.port, &format!("{procs}/9999"));
    assert_eq!(
        (status, v["kind"].as_str()),
        (404, Some("no_such_process")),
        "{v}"
    );
    let (status, v) = json(s.port, "POST", &format!("{procs}/9999/kill"), Value::Null);
    assert_eq!(
        (status, v["kind"].as_str()),
        (404, Some("no_such_process")),
        "{v}"
    );
    let (status, v) = get(s.port, &format!("{procs}/x/output"));
    assert_eq!(
        (status, v["kind"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"argv": ["true"], "cwd": "../.."}),
    );
    assert_eq!((status, v["kind"].as_str()), (403, Some("refused")), "{v}");
    // A process still running when its sandbox closes dies with it, and
    // the record says so.
    let last = format!("{}", 740_000_000 + std::process::id());
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"argv": ["sleep", last]}),
    );
    assert_eq!(status, 201, "{v}");
    let running = v["process"].as_u64().unwrap();
    // Started at once; running a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pids_with_arg(&last).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the process never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = json(s.port, "DELETE", &base, Value::Null);
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pids_with_arg(&last).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the process outlived its sandbox"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let records = hako_audit::records(Path::new(&s.log)).unwrap();
    let sandbox = base.rsplit('/').next().unwrap().parse::<u64>().unwrap();
    let ops = |op: &str| {
        records
            .iter()
            .filter(|r| r["kind"] == "process" && r["op"] == op)
            .inspect(|r| assert_eq!(r["sandbox"].as_u64(), Some(sandbox), "{r:?}"))
            .map(|r| r["process"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(ops("killed_at_close"), [running]);
    assert_eq!(ops("kill"), [p]);
    assert!(ops("send_input").contains(&cat));
    assert!(ops("read_output").contains(&cat));
    let started = records
        .iter()
        .filter(|r| r["kind"] == "exec" && r["running"] == true)
        .count();
    assert_eq!(started, 5, "{records:?}");
    // A sandbox without processes: 501, typed.
    let plain = start_with(|root| Ok(Box::new(Plain(linux(root)?)) as Box<dyn hako_core::Sandbox>));
    let base = open(&plain);
    let (status, v) = json(
        plain.port,
        "POST",
        &format!("{base}/processes"),
        serde_json::json!({"argv": ["true"]}),
    );
    assert_eq!(
        (status, v["kind"].as_str()),
        (501, Some("unsupported")),
        "{v}"
    );
    let (status, v) = get(plain.port, &format!("{base}/processes/1"));
    assert_eq!(
        (status, v["kind"].as_str()),
        (501, Some("unsupported")),
        "{v}"
    );
}

#[test]
fn waits_on_processes_past_their_pool_get_503_and_never_lock_other_requests_out() {
    let s = start_with(linux);
    let base = open(&s);
    let procs = format!("{base}/processes");
    let (status, v) = json(
        s.port,
        "POST",
        &procs,
        serde_json::json!({"argv": ["sleep", "600"]}),
    );
    assert_eq!(status, 201, "{v}");
    let p = v["process"].as_u64().unwrap();
    let wait = format!("{procs}/{p}/wait?timeout_ms=30000");
    // 32 waits held (the pool's size), each until the process ends (one
    // refused while the probe below holds a slot for a moment tries again).
    let port = s.port;
    let holders: Vec<_> = (0..32)
        .map(|_| {
            let wait = wait.clone();
            std::thread::spawn(move || loop {
                let (status, v) = json(port, "POST", &wait, Value::Null);
                if status != 503 {
                    return (status, v);
                }
                std::thread::sleep(Duration::from_millis(10));
            })
        })
        .collect();
    // One more is refused at once, once they are all in.
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    let refused = loop {
        let (status, v) = get(s.port, &format!("{procs}/{p}/output?wait_ms=0"));
        if status == 503 {
            break v;
        }
        assert_eq!(status, 200, "{v}");
        assert!(
            std::time::Instant::now() < deadline,
            "the waits never filled their pool"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(refused["kind"], "busy", "{refused}");
    // Other requests are served meanwhile, the kill among them.
    let (status, v) = get(s.port, &format!("{procs}/{p}"));
    assert_eq!((status, v["running"].as_bool()), (200, Some(true)), "{v}");
    let (status, v) = json(s.port, "POST", &format!("{procs}/{p}/kill"), Value::Null);
    assert_eq!(status, 200, "{v}");
    // Its end ends every wait, with the same state.
    for h in holders {
        let (status, st) = h.join().unwrap();
        assert_eq!(
            (status, st["running"].as_bool(), st["signal"].as_i64()),
            (200, Some(false), Some(9)),
            "{st}"
        );
    }
    let (status, _) = json(s.port, "POST", &wait, Value::Null);
    assert_eq!(status, 200);
}
