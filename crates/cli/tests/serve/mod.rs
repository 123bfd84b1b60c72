//! `hako serve` run as its users run it: a process of its own, spoken to
//! over HTTP on loopback.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::dirs;

mod cow;

/// One request on a connection of its own; the status and the body.
fn call(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("hako serve never listened: {e}"),
        }
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `hako serve --backend linux` on `port`, run by `sh -c PRELUDE; exec
/// hako serve ...` (a prelude can move it into a cgroup before it starts).
fn serve(ws: &Path, token_file: &Path, port: u16, prelude: &str) -> Child {
    let hako_bin = env!("CARGO_BIN_EXE_hako");
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{prelude} exec \"$0\" serve --backend linux --listen 127.0.0.1:{port} \
             --workspace \"$1\" --token-file \"$2\""
        ))
        .arg(hako_bin)
        .arg(ws)
        .arg(token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn serve_refuses_requests_without_the_token_and_runs_commands_on_linux_with_it() {
    let d = dirs();
    let token_file = d.ws.join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let port = free_port();
    let mut server = serve(&d.ws, &token_file, port, "");
    let call = |method: &str, path: &str, token: Option<&str>, body: &str| {
        call(port, method, path, token, body)
    };
    let (status, _) = call("POST", "/v1/sandboxes", None, "");
    assert_eq!(status, 401);
    let (status, _) = call("POST", "/v1/sandboxes", Some("s3cret-tokeN"), "");
    assert_eq!(status, 401);
    let (status, body) = call("GET", "/v1/sandboxes", Some("s3cret-token"), "");
    assert_eq!(status, 200);
    assert!(body.contains("\"sandboxes\":[]"), "{body}");
    let (status, body) = call("POST", "/v1/sandboxes", Some("s3cret-token"), "");
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(created["capabilities"]["isolation"], "process");
    let id = created["id"].as_u64().unwrap();
    let (status, body) = call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some("s3cret-token"),
        r#"{"command":"echo in-sandbox; ls /home | wc -l"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let out: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(out["stdout"], "in-sandbox\n0\n", "{out}");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// A cgroup with the pids controller, removed when dropped (once the
/// processes in it are gone).
struct PidsCgroup(PathBuf);

impl PidsCgroup {
    /// A new one under v1's pids hierarchy or the v2 root (when it
    /// delegates pids); `None` where neither is writable.
    fn new(name: &str) -> Option<PidsCgroup> {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let v2 = Path::new("/sys/fs/cgroup");
        let parent = if v1.join("cgroup.procs").exists() {
            v1
        } else if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "pids"))
        {
            v2
        } else {
            return None;
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        Some(PidsCgroup(dir))
    }

    fn read(&self, file: &str) -> u64 {
        let text = std::fs::read_to_string(self.0.join(file)).unwrap();
        text.trim().parse().unwrap()
    }
}

impl Drop for PidsCgroup {
    /// Kills what is left in it (a test that failed half-way), then
    /// removes it.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
            let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = std::process::Command::new("kill")
                    .args(["-9", pid])
                    .stderr(Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A server killed when the test ends, whatever its outcome.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_out_of_processes_refuses_a_sandbox_naming_the_limit_and_goes_on() {
    let Some(cgroup) = PidsCgroup::new(&format!("hako-test-pids-{}", std::process::id())) else {
        assert!(
            std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
            "no writable cgroup with the pids controller and HAKO_MUST_WORK=1"
        );
        eprintln!("skipped: no writable cgroup with the pids controller");
        return;
    };
    // Room for the server and a few sandboxes (a guest is a few processes
    // and the server a thread for each), not for many.
    std::fs::write(cgroup.0.join("pids.max"), "48").unwrap();
    let d = dirs();
    let token_file = d.ws.join("token");
    std::fs::write(&token_file, "t0ken\n").unwrap();
    let port = free_port();
    let procs = cgroup.0.join("cgroup.procs");
    let prelude = format!("echo $$ > '{}' &&", procs.display());
    let _server = Killed(serve(&d.ws, &token_file, port, &prelude));
    let call = |method: &str, path: &str, body: &str| call(port, method, path, Some("t0ken"), body);

    let mut open = Vec::new();
    let refusal = loop {
        assert!(
            open.len() < 40,
            "48 processes held {} sandboxes",
            open.len()
        );
        let (status, body) = call("POST", "/v1/sandboxes", "");
        if status != 201 {
            break (status, body);
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        open.push(v["id"].as_u64().unwrap());
    };
    // Refused, typed, naming what ran out and the limit.
    let (status, body) = refusal;
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "out_of_resources", "{body}");
    let message = v["error"].as_str().unwrap();
    assert!(
        message.contains("out of processes") && message.contains("pids.max"),
        "{message}"
    );
    assert!(!open.is_empty(), "not even one sandbox opened: {message}");

    // At the limit, a command either runs or is refused the same way
    // (its process could not be made), never an untyped failure.
    for _ in 0..5 {
        let (status, body) = call(
            "POST",
            &format!("/v1/sandboxes/{}/exec", open[0]),
            r#"{"argv":["echo","at-the-limit"]}"#,
        );
        if status == 200 {
            assert!(body.contains("at-the-limit"), "{body}");
        } else {
            assert_eq!(status, 503, "{body}");
            assert!(
                body.contains("out_of_resources") && body.contains("pids.max"),
                "{body}"
            );
        }
    }

    // The server goes on: closing sandboxes makes room (once their
    // processes are gone), the others run commands, and a new one opens.
    for _ in 0..2 {
        let Some(id) = open.pop() else { break };
        let (status, body) = call("DELETE", &format!("/v1/sandboxes/{id}"), "");
        assert_eq!(status, 200, "{body}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cgroup.read("pids.current") + 8 > 48 {
        assert!(
            Instant::now() < deadline,
            "closed sandboxes' processes stayed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(first) = open.first() {
        let (status, body) = call(
            "POST",
            &format!("/v1/sandboxes/{first}/exec"),
            r#"{"argv":["echo","still-here"]}"#,
        );
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("still-here"), "{body}");
    }
    let (status, body) = call("POST", "/v1/sandboxes", "");
    assert_eq!(status, 201, "{body}");
}

/// Host processes with an argument equal to `arg`.
fn pids_with_arg(arg: &str) -> Vec<u32> {
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

/// The host processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(pid.to_string().as_str()) {
            out.push(child);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie has ended; only its entry is left for its parent.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rfind(')').and_then(|i| s.get(i + 2..i + 3)) != Some("Z"))
}

#[test]
fn serve_on_port_zero_names_its_address_once_and_exits_closing_everything_when_its_stdin_writer_dies(
) {
    let d = dirs();
    let token_file = d.outside.join("token");
    std::fs::write(&token_file, "lifeline-token\n").unwrap();
    let log = d.outside.join("audit.log");
    // The writer of the server's stdin: its parent, as a client library
    // would be. Killing it ends the server's stdin.
    let mut writer = std::process::Command::new("sleep")
        .arg("600")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let server = std::process::Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["serve", "--backend", "linux", "--listen", "127.0.0.1:0"])
        .args([
            "--ready-json",
            "--exit-on-stdin-eof",
            "--max-processes",
            "2",
        ])
        .arg("--workspace")
        .arg(&d.ws)
        .arg("--token-file")
        .arg(&token_file)
        .arg("--audit")
        .arg(&log)
        .stdin(Stdio::from(writer.stdout.take().unwrap()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Killed(server);
    let pid = server.0.id();
    // Exactly one line, then nothing more on stdout.
    let mut stdout = std::io::BufReader::new(server.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ready["pid"].as_u64(), Some(u64::from(pid)), "{ready}");
    let listen = ready["listen"].as_str().unwrap();
    let port: u16 = listen.strip_prefix("127.0.0.1:").unwrap().parse().unwrap();
    assert_ne!(port, 0);
    assert_eq!(ready["url"], format!("http://127.0.0.1:{port}"), "{ready}");
    let call = |method: &str, path: &str, body: &str| {
        let (status, body) = call(port, method, path, Some("lifeline-token"), body);
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default(),
        )
    };
    let (status, created) = call("POST", "/v1/sandboxes", "");
    assert_eq!(status, 201, "{created}");
    let base = format!("/v1/sandboxes/{}", created["id"]);
    // Processes are bounded by --max-processes: the third is refused,
    // typed, and nothing more starts.
    let marker = format!("{}", 750_000_000 + std::process::id());
    for _ in 0..2 {
        let (status, v) = call(
            "POST",
            &format!("{base}/processes"),
            &format!(r#"{{"argv":["sleep","{marker}"]}}"#),
        );
        assert_eq!(status, 201, "{v}");
    }
    let (status, v) = call(
        "POST",
        &format!("{base}/processes"),
        &format!(r#"{{"argv":["sleep","{marker}"]}}"#),
    );
    assert_eq!((status, v["kind"].as_str()), (429, Some("too_many")), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("--max-processes"),
        "{v}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids_with_arg(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the processes never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let guests = children(pid);
    assert!(
        !guests.is_empty(),
        "the sandbox has no process of the server's"
    );

    // The writer dies: the server closes everything and exits 0.
    writer.kill().unwrap();
    writer.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "hako serve outlived its stdin");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "", "more than the ready line on stdout");
    // Nothing left behind: no process of the sandbox, no guest.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids_with_arg(&marker).is_empty() || guests.iter().any(|&g| alive(g)) {
        assert!(Instant::now() < deadline, "a sandbox outlived its server");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    // The log says each process was killed at the close, then the close.
    let records = std::fs::read_to_string(&log).unwrap();
    let kinds: Vec<(String, String)> = records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or("").to_string(),
                r["op"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let killed = kinds
        .iter()
        .filter(|k| *k == &("process".to_string(), "killed_at_close".to_string()))
        .count();
    assert_eq!(killed, 2, "{records}");
    assert!(
        kinds.contains(&("sandbox".to_string(), "close".to_string())),
        "{records}"
    );
    let out = crate::hako()
        .arg("audit")
        .arg("verify")
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
