//! The HTTP/1.x pieces the proxy needs: a bounded request-head parser,
//! authority and URL parsing, the upstream head rewrite, and body framing.
//!
//! The parser is strict where leniency would let the proxy and the upstream
//! disagree about where a request ends (request smuggling): obsolete line
//! folding, bare CR, both `Content-Length` and `Transfer-Encoding`, and
//! disagreeing `Content-Length`s are all refused.

mod body;
mod head;
mod target;

pub(crate) use body::{forward_body, framing, BodyError};
pub(crate) use head::{read_head, Head, HeadError};
pub(crate) use target::{
    host_header_matches, parse_target, split_authority, upstream_head, Target,
};

use crate::allow::printable;

/// A complete short response the proxy answers with itself: the status,
/// `X-Hako-Rule`, `Content-Type: text/plain`, `Connection: close`, and a
/// one-line body.
pub(crate) fn proxy_response(status: u16, reason: &str, rule: &str, body: &str) -> Vec<u8> {
    let body = format!("{}\n", printable(body));
    format!(
        "HTTP/1.1 {status} {reason}\r\nX-Hako-Rule: {rule}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_proxys_own_answer_is_complete_and_closes() {
        let out =
            String::from_utf8(proxy_response(403, "Forbidden", "not-on-allowlist", "no")).unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 403 Forbidden\r\nX-Hako-Rule: not-on-allowlist\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nno\n"
        );
    }

    #[test]
    fn the_proxys_own_answer_counts_the_body_it_sends() {
        // Whatever `printable` makes of the body, Content-Length is its
        // length, so the client reads exactly one response.
        let out = proxy_response(400, "Bad Request", "bad-request", "a\u{7}b\r\nc");
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        assert!(body.ends_with('\n'));
        assert!(!body.trim_end_matches('\n').contains(['\r', '\n', '\u{7}']));
    }
}
