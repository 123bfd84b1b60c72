//! Files through a sandbox's fence: the path from the query, each
//! effect and each refusal recorded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hako_audit::{FileOp, FrontEnd, Record};
use hako_core::{FileKind, Sandbox};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Response;
use serde_json::{json, Value};

use crate::reply::{error, from_error, no_sandbox, reply, response, with_body, Body, Reply};
use crate::state::{audit, audit_failure, lookup, State};
use crate::MAX_BODY;

/// Runs `f` on the sandbox `sid` names and the query's path; a sandbox
/// error is recorded (a refusal or an error) and answered.
pub(crate) fn with_file<T>(
    state: &State,
    sid: &str,
    file: Option<String>,
    f: impl FnOnce(u64, &dyn Sandbox, &Path) -> hako_core::Result<T>,
) -> Result<T, Reply> {
    let Some((id, sb)) = sid
        .parse::<u64>()
        .ok()
        .and_then(|n| lookup(state, n).map(|sb| (n, sb)))
    else {
        return Err(no_sandbox(sid));
    };
    let Some(path) = file else {
        return Err(error(400, "bad_request", "the query must name ?path="));
    };
    let path = PathBuf::from(path);
    f(id, sb.as_ref(), &path).map_err(|e| {
        audit_failure(state, id, sb.as_ref(), &e, |f| f.path = Some(path.clone()));
        from_error(&e)
    })
}

/// Records `op` on `path` in sandbox `id`.
fn audit_file(state: &State, id: u64, path: &Path, op: FileOp) {
    audit(
        state,
        Record::File(hako_audit::File::new(FrontEnd::Serve, Some(id), path, op)),
    );
}

/// `GET /v1/sandboxes/{id}/files?path=`: at most [`MAX_BODY`] bytes of the
/// file, raw, with `x-hako-truncated` saying whether that was all of it.
pub(crate) async fn read(state: Arc<State>, sid: String, file: Option<String>) -> Response<Body> {
    let read = tokio::task::spawn_blocking(move || {
        with_file(&state, &sid, file, |id, sb, p| {
            let read = match sb.read_limit() {
                Some(rl) => rl
                    .read_file_limit(p, MAX_BODY)
                    .map(|o| (o.data, o.truncated)),
                None => sb.read_file(p).map(|d| (d, false)),
            };
            if let Ok((data, truncated)) = &read {
                audit_file(&state, id, p, FileOp::read(data, *truncated));
            }
            read
        })
    })
    .await;
    match read {
        Ok(Ok((data, truncated))) => {
            let mut r = with_body(
                200,
                "application/octet-stream",
                Full::new(Bytes::from(data)).boxed(),
            );
            r.headers_mut().insert(
                "x-hako-truncated",
                HeaderValue::from_static(if truncated { "true" } else { "false" }),
            );
            r
        }
        Ok(Err(r)) => response(r),
        Err(e) => {
            tracing::warn!("hako serve: a request handler failed: {e}");
            response(error(
                500,
                "internal",
                "the request failed inside the server",
            ))
        }
    }
}

/// `PUT /v1/sandboxes/{id}/files?path=`, once its whole body is read:
/// missing parent directories are made first, through the fence (the
/// core's one `write_file_creating_parents`, as every front end writes),
/// and recorded.
pub(crate) fn write(state: &State, sid: &str, file: Option<String>, body: &[u8]) -> Reply {
    let r = with_file(state, sid, file, |id, sb, p| {
        let made = hako_core::write_file_creating_parents(sb, p, body)?;
        if let Some(parent) = &made {
            audit_file(state, id, parent, FileOp::MakeDir);
        }
        audit_file(state, id, p, FileOp::write(body));
        Ok(made.is_some())
    });
    r.map(|made| reply(200, json!({"written": body.len(), "created_dirs": made})))
        .unwrap_or_else(|r| r)
}

/// `POST /v1/sandboxes/{id}/dir?path=`: `mkdir -p` through the fence.
pub(crate) fn make_dir(state: &State, sid: &str, file: Option<String>) -> Reply {
    let r = with_file(state, sid, file, |id, sb, p| {
        let Some(mkdir) = sb.make_dir_all() else {
            return Err(unsupported(sb, "make_dir_all"));
        };
        mkdir.make_dir_all(p)?;
        audit_file(state, id, p, FileOp::MakeDir);
        Ok(())
    });
    r.map(|()| reply(200, json!({"ok": true})))
        .unwrap_or_else(|r| r)
}

/// `GET /v1/sandboxes/{id}/stat?path=`: the path's own metadata (a
/// symlink is reported as one, not followed).
pub(crate) fn stat(state: &State, sid: &str, file: Option<String>) -> Reply {
    let shown = file.clone().unwrap_or_default();
    let r = with_file(state, sid, file, |_, sb, p| match sb.stat() {
        Some(stat) => stat.stat(p),
        None => Err(unsupported(sb, "stat")),
    });
    r.map(|m| {
        let kind = match m.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            _ => "other",
        };
        let modified_ms = m.mtime.checked_mul(1000);
        reply(
            200,
            json!({
                "path": shown,
                "kind": kind,
                "size": m.size,
                "mode": m.mode,
                "modified_ms": modified_ms,
                "links": m.links,
                "symlink_target": m.symlink_target.as_ref().map(|t| t.to_string_lossy()),
            }),
        )
    })
    .unwrap_or_else(|r| r)
}

/// The error for a sandbox without `capability`.
fn unsupported(sb: &dyn Sandbox, capability: &'static str) -> hako_core::Error {
    hako_core::Error::Unsupported {
        backend: sb.capabilities().backend.clone(),
        capability,
    }
}

/// `DELETE /v1/sandboxes/{id}/files?path=`.
pub(crate) fn remove(state: &State, sid: &str, file: Option<String>) -> Reply {
    let r = with_file(state, sid, file, |id, sb, p| {
        sb.remove(p)?;
        audit_file(state, id, p, FileOp::Remove);
        Ok(())
    });
    r.map(|()| reply(200, json!({"removed": true})))
        .unwrap_or_else(|r| r)
}

/// `GET /v1/sandboxes/{id}/dir?path=` (the workspace without one).
pub(crate) fn list(state: &State, sid: &str, file: Option<String>) -> Reply {
    let file = file.or_else(|| Some(".".into()));
    let r = with_file(state, sid, file, |_, sb, p| sb.list_dir(p));
    let r = r.map(|listing| {
        let entries: Vec<Value> = listing
            .entries
            .iter()
            .map(|e| json!({"name": e.name.to_string_lossy(), "kind": e.kind, "size": e.size, "mode": e.mode, "mtime": e.mtime}))
            .collect();
        reply(200, json!({"entries": entries, "truncated": listing.truncated}))
    });
    r.unwrap_or_else(|r| r)
}
