//! `multipart/form-data` bodies, as the uploads of SWE-ReX (`--swerex`)
//! and E2B's envd (`--e2b`) send them: strictly read, every part's headers
//! UTF-8, the closing boundary required, at most a given number of parts.

/// One part of a form: its `Content-Disposition` `name` and `filename`,
/// and its bytes.
#[derive(Debug)]
pub(crate) struct Part<'a> {
    pub(crate) name: Option<String>,
    pub(crate) filename: Option<String>,
    pub(crate) data: &'a [u8],
}

/// The parts of `body`, a form of `content_type` (which names its
/// boundary); more than `max_parts` is an error.
pub(crate) fn parts<'a>(
    body: &'a [u8],
    content_type: &str,
    max_parts: usize,
) -> Result<Vec<Part<'a>>, String> {
    let boundary = boundary(content_type)?;
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let next_delimiter = [b"\r\n".as_slice(), delimiter].concat();
    let ends = "the form ends before its closing boundary".to_string();
    // The first delimiter (after a preamble, if any).
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
        if parts.len() == max_parts {
            return Err(format!("the form has more than {max_parts} parts"));
        }
        parts.push(Part {
            name: field("name"),
            filename: field("filename"),
            data: &content[..len],
        });
        // The next delimiter, after the part's line end.
        at = body.len() - content.len() + len + 2;
    }
}

/// The boundary of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Result<String, String> {
    let mut params = params(content_type);
    let kind = params.next().map(|(k, _)| k.to_ascii_lowercase());
    if kind.as_deref() != Some("multipart/form-data") {
        return Err(format!(
            "an upload is a multipart/form-data form, not {content_type:?}"
        ));
    }
    let boundary = params
        .find(|(k, _)| k.eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v)
        .unwrap_or_default();
    if boundary.is_empty() || boundary.len() > 70 {
        return Err("the form's boundary is missing or longer than 70 characters".into());
    }
    Ok(boundary)
}

/// A header value's `;`-separated items: the first as its key, the others
/// `key=value` (a quoted value unquoted).
fn params(value: &str) -> impl Iterator<Item = (String, String)> + '_ {
    let mut items = Vec::new();
    let (mut current, mut quoted, mut escaped) = (String::new(), false, false);
    for c in value.chars() {
        match c {
            _ if escaped => {
                current.push(c);
                escaped = false;
            }
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => items.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    items.push(current);
    items.into_iter().map(|item| {
        let item = item.trim();
        match item.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), v.trim().to_string()),
            None => (item.to_string(), String::new()),
        }
    })
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
