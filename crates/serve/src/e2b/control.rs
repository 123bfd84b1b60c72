//! E2B's control API: create, look at, list, time out, connect to and
//! kill sandboxes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hako_audit::{FrontEnd, Record, SandboxOpened};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, AUTHORIZATION, TRANSFER_ENCODING};
use hyper::{Method, Request, Response};
use serde_json::{json, Value};

use super::{
    api_error, kill, not_supported, random_hex, rfc3339, Boxed, DEFAULT_TIMEOUT, ENVD_VERSION,
    MAX_TIMEOUT,
};
use crate::reply::{busy, closing, reply, response, Body, Reply};
use crate::routes::{blocking, declared_length, read_body};
use crate::state::{audit, table, State};
use crate::MAX_BODY;

/// Whether the request carries the server's token: as `X-API-Key` (how the
/// SDK sends its API key) or as `Authorization: Bearer`.
fn authorized(state: &State, headers: &HeaderMap) -> Result<(), String> {
    let checked = crate::swerex::api_key(state, headers).unwrap_or_else(|| {
        hako_runtime::http::check_token(
            headers.get_all(AUTHORIZATION).iter().map(|v| v.as_bytes()),
            &state.token,
        )
    });
    checked.map_err(|why| {
        format!(
            "{}: set E2B_API_KEY to the server's token (sent as X-API-Key)",
            why.message()
        )
    })
}

/// Answers one call of the control API.
pub(super) async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let declared = declared_length(request.headers());
    if let Err(why) = authorized(&state, request.headers()) {
        return closing(api_error(401, why));
    }
    if let Err(r) = crate::auth::same_origin(&state, request.headers()) {
        return closing(api_error(r.status, r.body["error"].as_str().unwrap_or("")));
    }
    let Ok(declared) = declared else {
        return closing(api_error(400, "the Content-Length is not a number"));
    };
    if declared.is_some_and(|n| n > MAX_BODY) {
        return closing(api_error(413, format!("the body is over {MAX_BODY} bytes")));
    }
    let Some(slot) = state.requests.try_take() else {
        let r = busy("requests");
        return response(api_error(503, r.body["error"].as_str().unwrap_or("")));
    };
    let (head, body) = request.into_parts();
    let chunked = head.headers.contains_key(TRANSFER_ENCODING);
    let body = match read_body(&state, body, declared, chunked, false).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let method = head.method.clone();
    let uri = head.uri.clone();
    let answer = blocking(move || {
        let _slot = slot;
        route(
            &state,
            &method,
            uri.path(),
            uri.query().unwrap_or(""),
            &body,
        )
    })
    .await;
    response(answer)
}

fn route(state: &State, method: &Method, path: &str, query: &str, body: &[u8]) -> Reply {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let parts: &[&str] = match parts.as_slice() {
        ["v2", rest @ ..] => rest,
        all => all,
    };
    match (method, parts) {
        (&Method::POST, ["sandboxes"]) => create(state, body),
        (&Method::GET, ["sandboxes"]) => list(state, query),
        (&Method::GET, ["sandboxes", id]) => with(state, id, |b| reply(200, detail(b))),
        (&Method::DELETE, ["sandboxes", id]) => {
            if kill(state, id) {
                reply(204, Value::Null)
            } else {
                unknown(id)
            }
        }
        (&Method::POST, ["sandboxes", id, "timeout"]) => {
            with(state, id, |b| match timeout_of(body, true) {
                Ok(t) => {
                    b.set_timeout(t);
                    reply(204, Value::Null)
                }
                Err(r) => r,
            })
        }
        (&Method::POST, ["sandboxes", id, "connect"]) => with(state, id, |b| {
            match timeout_of(body, false) {
                Ok(t) => {
                    // Connecting never shortens a sandbox's life.
                    let end = SystemTime::now() + t;
                    if end > b.end() {
                        b.set_timeout(t);
                    }
                    reply(200, created(b))
                }
                Err(r) => r,
            }
        }),
        (_, ["sandboxes", _, "pause" | "resume"]) => {
            not_supported("pausing and resuming a sandbox")
        }
        (_, ["sandboxes", _, "snapshots"] | ["snapshots", ..]) => not_supported("snapshots"),
        (_, ["sandboxes", _, "fork"]) => not_supported("forking a sandbox"),
        (_, ["sandboxes", _, "metrics"] | ["sandboxes", "metrics"]) => not_supported("metrics"),
        (_, ["sandboxes", _, "logs"]) => not_supported("sandbox logs"),
        (_, ["sandboxes", _, "network"]) => not_supported("changing a sandbox's network"),
        (_, ["sandboxes", _, "refreshes"]) => not_supported("refreshes (set a timeout instead)"),
        (_, ["templates", ..]) => not_supported("templates"),
        (_, ["volumes", ..]) => not_supported("volumes"),
        (_, ["secrets", ..]) => not_supported("secrets"),
        _ => api_error(
            404,
            format!("{method} {path} is not supported by hako (hako serve --e2b answers E2B's sandboxes API)"),
        ),
    }
}

