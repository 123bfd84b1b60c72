//! Text from inside a sandbox, made safe to print on the user's terminal.
//!
//! A name, a symlink target, a command line or a message relayed from the
//! guest is chosen by whatever runs inside. Printed as it is, it reaches the
//! user's terminal as instructions: ESC and the C1 controls start escape
//! sequences (set the window title, clear the screen, write the clipboard
//! with OSC 52), CR and LF forge whole lines (`hako: ...` that hako never
//! said), and the bidi controls reorder what is displayed. Every
//! human-readable line hako prints that carries such text passes it through
//! [`escaped`] (a name, a target, a logged value) or [`message`] (hako's own
//! `hako: ...` lines, whose errors may quote either) first. The command's
//! own output relayed by `hako run`, and the `--json` outputs (JSON escapes
//! its controls), are not for this.

use std::fmt;

/// `text` as it may be shown on a terminal: every character for which
/// [`is_unsafe`] holds, every byte that is not part of valid UTF-8, and the
/// backslash are written as visible escapes; everything else as it is.
///
/// The escapes are `\\` (a backslash), `\n`, `\r` and `\t`, `\xNN` for any
/// other byte below 0x80 and for each byte of invalid UTF-8 (so `\xNN`
/// always stands for the byte NN of the original), and `\u{N}` for a
/// character from 0x80 up (its code point). Since the backslash itself is
/// escaped, the output names one input only: a name spelled `\x1b` shows
/// as `\\x1b`, a name holding ESC as `\x1b`.
pub fn escaped<T: AsRef<[u8]> + ?Sized>(text: &T) -> Escaped<'_> {
    Escaped {
        text: text.as_ref(),
        backslash: true,
    }
}

/// A message of hako's own (an error, a warning) as it may be shown on a
/// terminal: as [`escaped`], except that the backslash is left as it is.
/// Such messages quote the paths and names they carry with Rust's `{:?}`,
/// which has already escaped their backslashes (`"a\\b"`) and most of
/// their controls (`"\u{1b}"`); escaping those backslashes again would
/// only double them. Whatever control is still raw (a guest's words, a
/// path shown with `display()`, a C1 or bidi control `{:?}` left) is
/// escaped all the same, so the line can neither drive the terminal nor be
/// broken in two.
pub fn message<T: AsRef<[u8]> + ?Sized>(text: &T) -> Escaped<'_> {
    Escaped {
        text: text.as_ref(),
        backslash: false,
    }
}

