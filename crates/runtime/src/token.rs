//! The bearer token the HTTP front ends (`hako serve`, `hako mcp --http`)
//! require: made, read from a file, and compared without the time taken
//! showing anything of it.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// A fresh random token: 32 bytes from the kernel, in hex.
pub fn generate() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex(&bytes))
}

/// The token a file holds, without the white space around it; `Ok(None)`
/// for a file that holds nothing else (which must not let every client in).
pub fn read(path: &Path) -> std::io::Result<Option<String>> {
    let text = std::fs::read_to_string(path)?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// Whether `a` equals `b`, in time that depends only on their lengths.
/// ([`matches`] compares SHA-256 digests with it, so that not even the
/// token's length shows.)
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// The SHA-256 digest of a token, what [`Digested::matches`] compares
/// against: a server keeps this, computed once.
#[derive(Clone)]
pub struct Digested([u8; 32]);

impl Digested {
    /// The digest of `token`.
    pub fn new(token: &[u8]) -> Self {
        Digested(Sha256::digest(token).into())
    }

    /// Whether `given` is the token: digests compared in constant time.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        constant_time_eq(&given, &self.0)
    }
}

impl std::fmt::Debug for Digested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the digest: it would let a guess be checked offline.
        f.write_str("Digested(..)")
    }
}

/// Whether a bearer token a client `given` is `token`: their SHA-256
/// digests compared in constant time, so that neither the token nor its
/// length shows in the time the answer takes.
pub fn matches(given: &[u8], token: &[u8]) -> bool {
    Digested::new(token).matches(given)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_compare_by_value_only() {
        assert!(matches(b"secret", b"secret"));
        assert!(!matches(b"secret", b"secreT"));
        assert!(!matches(b"secre", b"secret"));
        assert!(!matches(b"", b"secret"));
        assert!(constant_time_eq(b"ab", b"ab") && !constant_time_eq(b"ab", b"abc"));
    }

    #[test]
    fn a_generated_token_is_64_hex_digits_and_fresh() {
        let a = generate().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, generate().unwrap());
    }

    #[test]
    fn a_token_file_is_trimmed_and_an_empty_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "  abc \n").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some("abc"));
        std::fs::write(&path, " \n").unwrap();
        assert_eq!(read(&path).unwrap(), None);
        assert!(read(&dir.path().join("missing")).is_err());
    }
}
