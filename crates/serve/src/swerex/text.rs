//! Text as SWE-ReX's Python side makes it: bytes decoded as `read_text`
//! and `errors="backslashreplace"` decode them, strings quoted as `repr`
//! quotes them (in the messages SWE-ReX's own server words with `!r`).

use super::{class, Fail};

/// A string as Python's `repr` shows it (for the messages SWE-ReX's own
/// server words with `!r`).
pub(super) fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Bytes as text the way SWE-ReX decodes a command's output
/// (`errors="backslashreplace"`): invalid bytes become `\xNN`.
pub(super) fn backslashreplace(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// How a file's bytes become text: `Path.read_text`'s `encoding` and
/// `errors`, for the encodings agents' files are in.
pub(super) struct Decoding {
    encoding: Encoding,
    errors: Errors,
}

#[derive(Clone, Copy)]
enum Encoding {
    Utf8,
    Ascii,
    Latin1,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Errors {
    Strict,
    Replace,
    Ignore,
    BackslashReplace,
}

impl Decoding {
    pub(super) fn new(encoding: Option<&str>, errors: Option<&str>) -> Result<Self, Fail> {
        let name = encoding
            .unwrap_or("utf-8")
            .to_ascii_lowercase()
            .replace('_', "-");
        let encoding = match name.as_str() {
            "utf-8" | "utf8" | "u8" => Encoding::Utf8,
            "ascii" | "us-ascii" => Encoding::Ascii,
            "latin-1" | "latin1" | "iso-8859-1" | "iso8859-1" | "l1" => Encoding::Latin1,
            _ => {
                return Err(Fail::raise(
                    class::LOOKUP,
                    format!(
                        "encoding {name:?}: hako serve --swerex reads utf-8, ascii and latin-1"
                    ),
                ))
            }
        };
        let errors = match errors.unwrap_or("strict") {
            "strict" => Errors::Strict,
            "replace" => Errors::Replace,
            "ignore" => Errors::Ignore,
            "backslashreplace" => Errors::BackslashReplace,
            other => {
                return Err(Fail::raise(
                    class::LOOKUP,
                    format!(
                        "errors {other:?}: hako serve --swerex takes strict, replace, ignore and backslashreplace"
                    ),
                ))
            }
        };
        Ok(Decoding { encoding, errors })
    }

    pub(super) fn name(&self) -> &'static str {
        match self.encoding {
            Encoding::Utf8 => "utf-8",
            Encoding::Ascii => "ascii",
            Encoding::Latin1 => "latin-1",
        }
    }

    /// The text, or the first byte that cannot be decoded and its offset
    /// (`strict`).
    pub(super) fn text(&self, data: &[u8]) -> Result<String, (u8, usize)> {
        let mut out = String::with_capacity(data.len());
        let bad = |out: &mut String, b: u8, at: usize| -> Result<(), (u8, usize)> {
            match self.errors {
                Errors::Strict => return Err((b, at)),
                Errors::Replace => out.push('\u{fffd}'),
                Errors::Ignore => {}
                Errors::BackslashReplace => out.push_str(&format!("\\x{b:02x}")),
            }
            Ok(())
        };
        match self.encoding {
            Encoding::Latin1 => out.extend(data.iter().map(|&b| char::from(b))),
            Encoding::Ascii => {
                for (at, &b) in data.iter().enumerate() {
                    if b.is_ascii() {
                        out.push(char::from(b));
                    } else {
                        bad(&mut out, b, at)?;
                    }
                }
            }
            Encoding::Utf8 => {
                let mut at = 0;
                for chunk in data.utf8_chunks() {
                    out.push_str(chunk.valid());
                    at += chunk.valid().len();
                    let invalid = chunk.invalid();
                    if !invalid.is_empty() {
                        if self.errors == Errors::Replace {
                            // One replacement per invalid sequence, as Python.
                            out.push('\u{fffd}');
                        } else {
                            for (i, &b) in invalid.iter().enumerate() {
                                bad(&mut out, b, at + i)?;
                            }
                        }
                        at += invalid.len();
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn python_repr_quotes_as_python_does() {
        assert_eq!(py_repr("ls -l"), "'ls -l'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_repr("x\ny\\"), "'x\\ny\\\\'");
    }

    #[test]
    fn text_is_decoded_as_read_text_would_or_the_bad_byte_is_named() {
        let strict = Decoding::new(None, None).unwrap();
        assert_eq!(strict.text("café".as_bytes()).unwrap(), "café");
        assert_eq!(strict.text(b"ab\xffc").unwrap_err(), (0xff, 2));
        let replace = Decoding::new(Some("UTF-8"), Some("replace")).unwrap();
        assert_eq!(replace.text(b"ab\xffc").unwrap(), "ab\u{fffd}c");
        let ignore = Decoding::new(Some("utf_8"), Some("ignore")).unwrap();
        assert_eq!(ignore.text(b"ab\xffc").unwrap(), "abc");
        let bs = Decoding::new(None, Some("backslashreplace")).unwrap();
        assert_eq!(bs.text(b"ab\xffc").unwrap(), "ab\\xffc");
        let latin = Decoding::new(Some("latin-1"), None).unwrap();
        assert_eq!(latin.text(b"caf\xe9").unwrap(), "café");
        assert!(Decoding::new(Some("ebcdic"), None).is_err());
        assert!(Decoding::new(None, Some("surrogateescape")).is_err());
    }
}
