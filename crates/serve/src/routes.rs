//! Routing: the token and the body's size checked first, a slot taken
//! from the request's pool, then the route's handler; the request's path
//! and body read strictly.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Method, Request, Response};
use serde_json::{json, Value};

use crate::auth::{authorized, same_origin, unauthorized};
use crate::exec::exec;
use crate::files::with_file;
use crate::reply::{
    busy, closing, cut_short, error, no_sandbox, reply, response, too_large, Body, Reply,
};
use crate::state::{lookup, State};
use crate::{files, processes, review, sandboxes};
use crate::{MAX_BODY, OPENAPI};

/// What a route costs: the pool its slot comes from, if any.
enum Cost {
    /// Answered from memory (health, the API description).
    Free,
    /// Runs a command.
    Exec,
    /// Moves a file (up to [`MAX_BODY`] bytes in memory).
    Transfer,
    /// May wait on a long-lived process (its end, or more output).
    Wait,
    /// Anything else.
    Request,
}

/// Which pool a route's slot comes from.
fn cost(method: &Method, parts: &[&str]) -> Cost {
    match (method, parts) {
        (&Method::GET, ["v1", "health" | "openapi.json"]) => Cost::Free,
        (&Method::POST, ["v1", "sandboxes", _, "exec"]) => Cost::Exec,
        (&Method::GET | &Method::PUT, ["v1", "sandboxes", _, "files"]) => Cost::Transfer,
        (&Method::GET, ["v1", "sandboxes", _, "processes", _, "output"])
        | (&Method::POST, ["v1", "sandboxes", _, "processes", _, "wait"]) => Cost::Wait,
        _ => Cost::Request,
    }
}

/// The request's declared body length: `Ok(None)` without one, `Err` for
/// one that is not a number.
pub(crate) fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    match headers.get(CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// Runs blocking sandbox work on tokio's blocking threads; a panic in it
/// is a `500`.
pub(crate) async fn blocking(f: impl FnOnce() -> Reply + Send + 'static) -> Reply {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        tracing::warn!("hako serve: a request handler failed: {e}");
        error(500, "internal", "the request failed inside the server")
    })
}

/// Answers one request: the token and the declared length first, then a
/// slot, then the route.
pub(crate) async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    // Before anything else, the body included.
    let authorized = authorized(&state, request.headers());
    let declared = declared_length(request.headers());
    if declared.is_ok_and(|n| n.is_some_and(|n| n > MAX_BODY)) {
        return closing(match authorized {
            Ok(()) => too_large(),
            Err(why) => unauthorized(why),
        });
    }
    if let Err(why) = authorized {
        return closing(unauthorized(why));
    }
    // The DNS-rebinding defence, on a loopback address.
    if let Err(r) = same_origin(&state, request.headers()) {
        return closing(r);
    }
    let Ok(declared) = declared else {
        return closing(error(
            400,
            "bad_request",
            "the Content-Length is not a number",
        ));
    };
    let (head, body) = request.into_parts();
    let method = head.method;
    let url = head
        .uri
        .path_and_query()
        .map_or_else(|| head.uri.path().to_string(), |p| p.as_str().to_string());
    let (path, file) = split(&url);
    let path = path.to_string();
    let parts: Vec<String> = path
        .trim_end_matches('/')
        .split('/')
        .skip(1)
        .map(str::to_string)
        .collect();
    let parts_ref: Vec<&str> = parts.iter().map(String::as_str).collect();
    // A slot for the whole request (for a streamed command, until it ends).
    let slot = match cost(&method, &parts_ref) {
        Cost::Free => None,
        Cost::Exec => match state.execs.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("commands")),
        },
        Cost::Request => match state.requests.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("requests")),
        },
        Cost::Transfer => match state.transfers.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("file transfers")),
        },
        Cost::Wait => match state.waits.try_take() {
            Some(slot) => Some(slot),
            None => return response(busy("waits on processes")),
        },
    };
    let file = match file {
        Ok(file) => file,
        Err(r) => return response(r),
    };
    let chunked = head.headers.contains_key(TRANSFER_ENCODING);
    let id = |s: &str| s.parse::<u64>().ok();
    match (&method, parts_ref.as_slice()) {
        (&Method::GET, ["v1", "health"]) => response(reply(200, json!({"ok": true}))),
        (&Method::GET, ["v1", "openapi.json"]) => {
            let body: Value = serde_json::from_str(OPENAPI).unwrap_or(Value::Null);
            response(reply(200, body))
        }
        (&Method::POST, ["v1", "sandboxes", sid, "exec"]) => {
            let Some((n, sb)) = id(sid).and_then(|n| lookup(&state, n).map(|sb| (n, sb))) else {
                return response(no_sandbox(sid));
            };
            let body = match read_body(&state, body, declared, chunked, false).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            exec(state, n, sb, &body, slot).await
        }
        (&Method::GET, ["v1", "sandboxes", sid, "files"]) => {
            files::read(state, sid.to_string(), file).await
        }
        (&Method::PUT, ["v1", "sandboxes", sid, "files"]) => {
            // The sandbox and the path first: a body is read only for a
            // write that can happen.
            if let Err(r) = with_file(&state, sid, file.clone(), |_, _, _| Ok(())) {
                return response(r);
            }
            // A body cut short must not replace the file: its length has
            // to be known to tell (a chunked body that ends early looks
            // complete).
            let body = match read_body(&state, body, declared, chunked, true).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let sid = sid.to_string();
            response(
                blocking(move || {
                    let _slot = slot;
                    files::write(&state, &sid, file, &body)
                })
                .await,
            )
        }
        _ => {
            // A POST's body is small JSON (a name, a label, paths), read
            // within the same bounds as any other.
            let body = if method == Method::POST {
                match read_body(&state, body, declared, chunked, false).await {
                    Ok(b) => b,
                    Err(r) => return r,
                }
            } else {
                drop(body);
                Vec::new()
            };
            let query = url.split_once('?').map(|(_, q)| q.to_string());
            response(
                blocking(move || {
                    let _slot = slot;
                    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                    let request = Routed {
                        path: &path,
                        file,
                        query: query.as_deref().unwrap_or(""),
                        body: &body,
                    };
                    route(&state, &method, &parts, request)
                })
                .await,
            )
        }
    }
}

