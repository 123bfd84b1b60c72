//! The same MCP server over MCP's streamable HTTP transport (`hako mcp
//! --http ADDR`): the same tools, the same one sandbox (opened on the first
//! tool call of any session, shared by every session) and the same audit
//! log, served with rmcp's `StreamableHttpService` on a bare hyper HTTP/1
//! server.
//!
//! The server runs commands, so reaching the port must not be enough.
//! Each request passes, in order:
//! 1. the bearer token: `Authorization: Bearer TOKEN`, compared in
//!    constant time, checked before anything else reads the request. A
//!    request without it gets 401 and touches nothing: no body is read, no
//!    session is created, no sandbox is opened. The header is then removed,
//!    so the token never reaches the handlers (rmcp hands the request's
//!    parts to them);
//! 2. the path: only [`MCP_PATH`];
//! 3. the body's declared size: more than [`MAX_BODY_BYTES`] gets 413
//!    before it is read (rmcp enforces the same bound while it reads, for
//!    chunked bodies);
//! 4. the DNS-rebinding defence (the runtime's, which `hako serve` uses
//!    too; checked right after the token): on a loopback address, a `Host`
//!    that is not the listen address or `localhost` (with the port, or
//!    none) gets 403, and so does any request carrying an `Origin`
//!    (browsers send one; MCP clients do not; rmcp refuses one too). Off
//!    loopback the names the server is reached by are not known, so the
//!    `Host` check is off and the token is the guard; a warning says so.
//!
//! SIGTERM or SIGINT stops it: every session ends, the sandbox is closed
//! (everything started in it is killed), then the audit log gets its
//! closing record.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hako_runtime::http::TokenRefusal;
use hako_runtime::token::Digested;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{
    HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, WWW_AUTHENTICATE,
};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::server::HakoServer;
use crate::state::State;
use crate::{McpConfig, DRAIN};

/// The one path the server answers on.
pub const MCP_PATH: &str = "/mcp";

/// The largest request body accepted: the stdio transport's line limit, so
/// a call that fits one transport fits the other.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How long a client gets to send a request's headers (a connection that
/// dribbles them is dropped).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long to wait before accepting again after `accept` failed (out of
/// file descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Where and how to serve HTTP.
pub struct HttpConfig {
    /// The socket to serve on, already bound (so the caller reports a bind
    /// failure itself and may bind port 0). Its address decides the `Host`
    /// check: see the module's documentation.
    pub listener: std::net::TcpListener,
    /// The bearer token every request must carry. Must not be empty.
    pub token: String,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("HttpConfig")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

type Body = BoxBody<Bytes, Infallible>;
type Service = StreamableHttpService<HakoServer, LocalSessionManager>;

/// Serves MCP over streamable HTTP on `http.listener`, at [`MCP_PATH`],
/// until the process gets SIGTERM or SIGINT; then closes the sandbox and
/// the audit log. Builds its own tokio runtime; call it from a thread that
/// is not running one. Logs go through `tracing`.
pub fn serve_http(config: McpConfig, http: HttpConfig) -> std::io::Result<()> {
    if http.token.trim().is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the bearer token is empty",
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("hako-mcp")
        .build()?;
    let state = Arc::new(
        State::new(config.make_sandbox, config.audit)
            .with_max_calls(config.max_calls)
            .with_cow(config.cow, config.allow_agent_commit),
    );
    let result = runtime.block_on(serve(state.clone(), http));
    // Every session has ended: close the sandbox first, which kills
    // whatever tool calls are still waiting on it, then let them finish.
    state.shutdown();
    runtime.shutdown_timeout(DRAIN);
    state.close_audit();
    result
}

async fn serve(state: Arc<State>, http: HttpConfig) -> std::io::Result<()> {
    http.listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(http.listener)?;
    let local = listener.local_addr()?;
    // Before the first connection, so a signal is never missed.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    tokio::pin!(stop);

    let mut rmcp_config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .enforce_origin_validation();
    // The Host is checked before rmcp sees the request, by the runtime's
    // check that `hako serve` uses too.
    if hako_runtime::http::allowed_hosts(local).is_none() {
        tracing::warn!(
            %local,
            "not a loopback address: the Host header is not checked, the bearer token is the only guard"
        );
    }
    rmcp_config = rmcp_config.disable_allowed_hosts();
    // Cancelling it ends every session.
    let sessions = rmcp_config.cancellation_token.clone();
    let service: Service = StreamableHttpService::new(
        move || Ok(HakoServer::new(state.clone())),
        Arc::new(LocalSessionManager::default()),
        rmcp_config,
    );
    let token = Arc::new(hako_runtime::token::Digested::new(
        http.token.trim().as_bytes(),
    ));
    tracing::info!(%local, path = MCP_PATH, "serving MCP over streamable HTTP");

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!("cannot accept a connection: {err}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = service.clone();
        let token = token.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |request| {
                let service = service.clone();
                let token = token.clone();
                async move { Ok::<_, Infallible>(handle(&service, &token, local, peer, request).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), handler)
                .await;
            if let Err(err) = served {
                tracing::debug!(%peer, "connection ended: {err}");
            }
        });
    }
    tracing::info!("signalled: shutting down");
    sessions.cancel();
    Ok(())
}

