//! Fuzzing the HTTP API's paths and request bodies with a fixed budget
//! (run by plain `cargo test`): random methods, paths built from the
//! routes' pieces and hostile ones (`..`, `%00`, `%2e`, huge ids, odd
//! queries), and bodies that are random JSON of the exec shape or random
//! bytes, sent to a server whose sandboxes have the real fence for files
//! but run no command (so nothing random ever runs on this machine). Every
//! request must get an answer (no panic, no dropped connection, no 5xx
//! but 501 and 503), the server must still serve afterwards, and nothing
//! outside the workspace may change. `HAKO_FUZZ_CASES` sets the cases and
//! `HAKO_FUZZ_SEED` the first seed.

use super::*;

const CASES: u64 = 800;

fn cases() -> u64 {
    std::env::var("HAKO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn first_seed() -> u64 {
    std::env::var("HAKO_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7365_7276)
}

/// Files through the host backend's fence; commands and sessions refused.
struct FilesOnly(HostSandbox);

impl hako_core::Sandbox for FilesOnly {
    fn capabilities(&self) -> &hako_core::Capabilities {
        self.0.capabilities()
    }
    fn exec(&self, _: &hako_core::Command) -> hako_core::Result<hako_core::Output> {
        Err(hako_core::Error::Closed)
    }
    fn read_file(&self, p: &Path) -> hako_core::Result<Vec<u8>> {
        self.0.read_file(p)
    }
    fn write_file(&self, p: &Path, data: &[u8]) -> hako_core::Result<()> {
        self.0.write_file(p, data)
    }
    fn remove(&self, p: &Path) -> hako_core::Result<()> {
        self.0.remove(p)
    }
    fn list_dir(&self, p: &Path) -> hako_core::Result<hako_core::DirListing> {
        self.0.list_dir(p)
    }
    fn close(&self) -> hako_core::Result<()> {
        self.0.close()
    }
}

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "get",
];

const PATH_PIECES: &[&str] = &[
    "/v1",
    "/sandboxes",
    "/",
    "//",
    "/exec",
    "/files",
    "/dir",
    "/sessions",
    "/health",
    "/openapi.json",
    "?path=",
    "?path=a.txt",
    "?path=../secret",
    "?path=%2e%2e/secret",
    "?path=%00",
    "?path=/etc/passwd",
    "&path=b",
    "&",
    "=",
    "%",
    "%zz",
    "%2F",
    "..",
    ".",
    "18446744073709551616",
    "-1",
    "0",
    "99",
    "{id}",
    "{id}",
    "{id}",
    "a.txt",
    "é",
    "%C3%A9",
    "?offset=1&limit=2",
    "?recursive=true",
];

const TEXT_PIECES: &[&str] = &[
    "a",
    "a.txt",
    "..",
    "/",
    "../secret",
    "\0",
    "é",
    " ",
    "sh",
    "-c",
    "true",
    "\n",
    "x",
];

fn text(rng: &mut fastrand::Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.usize(0..6) {
        match rng.u8(0..8) {
            0..=5 => s.push_str(TEXT_PIECES[rng.usize(0..TEXT_PIECES.len())]),
            6 => s.push(rng.char(..)),
            _ => s.push_str(&"y".repeat(rng.usize(0..3000))),
        }
    }
    s
}

fn any_value(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..8) {
        0 => Value::Null,
        1 => serde_json::json!(rng.bool()),
        2 => serde_json::json!(rng.i64(..)),
        3 => serde_json::json!(rng.u64(..)),
        4 => serde_json::json!(-1.5),
        5 => serde_json::json!([text(rng), text(rng)]),
        6 => serde_json::json!({"k": text(rng)}),
        _ => serde_json::json!(text(rng)),
    }
}

/// A body: an object of exec's fields (often of the wrong type), random
/// JSON, or random bytes.
fn body(rng: &mut fastrand::Rng) -> Vec<u8> {
    match rng.u8(0..10) {
        0..=5 => {
            let mut map = serde_json::Map::new();
            for field in [
                "argv",
                "command",
                "cwd",
                "timeout_ms",
                "stdin",
                "session",
                "stream",
            ] {
                if rng.bool() {
                    map.insert(field.into(), any_value(rng));
                }
            }
            if rng.u8(0..10) == 0 {
                map.insert(text(rng), any_value(rng));
            }
            Value::Object(map).to_string().into_bytes()
        }
        6 | 7 => any_value(rng).to_string().into_bytes(),
        8 => (0..rng.usize(0..512)).map(|_| rng.u8(..)).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn fuzz_serve_paths_and_bodies_always_get_an_answer_and_reach_nothing_outside() {
    let s = start_config(
        |root| {
            Ok(
                Box::new(FilesOnly(HostSandbox::new(HostConfig::new(root))?))
                    as Box<dyn hako_core::Sandbox>,
            )
        },
        |_| {},
    );
    let outside = s.ws.parent().unwrap().to_path_buf();
    std::fs::write(outside.join("secret"), "OUTSIDE").unwrap();
    let (status, created) = json(s.port, "POST", "/v1/sandboxes", Value::Null);
    assert_eq!(status, 201, "{created}");
    let id = created["id"].to_string();
    let first = first_seed();
    for seed in first..first + cases() {
        let mut rng = fastrand::Rng::with_seed(seed);
        let method = METHODS[rng.usize(0..METHODS.len())];
        let mut path = String::new();
        for _ in 0..rng.usize(1..8) {
            path.push_str(&PATH_PIECES[rng.usize(0..PATH_PIECES.len())].replace("{id}", &id));
        }
        // What a request line can carry: no space, CR, LF or other control.
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        let body = body(&mut rng);
        let caught =
            std::panic::catch_unwind(|| request(s.port, method, &path, Some(TOKEN), &body));
        let Ok((status, head, _)) = caught else {
            panic!("seed {seed}: {method} {path}: no answer (the connection dropped)");
        };
        assert!(
            status < 500 || status == 501 || status == 503,
            "seed {seed}: {method} {path} {:?}: {head}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        );
    }
    // Still serving, the sandbox still there, and nothing changed outside.
    let (status, _) = json(s.port, "GET", &format!("/v1/sandboxes/{id}"), Value::Null);
    assert_eq!(status, 200);
    let mut names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["audit.log", "secret", "ws"]);
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "OUTSIDE"
    );
}
