//! The bearer token every request must carry.

use hyper::header::{HeaderMap, AUTHORIZATION};

use crate::reply::{error, Reply};
use crate::state::State;

/// Whether the request carries the server's bearer token. The scheme is
/// matched without regard to case (RFC 9110); the token is compared by
/// its SHA-256 digest, in constant time.
pub(crate) fn authorized(state: &State, headers: &HeaderMap) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .is_some_and(|t| state.token.matches(t.trim().as_bytes()))
}

/// The answer to a request without the token (it touched nothing).
pub(crate) fn unauthorized() -> Reply {
    error(
        401,
        "unauthorized",
        "a bearer token is required (Authorization: Bearer TOKEN)",
    )
}