fn unknown(id: &str) -> Reply {
    api_error(404, format!("sandbox {id} not found"))
}

fn with(state: &State, id: &str, f: impl FnOnce(&Boxed) -> Reply) -> Reply {
    match state.e2b.get(id) {
        Some(b) => f(&b),
        None => unknown(id),
    }
}

/// The `timeout` (seconds) of a body: required for `POST .../timeout`,
/// else [`DEFAULT_TIMEOUT`]; at most [`MAX_TIMEOUT`].
fn timeout_of(body: &[u8], required: bool) -> Result<Duration, Reply> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| api_error(400, format!("the body is not JSON: {e}")))?
    };
    let Some(t) = value.get("timeout").filter(|t| !t.is_null()) else {
        return if required {
            Err(api_error(400, "give a timeout in seconds"))
        } else {
            Ok(DEFAULT_TIMEOUT)
        };
    };
    let secs = t
        .as_u64()
        .ok_or_else(|| api_error(400, "the timeout is a whole number of seconds"))?;
    let t = Duration::from_secs(secs);
    if t > MAX_TIMEOUT {
        return Err(api_error(
            400,
            format!(
                "a timeout of {secs} s is over the most hako allows ({} s)",
                MAX_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(t)
}

/// `POST /v2/sandboxes`: a sandbox with the server's policy, in a
/// workspace of its own.
fn create(state: &State, body: &[u8]) -> Reply {
    let Some(e2b) = &state.config.e2b else {
        return api_error(500, "the server has no E2B configuration");
    };
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return api_error(400, format!("the body is not JSON: {e}")),
    };
    let template = value
        .get("templateID")
        .and_then(Value::as_str)
        .unwrap_or("base")
        .to_string();
    if template != "base" {
        return api_error(
            400,
            format!(
                "template {template:?}: templates are not supported by hako; every sandbox is made with the server's flags (its profile, backend, image and limits): use the default template (base)"
            ),
        );
    }
    if value.get("mcp").is_some_and(|v| !v.is_null()) {
        return not_supported("the MCP gateway");
    }
    if value
        .get("volumeMounts")
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
    {
        return not_supported("volume mounts");
    }
    // The network is the server's (--net, --allow): a rule of the
    // client's own is refused, never dropped; asking for none is kept
    // only where the sandbox has none (checked once it is open).
    if value.get("network").is_some_and(|v| !v.is_null()) {
        return not_supported(
            "a sandbox's own network rules (the server's --net and --allow set every sandbox's network)",
        );
    }
    let offline = ["allow_internet_access", "allowInternetAccess"]
        .iter()
        .any(|k| value.get(*k) == Some(&Value::Bool(false)));
    let timeout = match timeout_of(body, false) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mut envs = Vec::new();
    if let Some(map) = value.get("envVars").and_then(Value::as_object) {
        for (k, v) in map {
            match v.as_str() {
                Some(v) => envs.push((k.clone(), v.to_string())),
                None => return api_error(400, format!("envVars.{k} is not a string")),
            }
        }
    }
    let metadata = value
        .get("metadata")
        .filter(|m| m.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    {
        let mut t = table(state);
        let max = state.config.max_sandboxes;
        if t.open.len() + t.opening >= max {
            return api_error(
                429,
                format!("{max} sandboxes are open, the most this server allows (hako serve --max-sandboxes); kill one first"),
            );
        }
        t.opening += 1;
    }
    let made = open(state, e2b);
    table(state).opening -= 1;
    let (id, workspace, sb) = match made {
        Ok(m) => m,
        Err(r) => return r,
    };
    if offline && sb.capabilities().network != hako_core::NetworkAccess::None {
        let _ = sb.close();
        let _ = super::remove_workspace(&workspace);
        return api_error(
            400,
            "allow_internet_access=false: this server's sandboxes reach the network (its --net or --allow), and hako serve --e2b gives every sandbox the server's network; ask a server started with --net none",
        );
    }
    let access_token = match random_hex(32) {
        Ok(t) => t,
        Err(e) => {
            let _ = sb.close();
            let _ = std::fs::remove_dir_all(&workspace);
            return api_error(500, format!("cannot make an access token: {e}"));
        }
    };
    let table_id = state.next.fetch_add(1, Ordering::SeqCst);
    let caps = sb.capabilities().clone();
    let workdir = sb
        .workdir()
        .map_or_else(|| workspace.clone(), |w| w.workdir().to_path_buf());
    table(state).open.insert(table_id, Arc::from(sb));
    let mut opened = SandboxOpened::new(FrontEnd::Serve, Some(table_id), &caps);
    opened.workdir = Some(workspace.clone());
    audit(state, Record::SandboxOpened(opened));
    let now = SystemTime::now();
    let b = Arc::new(Boxed {
        id: id.clone(),
        table_id,
        workspace,
        workdir,
        access_token,
        template,
        metadata,
        envs,
        started: now,
        end: Mutex::new(now + timeout),
        procs: Mutex::new(HashMap::new()),
        watchers: Mutex::new(HashMap::new()),
        next_pid: AtomicU32::new(1000),
    });
    let answer = created(&b);
    state.e2b.boxes().insert(id, b);
    reply(201, answer)
}

/// Makes a workspace under the root and opens a sandbox on it.
fn open(
    state: &State,
    e2b: &super::E2bConfig,
) -> Result<(String, std::path::PathBuf, Box<dyn hako_core::Sandbox>), Reply> {
    let id = random_hex(10).map_err(|e| api_error(500, format!("cannot make an id: {e}")))?;
    let id = format!("hk{id}");
    let workspace = e2b.root.join(&id);
    let made = {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new().mode(0o700).create(&workspace)
    };
    if let Err(e) = made {
        return Err(api_error(
            500,
            format!("cannot make the sandbox's workspace under the server's E2B root: {e}"),
        ));
    }
    // Its canonical path: what commands see, and what paths map to.
    let workspace = std::fs::canonicalize(&workspace).unwrap_or(workspace);
    match (e2b.open_in)(&workspace) {
        Ok(sb) => Ok((id, workspace, sb)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&workspace);
            let failure = hako_audit::Failure::new(FrontEnd::Serve, &e.to_string());
            audit(state, failure.record(hako_audit::is_refusal(&e)));
            let status = crate::reply::from_error(&e).status;
            Err(api_error(
                if status == 429 { 429 } else { 500 },
                format!("cannot open a sandbox: {e}"),
            ))
        }
    }
}

/// The `Sandbox` answer of create and connect.
fn created(b: &Boxed) -> Value {
    json!({
        "templateID": b.template,
        "sandboxID": b.id,
        "clientID": "hako",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": b.access_token,
        "domain": null,
    })
}

/// The `SandboxDetail` answer.
fn detail(b: &Boxed) -> Value {
    let mut v = listed(b);
    v["envdAccessToken"] = json!(b.access_token);
    v
}

/// The `ListedSandbox` answer.
fn listed(b: &Boxed) -> Value {
    json!({
        "templateID": b.template,
        "sandboxID": b.id,
        "clientID": "hako",
        "startedAt": rfc3339(b.started),
        "endAt": rfc3339(b.end()),
        "envdVersion": ENVD_VERSION,
        "cpuCount": std::thread::available_parallelism().map_or(1, usize::from),
        "memoryMB": 0,
        "diskSizeMB": 0,
        "state": "running",
        "metadata": b.metadata,
    })
}

/// `GET /v2/sandboxes`: every sandbox (all running: hako does not pause),
/// filtered by `metadata` (`k=v&k2=v2`, URL-encoded) when given.
fn list(state: &State, query: &str) -> Reply {
    let mut wanted: Vec<(String, String)> = Vec::new();
    let mut states: Vec<String> = Vec::new();
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        let Ok(v) = crate::routes::percent_decode(v) else {
            return api_error(400, format!("the query's {k} is not URL-encoded UTF-8"));
        };
        match k {
            "metadata" => {
                for pair in v.split('&') {
                    if let Some((mk, mv)) = pair.split_once('=') {
                        match (
                            crate::routes::percent_decode(mk),
                            crate::routes::percent_decode(mv),
                        ) {
                            (Ok(mk), Ok(mv)) => wanted.push((mk, mv)),
                            _ => return api_error(400, "the metadata filter is not URL-encoded"),
                        }
                    }
                }
            }
            "state" => states.extend(v.split(',').map(str::to_string)),
            _ => {}
        }
    }
    if !states.is_empty() && !states.iter().any(|s| s == "running") {
        return reply(200, json!([]));
    }
    let mut all: Vec<Arc<Boxed>> = state.e2b.boxes().values().cloned().collect();
    all.sort_by_key(|b| b.started);
    let items: Vec<Value> = all
        .iter()
        .filter(|b| {
            wanted
                .iter()
                .all(|(k, v)| b.metadata.get(k).and_then(Value::as_str) == Some(v.as_str()))
        })
        .map(|b| listed(b))
        .collect();
    reply(200, Value::Array(items))
}
