//! envd, the in-sandbox API: its process and filesystem services over
//! Connect (the JSON codec the SDK uses; server streams in Connect's
//! envelopes) and its `/files` upload and download.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::{Method, Request, Response};
use serde_json::{json, Value};

use hako_core::{Command, FileKind, Sandbox, SpawnOptions, Stream};

use hako_audit::{Exec, FileOp, FrontEnd, ProcessOp, Record};

use super::{sandbox_of, Boxed, Proc};
use crate::reply::{with_body, Body};
use crate::routes::{declared_length, read_body};
use crate::state::{audit, audit_failure, lookup, State};
use crate::{MAX_BODY, MAX_EXEC_TIMEOUT};

/// A Connect error: its code and message.
struct Fail(&'static str, String);

impl Fail {
    fn status(&self) -> u16 {
        match self.0 {
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "unauthenticated" => 401,
            "permission_denied" => 403,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "deadline_exceeded" => 504,
            _ => 500,
        }
    }

    fn json(&self) -> Value {
        json!({"code": self.0, "message": self.1})
    }

    fn unsupported(what: &str) -> Fail {
        Fail(
            "unimplemented",
            format!("{what} is not supported by hako (hako serve --e2b)"),
        )
    }
}

/// A sandbox error as Connect's code.
fn from_hako(e: &hako_core::Error) -> Fail {
    use hako_core::{Error, FenceError};
    let code = match e {
        Error::Fence(f) => match f {
            FenceError::NotFound { .. } => "not_found",
            FenceError::AlreadyExists { .. } => "already_exists",
            FenceError::IsADirectory { .. } | FenceError::NotADirectory { .. } => {
                "invalid_argument"
            }
            FenceError::FileTooLarge { .. } => "resource_exhausted",
            FenceError::Io { .. } => "internal",
            _ => "permission_denied",
        },
        Error::NoSuchProcess { .. } => "not_found",
        Error::CommandNotFound { .. } | Error::InvalidCommand { .. } => "invalid_argument",
        Error::LimitReached { .. } | Error::OutOfResources { .. } => "resource_exhausted",
        Error::Unsupported { .. } => "unimplemented",
        Error::IsolationTooWeak { .. }
        | Error::NetworkUnavailable { .. }
        | Error::BadNetworkPolicy { .. }
        | Error::CannotExecute { .. } => "permission_denied",
        Error::Closed | Error::SandboxLost { .. } => "unavailable",
        _ => "internal",
    };
    Fail(code, e.to_string())
}

fn plain(status: u16, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    with_body(status, content_type, Full::new(Bytes::from(body)).boxed())
}

/// A unary Connect answer.
fn unary(result: Result<Value, Fail>) -> Response<Body> {
    match result {
        Ok(v) => plain(200, "application/json", v.to_string().into_bytes()),
        Err(f) => plain(
            f.status(),
            "application/json",
            f.json().to_string().into_bytes(),
        ),
    }
}

/// An error of the `/files` API: `{"code": status, "message": ...}`.
fn files_error(f: &Fail) -> Response<Body> {
    let status = f.status();
    plain(
        status,
        "application/json",
        json!({"code": status, "message": f.1})
            .to_string()
            .into_bytes(),
    )
}

/// One message of a Connect stream: flags, length, JSON.
fn envelope(flags: u8, message: &Value) -> Bytes {
    let data = message.to_string().into_bytes();
    let mut out = Vec::with_capacity(data.len() + 5);
    out.push(flags);
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&data);
    Bytes::from(out)
}

