//! The bearer token every request must carry, and the DNS-rebinding
//! defence on a loopback address: both the runtime's, shared with `hako
//! mcp --http`.

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};

use crate::reply::{error, Reply};
use crate::state::State;

/// Whether the request carries the server's bearer token (exactly one
/// `Authorization: Bearer TOKEN`, the scheme in any case; the token
/// compared by its SHA-256 digest, in constant time), or why not. A
/// server in SWE-ReX mode also takes the token as SWE-ReX's client sends
/// it (see [`crate::swerex::api_key`]).
pub(crate) fn authorized(
    state: &State,
    headers: &HeaderMap,
) -> Result<(), hako_runtime::http::TokenRefusal> {
    if state.config.swerex || state.config.e2b.is_some() {
        if let Some(checked) = crate::swerex::api_key(state, headers) {
            return checked;
        }
    }
    hako_runtime::http::check_token(
        headers.get_all(AUTHORIZATION).iter().map(|v| v.as_bytes()),
        &state.token,
    )
}

/// The answer to a request without the right token (it touched nothing):
/// `401`, saying whether the token was missing or wrong.
pub(crate) fn unauthorized(why: hako_runtime::http::TokenRefusal) -> Reply {
    error(401, "unauthorized", why.message())
}

/// On a loopback address: the `Host` must name this server and no
/// `Origin` may come (a browser page's request); `403` otherwise.
pub(crate) fn same_origin(state: &State, headers: &HeaderMap) -> Result<(), Reply> {
    let Some(local) = state.local else {
        return Ok(());
    };
    hako_runtime::http::check_host_and_origin(
        local,
        headers.get(HOST).map(|v| v.as_bytes()),
        headers.contains_key(ORIGIN),
    )
    .map_err(|why| error(403, "forbidden_host", why))
}
