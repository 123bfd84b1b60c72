//! Accepting connections and handing them to hyper: the connection bound,
//! the deadline for headers, and a first request hyper cannot parse
//! answered by hand.

use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::auth::{authorized, unauthorized};
use crate::reply::{too_large, Reply};
use crate::routes::handle;
use crate::state::State;
use crate::ACCEPT_BACKOFF;

/// Resolves on SIGINT or SIGTERM (or never, when not asked to).
async fn stop_signal(enabled: bool) -> std::io::Result<()> {
    if !enabled {
        std::future::pending::<()>().await;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// Resolves when this process's stdin ends (or never, when not asked to).
/// A thread of its own reads it (and throws away what it reads): a
/// blocking read on tokio's pool would hold up the runtime's shutdown.
async fn stdin_eof(enabled: bool) {
    if !enabled {
        return std::future::pending::<()>().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("hako-serve-stdin".into())
        .spawn(move || {
            let mut sink = [0u8; 4096];
            let mut stdin = std::io::stdin().lock();
            loop {
                match std::io::Read::read(&mut stdin, &mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!("hako serve: cannot read stdin ({e}); taken as its end");
                        break;
                    }
                }
            }
            let _ = tx.send(());
        });
    if let Err(e) = spawned {
        // Fail closed: without the watch the lifeline cannot work.
        tracing::warn!("hako serve: cannot watch stdin ({e}); stopping");
        return;
    }
    let _ = rx.await;
}

/// Accepts connections until the listener fails or a stop signal comes,
/// each served on a task of its own while a connection slot is free.
pub(crate) async fn accept_loop(
    listener: std::net::TcpListener,
    state: Arc<State>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // Before the first connection, so a signal is never missed.
    let stop = stop_signal(state.config.stop_on_signals);
    tokio::pin!(stop);
    let eof = stdin_eof(state.config.stop_on_stdin_eof);
    tokio::pin!(eof);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("hako serve: cannot accept a connection: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            stopped = &mut stop => {
                stopped?;
                tracing::info!("hako serve: signalled, shutting down");
                return Ok(());
            }
            () = &mut eof => {
                tracing::info!("hako serve: stdin ended, shutting down");
                return Ok(());
            }
        };
        let Some(slot) = state.connections.try_take() else {
            tracing::warn!(
                %peer,
                "hako serve: {} connections are open; closed a new one",
                state.connections.max
            );
            drop(stream);
            continue;
        };
        // Answers go out at once: with Nagle's algorithm a reply written
        // in two parts waits for the client's delayed ACK of the first.
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(state, stream, peer).await;
        });
    }
}

