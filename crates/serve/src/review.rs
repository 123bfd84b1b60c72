//! The review routes of a copy-on-write sandbox (`hako serve --cow`):
//! its changes, checkpoints, rollback, and, only with
//! `--allow-agent-commit`, commit and discard. Each writes the same
//! `review` audit record `hako commit` writes (`front_end` `serve`, the
//! sandbox's id).
//!
//! Reading the changes and taking a checkpoint read the upper layer
//! while the sandbox runs. Rollback, commit and discard change the layers
//! or the workspace, which no mounted sandbox may see change under it:
//! the sandbox is closed (every process and session in it ends; a request
//! still using it gets `410`), the layers changed, and another sandbox
//! opened on them under the same id.

use std::path::PathBuf;
use std::sync::Arc;

use hako_audit::{FrontEnd, Record, SandboxOpened};
use hako_runtime::cow::{commit_op, discard_op, ReviewError};
use hako_runtime::CowHold;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::reply::{error, from_error, no_sandbox, reply, Reply};
use crate::state::{self, audit, table, State};

/// The most bytes of a unified diff one answer carries (the entries and
/// the hash are of every change).
const MAX_DIFF: usize = 16 << 20;

/// The most entries one answer lists.
const MAX_ENTRIES: usize = 100_000;

/// The sandbox `sid`'s layers, or the answer: `404` for no such
/// sandbox, `400` `not_cow` for one without layers.
fn layers_of(state: &State, sid: &str) -> Result<(u64, Arc<CowHold>), Reply> {
    let n = sid.parse::<u64>().map_err(|_| no_sandbox(sid))?;
    let t = table(state);
    if !t.open.contains_key(&n) {
        return Err(no_sandbox(sid));
    }
    match t.layers.get(&n) {
        Some(layers) => Ok((n, Arc::clone(layers))),
        None => Err(not_cow()),
    }
}

/// The answer for a sandbox that is not copy-on-write.
fn not_cow() -> Reply {
    error(
        400,
        "not_cow",
        "this server's sandboxes are not copy-on-write: their changes land in the workspace as they are made; start hako serve with --cow",
    )
}

/// The answer for a review operation that failed.
fn failed(state: &State, id: u64, tool: &str, e: &ReviewError) -> Reply {
    let mut failure = hako_audit::Failure::new(FrontEnd::Serve, &e.to_string());
    failure.sandbox = Some(id);
    failure.tool = Some(tool.to_owned());
    audit(state, failure.record(e.is_refusal()));
    let (status, kind) = if e.is_not_found() {
        (404, "not_found")
    } else if e.is_refusal() {
        (409, "refused")
    } else {
        (500, "review_failed")
    };
    error(status, kind, e.to_string())
}

/// A request body as `T`; an empty body is `T`'s default.
fn body_of<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, Reply> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        error(
            400,
            "bad_request",
            format!("the body is not what this route takes: {e}"),
        )
    })
}

/// `GET /v1/sandboxes/{id}/changes?path=P&from=A&to=B`: the changes (at
/// and beneath each `path`; all without one) from the workspace, or
/// checkpoint `from`, to the sandbox now, or checkpoint `to`.
pub(crate) fn changes(
    state: &State,
    sid: &str,
    paths: Vec<String>,
    from: Option<String>,
    to: Option<String>,
) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    let paths: Vec<PathBuf> = paths.into_iter().map(PathBuf::from).collect();
    match layers.changes(&paths, from.as_deref(), to.as_deref()) {
        Ok(mut changes) => {
            let mut entries = changes.json["changes"].take();
            let listed = entries.as_array().map_or(0, Vec::len);
            if let Some(all) = entries.as_array_mut() {
                all.truncate(MAX_ENTRIES);
            }
            let mut diff = changes.unified;
            let diff_truncated = diff.len() > MAX_DIFF;
            if diff_truncated {
                let mut end = MAX_DIFF;
                while !diff.is_char_boundary(end) {
                    end -= 1;
                }
                diff.truncate(end);
            }
            reply(
                200,
                json!({
                    "hash": changes.hash,
                    "count": changes.count,
                    "stat": changes.stat,
                    "diff": diff,
                    "diff_truncated": diff_truncated,
                    "changes": entries,
                    "changes_truncated": listed > MAX_ENTRIES,
                }),
            )
        }
        Err(e) => failed(state, n, "changes", &e),
    }
}

