//! `hako serve --e2b`: E2B's wire protocol, so that the unmodified `e2b`
//! SDK (`Sandbox.create()`, `sandbox.commands.run(...)`,
//! `sandbox.files.write(...)`) drives hako sandboxes.
//!
//! What the SDK sees, on the one listen address (`E2B_API_URL` and
//! `E2B_SANDBOX_URL` both set to it):
//! - The control API (`control`): `POST /v2/sandboxes` (and
//!   `/sandboxes`) creates a sandbox with the server's policy (its flags;
//!   the template may be `base`, E2B's default, and nothing else: hako has
//!   no templates), `GET /sandboxes/{id}`, `GET /v2/sandboxes` (and
//!   `/sandboxes`), `POST /sandboxes/{id}/timeout`,
//!   `POST /v2/sandboxes/{id}/connect`, `DELETE /sandboxes/{id}`. The API
//!   key (`X-API-Key`) is the server's token. A sandbox's `timeout` is its
//!   lease: when it passes, the sandbox is killed (its processes, then its
//!   workspace).
//! - The in-sandbox API (`envd`), told apart by the `E2b-Sandbox-Id`
//!   header the SDK sends with every call to a sandbox: envd's process
//!   and filesystem services over Connect (JSON codec, as the SDK speaks
//!   it) and its `/files` upload and download. Directory watches are
//!   polled (the directory listed again and compared), not pushed. Each such request carries
//!   the sandbox's access token (`X-Access-Token`), a random secret handed
//!   out by create and connect to holders of the server's token.
//! - Each sandbox has a workspace of its own: a fresh directory under the
//!   server's root (`--e2b-root`), removed with the sandbox. `/home/user`
//!   (E2B's home and default working directory) is that workspace: a path
//!   under it, or a relative one, resolves inside it; the workspace's own
//!   path (what `pwd` prints in a command) is accepted too; anything else
//!   is refused by the fence (`permission_denied`).
//! - What hako has no equivalent for (templates, pause and resume,
//!   snapshots, metrics, terminals, streamed stdin)
//!   answers `501` (or Connect's `unimplemented`) saying it is not
//!   supported by hako.

mod control;
mod envd;
mod multipart;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use hako_core::{ProcessId, Sandbox};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response};
use serde_json::{json, Value};

use crate::reply::{reply, Body, Reply};
use crate::state::State;

/// The header the SDK names the sandbox of an in-sandbox call with.
const SANDBOX_ID: &str = "e2b-sandbox-id";

/// The header the SDK sends a sandbox's access token in.
const ACCESS_TOKEN: &str = "x-access-token";

/// The envd version announced: features the SDK gates on later versions
/// (octet-stream uploads, file metadata) are not used by it.
const ENVD_VERSION: &str = "0.5.6";

/// E2B's home directory, mapped to a sandbox's workspace.
const HOME: &str = "/home/user";

/// A sandbox's lifetime when create gives none (E2B's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest lifetime a sandbox may be given (a day).
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How often leases are checked.
const LEASE_TICK: Duration = Duration::from_millis(500);

/// How the server opens a sandbox in a workspace of its own.
pub type OpenIn = dyn Fn(&Path) -> hako_core::Result<Box<dyn Sandbox>> + Send + Sync;

/// `--e2b`: where each sandbox's workspace is made, and how a sandbox is
/// opened on it.
pub struct E2bConfig {
    /// The directory holding each sandbox's workspace.
    pub root: PathBuf,
    /// Opens a sandbox with the server's policy on the workspace given.
    pub open_in: Box<OpenIn>,
}

/// The sandboxes made through the E2B API.
#[derive(Default)]
pub(crate) struct E2b {
    boxes: Mutex<HashMap<String, Arc<Boxed>>>,
}

/// One E2B sandbox.
pub(crate) struct Boxed {
    /// Its E2B id.
    id: String,
    /// Its id in the server's table.
    table_id: u64,
    /// Its own workspace (under the root), removed with it.
    workspace: PathBuf,
    /// The workspace as commands inside see it (on `linux` and `landlock`
    /// the same path; a container's own path on the others).
    workdir: PathBuf,
    /// The secret its in-sandbox calls carry.
    access_token: String,
    template: String,
    metadata: Value,
    /// Variables every command gets (create's `envVars`).
    envs: Vec<(String, String)>,
    started: SystemTime,
    end: Mutex<SystemTime>,
    /// Its processes by E2B pid.
    procs: Mutex<HashMap<u32, Proc>>,
    /// Its directory watchers (`files.watch_dir`) by id.
    watchers: Mutex<HashMap<String, envd::Watcher>>,
    next_pid: AtomicU32,
}

