//! Plain HTTP forwarding (an absolute-form `http://` request): the URL and
//! `Host` checked against each other, the body's framing checked, one
//! request sent upstream while its response flows back.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread;

use hako_core::NetProtocol;

use super::accept::Ctx;
use super::client::Client;
use super::connect::{bad_request, open_upstream, refuse_http, respond};
use super::record::{event_allowed, Done};
use super::{RULE_BAD_REQUEST, RULE_HOST_HEADER_MISMATCH};
use crate::allow::printable;
use crate::http::{self, BodyError, Target};
use crate::live::touch;
use crate::relay::{Sock, RELAY_BUF};

/// Counts the bytes written through it, and notes them in the
/// connection's progress.
struct Counting<'a> {
    inner: &'a TcpStream,
    n: u64,
    progress: &'a AtomicU64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (&mut &*self.inner).write(buf)?;
        self.n += n as u64;
        touch(Some(self.progress));
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies the upstream's response to the client until the upstream's end of
/// stream, noting it in `progress`, and returns the bytes copied. The client is
/// half-closed only if something was copied, so that the proxy can still
/// answer when nothing came; if the client goes away, the upstream is shut
/// down.
fn copy_response(upstream: &TcpStream, client: &Sock, progress: &AtomicU64) -> u64 {
    let mut buf = vec![0u8; RELAY_BUF];
    let mut total: u64 = 0;
    loop {
        let n = match (&mut &*upstream).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        touch(Some(progress));
        if (&mut &*client).write_all(&buf[..n]).is_err() {
            let _ = upstream.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return total;
        }
        total += n as u64;
        touch(Some(progress));
    }
    if total > 0 {
        let _ = client.shutdown(Shutdown::Write);
    }
    total
}

/// Forwards one absolute-form `http://` request and its response, and
/// records it; a request the proxy refuses or cannot parse is answered.
pub(super) fn serve_forward(ctx: &Ctx, client: &Sock, mut reader: Client<'_>, head: &http::Head) {
    let proto = NetProtocol::Http;
    let (authority, host, port, path) = match http::parse_target(&head.target) {
        Ok(Target::Http {
            authority,
            host,
            port,
            path,
        }) => (authority, host, port, path),
        Ok(Target::Https) => {
            let why = "https:// URLs go through CONNECT, not plain forwarding (set HTTPS_PROXY)"
                .to_string();
            return bad_request(ctx, client, proto, 400, why);
        }
        Ok(Target::Origin) => {
            let why =
                "this is the hako egress proxy, not a web server: send absolute-form requests \
                       (GET http://host/path) or CONNECT host:port"
                    .to_string();
            return bad_request(ctx, client, NetProtocol::Unknown, 400, why);
        }
        Ok(Target::Other) => {
            let why = "only http:// URLs are forwarded; use CONNECT for anything else".to_string();
            return bad_request(ctx, client, proto, 400, why);
        }
        Err(why) => return bad_request(ctx, client, proto, 400, format!("bad URL: {why}")),
    };
    let hosts: Vec<&[u8]> = head.values("host").collect();
    if hosts.len() > 1 {
        return bad_request(ctx, client, proto, 400, "more than one Host header".into());
    }
    if let Some(value) = hosts.first() {
        if !http::host_header_matches(value, &host, port) {
            let message = format!(
                "the Host header `{}` does not name the URL's host",
                printable(&String::from_utf8_lossy(value))
            );
            return refuse_http(
                ctx,
                client,
                proto,
                &host,
                port,
                RULE_HOST_HEADER_MISMATCH,
                message,
            );
        }
    }
    let framing = match http::framing(head) {
        Ok(f) => f,
        Err(why) => {
            return bad_request(
                ctx,
                client,
                proto,
                400,
                format!("ambiguous request body: {why}"),
            )
        }
    };
    let Some((rule, upstream, address)) = open_upstream(ctx, client, proto, &host, port) else {
        return;
    };
    // The response flows back while the body goes up (so `Expect:
    // 100-continue` and early answers work).
    let _ = client.set_write_timeout(None);
    reader.get_mut().deadline = None;
    let progress = Arc::clone(&ctx.progress);
    let response = match (upstream.try_clone(), client.try_clone()) {
        (Ok(up), Ok(down)) => thread::Builder::new()
            .name("hako-net-response".into())
            .spawn(move || copy_response(&up, &down, &progress)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let response = match response {
        Ok(handle) => handle,
        Err(e) => {
            let _ = upstream.shutdown(Shutdown::Both);
            respond(
                client,
                502,
                "Bad Gateway",
                "proxy-error",
                &format!("hako egress proxy: {e}"),
            );
            let done = Done {
                address: Some(address),
                up: 0,
                down: 0,
                message: Some(format!("proxy error: {e}")),
            };
            return event_allowed(ctx, proto, &host, port, &rule, done);
        }
    };
    let upstream_head = http::upstream_head(head, &path, &authority);
    let mut w = Counting {
        inner: &upstream,
        n: 0,
        progress: &ctx.progress,
    };
    let sent = w
        .write_all(&upstream_head)
        .map_err(BodyError::Io)
        .and_then(|()| http::forward_body(&mut reader, &mut w, &framing));
    let up = w.n;
    // One request per connection: nothing the client sends after this body
    // is read, so a pipelined request never reaches this upstream.
    drop(reader);
    let message = match sent {
        Ok(_) => None,
        Err(e) => {
            let _ = upstream.shutdown(Shutdown::Both);
            let why = match &e {
                BodyError::Bad(why) => format!("bad request body: {why}"),
                BodyError::Io(e) => format!("request not forwarded: {e}"),
            };
            Some((why, matches!(e, BodyError::Bad(_))))
        }
    };
    let down = response.join().unwrap_or(0);
    let message = match message {
        None => None,
        Some((why, bad)) => {
            if bad && down == 0 {
                respond(
                    client,
                    400,
                    "Bad Request",
                    RULE_BAD_REQUEST,
                    &format!("hako egress proxy: {why} (rule {RULE_BAD_REQUEST})"),
                );
            }
            Some(why)
        }
    };
    let _ = client.shutdown(Shutdown::Write);
    event_allowed(
        ctx,
        proto,
        &host,
        port,
        &rule,
        Done {
            address: Some(address),
            up,
            down,
            message,
        },
    );
}
