//! The `multipart/form-data` body of an upload to `/files`: each part's
//! file name (its path) and bytes.

/// The most parts one upload may have.
const MAX_PARTS: usize = 1024;

/// Each part of `body`: its file name (or field name, without one) and
/// bytes.
pub(super) fn parts(body: &[u8], content_type: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    crate::multipart::parts(body, content_type, MAX_PARTS)?
        .into_iter()
        .map(|part| {
            let name = part
                .filename
                .or(part.name)
                .ok_or("a form part has neither a file name nor a name")?;
            Ok((name, part.data.to_vec()))
        })
        .collect()
}