/// The single message of an enveloped (streaming) request.
fn unenvelope(body: &[u8]) -> Result<Value, Fail> {
    let bad = || {
        Fail(
            "invalid_argument",
            "the request is not one Connect envelope".into(),
        )
    };
    if body.len() < 5 || body[0] & 0x01 != 0 {
        return Err(bad());
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != 5 + len {
        return Err(bad());
    }
    serde_json::from_slice(&body[5..])
        .map_err(|e| Fail("invalid_argument", format!("the request is not JSON: {e}")))
}

/// Answers one in-sandbox call.
pub(super) async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let declared = declared_length(request.headers());
    let b = match sandbox_of(&state, request.headers()) {
        Ok(b) => b,
        Err((status, message)) => {
            let code = if status == 401 {
                "unauthenticated"
            } else {
                "unavailable"
            };
            let mut r = unary(Err(Fail(code, message)));
            *r.status_mut() = hyper::StatusCode::from_u16(status)
                .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
            return r;
        }
    };
    if let Err(r) = crate::auth::same_origin(&state, request.headers()) {
        let message = r.body["error"].as_str().unwrap_or("").to_string();
        let mut r = unary(Err(Fail("permission_denied", message)));
        *r.status_mut() = hyper::StatusCode::FORBIDDEN;
        return r;
    }
    let Ok(declared) = declared else {
        return unary(Err(Fail(
            "invalid_argument",
            "the Content-Length is not a number".into(),
        )));
    };
    if declared.is_some_and(|n| n > MAX_BODY) {
        return unary(Err(Fail(
            "resource_exhausted",
            format!("the body is over {MAX_BODY} bytes"),
        )));
    }
    let (head, body) = request.into_parts();
    let path = head.uri.path().to_string();
    let query = head.uri.query().unwrap_or("").to_string();
    let starts = path == "/process.Process/Start"
        || path == "/process.Process/Connect"
        || path == "/filesystem.Filesystem/WatchDir";
    let moves = path == "/files";
    let slot = if starts {
        state.execs.try_take()
    } else if moves {
        state.transfers.try_take()
    } else {
        state.requests.try_take()
    };
    let Some(slot) = slot else {
        return unary(Err(Fail(
            "resource_exhausted",
            "the server is serving as many calls as it allows; retry shortly".into(),
        )));
    };
    let chunked = head.headers.contains_key(TRANSFER_ENCODING);
    let body = match read_body(&state, body, declared, chunked, false).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let content_type = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let deadline = head
        .headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let keepalive = head
        .headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let Some(sb) = lookup(&state, b.table_id) else {
        return unary(Err(Fail("unavailable", "the sandbox is closed".into())));
    };
    if starts {
        let turn = state.starts.enter().await;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
        let start = path.ends_with("/Start");
        let watch = path.ends_with("/WatchDir");
        let worker = Arc::clone(&state);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let _turn = turn;
            let at = Audit(&worker, &b, sb.as_ref());
            let outcome = unenvelope(&body).and_then(|req| {
                if watch {
                    stream_watch(&at, &req, deadline, keepalive, &tx)
                } else if start {
                    stream_start(&at, &req, deadline, keepalive, &tx)
                } else {
                    stream_connect(&at, &req, keepalive, &tx)
                }
            });
            let end = match outcome {
                Ok(()) => json!({}),
                Err(f) => json!({"error": f.json()}),
            };
            let _ = tx.blocking_send(envelope(0x02, &end));
        });
        return with_body(200, "application/connect+json", Envelopes(rx).boxed());
    }
    let method = head.method.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let at = Audit(&state, &b, sb.as_ref());
        if path == "/files" {
            return files(&at, &method, &query, &body, &content_type);
        }
        if path == "/health" {
            return plain(204, "text/plain", Vec::new());
        }
        let req: Value = if body.is_empty() {
            json!({})
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return unary(Err(Fail(
                        "invalid_argument",
                        format!("the request is not JSON: {e}"),
                    )))
                }
            }
        };
        unary(rpc(&at, &path, &req))
    })
    .await
    .unwrap_or_else(|_| {
        unary(Err(Fail(
            "internal",
            "the call failed inside the server".into(),
        )))
    })
}