/// Whether `c` must not reach a terminal as itself: the C0 controls
/// (U+0000 to U+001F, among them ESC, BEL, CR, LF), DEL (U+007F), the C1
/// controls (U+0080 to U+009F, among them CSI U+009B and OSC U+009D, which
/// some terminals obey as ESC [ and ESC ]), the line and paragraph
/// separators (U+2028, U+2029), and the bidi controls (U+061C, U+200E,
/// U+200F, U+202A to U+202E, U+2066 to U+2069), which make a name display
/// in another order than it is spelled.
///
/// Other invisible characters (zero-width spaces, joiners) are left: they
/// change neither the terminal's state, nor the lines, nor the order.
pub fn is_unsafe(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// Text shown with its controls escaped (see [`escaped`] and [`message`]).
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a> {
    text: &'a [u8],
    /// Whether the backslash is escaped too.
    backslash: bool,
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.text.utf8_chunks() {
            let valid = chunk.valid();
            // Runs of safe characters are written whole.
            let mut from = 0;
            for (at, c) in valid.char_indices() {
                if !is_unsafe(c) && (c != '\\' || !self.backslash) {
                    continue;
                }
                f.write_str(&valid[from..at])?;
                from = at + c.len_utf8();
                match c {
                    '\\' => f.write_str("\\\\")?,
                    '\n' => f.write_str("\\n")?,
                    '\r' => f.write_str("\\r")?,
                    '\t' => f.write_str("\\t")?,
                    c if c.is_ascii() => write!(f, "\\x{:02x}", u32::from(c))?,
                    c => write!(f, "\\u{{{:x}}}", u32::from(c))?,
                }
            }
            f.write_str(&valid[from..])?;
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &[u8]) -> String {
        escaped(text).to_string()
    }

    #[test]
    fn plain_text_and_printable_unicode_are_shown_as_they_are() {
        assert_eq!(shown(b""), "");
        assert_eq!(shown(b"src/main.rs -> ../x y"), "src/main.rs -> ../x y");
        let unicode = "caf\u{e9} \u{65e5}\u{672c} \u{1f980} \u{a0}\u{200b}";
        assert_eq!(escaped(unicode).to_string(), unicode);
    }

    #[test]
    fn every_c0_control_and_del_is_escaped() {
        for b in (0u8..0x20).chain([0x7f]) {
            let out = shown(&[b'a', b, b'b']);
            let want = match b {
                b'\n' => "a\\nb".to_string(),
                b'\r' => "a\\rb".to_string(),
                b'\t' => "a\\tb".to_string(),
                _ => format!("a\\x{b:02x}b"),
            };
            assert_eq!(out, want, "byte {b:#x}");
            assert!(out.bytes().all(|c| (0x20..0x7f).contains(&c)), "{out:?}");
        }
    }

    #[test]
    fn an_osc_title_a_screen_clear_and_an_osc52_clipboard_write_are_shown_inert() {
        let attack = b"\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x07";
        assert_eq!(
            shown(attack),
            "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
        );
    }

    #[test]
    fn a_forged_line_stays_on_the_line_it_is_in() {
        let out = shown(b"x\r\nhako: all good\n");
        assert_eq!(out, "x\\r\\nhako: all good\\n");
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn c1_controls_line_separators_and_bidi_controls_are_escaped() {
        let cases = [
            ('\u{80}', "\\u{80}"),
            ('\u{9b}', "\\u{9b}"),
            ('\u{9d}', "\\u{9d}"),
            ('\u{9f}', "\\u{9f}"),
            ('\u{61c}', "\\u{61c}"),
            ('\u{200e}', "\\u{200e}"),
            ('\u{200f}', "\\u{200f}"),
            ('\u{2028}', "\\u{2028}"),
            ('\u{2029}', "\\u{2029}"),
            ('\u{202a}', "\\u{202a}"),
            ('\u{202e}', "\\u{202e}"),
            ('\u{2066}', "\\u{2066}"),
            ('\u{2069}', "\\u{2069}"),
        ];
        for (c, want) in cases {
            assert_eq!(escaped(&format!("a{c}b")).to_string(), format!("a{want}b"));
        }
        // Neighbours of the ranges are printable and left alone.
        for c in [
            '\u{a0}', '\u{a1}', '\u{2027}', '\u{202f}', '\u{2065}', '\u{206a}',
        ] {
            assert!(!is_unsafe(c), "{c:?}");
        }
        // "txt.exe" spelled backwards behind a right-to-left override.
        assert_eq!(
            escaped("invoice\u{202e}txt.exe").to_string(),
            "invoice\\u{202e}txt.exe"
        );
    }

    #[test]
    fn invalid_utf8_bytes_are_escaped_one_by_one() {
        assert_eq!(shown(b"a\xffb"), "a\\xffb");
        // A C1 control as a lone Latin-1 byte is invalid UTF-8.
        assert_eq!(shown(b"\x9b2J"), "\\x9b2J");
        // A truncated sequence, then valid text again.
        assert_eq!(shown(b"\xe6\x97caf\xc3\xa9"), "\\xe6\\x97caf\u{e9}");
    }

    #[test]
    fn the_backslash_is_escaped_so_that_no_two_inputs_show_alike() {
        assert_eq!(shown(b"a\\b"), "a\\\\b");
        assert_ne!(shown(b"\\x1b"), shown(b"\x1b"));
        assert_ne!(shown(b"\\n"), shown(b"\n"));
        assert_ne!(shown(b"\\u{9b}"), escaped("\u{9b}").to_string());
        assert_ne!(shown(b"\xc2\x9b"), shown(b"\\xc2\\x9b"));
    }

    #[test]
    fn a_message_keeps_its_backslashes_and_loses_its_controls() {
        // A path as `{:?}` quotes it, beside a guest's raw words.
        let text = "\"a\\\\b\\u{1b}\" does not exist: \x1b]0;x\x07\nhako: forged\u{9b}";
        assert_eq!(
            message(text).to_string(),
            "\"a\\\\b\\u{1b}\" does not exist: \\x1b]0;x\\x07\\nhako: forged\\u{9b}"
        );
        assert_eq!(message(b"a\xff").to_string(), "a\\xff");
    }
}