/// `GET /v1/sandboxes/{id}/checkpoints`.
pub(crate) fn list_checkpoints(state: &State, sid: &str) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    match layers.checkpoints() {
        Ok(all) => reply(200, json!({ "checkpoints": all })),
        Err(e) => failed(state, n, "list_checkpoints", &e),
    }
}

/// The body of `POST /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointBody {
    label: Option<String>,
}

/// `POST /v1/sandboxes/{id}/checkpoints` `{"label": L}`: records the
/// sandbox's layer as it is now.
pub(crate) fn checkpoint(state: &State, sid: &str, body: &[u8]) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    let body: CheckpointBody = match body_of(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    match layers.checkpoint(body.label.as_deref()) {
        Ok(cp) => reply(201, json!(cp)),
        Err(e) => failed(state, n, "checkpoint", &e),
    }
}

/// A checkpoint as a body names it: its number or its label.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Which {
    Number(u64),
    Text(String),
}

/// The body of `POST /v1/sandboxes/{id}/rollback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    checkpoint: Which,
}

impl Default for RollbackBody {
    fn default() -> Self {
        RollbackBody {
            checkpoint: Which::Text(String::new()),
        }
    }
}

/// The body of `POST .../commit` and `.../discard`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathsBody {
    #[serde(default)]
    paths: Vec<String>,
    expect: Option<String>,
}

/// Runs `f` on sandbox `n`'s layers with no sandbox on them: the sandbox
/// is closed, `f` run, and another sandbox opened on the layers under
/// the same id (if it was not deleted meanwhile). The answer says
/// whether it was reopened.
fn with_closed<T>(
    state: &State,
    n: u64,
    layers: &Arc<CowHold>,
    f: impl FnOnce(&CowHold) -> T,
) -> Result<(T, Value), Reply> {
    let Some(cow) = &state.config.cow else {
        return Err(not_cow());
    };
    let _alone = layers.exclusive();
    // The sandbox now (another such operation may have replaced it).
    let Some(old) = state::lookup(state, n) else {
        return Err(no_sandbox(&n.to_string()));
    };
    crate::processes::record_killed_at_close(state, n, old.as_ref());
    let _ = old.close();
    drop(old);
    audit(state, state::closed(n));
    let done = f(layers);
    let reopened = match (cow.open_on)(Arc::clone(layers)) {
        Ok(sb) => {
            let caps = sb.capabilities().clone();
            let workdir = sb.workdir().map(|w| w.workdir().to_path_buf());
            let mut t = table(state);
            if let std::collections::hash_map::Entry::Occupied(mut e) = t.open.entry(n) {
                e.insert(Arc::from(sb));
                t.lost.remove(&n);
                drop(t);
                let mut opened = SandboxOpened::new(FrontEnd::Serve, Some(n), &caps);
                opened.workdir = workdir;
                audit(state, Record::SandboxOpened(opened));
                json!({"reopened": true})
            } else {
                drop(t);
                let _ = sb.close();
                json!({"reopened": false, "why": "the sandbox was deleted meanwhile"})
            }
        }
        Err(e) => {
            // The id names a closed sandbox no more: it is gone.
            let mut t = table(state);
            t.open.remove(&n);
            t.layers.remove(&n);
            t.lost.remove(&n);
            drop(t);
            json!({"reopened": false, "why": from_error(&e).body["error"].clone()})
        }
    };
    Ok((done, reopened))
}

