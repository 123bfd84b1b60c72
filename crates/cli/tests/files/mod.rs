//! Writing a file whose parent directories are missing: `hako fs write`
//! creates them through the fence, as MCP's `write_file` does, and both
//! refuse the same attacks with the same typed error.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use super::{dirs, fs_in, hako, text};

/// The fence's refusal of a path through a symlink that leads out.
const SYMLINK_ESCAPE: &str = "a symlink on the path leads outside the sandbox root";
/// The fence's refusal to create a dangling symlink's target.
const DANGLING: &str = "it is a dangling symlink; hako never creates a symlink's target";

/// Every entry under `root`, sorted, as `path kind content`: a file with
/// its bytes, a symlink with its target (never followed; the directory
/// holding `root` written `TMP`, so two such trees compare).
fn tree(root: &Path) -> Vec<String> {
    let tmp = root.parent().unwrap().display().to_string();
    fn walk(root: &Path, tmp: &str, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push(format!("{rel} symlink {}", target.display()).replace(tmp, "TMP"));
            } else if meta.is_dir() {
                out.push(format!("{rel} dir"));
                walk(root, tmp, &path, out);
            } else {
                out.push(format!(
                    "{rel} file {}",
                    text(&std::fs::read(&path).unwrap())
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &tmp, root, &mut out);
    out.sort();
    out
}

/// A workspace with the attacks' symlinks in it: `out_abs` and `out_rel`
/// lead to `outside`, `out_dangling` to a directory outside that does not
/// exist, `in_dangling` to a name inside that does not exist.
fn plant_symlinks(ws: &Path, outside: &Path) {
    symlink(outside, ws.join("out_abs")).unwrap();
    symlink("../outside", ws.join("out_rel")).unwrap();
    symlink(outside.join("made-by-hako"), ws.join("out_dangling")).unwrap();
    symlink("missing-inside", ws.join("in_dangling")).unwrap();
}

/// The writes both front ends are given: each path and the refusal it
/// must meet (`None`: it must be written).
const WRITES: &[(&str, Option<&str>)] = &[
    ("notes/x.txt", None),
    ("a/b/c/deep.txt", None),
    ("out_abs/new/x.txt", Some(SYMLINK_ESCAPE)),
    ("out_rel/new/x.txt", Some(SYMLINK_ESCAPE)),
    ("out_abs/x.txt", Some(SYMLINK_ESCAPE)),
    ("out_dangling/x.txt", Some(SYMLINK_ESCAPE)),
    ("in_dangling/x.txt", Some(DANGLING)),
    ("notes/after-the-attacks.txt", None),
];

/// What `outside` must still hold: its sentinel only.
fn assert_outside_untouched(outside: &Path) {
    assert_eq!(tree(outside), ["secret file OUTSIDE-SECRET"]);
}

#[test]
fn fs_write_creates_missing_parent_directories() {
    let d = dirs();
    let out = fs_in(&d.ws, &["--json", "write", "notes/today/x.txt"], b"hello");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["created_dirs"], true, "{v}");
    assert_eq!(
        std::fs::read_to_string(d.ws.join("notes/today/x.txt")).unwrap(),
        "hello"
    );
    // The directories are ordinary ones of the user's, as `mkdir` makes.
    assert!(d.ws.join("notes/today").is_dir());
    // A write beside it creates nothing and says so.
    let out = fs_in(&d.ws, &["--json", "write", "notes/today/y.txt"], b"again");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["created_dirs"], false, "{v}");
    // A file in the way of a directory is not replaced.
    let out = fs_in(&d.ws, &["write", "notes/today/x.txt/z.txt"], b"no");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(d.ws.join("notes/today/x.txt")).unwrap(),
        "hello"
    );
}

#[test]
fn fs_write_under_a_symlinked_parent_pointing_outside_is_refused() {
    let d = dirs();
    plant_symlinks(&d.ws, &d.outside);
    for (path, refusal) in WRITES {
        let out = fs_in(&d.ws, &["write", path], b"EVIL");
        let stderr = text(&out.stderr);
        match refusal {
            None => {
                assert_eq!(out.status.code(), Some(0), "{path}: {stderr}");
                assert_eq!(std::fs::read(d.ws.join(path)).unwrap(), b"EVIL");
            }
            Some(refusal) => {
                assert_eq!(out.status.code(), Some(1), "{path}: {stderr}");
                assert_eq!(stderr.lines().count(), 1, "{path}: {stderr}");
                assert!(stderr.contains(refusal), "{path}: {stderr}");
            }
        }
    }
    assert_outside_untouched(&d.outside);
    assert!(!d.ws.join("missing-inside").exists());
    // The workspace still works: a write and a read after the attacks.
    let out = fs_in(&d.ws, &["write", "later/ok.txt"], b"fine");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = fs_in(&d.ws, &["read", "later/ok.txt"], b"");
    assert_eq!(text(&out.stdout), "fine");
}