/// A process started through envd.
#[derive(Clone)]
struct Proc {
    id: ProcessId,
    tag: Option<String>,
    config: Value,
}

impl E2b {
    fn boxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Boxed>>> {
        self.boxes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, id: &str) -> Option<Arc<Boxed>> {
        self.boxes().get(id).cloned()
    }
}

impl Boxed {
    fn end(&self) -> SystemTime {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = SystemTime::now() + timeout;
    }

    fn procs(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Proc>> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, HashMap<String, envd::Watcher>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::SeqCst)
    }

    /// The path, relative to the workspace, that `path` (as an E2B
    /// program gives it) names, or why it is refused.
    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        resolve(&[&self.workdir, &self.workspace], path)
    }

    /// A relative path as commands inside the sandbox see it.
    fn inside(&self, rel: &Path) -> PathBuf {
        let mut out = self.workdir.clone();
        out.extend(
            rel.components()
                .filter(|c| *c != std::path::Component::CurDir),
        );
        out
    }

    /// A relative path as the program sees it: under `/home/user`.
    fn show(&self, rel: &Path) -> String {
        show(rel)
    }
}

/// A path relative to the workspace as the program sees it: under
/// `/home/user`.
fn show(rel: &Path) -> String {
    let mut out = String::from(HOME);
    for c in rel.components() {
        if let std::path::Component::Normal(n) = c {
            out.push('/');
            out.push_str(&n.to_string_lossy());
        }
    }
    out
}

/// Where `path` lands, relative to the workspace (`.` for the workspace
/// itself): `/home/user` and what is under it, a relative path, or a path
/// under one of the workspace's own absolute paths (`own`: as commands
/// see it, and on the host); `..` is never followed (the fence checks the
/// result again).
fn resolve(own: &[&Path], path: &str) -> Result<PathBuf, String> {
    if path.contains('\0') {
        return Err("a path may not hold a NUL byte".into());
    }
    let rest = if path.is_empty() || path == "~" {
        ""
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest
    } else if path == HOME {
        ""
    } else if let Some(rest) = path.strip_prefix(&format!("{HOME}/")) {
        rest
    } else if !path.starts_with('/') {
        path
    } else if let Some(rest) = own
        .iter()
        .find_map(|w| Path::new(path).strip_prefix(w).ok())
    {
        return join(&rest.to_string_lossy(), path);
    } else {
        return Err(format!(
            "{path} is outside the sandbox's workspace: hako maps {HOME} (and relative paths) to the sandbox's own workspace, and refuses every other path"
        ));
    };
    join(rest, path)
}

fn join(rest: &str, asked: &str) -> Result<PathBuf, String> {
    let mut out = PathBuf::from(".");
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "{asked} names a parent directory (..): refused, it could leave the sandbox's workspace"
                ))
            }
            p => out.push(p),
        }
    }
    Ok(out)
}

/// A random hex secret of 32 bytes (an id's 8).
fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read as _;
        f.read_exact(&mut buf)
    })?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error as E2B's API answers it: `{"code": status, "message": ...}`.
fn api_error(status: u16, message: impl Into<String>) -> Reply {
    reply(status, json!({"code": status, "message": message.into()}))
}

/// The answer to a feature hako has no equivalent for.
fn not_supported(what: &str) -> Reply {
    api_error(
        501,
        format!("{what} is not supported by hako (hako serve --e2b answers sandboxes, commands and files)"),
    )
}

/// Answers one request of E2B's protocol: an in-sandbox call (it names its
/// sandbox) or a call of the control API.
pub(crate) async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    if request.headers().contains_key(SANDBOX_ID) {
        envd::handle(state, request).await
    } else {
        control::handle(state, request).await
    }
}