/// One request: the checks in the module's documentation, in that order,
/// then rmcp.
async fn handle(
    service: &Service,
    token: &Digested,
    local: SocketAddr,
    peer: SocketAddr,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    match precheck(request.headers(), request.uri().path(), token, local) {
        Err(Refusal::Unauthorized(why)) => {
            tracing::warn!(%peer, "refused a request without the bearer token");
            return plain(StatusCode::UNAUTHORIZED, why.message());
        }
        Err(Refusal::ForeignHost(why)) => {
            tracing::warn!(%peer, "refused a request: {why}");
            return plain(StatusCode::FORBIDDEN, &why);
        }
        Err(Refusal::NotFound) => {
            return plain(
                StatusCode::NOT_FOUND,
                &format!("not found: the MCP endpoint is {MCP_PATH}"),
            )
        }
        Err(Refusal::TooLarge) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            )
        }
        Ok(()) => {}
    }
    let mut request = request;
    // The token stops here: rmcp passes the request's parts to the tools.
    request.headers_mut().remove(AUTHORIZATION);
    service.handle(request).await
}

/// Why a request is refused before rmcp sees it.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    Unauthorized(TokenRefusal),
    ForeignHost(String),
    NotFound,
    TooLarge,
}

/// The checks made before rmcp reads anything: the token, the `Host` and
/// `Origin` (on loopback), the path, the declared body size. Pure, so it
/// is tested without a socket.
fn precheck(
    headers: &HeaderMap,
    path: &str,
    token: &Digested,
    local: SocketAddr,
) -> Result<(), Refusal> {
    authorized(headers, token).map_err(Refusal::Unauthorized)?;
    hako_runtime::http::check_host_and_origin(
        local,
        headers.get(HOST).map(|v| v.as_bytes()),
        headers.contains_key(ORIGIN),
    )
    .map_err(Refusal::ForeignHost)?;
    if path != MCP_PATH {
        return Err(Refusal::NotFound);
    }
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return Err(Refusal::TooLarge);
    }
    Ok(())
}

/// Whether the request carries exactly one `Authorization` header, of
/// scheme `Bearer` (any case, as RFC 9110 has it), whose token is the
/// server's, compared by digest in constant time (the runtime's check,
/// shared with `hako serve`), or why not.
fn authorized(headers: &HeaderMap, token: &Digested) -> Result<(), TokenRefusal> {
    hako_runtime::http::check_token(
        headers.get_all(AUTHORIZATION).iter().map(|v| v.as_bytes()),
        token,
    )
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn digest(t: &[u8]) -> Digested {
        Digested::new(t)
    }

    fn local() -> SocketAddr {
        "127.0.0.1:8701".parse().unwrap()
    }

    #[test]
    fn the_right_bearer_token_is_accepted_in_any_scheme_case() {
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret "] {
            assert!(
                authorized(&headers(&[("authorization", value)]), &digest(b"s3cret")).is_ok(),
                "{value}"
            );
        }
    }

    #[test]
    fn a_missing_wrong_or_doubled_token_is_refused() {
        let token = digest(b"s3cret");
        assert!(authorized(&headers(&[]), &token).is_err());
        for value in [
            "Bearer",
            "Bearer ",
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "s3cret",
            "Bearers3cret",
        ] {
            assert!(
                authorized(&headers(&[("authorization", value)]), &token).is_err(),
                "{value}"
            );
        }
        let doubled = headers(&[
            ("authorization", "Bearer s3cret"),
            ("authorization", "Bearer s3cret"),
        ]);
        assert!(authorized(&doubled, &token).is_err());
        assert_eq!(
            authorized(&headers(&[("authorization", "Bearer nope")]), &token),
            Err(TokenRefusal::Wrong)
        );
    }

    #[test]
    fn an_empty_server_token_authorizes_nothing() {
        assert!(authorized(&headers(&[("authorization", "Bearer ")]), &digest(b"")).is_err());
        assert!(authorized(&headers(&[("authorization", "Bearer  ")]), &digest(b"")).is_err());
    }

    #[test]
    fn the_token_is_checked_before_the_host_the_path_and_the_size() {
        let big = (MAX_BODY_BYTES + 1).to_string();
        let t = digest(b"t");
        let no_token = headers(&[("content-length", &big), ("host", "evil.example")]);
        assert!(matches!(
            precheck(&no_token, "/elsewhere", &t, local()),
            Err(Refusal::Unauthorized(_))
        ));
        let foreign = headers(&[("authorization", "Bearer t"), ("host", "evil.example:8701")]);
        assert!(matches!(
            precheck(&foreign, MCP_PATH, &t, local()),
            Err(Refusal::ForeignHost(_))
        ));
        let with = headers(&[
            ("authorization", "Bearer t"),
            ("content-length", &big),
            ("host", "localhost:8701"),
        ]);
        assert_eq!(
            precheck(&with, "/elsewhere", &t, local()),
            Err(Refusal::NotFound)
        );
        assert_eq!(
            precheck(&with, MCP_PATH, &t, local()),
            Err(Refusal::TooLarge)
        );
        let fits = headers(&[
            ("authorization", "Bearer t"),
            ("content-length", "10"),
            ("host", "127.0.0.1:8701"),
        ]);
        assert_eq!(precheck(&fits, MCP_PATH, &t, local()), Ok(()));
    }
}
