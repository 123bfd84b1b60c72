//! The sandboxes a client opens (at most
//! [`ServeConfig::max_sandboxes`](crate::ServeConfig::max_sandboxes)), lists, looks
//! at and closes, and the shell sessions in them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hako_audit::{FrontEnd, Record, SandboxOpened, Session, SessionOp};
use hako_core::{Sandbox, SessionId, SessionOptions};
use serde_json::{json, Value};

use crate::reply::{error, from_error, no_sandbox, reply, Reply};
use crate::state::{self, audit, table, with_sandbox, State};

/// The body of `POST /v1/sandboxes`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// With `--cow`: keep the sandbox's layers as this named sandbox.
    name: Option<String>,
}

/// `POST /v1/sandboxes` (`{"name": N}` with `--cow`): opens one with the
/// server's factory; with `--cow`, on layers of its own (a temporary one,
/// or the named sandbox `N`, locked while it is open).
pub(crate) fn create(state: &State, body: &[u8]) -> Reply {
    let body: CreateBody = if body.iter().all(u8::is_ascii_whitespace) || body == b"null" {
        CreateBody::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                return error(
                    400,
                    "bad_request",
                    format!("the body is not {{\"name\": NAME}}: {e}"),
                )
            }
        }
    };
    if body.name.is_some() && state.config.cow.is_none() {
        return error(
            400,
            "not_cow",
            "a name keeps a copy-on-write sandbox's layers; this server's sandboxes are not copy-on-write (hako serve --cow)",
        );
    }
    // The place is taken under the lock, before the (slow) factory runs:
    // concurrent creates cannot pass the limit between check and insert.
    {
        let mut t = table(state);
        let max = state.config.max_sandboxes;
        if t.open.len() + t.opening >= max {
            return error(
                429,
                "too_many_sandboxes",
                format!(
                    "{max} sandboxes are open, the most this server allows \
                     (hako serve --max-sandboxes); close one first"
                ),
            );
        }
        t.opening += 1;
    }
    // Given back if the factory panics, too.
    let mut place = Opening { state, taken: true };
    let made = match &state.config.cow {
        None => (state.config.make_sandbox)().map(|sb| (sb, None)),
        Some(cow) => match (cow.layers)(body.name.as_deref()) {
            Ok(layers) => (cow.open_on)(Arc::clone(&layers)).map(|sb| (sb, Some(layers))),
            Err(e) => {
                drop(place);
                return layers_refused(state, &e);
            }
        },
    };
    let mut t = table(state);
    t.opening -= 1;
    place.taken = false;
    match made {
        Ok((sb, layers)) => {
            let id = state.next.fetch_add(1, Ordering::SeqCst);
            let caps = sb.capabilities().clone();
            let workdir = sb.workdir().map(|w| w.workdir().to_path_buf());
            t.open.insert(id, Arc::from(sb));
            let cow = cow_json(layers.as_deref());
            if let Some(layers) = layers {
                t.layers.insert(id, layers);
            }
            drop(t);
            let mut opened = SandboxOpened::new(FrontEnd::Serve, Some(id), &caps);
            opened.workdir = workdir;
            audit(state, Record::SandboxOpened(opened));
            reply(201, json!({"id": id, "capabilities": caps, "cow": cow}))
        }
        Err(e) => {
            drop(t);
            // A sandbox that would not open is recorded too.
            let failure = hako_audit::Failure::new(FrontEnd::Serve, &e.to_string());
            audit(state, failure.record(hako_audit::is_refusal(&e)));
            from_error(&e)
        }
    }
}

/// What a sandbox's answer says of its layers: `null` without `--cow`,
/// else `{"name": N}` (`null` for a temporary layer).
fn cow_json(layers: Option<&hako_runtime::CowHold>) -> Value {
    match layers {
        None => Value::Null,
        Some(l) => json!({ "name": l.name() }),
    }
}