async fn serve_connection(
    state: Arc<State>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) {
    // hyper refuses a Content-Length past u64::MAX - 2 itself (431) before
    // any handler sees it: such a request is answered here like any other
    // too large one, the token checked first.
    match refuse_unparseable_length(&state, &stream).await {
        Peeked::Serve => {}
        Peeked::Refuse(r) => {
            let _ = answer_raw(stream, r).await;
            return;
        }
        Peeked::Silent => {
            tracing::debug!(%peer, "hako serve: closed a connection that sent nothing");
            return;
        }
    }
    let header_timeout = state.config.header_timeout;
    let state_write_timeout = state.config.write_timeout;
    let handler = hyper::service::service_fn(move |request| {
        let state = Arc::clone(&state);
        async move {
            // A server in SWE-ReX mode answers that protocol only.
            if state.config.swerex {
                return Ok::<_, Infallible>(crate::swerex::handle(state, request).await);
            }
            // And one in E2B mode, E2B's.
            if state.config.e2b.is_some() {
                return Ok::<_, Infallible>(crate::e2b::handle(state, request).await);
            }
            Ok::<_, Infallible>(handle(state, request).await)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // A client may shut its side down once it has sent its request,
        // and still read the answer.
        .half_close(true)
        .serve_connection(
            TokioIo::new(WriteTimeout::new(stream, state_write_timeout)),
            handler,
        )
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, "hako serve: connection ended: {e}");
    }
}

/// What the first bytes of a connection call for.
enum Peeked {
    /// Hand it to hyper.
    Serve,
    /// Answer this, then close.
    Refuse(Reply),
    /// Close it: nothing came within the header timeout.
    Silent,
}

/// The answer to a connection whose first request declares a
/// Content-Length hyper cannot take (past `u64::MAX - 2`): `401` without
/// the token, else `413`. Looks at what has arrived without consuming it.
async fn refuse_unparseable_length(state: &State, stream: &tokio::net::TcpStream) -> Peeked {
    let mut buf = vec![0u8; 16 << 10];
    // The head may come in several segments: look again (briefly) until
    // it is whole, the buffer is full, or the header timeout passes.
    let deadline = tokio::time::Instant::now() + state.config.header_timeout;
    let mut seen = 0;
    let n = loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Err(_) if seen == 0 => return Peeked::Silent,
            Err(_) => break seen,
            Ok(Err(_)) => return Peeked::Serve,
            Ok(Ok(n)) => n,
        };
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let complete = matches!(
            httparse::Request::new(&mut headers).parse(&buf[..n]),
            Ok(httparse::Status::Complete(_)) | Err(_)
        );
        if complete || n == 0 || n == buf.len() {
            break n;
        }
        if n == seen {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        seen = n;
        if tokio::time::Instant::now() >= deadline {
            break n;
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    if request.parse(&buf[..n]).is_err() {
        return Peeked::Serve;
    }
    let huge = request.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-length")
            && std::str::from_utf8(h.value)
                .ok()
                .map(str::trim)
                .is_some_and(|v| {
                    !v.is_empty()
                        && v.bytes().all(|b| b.is_ascii_digit())
                        && v.parse::<u64>().map_or(true, |n| n > u64::MAX - 2)
                })
    });
    if !huge {
        return Peeked::Serve;
    }
    let mut map = HeaderMap::new();
    for h in request.headers.iter() {
        if h.name.eq_ignore_ascii_case("authorization") {
            if let Ok(v) = HeaderValue::from_bytes(h.value) {
                map.append(AUTHORIZATION, v);
            }
        }
        if h.name.eq_ignore_ascii_case(crate::swerex::API_KEY) {
            if let Ok(v) = HeaderValue::from_bytes(h.value) {
                map.append(crate::swerex::API_KEY, v);
            }
        }
    }
    Peeked::Refuse(match authorized(state, &map) {
        Ok(()) => too_large(),
        Err(why) => unauthorized(why),
    })
}

/// Writes `r` as a whole HTTP/1.1 answer on a connection hyper never saw,
/// then drains (briefly) what the client sent, so that closing does not
/// reset the connection under the answer.
async fn answer_raw(mut stream: tokio::net::TcpStream, r: Reply) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = format!("{}\n", r.body);
    let reason = StatusCode::from_u16(r.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let auth = if r.status == 401 {
        "WWW-Authenticate: Bearer\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 8192];
    let mut left: usize = 1 << 20;
    while left > 0 {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
    Ok(())
}

/// A connection whose writes fail with `TimedOut` once one has made no
/// progress for `limit`: a client that never reads its answer is dropped
/// (its connection slot and its answer's memory given back), and the
/// server goes on serving others. A client reading slowly but steadily is
/// never cut: each write that goes through starts the clock again.
pub(crate) struct WriteTimeout<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write is pending.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        WriteTimeout {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: arms the clock (once) and says
    /// whether it has run out.
    fn timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        sleep.as_mut().poll(cx).is_ready()
    }

    /// What a write or flush that returned `polled` answers: its own
    /// result once it moved (the clock disarmed), `Pending` while it
    /// waits, and the stall's error once the clock has run out.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Pending if self.timed_out(cx) => Poll::Ready(Err(stalled_error(self.limit))),
            Poll::Pending => Poll::Pending,
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

fn stalled_error(limit: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the client read nothing of its answer for {} ms; connection dropped",
            limit.as_millis()
        ),
    )
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => {
                if self.timed_out(cx) {
                    Poll::Ready(Err(stalled_error(self.limit)))
                } else {
                    Poll::Pending
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