/// A streamed body: the envelopes a blocking task sends, ending when it
/// drops its sender.
struct Envelopes(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Envelopes {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// The unary methods.
fn rpc(at: &Audit<'_>, path: &str, req: &Value) -> Result<Value, Fail> {
    let (b, sb) = (at.1, at.2);
    match path {
        "/process.Process/List" => list(b, sb),
        "/process.Process/SendInput" => {
            let id = selected(b, req)?.id;
            let data = bytes_field(&req["input"], "stdin")?;
            processes(sb)?
                .write_stdin(id, &data)
                .map_err(|e| from_hako(&e))?;
            Ok(json!({}))
        }
        "/process.Process/CloseStdin" => {
            let id = selected(b, req)?.id;
            processes(sb)?
                .close_stdin(id)
                .map_err(|e| at.failed(&e, None))?;
            at.process(
                id,
                ProcessOp::SendInput {
                    bytes: 0,
                    sha256: hako_audit::sha256_hex(&[]),
                    closed_stdin: true,
                },
            );
            Ok(json!({}))
        }
        "/process.Process/SendSignal" => {
            let id = selected(b, req)?.id;
            match req["signal"].as_str() {
                Some("SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") | None => {}
                Some(other) => {
                    return Err(Fail(
                        "invalid_argument",
                        format!("signal {other} is not one envd sends"),
                    ))
                }
            }
            let procs = processes(sb)?;
            procs.kill(id).map_err(|e| at.failed(&e, None))?;
            let now = procs.wait(id, Some(Duration::ZERO)).ok();
            let status = now.as_ref().and_then(|s| s.status);
            at.process(
                id,
                ProcessOp::Kill {
                    ended: now.as_ref().is_some_and(hako_core::ProcessState::finished),
                    exit_code: status.and_then(|s| s.code()),
                    signal: status.and_then(|s| s.signal()),
                },
            );
            Ok(json!({}))
        }
        "/process.Process/Update" => Err(Fail::unsupported("a terminal (pty)")),
        "/process.Process/StreamInput" => Err(Fail::unsupported("streamed stdin (use send_stdin)")),
        "/filesystem.Filesystem/Stat" => {
            let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
            Ok(json!({"entry": entry(b, sb, &p)?}))
        }
        "/filesystem.Filesystem/MakeDir" => {
            let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
            if sb.stat().is_some() && entry(b, sb, &p).is_ok() {
                return Err(Fail("already_exists", format!("{} exists", b.show(&p))));
            }
            let Some(mk) = sb.make_dir_all() else {
                return Err(Fail::unsupported("making a directory on this backend"));
            };
            mk.make_dir_all(&p).map_err(|e| at.failed(&e, Some(&p)))?;
            at.file(&p, FileOp::MakeDir);
            Ok(json!({"entry": entry(b, sb, &p)?}))
        }
        "/filesystem.Filesystem/Remove" => {
            let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
            if b.show(&p) == super::HOME {
                return Err(Fail(
                    "permission_denied",
                    "the workspace itself is not removed".into(),
                ));
            }
            remove_all(at, &p)?;
            Ok(json!({}))
        }
        "/filesystem.Filesystem/Move" => {
            let from = at.resolve(req["source"].as_str().unwrap_or(""))?;
            let to = at.resolve(req["destination"].as_str().unwrap_or(""))?;
            entry(b, sb, &from)?;
            let command =
                Command::new(["mv", "-T", "--"]).arg_paths(&b.inside(&from), &b.inside(&to));
            let out = sb.exec(&command).map_err(|e| at.failed(&e, Some(&from)))?;
            at.exec(&command, |e| e.output(&out));
            if !out.status.success() {
                return Err(Fail(
                    "invalid_argument",
                    format!(
                        "cannot move {} to {}: {}",
                        b.show(&from),
                        b.show(&to),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ));
            }
            Ok(json!({"entry": entry(b, sb, &to)?}))
        }
        "/filesystem.Filesystem/ListDir" => {
            let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
            let depth = req["depth"].as_u64().unwrap_or(1).max(1);
            let mut entries = Vec::new();
            list_dir(b, sb, &p, depth, &mut entries)?;
            Ok(json!({"entries": entries}))
        }
        "/filesystem.Filesystem/CreateWatcher" => {
            let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
            let recursive = req["recursive"].as_bool().unwrap_or(false);
            let seen = snapshot(at, &p, recursive)?;
            let mut watchers = b.watchers();
            if watchers.len() >= MAX_WATCHERS {
                return Err(Fail(
                    "resource_exhausted",
                    format!("a sandbox has at most {MAX_WATCHERS} watchers; stop one first"),
                ));
            }
            let id = super::random_hex(8).map_err(|e| Fail("internal", e.to_string()))?;
            watchers.insert(
                id.clone(),
                Watcher {
                    path: p,
                    recursive,
                    seen,
                },
            );
            Ok(json!({"watcherId": id}))
        }
        "/filesystem.Filesystem/GetWatcherEvents" => {
            let id = req["watcherId"].as_str().unwrap_or("");
            let (path, recursive, before) = match b.watchers().get(id) {
                Some(w) => (w.path.clone(), w.recursive, w.seen.clone()),
                None => return Err(Fail("not_found", format!("watcher {id} not found"))),
            };
            let now = snapshot(at, &path, recursive)?;
            let events = changes(&before, &now);
            if let Some(w) = b.watchers().get_mut(id) {
                w.seen = now;
            }
            Ok(json!({"events": events}))
        }
        "/filesystem.Filesystem/RemoveWatcher" => {
            let id = req["watcherId"].as_str().unwrap_or("");
            match b.watchers().remove(id) {
                Some(_) => Ok(json!({})),
                None => Err(Fail("not_found", format!("watcher {id} not found"))),
            }
        }
        "/filesystem.Filesystem/WatchDir" => Err(Fail(
            "invalid_argument",
            "WatchDir is a server stream: call it as one".into(),
        )),
        other => Err(Fail(
            "unimplemented",
            format!(
                "{other} is not supported by hako (hako serve --e2b answers envd's process and filesystem services and /files)"
            ),
        )),
    }
}

trait ArgPaths {
    fn arg_paths(self, a: &Path, b: &Path) -> Command;
}

impl ArgPaths for Command {
    fn arg_paths(self, a: &Path, b: &Path) -> Command {
        let mut argv = self.program.argv();
        argv.push(a.to_string_lossy().into_owned());
        argv.push(b.to_string_lossy().into_owned());
        Command::new(argv)
    }
}

fn processes(sb: &dyn Sandbox) -> Result<&dyn hako_core::Processes, Fail> {
    sb.processes()
        .ok_or_else(|| Fail::unsupported("long-lived processes on this backend"))
}

/// What records an in-sandbox call's effects: the server, the E2B
/// sandbox, and its hako sandbox.
struct Audit<'a>(&'a State, &'a Boxed, &'a dyn Sandbox);

impl Audit<'_> {
    /// Records a failed sandbox call (a refusal or an error) and gives
    /// its Connect error.
    fn failed(&self, e: &hako_core::Error, path: Option<&Path>) -> Fail {
        audit_failure(self.0, self.1.table_id, self.2, e, |f| {
            f.path = path.map(Path::to_path_buf);
        });
        from_hako(e)
    }

    /// Records a path refused before it reached the sandbox.
    fn refused(&self, path: &str, why: String) -> Fail {
        let mut failure = hako_audit::Failure::new(FrontEnd::Serve, &why);
        failure.backend = Some(self.2.capabilities().backend.clone());
        failure.sandbox = Some(self.1.table_id);
        failure.path = Some(PathBuf::from(path));
        audit(self.0, failure.record(true));
        Fail("permission_denied", why)
    }

    fn file(&self, path: &Path, op: FileOp) {
        audit(
            self.0,
            Record::File(hako_audit::File::new(
                FrontEnd::Serve,
                Some(self.1.table_id),
                path,
                op,
            )),
        );
    }

    fn process(&self, id: hako_core::ProcessId, op: ProcessOp) {
        audit(
            self.0,
            Record::Process(hako_audit::Process {
                process: id.0,
                sandbox: Some(self.1.table_id),
                op,
            }),
        );
    }

    fn exec(&self, command: &Command, f: impl FnOnce(Exec) -> Exec) {
        let mut exec = f(Exec::new(
            FrontEnd::Serve,
            &self.2.capabilities().backend,
            command,
        ));
        exec.sandbox = Some(self.1.table_id);
        audit(self.0, Record::Exec(exec));
    }

    /// The sandbox path `path` names, or the refusal (recorded).
    fn resolve(&self, path: &str) -> Result<PathBuf, Fail> {
        self.1.resolve(path).map_err(|why| self.refused(path, why))
    }
}

fn bytes_field(v: &Value, field: &str) -> Result<Vec<u8>, Fail> {
    let text = v[field].as_str().unwrap_or("");
    BASE64
        .decode(text)
        .map_err(|e| Fail("invalid_argument", format!("{field} is not base64: {e}")))
}

/// The process a request's `process` selector names (a pid or a tag).
fn selected(b: &Boxed, req: &Value) -> Result<Proc, Fail> {
    let sel = &req["process"];
    let procs = b.procs();
    let found = if let Some(pid) = sel["pid"].as_u64() {
        u32::try_from(pid).ok().and_then(|p| procs.get(&p).cloned())
    } else if let Some(tag) = sel["tag"].as_str() {
        procs
            .values()
            .find(|p| p.tag.as_deref() == Some(tag))
            .cloned()
    } else {
        return Err(Fail(
            "invalid_argument",
            "name a process by pid or tag".into(),
        ));
    };
    found.ok_or_else(|| Fail("not_found", format!("process {sel} not found")))
}

fn list(b: &Boxed, sb: &dyn Sandbox) -> Result<Value, Fail> {
    let running: Vec<_> = processes(sb)?
        .list()
        .map_err(|e| from_hako(&e))?
        .into_iter()
        .filter(|s| !s.finished())
        .map(|s| s.id)
        .collect();
    let procs = b.procs();
    let mut out: Vec<(u32, Value)> = procs
        .iter()
        .filter(|(_, p)| running.contains(&p.id))
        .map(|(pid, p)| {
            let mut v = json!({"pid": pid, "config": p.config});
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            (*pid, v)
        })
        .collect();
    out.sort_by_key(|(pid, _)| *pid);
    Ok(json!({"processes": out.into_iter().map(|(_, v)| v).collect::<Vec<_>>()}))
}

/// `Start`: runs the command as a long-lived process and streams its
/// start, output and end.
fn stream_start(
    at: &Audit<'_>,
    req: &Value,
    deadline: Option<Duration>,
    keepalive: Option<Duration>,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<(), Fail> {
    let (b, sb) = (at.1, at.2);
    if req.get("pty").is_some_and(|v| !v.is_null()) {
        return Err(Fail::unsupported("a terminal (pty)"));
    }
    let config = &req["process"];
    let cmd = config["cmd"].as_str().unwrap_or("");
    if cmd.is_empty() {
        return Err(Fail("invalid_argument", "process.cmd is empty".into()));
    }
    let mut argv = vec![cmd.to_string()];
    if let Some(args) = config["args"].as_array() {
        argv.extend(args.iter().map(|a| a.as_str().unwrap_or("").to_string()));
    }
    let cwd = match config["cwd"].as_str() {
        Some(c) if !c.is_empty() => b.inside(&at.resolve(c)?),
        _ => b.workdir.clone(),
    };
    let mut command = Command::new(argv).cwd(cwd);
    command = command.env("HOME", b.workdir.to_string_lossy());
    for (k, v) in &b.envs {
        command = command.env(k, v);
    }
    if let Some(envs) = config["envs"].as_object() {
        for (k, v) in envs {
            command = command.env(k, v.as_str().unwrap_or(""));
        }
    }
    // The call's deadline is the command's; without one (`timeout=0`, as
    // a server started in the background is given) the sandbox's own
    // lease bounds it, as on E2B: it is killed with the sandbox.
    if let Some(d) = deadline.filter(|d| !d.is_zero()) {
        command = command.timeout(d.min(MAX_EXEC_TIMEOUT));
    }
    let stdin = req["stdin"].as_bool().unwrap_or(false);
    let procs = processes(sb)?;
    let pid = b.next_pid();
    let tag = req["tag"].as_str().map(str::to_string);
    let id = procs
        .spawn(
            &command,
            &SpawnOptions {
                tags: vec![format!("e2b:{pid}")],
                live_stdin: stdin,
                ..SpawnOptions::default()
            },
        )
        .map_err(|e| at.failed(&e, None))?;
    at.exec(&command, |e| e.still_running(id.0, Duration::ZERO, 0, 0));
    b.procs().insert(
        pid,
        Proc {
            id,
            tag,
            config: config.clone(),
        },
    );
    send(tx, &json!({"event": {"start": {"pid": pid}}}))?;
    let outcome = pump(procs, id, (0, 0), keepalive, tx);
    // A client that went away leaves the process running, still found by
    // its pid (`commands.connect`, `kill`); one that ended is forgotten.
    if procs
        .wait(id, Some(Duration::ZERO))
        .map_or(true, |s| s.finished())
    {
        b.procs().remove(&pid);
    }
    outcome
}

/// `Connect`: streams the output of a running process from now on, and its end.
fn stream_connect(
    at: &Audit<'_>,
    req: &Value,
    keepalive: Option<Duration>,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<(), Fail> {
    let (b, sb) = (at.1, at.2);
    let p = selected(b, req)?;
    let pid = req["process"]["pid"]
        .as_u64()
        .or_else(|| {
            b.procs()
                .iter()
                .find(|(_, q)| q.id == p.id)
                .map(|(pid, _)| u64::from(*pid))
        })
        .unwrap_or(0);
    let procs = processes(sb)?;
    let now = procs
        .wait(p.id, Some(Duration::ZERO))
        .map_err(|e| from_hako(&e))?;
    send(tx, &json!({"event": {"start": {"pid": pid}}}))?;
    pump(
        procs,
        p.id,
        (now.stdout_total, now.stderr_total),
        keepalive,
        tx,
    )
}

fn send(tx: &tokio::sync::mpsc::Sender<Bytes>, message: &Value) -> Result<(), Fail> {
    tx.blocking_send(envelope(0, message))
        .map_err(|_| Fail("canceled", "the client went away".into()))
}

/// Streams a process's output from `offsets` until it ends, then its end
/// event. A client that goes away stops the stream, not the process.
fn pump(
    procs: &dyn hako_core::Processes,
    id: hako_core::ProcessId,
    offsets: (u64, u64),
    keepalive: Option<Duration>,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<(), Fail> {
    let (mut out_at, mut err_at) = offsets;
    let (mut out_done, mut err_done) = (false, false);
    let mut last_sent = Instant::now();
    const CHUNK: usize = 64 << 10;
    // One read of `stream` from `at`: its bytes sent as the event of
    // `name`; whether any were, the next offset, and whether it ended.
    let step = |stream: Stream,
                name: &str,
                at: u64,
                wait: Option<Duration>|
     -> Result<(bool, u64, bool), Fail> {
        let s = procs
            .read_output(id, stream, at, CHUNK, wait)
            .map_err(|e| from_hako(&e))?;
        let got = !s.data.is_empty();
        if got {
            send(
                tx,
                &json!({"event": {"data": {name: BASE64.encode(&s.data)}}}),
            )?;
        }
        Ok((got, s.next, s.ended && s.data.is_empty()))
    };
    let poll = Some(Duration::from_millis(50));
    while !(out_done && err_done) {
        let mut got = false;
        if !out_done {
            let (sent, next, done) = step(Stream::Stdout, "stdout", out_at, poll)?;
            (got, out_at, out_done) = (sent, next, done);
        }
        if !err_done {
            // Waits only once stdout has ended (stdout's read waited).
            let wait = if out_done { poll } else { None };
            let (sent, next, done) = step(Stream::Stderr, "stderr", err_at, wait)?;
            (got, err_at, err_done) = (got || sent, next, done);
        }
        if got {
            last_sent = Instant::now();
        } else if keepalive.is_some_and(|k| last_sent.elapsed() >= k) {
            send(tx, &json!({"event": {"keepalive": {}}}))?;
            last_sent = Instant::now();
        }
    }
    let end = procs.wait(id, None).map_err(|e| from_hako(&e))?;
    if end.timed_out {
        return Err(Fail(
            "deadline_exceeded",
            "the command's timeout passed; it was killed".into(),
        ));
    }
    let (code, status) = match (end.status, &end.error) {
        (Some(s), _) => match (s.code(), s.signal()) {
            (Some(c), _) => (c, format!("exit status {c}")),
            (None, Some(sig)) => (-1, format!("signal: {sig}")),
            _ => (-1, "ended".to_string()),
        },
        (None, Some(e)) => (-1, e.clone()),
        (None, None) => (-1, "ended".to_string()),
    };
    let mut event = json!({"exitCode": code, "exited": end.status.is_some(), "status": status});
    if let Some(e) = &end.error {
        event["error"] = json!(e);
    }
    send(tx, &json!({"event": {"end": event}}))
}

/// The most watchers a sandbox holds at once.
const MAX_WATCHERS: usize = 16;

/// The most entries one watch compares.
const MAX_WATCHED: usize = 10_000;

/// How often a `WatchDir` stream lists its directory again.
const WATCH_POLL: Duration = Duration::from_millis(200);

/// A directory watched by polling: what was there when last looked at.
pub(super) struct Watcher {
    path: PathBuf,
    recursive: bool,
    seen: Snapshot,
}

/// Each entry under a watched directory (relative to it): its kind, size
/// and modification time.
type Snapshot = std::collections::BTreeMap<String, (bool, u64, i64)>;

fn snapshot(at: &Audit<'_>, dir: &Path, recursive: bool) -> Result<Snapshot, Fail> {
    let mut out = Snapshot::new();
    let mut todo = vec![(dir.to_path_buf(), String::new())];
    while let Some((p, prefix)) = todo.pop() {
        let listing = at.2.list_dir(&p).map_err(|e| {
            if p == dir {
                at.failed(&e, Some(&p))
            } else {
                from_hako(&e)
            }
        });
        let listing = match listing {
            Ok(l) => l,
            // A subdirectory removed while being looked at.
            Err(_) if p != dir => continue,
            Err(f) => return Err(f),
        };
        for e in listing.entries {
            let name = format!("{prefix}{}", e.name.to_string_lossy());
            let is_dir = e.kind == FileKind::Dir;
            if is_dir && recursive {
                todo.push((p.join(&e.name), format!("{name}/")));
            }
            out.insert(name, (is_dir, e.size, e.mtime));
            if out.len() > MAX_WATCHED {
                return Err(Fail(
                    "resource_exhausted",
                    format!("a watched directory holds more than {MAX_WATCHED} entries"),
                ));
            }
        }
    }
    Ok(out)
}

/// The `FilesystemEvent`s between two looks at a directory.
fn changes(before: &Snapshot, now: &Snapshot) -> Vec<Value> {
    let mut events = Vec::new();
    for (name, info) in now {
        match before.get(name) {
            None => events.push(json!({"name": name, "type": "EVENT_TYPE_CREATE"})),
            Some(old) if old != info && !info.0 => {
                events.push(json!({"name": name, "type": "EVENT_TYPE_WRITE"}));
            }
            _ => {}
        }
    }
    for name in before.keys().filter(|n| !now.contains_key(*n)) {
        events.push(json!({"name": name, "type": "EVENT_TYPE_REMOVE"}));
    }
    events
}

/// `WatchDir`: the directory's changes as they are seen (polled), until
/// the client goes away or the call's deadline passes.
fn stream_watch(
    at: &Audit<'_>,
    req: &Value,
    deadline: Option<Duration>,
    keepalive: Option<Duration>,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<(), Fail> {
    let p = at.resolve(req["path"].as_str().unwrap_or(""))?;
    let recursive = req["recursive"].as_bool().unwrap_or(false);
    let mut seen = snapshot(at, &p, recursive)?;
    send(tx, &json!({"start": {}}))?;
    let began = Instant::now();
    let end = deadline
        .filter(|d| !d.is_zero())
        .unwrap_or(MAX_EXEC_TIMEOUT)
        .min(MAX_EXEC_TIMEOUT);
    let mut last_sent = Instant::now();
    while began.elapsed() < end {
        std::thread::sleep(WATCH_POLL);
        if tx.is_closed() {
            return Ok(());
        }
        let now = match snapshot(at, &p, recursive) {
            Ok(now) => now,
            // The directory itself removed: its removal is the last event.
            Err(Fail("not_found", _)) => Snapshot::new(),
            Err(f) => return Err(f),
        };
        let events = changes(&seen, &now);
        if !events.is_empty() {
            last_sent = Instant::now();
        }
        for event in events {
            send(tx, &json!({"filesystem": event}))?;
        }
        if keepalive.is_some_and(|k| last_sent.elapsed() >= k) {
            send(tx, &json!({"keepalive": {}}))?;
            last_sent = Instant::now();
        }
        seen = now;
    }
    Err(Fail(
        "deadline_exceeded",
        "the watch's timeout passed".into(),
    ))
}

/// An `EntryInfo` for `p`.
fn entry(b: &Boxed, sb: &dyn Sandbox, p: &Path) -> Result<Value, Fail> {
    let Some(stat) = sb.stat() else {
        return Err(Fail::unsupported("stat on this backend"));
    };
    let m = stat.stat(p).map_err(|e| from_hako(&e))?;
    let shown = b.show(p);
    let name = shown.rsplit('/').next().unwrap_or_default().to_string();
    Ok(entry_json(
        b,
        &name,
        p,
        m.kind,
        m.size,
        m.mode,
        m.mtime,
        m.symlink_target.as_deref(),
    ))
}

#[allow(clippy::too_many_arguments)]
fn entry_json(
    b: &Boxed,
    name: &str,
    p: &Path,
    kind: FileKind,
    size: u64,
    mode: u32,
    mtime: i64,
    target: Option<&std::ffi::OsStr>,
) -> Value {
    let kind_name = match kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": name,
        "type": kind_name,
        "path": b.show(p),
        "size": size.to_string(),
        "mode": mode & 0o7777,
        "permissions": permissions(kind, mode),
        "owner": "user",
        "group": "user",
        "modifiedTime": super::rfc3339(
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(mtime).unwrap_or(0))
        ),
        "isSymlink": kind == FileKind::Symlink,
    });
    if let Some(t) = target {
        v["symlinkTarget"] = json!(t.to_string_lossy());
    }
    v
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The most entries one `ListDir` answers, across every directory its
/// `depth` reaches: the tree is the sandbox's, as wide and deep as its
/// programs made it, and the answer is held in the server's memory.
const MAX_LISTED: usize = 100_000;

fn list_dir(
    b: &Boxed,
    sb: &dyn Sandbox,
    p: &Path,
    depth: u64,
    out: &mut Vec<Value>,
) -> Result<(), Fail> {
    let listing = sb.list_dir(p).map_err(|e| from_hako(&e))?;
    for e in listing.entries {
        if out.len() >= MAX_LISTED {
            return Err(Fail(
                "resource_exhausted",
                format!(
                    "the listing is over {MAX_LISTED} entries, the most hako answers at once: list with a smaller depth"
                ),
            ));
        }
        let name = e.name.to_string_lossy().into_owned();
        let child = p.join(&e.name);
        out.push(entry_json(
            b, &name, &child, e.kind, e.size, e.mode, e.mtime, None,
        ));
        if e.kind == FileKind::Dir && depth > 1 {
            list_dir(b, sb, &child, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Removes `p` and, for a directory, all under it.
fn remove_all(at: &Audit<'_>, p: &Path) -> Result<(), Fail> {
    let sb = at.2;
    if let Some(stat) = sb.stat() {
        let m = stat.stat(p).map_err(|e| at.failed(&e, Some(p)))?;
        if m.kind == FileKind::Dir {
            for e in sb.list_dir(p).map_err(|e| at.failed(&e, Some(p)))?.entries {
                remove_all(at, &p.join(e.name))?;
            }
        }
    }
    sb.remove(p).map_err(|e| at.failed(&e, Some(p)))?;
    at.file(p, FileOp::Remove);
    Ok(())
}

/// At most [`MAX_BODY`] bytes of a file (a larger one is refused),
/// recorded.
fn read(at: &Audit<'_>, p: &Path) -> Result<Vec<u8>, Fail> {
    let sb = at.2;
    let (data, truncated) = match sb.read_limit() {
        Some(rl) => rl
            .read_file_limit(p, MAX_BODY)
            .map(|o| (o.data, o.truncated)),
        None => sb.read_file(p).map(|d| (d, false)),
    }
    .map_err(|e| at.failed(&e, Some(p)))?;
    at.file(p, FileOp::read(&data, truncated));
    if truncated || data.len() as u64 > MAX_BODY {
        return Err(Fail(
            "resource_exhausted",
            format!(
                "{} is over {MAX_BODY} bytes, the most one read returns",
                at.1.show(p)
            ),
        ));
    }
    Ok(data)
}

/// `/files`: `GET ?path=` downloads a file; `POST` (a multipart form, each
/// part's file name its path, or `?path=` for a single part) writes them.
fn files(
    at: &Audit<'_>,
    method: &Method,
    query: &str,
    body: &[u8],
    content_type: &str,
) -> Response<Body> {
    let mut path = None;
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        if k == "path" {
            match crate::routes::percent_decode(v) {
                Ok(p) => path = Some(p),
                Err(why) => {
                    return files_error(&Fail("invalid_argument", format!("the path {why}")))
                }
            }
        }
    }
    let (b, sb) = (at.1, at.2);
    if *method == Method::GET {
        let Some(p) = path else {
            return files_error(&Fail("invalid_argument", "give ?path=".into()));
        };
        let read = at.resolve(&p).and_then(|p| read(at, &p));
        return match read {
            Ok(data) => plain(200, "application/octet-stream", data),
            Err(f) => files_error(&f),
        };
    }
    if *method != Method::POST {
        return files_error(&Fail(
            "unimplemented",
            format!("/files takes GET or POST, not {method}"),
        ));
    }
    let parts = match super::multipart::parts(body, content_type) {
        Ok(p) => p,
        Err(why) => return files_error(&Fail("invalid_argument", why)),
    };
    let mut written = Vec::new();
    for (filename, data) in &parts {
        let name = if parts.len() == 1 {
            path.clone().unwrap_or_else(|| filename.clone())
        } else {
            filename.clone()
        };
        let result = at.resolve(&name).and_then(|p| {
            hako_core::write_file_creating_parents(sb, &p, data)
                .map_err(|e| at.failed(&e, Some(&p)))?;
            at.file(&p, FileOp::write(data));
            Ok(p)
        });
        match result {
            Ok(p) => written.push(json!({
                "name": p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                "type": "file",
                "path": b.show(&p),
            })),
            Err(f) => return files_error(&f),
        }
    }
    plain(
        200,
        "application/json",
        Value::Array(written).to_string().into_bytes(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn an_envelope_round_trips_and_a_bad_one_is_refused() {
        let msg = json!({"process": {"cmd": "/bin/bash"}});
        let framed = envelope(0, &msg);
        assert_eq!(framed[0], 0);
        assert_eq!(unenvelope(&framed).ok(), Some(msg));
        let end = envelope(0x02, &json!({}));
        assert_eq!(end[0], 0x02);
        // Cut short, too long, compressed, not JSON.
        assert!(unenvelope(&framed[..framed.len() - 1]).is_err());
        assert!(unenvelope(&[&framed[..], b"x"].concat()).is_err());
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert!(unenvelope(&compressed).is_err());
        assert!(unenvelope(&[0, 0, 0, 0, 1, b'{']).is_err());
        assert!(unenvelope(&[]).is_err());
    }

    #[test]
    fn watch_changes_are_creates_writes_and_removes() {
        let mut before = Snapshot::new();
        before.insert("a".into(), (false, 1, 10));
        before.insert("d".into(), (true, 0, 10));
        before.insert("gone".into(), (false, 1, 10));
        let mut now = before.clone();
        now.remove("gone");
        now.insert("a".into(), (false, 2, 11));
        now.insert("d".into(), (true, 0, 12));
        now.insert("new".into(), (false, 0, 12));
        let events = changes(&before, &now);
        let has = |name: &str, kind: &str| {
            events
                .iter()
                .any(|e| e["name"] == name && e["type"] == kind)
        };
        assert!(has("a", "EVENT_TYPE_WRITE"));
        assert!(has("new", "EVENT_TYPE_CREATE"));
        assert!(has("gone", "EVENT_TYPE_REMOVE"));
        // A directory's own time changing is not a write.
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(changes(&now, &now).is_empty());
    }
}