/// The answer when a sandbox's layers could not be made: `400` for a
/// name hako does not accept, `409` `name_in_use` for a named sandbox
/// another sandbox or process holds, `500` otherwise; recorded.
fn layers_refused(state: &State, e: &hako_runtime::cow::StateError) -> Reply {
    use hako_runtime::cow::StateError;
    let (status, kind, refused) = match e {
        StateError::InvalidName { .. } => (400, "bad_name", true),
        StateError::Busy { .. } => (409, "name_in_use", true),
        StateError::InsideSandbox { .. }
        | StateError::NotPrivate { .. }
        | StateError::BindOverlapsWorkspace { .. } => (403, "policy", true),
        StateError::WorkspaceMoved { .. } => (409, "workspace_moved", true),
        _ => (500, "state_failed", false),
    };
    let failure = hako_audit::Failure::new(FrontEnd::Serve, &e.to_string());
    audit(state, failure.record(refused));
    error(status, kind, e.to_string())
}

/// A place in the table taken by a sandbox being opened.
struct Opening<'a> {
    state: &'a State,
    taken: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.taken {
            table(self.state).opening -= 1;
        }
    }
}

/// `GET /v1/sandboxes`: every open sandbox, by id.
pub(crate) fn list(state: &State) -> Reply {
    let mut all: Vec<(u64, Arc<dyn Sandbox>)> = table(state)
        .open
        .iter()
        .map(|(id, sb)| (*id, Arc::clone(sb)))
        .collect();
    all.sort_by_key(|(id, _)| *id);
    let list: Vec<Value> = all
        .into_iter()
        .map(|(id, sb)| json!({"id": id, "capabilities": sb.capabilities()}))
        .collect();
    reply(200, json!({"sandboxes": list}))
}

/// `GET /v1/sandboxes/{id}`.
pub(crate) fn get(state: &State, sid: &str) -> Reply {
    let layers = id(sid).and_then(|n| table(state).layers.get(&n).cloned());
    with_sandbox(state, id(sid), |id, sb| {
        reply(
            200,
            json!({"id": id, "capabilities": sb.capabilities(), "cow": cow_json(layers.as_deref())}),
        )
    })
}

/// `DELETE /v1/sandboxes/{id}`: closes it (everything started in it is
/// killed).
pub(crate) fn close(state: &State, sid: &str) -> Reply {
    let removed = id(sid).and_then(|n| {
        let mut table = table(state);
        table.lost.remove(&n);
        let layers = table.layers.remove(&n);
        table.open.remove(&n).map(|sb| (n, sb, layers))
    });
    match removed {
        Some((n, sb, layers)) => {
            crate::processes::record_killed_at_close(state, n, sb.as_ref());
            let closed = sb.close();
            audit(state, state::closed(n));
            // The layers go once the sandbox is closed (a temporary one
            // is removed when the last request using it ends).
            drop(sb);
            drop(layers);
            match closed {
                Ok(()) => reply(200, json!({"closed": true})),
                Err(e) => from_error(&e),
            }
        }
        None => no_sandbox(sid),
    }
}

/// `POST /v1/sandboxes/{id}/sessions`.
pub(crate) fn open_session(state: &State, sid: &str) -> Reply {
    with_sandbox(state, id(sid), |n, sb| match sb.sessions() {
        Some(s) => match s.open_session(&SessionOptions::default()) {
            Ok(session) => {
                audit(state, session_record(SessionOp::Open, n, session.0));
                reply(200, json!({"session": session.0}))
            }
            Err(e) => {
                state::note_lost(state, n, &e);
                from_error(&e)
            }
        },
        None => error(501, "unsupported", "this sandbox has no sessions"),
    })
}

/// `DELETE /v1/sandboxes/{id}/sessions/{session}`.
pub(crate) fn close_session(state: &State, sid: &str, session: &str) -> Reply {
    let Some(session) = id(session) else {
        return error(400, "bad_request", "a session is a number");
    };
    with_sandbox(state, id(sid), |n, sb| match sb.sessions() {
        Some(s) => match s.close_session(SessionId(session)) {
            Ok(()) => {
                audit(state, session_record(SessionOp::Close, n, session));
                reply(200, json!({"closed": true}))
            }
            Err(e) => {
                state::note_lost(state, n, &e);
                from_error(&e)
            }
        },
        None => error(501, "unsupported", "this sandbox has no sessions"),
    })
}

fn session_record(op: SessionOp, sandbox: u64, session: u64) -> Record {
    Record::Session(Session {
        op,
        session,
        sandbox: Some(sandbox),
    })
}

/// A sandbox's or a session's id as the path gives it.
fn id(s: &str) -> Option<u64> {
    s.parse::<u64>().ok()
}