/// What [`route`] needs of a request.
pub(crate) struct Routed<'a> {
    /// The path, without the query.
    pub(crate) path: &'a str,
    /// The query's `path=` value, decoded.
    pub(crate) file: Option<String>,
    /// The query, as sent.
    pub(crate) query: &'a str,
    /// The body (read for a POST only).
    pub(crate) body: &'a [u8],
}

/// The routes answered with JSON after blocking sandbox work, with at
/// most a small body.
pub(crate) fn route(state: &State, method: &Method, parts: &[&str], request: Routed<'_>) -> Reply {
    let Routed {
        path,
        file,
        query,
        body,
    } = request;
    match (method, parts) {
        (&Method::GET, ["v1", "sandboxes"]) => sandboxes::list(state),
        (&Method::POST, ["v1", "sandboxes"]) => sandboxes::create(state, body),
        (&Method::GET, ["v1", "sandboxes", sid, "changes"]) => {
            let values = |key: &str| query_values(query, key);
            match (values("path"), values("from"), values("to")) {
                (Ok(paths), Ok(from), Ok(to)) => review::changes(
                    state,
                    sid,
                    paths,
                    from.into_iter().next(),
                    to.into_iter().next(),
                ),
                (Err(r), _, _) | (_, Err(r), _) | (_, _, Err(r)) => r,
            }
        }
        (&Method::GET, ["v1", "sandboxes", sid, "checkpoints"]) => {
            review::list_checkpoints(state, sid)
        }
        (&Method::POST, ["v1", "sandboxes", sid, "checkpoints"]) => {
            review::checkpoint(state, sid, body)
        }
        (&Method::POST, ["v1", "sandboxes", sid, "rollback"]) => review::rollback(state, sid, body),
        (&Method::POST, ["v1", "sandboxes", sid, "commit"]) => review::commit(state, sid, body),
        (&Method::POST, ["v1", "sandboxes", sid, "discard"]) => review::discard(state, sid, body),
        (&Method::GET, ["v1", "sandboxes", sid]) => sandboxes::get(state, sid),
        (&Method::DELETE, ["v1", "sandboxes", sid]) => sandboxes::close(state, sid),
        (&Method::DELETE, ["v1", "sandboxes", sid, "files"]) => files::remove(state, sid, file),
        (&Method::GET, ["v1", "sandboxes", sid, "dir"]) => files::list(state, sid, file),
        (&Method::POST, ["v1", "sandboxes", sid, "dir"]) => files::make_dir(state, sid, file),
        (&Method::GET, ["v1", "sandboxes", sid, "stat"]) => files::stat(state, sid, file),
        (&Method::GET, ["v1", "sandboxes", sid, "processes"]) => processes::list(state, sid),
        (&Method::POST, ["v1", "sandboxes", sid, "processes"]) => {
            processes::spawn(state, sid, body)
        }
        (&Method::GET, ["v1", "sandboxes", sid, "processes", p]) => processes::get(state, sid, p),
        (&Method::GET, ["v1", "sandboxes", sid, "processes", p, "output"]) => {
            match query_pairs(query) {
                Ok(q) => processes::output(state, sid, p, &q),
                Err(r) => r,
            }
        }
        (&Method::POST, ["v1", "sandboxes", sid, "processes", p, "stdin"]) => {
            processes::stdin(state, sid, p, body)
        }
        (&Method::POST, ["v1", "sandboxes", sid, "processes", p, "kill"]) => {
            processes::kill(state, sid, p)
        }
        (&Method::POST, ["v1", "sandboxes", sid, "processes", p, "wait"]) => {
            match query_pairs(query) {
                Ok(q) => processes::wait(state, sid, p, &q),
                Err(r) => r,
            }
        }
        (&Method::POST, ["v1", "sandboxes", sid, "sessions"]) => {
            sandboxes::open_session(state, sid)
        }
        (&Method::DELETE, ["v1", "sandboxes", sid, "sessions", session]) => {
            sandboxes::close_session(state, sid, session)
        }
        _ => error(
            404,
            "no_such_route",
            format!("no route {} {path}", method.as_str()),
        ),
    }
}