/// `hako mcp` on stdio, spoken to line by line.
struct Mcp {
    server: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
    next_id: u64,
}

impl Mcp {
    fn start(ws: &Path, backend: &str) -> Mcp {
        let mut server = hako()
            .args(["mcp", "--backend", backend, "--workspace"])
            .arg(ws)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let to = server.stdin.take().unwrap();
        let from = BufReader::new(server.stdout.take().unwrap());
        let mut mcp = Mcp {
            server,
            to,
            from,
            next_id: 1,
        };
        mcp.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "hako-tests", "version": "0"},
            }),
        );
        mcp.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: serde_json::Value) {
        writeln!(self.to, "{message}").unwrap();
        self.to.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        loop {
            let mut line = String::new();
            assert_ne!(self.from.read_line(&mut line).unwrap(), 0, "hako mcp ended");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    }

    /// Calls `tool`: whether it was an error, and its text.
    fn call(&mut self, tool: &str, arguments: serde_json::Value) -> (bool, String) {
        let v = self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": arguments}),
        );
        let result = &v["result"];
        assert!(result["content"].is_array(), "{v}");
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        (result["isError"] == true, text)
    }

    fn close(self) {
        let Mcp { mut server, to, .. } = self;
        drop(to);
        assert!(server.wait().unwrap().success());
    }
}

/// The backend both front ends open: `linux` where it can run, else
/// `host` (the fence is the same host-side code either way).
fn backend() -> &'static str {
    match hako_sys::ns::user_namespaces_allowed() {
        Ok(()) => "linux",
        Err(reason) => {
            assert!(
                std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
                "the linux backend cannot run here ({reason}) and HAKO_MUST_WORK=1"
            );
            eprintln!("SKIPPED linux in fs_write_and_mcp_write_file_agree: {reason}; using host");
            "host"
        }
    }
}

#[test]
fn fs_write_and_mcp_write_file_agree() {
    if !super::terminal::guest_ready() {
        return;
    }
    let backend = backend();
    let by_cli = dirs();
    let by_mcp = dirs();
    for d in [&by_cli, &by_mcp] {
        plant_symlinks(&d.ws, &d.outside);
    }
    let mut mcp = Mcp::start(&by_mcp.ws, backend);
    for (path, refusal) in WRITES {
        let out = fs_in(
            &by_cli.ws,
            &["--backend", backend, "write", path],
            b"same content\n",
        );
        let cli_refused = out.status.code() == Some(1);
        let cli_error = text(&out.stderr);
        let (mcp_refused, mcp_text) = mcp.call(
            "write_file",
            serde_json::json!({"path": path, "content": "same content\n"}),
        );
        assert_eq!(
            cli_refused, mcp_refused,
            "{path}: hako fs write: {cli_error}; write_file: {mcp_text}"
        );
        if let Some(refusal) = refusal {
            assert!(cli_refused, "{path} was written by hako fs write");
            // The same typed error, word for word, from both.
            let cli_line = cli_error.trim().trim_start_matches("hako: ");
            assert!(cli_error.contains(refusal), "{path}: {cli_error}");
            assert!(
                mcp_text.starts_with(cli_line),
                "{path}: hako fs write: {cli_line}; write_file: {mcp_text}"
            );
        }
    }
    // The MCP sandbox is still usable after the attacks: a command sees
    // what was written, and writes again.
    let (failed, output) = mcp.call(
        "run_command",
        serde_json::json!({"command": "cat notes/x.txt && echo more > notes/more.txt"}),
    );
    assert!(!failed, "{output}");
    assert!(output.contains("same content"), "{output}");
    mcp.close();
    std::fs::remove_file(by_mcp.ws.join("notes/more.txt")).unwrap();
    assert_eq!(tree(&by_cli.ws), tree(&by_mcp.ws));
    assert!(tree(&by_cli.ws).contains(&"a/b/c/deep.txt file same content\n".to_string()));
    assert_outside_untouched(&by_cli.outside);
    assert_outside_untouched(&by_mcp.outside);
}