/// `POST /v1/sandboxes/{id}/rollback` `{"checkpoint": N or LABEL}`.
pub(crate) fn rollback(state: &State, sid: &str, body: &[u8]) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    let body: RollbackBody = match body_of(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let which = match body.checkpoint {
        Which::Number(id) => id.to_string(),
        Which::Text(t) if !t.is_empty() => t,
        Which::Text(_) => {
            return error(
                400,
                "bad_request",
                "name the checkpoint: {\"checkpoint\": N or LABEL}",
            )
        }
    };
    let (done, sandbox) = match with_closed(state, n, &layers, |l| l.rollback(&which)) {
        Ok(done) => done,
        Err(r) => return r,
    };
    match done {
        Ok(cp) => {
            let op = hako_audit::ReviewOp::Rollback { checkpoint: cp.id };
            audit(state, layers.record(FrontEnd::Serve, Some(n), op));
            reply(200, json!({"checkpoint": cp, "sandbox": sandbox}))
        }
        Err(e) => failed(state, n, "rollback", &e),
    }
}

/// The answer to a commit or discard without `--allow-agent-commit`.
fn commit_refused(state: &State, n: u64, layers: &CowHold, what: &str) -> Reply {
    let person = match layers.name() {
        Some(name) => format!("`hako commit {name}` (after `hako diff {name}`)"),
        None => "`hako commit NAME` on a sandbox created with a name".to_owned(),
    };
    let message = format!(
        "refused: an agent may not {what} this sandbox's changes; committing stays with the person: {person}. The server was started without --allow-agent-commit, the flag that allows it"
    );
    let mut failure = hako_audit::Failure::new(FrontEnd::Serve, &message);
    failure.sandbox = Some(n);
    failure.tool = Some(what.to_owned());
    audit(state, failure.record(true));
    error(403, "agent_commit_refused", message)
}

/// `POST /v1/sandboxes/{id}/commit` `{"paths": [...], "expect": HASH}`.
pub(crate) fn commit(state: &State, sid: &str, body: &[u8]) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    if !state.config.allow_agent_commit {
        return commit_refused(state, n, &layers, "commit");
    }
    let body: PathsBody = match body_of(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let paths: Vec<PathBuf> = body.paths.into_iter().map(PathBuf::from).collect();
    let (result, sandbox) = match with_closed(state, n, &layers, |l| {
        l.commit(&paths, body.expect.as_deref())
    }) {
        Ok(done) => done,
        Err(r) => return r,
    };
    // What was written is recorded, whatever the outcome.
    if let Some(op) = commit_op(&result) {
        audit(state, layers.record(FrontEnd::Serve, Some(n), op));
    }
    match result {
        Ok(report) => reply(
            200,
            json!({"hash": report.hash, "applied": report.applied, "sandbox": sandbox}),
        ),
        Err(e) => failed(state, n, "commit", &e),
    }
}

/// `POST /v1/sandboxes/{id}/discard` `{"paths": [...]}`.
pub(crate) fn discard(state: &State, sid: &str, body: &[u8]) -> Reply {
    let (n, layers) = match layers_of(state, sid) {
        Ok(found) => found,
        Err(r) => return r,
    };
    if !state.config.allow_agent_commit {
        return commit_refused(state, n, &layers, "discard");
    }
    let body: PathsBody = match body_of(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.expect.is_some() {
        return error(400, "bad_request", "discard takes no `expect`");
    }
    let paths: Vec<PathBuf> = body.paths.into_iter().map(PathBuf::from).collect();
    let (result, sandbox) = match with_closed(state, n, &layers, |l| l.discard(&paths)) {
        Ok(done) => done,
        Err(r) => return r,
    };
    match result {
        Ok(removed) => {
            audit(
                state,
                layers.record(FrontEnd::Serve, Some(n), discard_op(&removed)),
            );
            let shown: Vec<String> = removed
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            reply(200, json!({"discarded": shown, "sandbox": sandbox}))
        }
        Err(e) => failed(state, n, "discard", &e),
    }
}