/// A request path split from its query, with the query's `path=` value
/// percent-decoded (or the answer for a value that cannot be a path).
fn split(url: &str) -> (&str, Result<Option<String>, Reply>) {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let value = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "path")
        .map(|(_, v)| percent_decode(v))
        .transpose()
        .map_err(|why| error(400, "bad_path", format!("the query's path {why}")));
    (path, value)
}

/// Every value of `key` in `query`, percent-decoded (or the answer for
/// one that cannot be a path).
fn query_values(query: &str, key: &str) -> Result<Vec<String>, Reply> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| {
            percent_decode(v)
                .map_err(|why| error(400, "bad_path", format!("the query's {key} {why}")))
        })
        .collect()
}

/// Every key and value of `query`, percent-decoded (or the answer for
/// one that cannot be decoded).
fn query_pairs(query: &str) -> Result<Vec<(String, String)>, Reply> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| match (percent_decode(k), percent_decode(v)) {
            (Ok(k), Ok(v)) => Ok((k, v)),
            (Err(why), _) | (_, Err(why)) => {
                Err(error(400, "bad_request", format!("the query's {k} {why}")))
            }
        })
        .collect()
}

/// Decodes `%XX` escapes (and `+`, a space in a query). Strict: a `%` not
/// followed by two hex digits, a NUL byte or bytes that are not UTF-8 are
/// an error, never replaced, so that the path used is always the path
/// sent.
pub(crate) fn percent_decode(s: &str) -> Result<String, &'static str> {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => match (bytes.next().and_then(hex), bytes.next().and_then(hex)) {
                (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                _ => return Err("has a % not followed by two hex digits"),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    if out.contains(&0) {
        return Err("contains a NUL byte");
    }
    String::from_utf8(out).map_err(|_| "is not UTF-8 once decoded")
}

/// Reads a request's body: at most [`MAX_BODY`] bytes (a larger declared
/// length never gets here), and, when the request declared its length,
/// exactly that many: a body cut short is an error, not a shorter body.
/// With `need_length`, a body of unknown length (chunked) is refused. A
/// body that stalls for the configured body timeout gets `408`. The error
/// is a whole answer, which closes the connection when the body was not
/// all read.
pub(crate) async fn read_body(
    state: &State,
    mut incoming: Incoming,
    declared: Option<u64>,
    chunked: bool,
    need_length: bool,
) -> Result<Vec<u8>, Response<Body>> {
    if need_length && declared.is_none() && chunked {
        return Err(closing(error(
            411,
            "length_required",
            "give the body's Content-Length (a chunked body that ends early could not be told from a whole one)",
        )));
    }
    let mut body = Vec::new();
    loop {
        let frame = match tokio::time::timeout(state.config.body_timeout, incoming.frame()).await {
            Err(_) => {
                return Err(closing(error(
                    408,
                    "timeout",
                    format!(
                        "the body stalled for {} ms; nothing was done",
                        state.config.body_timeout.as_millis()
                    ),
                )))
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => {
                if let Some(n) = declared {
                    return Err(closing(cut_short(body.len(), n)));
                }
                return Err(closing(error(
                    400,
                    "bad_request",
                    format!("cannot read the body: {e}"),
                )));
            }
        };
        if let Ok(data) = frame.into_data() {
            body.extend_from_slice(&data);
            if body.len() as u64 > MAX_BODY {
                return Err(closing(too_large()));
            }
        }
    }
    if let Some(n) = declared {
        if body.len() as u64 != n {
            return Err(closing(cut_short(body.len(), n)));
        }
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn percent_decoding_is_strict_and_never_replaces_bytes() {
        assert_eq!(percent_decode("%2e%2E%2fx").unwrap(), "../x");
        assert_eq!(percent_decode("caf%C3%A9+au+lait").unwrap(), "café au lait");
        assert_eq!(percent_decode("100%25").unwrap(), "100%");
        for bad in [
            "%", "%2", "a%2", "%zz", "%+1", "%-1", "%\u{e9}1", "%ff", "a%c3", "x%00y",
        ] {
            assert!(percent_decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_query_path_is_found_among_other_keys_and_a_bad_one_is_an_answer() {
        let (path, file) = split("/v1/sandboxes/1/files?x=1&path=a%2Fb&path=c");
        assert_eq!(path, "/v1/sandboxes/1/files");
        assert_eq!(file.ok().flatten().as_deref(), Some("a/b"));
        let (_, file) = split("/v1/x?path=a%ff");
        assert_eq!(file.err().map(|r| r.status), Some(400));
        let (_, file) = split("/v1/x");
        assert!(matches!(file, Ok(None)));
    }
}