/// The sandbox's id named by `headers`, if it is one of this server's and
/// the access token sent is its own; else the answer.
fn sandbox_of(state: &State, headers: &HeaderMap) -> Result<Arc<Boxed>, (u16, String)> {
    let id = headers
        .get(SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(b) = state.e2b.get(id) else {
        return Err((
            502,
            format!("sandbox {id:?} was not found: it was killed, its timeout passed, or it never was on this server"),
        ));
    };
    let mut given = headers.get_all(ACCESS_TOKEN).iter();
    match (given.next(), given.next()) {
        (Some(t), None) if same_secret(t.as_bytes(), b.access_token.as_bytes()) => Ok(b),
        (None, _) => Err((
            401,
            "an in-sandbox call must carry the sandbox's access token (X-Access-Token), as the SDK sends it".into(),
        )),
        _ => Err((401, "the access token is not this sandbox's".into())),
    }
}

/// Kills sandbox `id` (its processes, the sandbox, then its workspace).
/// Whether there was one.
fn kill(state: &State, id: &str) -> bool {
    let Some(b) = state.e2b.boxes().remove(id) else {
        return false;
    };
    let sb = crate::state::table(state).open.remove(&b.table_id);
    if let Some(sb) = sb {
        crate::processes::record_killed_at_close(state, b.table_id, sb.as_ref());
        if let Err(e) = sb.close() {
            tracing::warn!(sandbox = %b.id, "hako serve: closing an E2B sandbox: {e}");
        }
        crate::state::audit(state, crate::state::closed(b.table_id));
    }
    if let Err(e) = remove_workspace(&b.workspace) {
        tracing::error!(sandbox = %b.id, "hako serve: cannot remove an E2B sandbox's workspace {}: {e}", b.workspace.display());
    }
    true
}

/// Removes a closed sandbox's workspace, whatever its programs left in it:
/// a directory they made unreadable or unwritable (`chmod 000`) is given
/// back to its owner first, never following a symlink (nothing runs in
/// the sandbox any more to swap one in).
pub(super) fn remove_workspace(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::remove_dir_all(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    // Depth first without recursion: the tree is the sandbox's, as deep
    // as it made it.
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }
    std::fs::remove_dir_all(path)
}

/// Kills every sandbox (at shutdown).
pub(crate) fn kill_all(state: &State) {
    let ids: Vec<String> = state.e2b.boxes().keys().cloned().collect();
    for id in ids {
        kill(state, &id);
    }
}

/// Kills each sandbox whose lease has passed, every [`LEASE_TICK`], until
/// the server is gone.
pub(crate) fn start_leases(state: &Arc<State>) -> std::io::Result<()> {
    let weak: Weak<State> = Arc::downgrade(state);
    std::thread::Builder::new()
        .name("hako-e2b-leases".into())
        .spawn(move || loop {
            std::thread::sleep(LEASE_TICK);
            let Some(state) = weak.upgrade() else {
                return;
            };
            let now = SystemTime::now();
            let expired: Vec<String> = state
                .e2b
                .boxes()
                .values()
                .filter(|b| b.end() <= now)
                .map(|b| b.id.clone())
                .collect();
            for id in expired {
                tracing::info!(sandbox = %id, "hako serve: an E2B sandbox's timeout passed; killed");
                kill(&state, &id);
            }
        })
        .map(|_| ())
}

/// `t` as RFC 3339 (UTC, seconds).
fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (year, month, day, hour, minute, second) = hako_audit::utc_parts(secs);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn home_and_relative_paths_land_in_the_workspace_and_others_are_refused() {
        let ws: &[&Path] = &[Path::new("/workspace"), Path::new("/srv/e2b/abc")];
        let rel = |p: &str| PathBuf::from(p);
        assert_eq!(resolve(ws, "/home/user").unwrap(), rel("."));
        assert_eq!(resolve(ws, "~").unwrap(), rel("."));
        assert_eq!(resolve(ws, "/home/user/a/b").unwrap(), rel("./a/b"));
        assert_eq!(resolve(ws, "~/a").unwrap(), rel("./a"));
        assert_eq!(resolve(ws, "a/./b").unwrap(), rel("./a/b"));
        assert_eq!(resolve(ws, "/srv/e2b/abc/x").unwrap(), rel("./x"));
        assert_eq!(resolve(ws, "/workspace/x/").unwrap(), rel("./x"));
        assert_eq!(show(&rel("./a/b")), "/home/user/a/b");
        assert_eq!(show(&rel(".")), "/home/user");
        for bad in [
            "/etc/passwd",
            "/home/user/../x",
            "../x",
            "/home/userx",
            "/srv/e2b/abcd",
            "/srv/e2b/abc/../other",
            "/workspace/../etc",
            "/workspacex",
            "a\0b",
        ] {
            assert!(resolve(ws, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59Z");
    }
}
