//! The `multipart/form-data` body of an upload to `/files`: each part's
//! file name (its path) and bytes.

use crate::swerex::upload::{boundary, find, params};

/// The most parts one upload may have.
const MAX_PARTS: usize = 1024;

/// Each part of `body`: its file name (or field name, without one) and
/// bytes.
pub(super) fn parts(body: &[u8], content_type: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let boundary = boundary(content_type)?;
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let next_delimiter = [b"\r\n".as_slice(), delimiter].concat();
    let ends = "the form ends before its closing boundary".to_string();
    let mut at = if body.starts_with(delimiter) {
        0
    } else {
        find(body, &next_delimiter).ok_or_else(|| ends.clone())? + 2
    };
    let mut parts = Vec::new();
    loop {
        let rest = &body[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        let rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a form boundary is not followed by a line end")?;
        let head_end = if rest.starts_with(b"\r\n") {
            0
        } else {
            find(rest, b"\r\n\r\n").ok_or_else(|| ends.clone())? + 2
        };
        let head = std::str::from_utf8(&rest[..head_end])
            .map_err(|_| "a form part's headers are not UTF-8".to_string())?;
        let content = &rest[head_end + 2..];
        let len = find(content, &next_delimiter).ok_or_else(|| ends.clone())?;
        let disposition: Vec<(String, String)> = head
            .split("\r\n")
            .filter_map(|line| line.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
            .map(|(_, v)| params(v).skip(1).collect())
            .ok_or("a form part has no Content-Disposition")?;
        let field = |key: &str| {
            disposition
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.clone())
        };
        let name = field("filename")
            .or_else(|| field("name"))
            .ok_or("a form part has neither a file name nor a name")?;
        if parts.len() == MAX_PARTS {
            return Err(format!("the form has more than {MAX_PARTS} parts"));
        }
        parts.push((name, content[..len].to_vec()));
        at = body.len() - content.len() + len + 2;
    }
}
