//! The JSON shapes the API answers with: errors (status and kind), a
//! command's result, and the responses that carry them.

use std::convert::Infallible;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hako_core::{Error, Output};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::MAX_BODY;

/// An answer: status and JSON body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

/// An answer with `status` and `body`.
pub(crate) fn reply(status: u16, body: Value) -> Reply {
    Reply { status, body }
}

/// An error answer: `{"error": message, "kind": kind}`.
pub(crate) fn error(status: u16, kind: &str, message: impl Into<String>) -> Reply {
    reply(status, json!({"error": message.into(), "kind": kind}))
}

/// The status and kind a sandbox error answers with.
pub(crate) fn from_error(e: &Error) -> Reply {
    let (status, kind) = match e {
        Error::Fence(f) => match f {
            hako_core::FenceError::NotFound { .. } => (404, "not_found"),
            hako_core::FenceError::FileTooLarge { .. } => (413, "too_large"),
            hako_core::FenceError::Io { .. } => (500, "io"),
            _ => (403, "refused"),
        },
        Error::CommandNotFound { .. } => (422, "command_not_found"),
        Error::CannotExecute { .. } => (422, "cannot_execute"),
        Error::InvalidCommand { .. } => (400, "invalid_command"),
        Error::SessionNotOpen { .. } => (404, "no_such_session"),
        Error::NoSuchProcess { .. } => (404, "no_such_process"),
        Error::SessionBusy { .. } => (409, "session_busy"),
        Error::Closed => (410, "closed"),
        Error::SandboxLost { .. } => (502, "sandbox_lost"),
        Error::Unsupported { .. } => (501, "unsupported"),
        Error::LimitReached { .. } => (429, "too_many"),
        Error::OutOfResources { .. } => (503, "out_of_resources"),
        Error::IsolationTooWeak { .. }
        | Error::NetworkUnavailable { .. }
        | Error::BadNetworkPolicy { .. } => (403, "policy"),
        _ => (502, "sandbox_failed"),
    };
    error(status, kind, e.to_string())
}

/// The answer to a body over [`MAX_BODY`].
pub(crate) fn too_large() -> Reply {
    error(
        413,
        "too_large",
        format!("the body is over {MAX_BODY} bytes"),
    )
}

/// The answer when every slot of a pool is taken.
pub(crate) fn busy(what: &str) -> Reply {
    error(
        503,
        "busy",
        format!("the server is serving as many {what} as it allows; retry shortly"),
    )
}

/// The answer to a body shorter than its Content-Length.
pub(crate) fn cut_short(got: usize, declared: u64) -> Reply {
    error(
        400,
        "body_cut_short",
        format!(
            "the body ended after {got} of the {declared} bytes its Content-Length declared; nothing was done"
        ),
    )
}

/// The answer for a sandbox id that is not open.
pub(crate) fn no_sandbox(sid: &str) -> Reply {
    error(404, "no_such_sandbox", format!("no sandbox {sid}"))
}

/// How output bytes are put in JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Encoding {
    /// As text: bytes that are not UTF-8 are replaced (U+FFFD).
    #[default]
    Utf8,
    /// Base64 (standard alphabet, padded) of the raw bytes.
    Base64,
}

impl Encoding {
    /// `bytes` as a JSON string in this encoding.
    pub(crate) fn text(self, bytes: &[u8]) -> Value {
        match self {
            Encoding::Utf8 => Value::String(String::from_utf8_lossy(bytes).into_owned()),
            Encoding::Base64 => Value::String(BASE64.encode(bytes)),
        }
    }

    /// Its name in a query (`utf8` or `base64`), or the answer for another.
    pub(crate) fn parse(name: &str) -> Result<Self, Reply> {
        match name {
            "utf8" => Ok(Encoding::Utf8),
            "base64" => Ok(Encoding::Base64),
            other => Err(error(
                400,
                "bad_request",
                format!("encoding is {other:?}; give utf8 or base64"),
            )),
        }
    }
}

/// Decodes the base64 of a request's `field`, or answers why not.
pub(crate) fn from_base64(field: &str, text: &str) -> Result<Vec<u8>, Reply> {
    BASE64.decode(text).map_err(|e| {
        error(
            400,
            "bad_request",
            format!("{field} is not base64 (standard alphabet, padded): {e}"),
        )
    })
}

/// A command's result as the API answers it, its output in `encoding`.
pub(crate) fn output_json(out: &Output, encoding: Encoding) -> Value {
    json!({
        "exit_code": out.status.code(),
        "signal": out.status.signal(),
        "stdout": encoding.text(&out.stdout),
        "stderr": encoding.text(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "stdout_bytes": out.stdout_total,
        "stderr_bytes": out.stderr_total,
        "duration_ms": u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
        "timed_out": out.timed_out,
        "oom_killed": out.oom_killed,
    })
}

/// A response body: whole, or streamed.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// A response of `status` with `body` of `content_type`.
pub(crate) fn with_body(status: u16, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

/// `r` as a JSON response (`401` with its `WWW-Authenticate`).
pub(crate) fn response(r: Reply) -> Response<Body> {
    let body = Full::new(Bytes::from(r.body.to_string())).boxed();
    let mut response = with_body(r.status, "application/json", body);
    if r.status == 401 {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// An answer after which the connection is closed: its body was not (all)
/// read, and is not read.
pub(crate) fn closing(r: Reply) -> Response<Body> {
    let mut response = response(r);
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    response
}
