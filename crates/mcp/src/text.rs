//! The pure parts of the tools: keeping the head and tail of an output,
//! exact-string replacement, and numbering the lines of a file. No sandbox
//! and no I/O here, so every rule is unit-tested.

use std::fmt::Write as _;

/// Keeps the first `head` and the last `tail` bytes of a stream fed in
/// chunks, and counts everything, so that a command that prints gigabytes
/// costs `head + tail` bytes of memory and the model still sees how it
/// started and how it ended.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    /// A ring of the last bytes after the head filled: `tail[tail_start..]`
    /// then `tail[..tail_start]` in stream order once it has wrapped.
    tail: Vec<u8>,
    tail_start: usize,
    /// Bytes seen (fed or reported lost).
    total: u64,
    /// Bytes between the head and the tail that are not kept.
    cut: u64,
    /// Of `cut`, bytes the sandbox dropped before they could be read.
    lost: u64,
    /// Bytes dropped before the first byte kept (shown before the head).
    lost_first: u64,
}

impl HeadTail {
    /// Keeps up to `head` bytes from the start and `tail` from the end.
    pub fn new(head: usize, tail: usize) -> Self {
        HeadTail {
            head_cap: head,
            tail_cap: tail,
            head: Vec::new(),
            tail: Vec::new(),
            tail_start: 0,
            total: 0,
            cut: 0,
            lost: 0,
            lost_first: 0,
        }
    }

    /// Feeds the next bytes of the stream.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.head_cap && self.cut == 0 {
            let take = data.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.is_empty() {
            return;
        }
        if self.tail_cap == 0 {
            self.cut += data.len() as u64;
            return;
        }
        // Only the last `tail_cap` bytes of this chunk can survive it.
        if data.len() >= self.tail_cap {
            let skip = data.len() - self.tail_cap;
            self.cut += (self.tail.len() + skip) as u64;
            self.tail.clear();
            self.tail.extend_from_slice(&data[skip..]);
            self.tail_start = 0;
            return;
        }
        for &b in data {
            if self.tail.len() < self.tail_cap {
                self.tail.push(b);
            } else {
                self.tail[self.tail_start] = b;
                self.tail_start = (self.tail_start + 1) % self.tail_cap;
                self.cut += 1;
            }
        }
    }

    /// Records `n` bytes of the stream that were dropped before they could
    /// be read (the sandbox's buffer overran): they count as cut, and the
    /// head stops growing, since what follows is no longer the start.
    pub fn lose(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.total += n;
        if self.head.is_empty() && self.cut == 0 {
            // Nothing kept yet: the head starts after the gap, which is
            // shown first.
            self.lost_first += n;
            return;
        }
        // Everything kept in the tail so far now sits before a gap: move it
        // out of the tail (it is no longer "the end").
        self.cut += self.tail.len() as u64 + n;
        self.lost += n;
        self.tail.clear();
        self.tail_start = 0;
    }

    /// Bytes seen in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes not kept.
    #[cfg(test)]
    pub fn cut(&self) -> u64 {
        self.cut
    }

    /// The kept bytes as text: a note of bytes dropped before anything was
    /// kept (if any were), the head, a marker naming what was cut (if
    /// anything was), and the tail. Invalid UTF-8 is replaced; a character
    /// split at an edge of a gap is dropped rather than mangled.
    pub fn render(&self) -> String {
        let mut tail = Vec::with_capacity(self.tail.len());
        tail.extend_from_slice(&self.tail[self.tail_start..]);
        tail.extend_from_slice(&self.tail[..self.tail_start]);
        let mut out = String::new();
        let gap_before = self.lost_first > 0;
        if gap_before {
            let _ = writeln!(
                out,
                "[... the first {} bytes were dropped by the sandbox's buffer before they could be read ...]",
                self.lost_first
            );
        }
        if self.cut == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            out.push_str(&lossy(&all, gap_before, false));
            return out;
        }
        out.push_str(&lossy(&self.head, gap_before, true));
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = write!(out, "[... {} bytes cut", self.cut);
        if self.lost > 0 {
            let _ = write!(
                out,
                "; {} of them were dropped by the sandbox's buffer before they were read",
                self.lost
            );
        }
        out.push_str(" ...]\n");
        out.push_str(&lossy(&tail, true, false));
        out
    }
}

/// `bytes` as text; with `cut_start`, without the UTF-8 continuation bytes
/// it starts with (the rest of a character whose start was cut); with
/// `cut_end`, without a character cut off at its end.
fn lossy(bytes: &[u8], cut_start: bool, cut_end: bool) -> String {
    let skip = if cut_start {
        bytes
            .iter()
            .take(3)
            .take_while(|&&b| b & 0xC0 == 0x80)
            .count()
    } else {
        0
    };
    let bytes = &bytes[skip..];
    let end = match std::str::from_utf8(bytes) {
        Err(e) if cut_end && e.error_len().is_none() => e.valid_up_to(),
        _ => bytes.len(),
    };
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Why an exact-string edit was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditError {
    /// `old_string` is empty.
    EmptyOld,
    /// `old_string` and `new_string` are the same.
    NoChange,
    /// `old_string` does not occur.
    NotFound,
    /// `old_string` occurs this many times and `replace_all` was not set.
    NotUnique(usize),
    /// The edited text would be this many bytes, more than the most allowed.
    TooLarge {
        /// Bytes the result would have.
        len: u128,
        /// The most allowed.
        max: usize,
    },
}

impl EditError {
    /// The message for the model, about `path`.
    pub fn message(&self, path: &str) -> String {
        match self {
            EditError::EmptyOld => "old_string is empty; give the exact text to replace (use write_file to create a file or replace all of it)".into(),
            EditError::NoChange => "old_string and new_string are the same; nothing to change".into(),
            EditError::NotFound => format!(
                "old_string was not found in {path} (0 matches); it must match the file exactly, whitespace and indentation included: read the file again and copy the text"
            ),
            EditError::NotUnique(n) => format!(
                "old_string matches {n} times in {path}; it must match exactly once: include more of the surrounding lines to make it unique, or set replace_all to true to replace all {n}"
            ),
            EditError::TooLarge { len, max } => format!(
                "the edit would make {path} {len} bytes, more than the {max} edit_file writes; nothing was changed (use write_file, or run_command)"
            ),
        }
    }
}

/// Replaces `old` by `new` in `content`: exactly one occurrence, or every
/// (non-overlapping) one with `replace_all`. Returns the new content and
/// how many were replaced.
///
/// The result's size is worked out before it is built and refused past
/// `max` bytes: a one-byte `old` matching millions of times, each replaced
/// by a long `new`, would otherwise ask for far more memory than exists.
pub fn replace_exact(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    max: usize,
) -> Result<(String, usize), EditError> {
    if old.is_empty() {
        return Err(EditError::EmptyOld);
    }
    if old == new {
        return Err(EditError::NoChange);
    }
    let count = content.matches(old).count();
    if count == 0 {
        return Err(EditError::NotFound);
    }
    if count > 1 && !replace_all {
        return Err(EditError::NotUnique(count));
    }
    // In u128, where count * new.len() cannot overflow; the matches do not
    // overlap, so the subtraction cannot go below zero.
    let len = content.len() as u128 - count as u128 * old.len() as u128
        + count as u128 * new.len() as u128;
    if len > max as u128 {
        return Err(EditError::TooLarge { len, max });
    }
    if count == 1 {
        Ok((content.replacen(old, new, 1), 1))
    } else {
        Ok((content.replace(old, new), count))
    }
}

/// Longest line shown by `read_file`, in characters; longer lines are cut
/// and say so.
pub const MAX_LINE_CHARS: usize = 2000;

/// What [`number_lines`] shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbered {
    /// The lines, `cat -n` style: the number right-aligned in six columns,
    /// a tab, the line.
    pub text: String,
    /// The first line shown (1-based); 0 when none is.
    pub first: u64,
    /// The last line shown; 0 when none is.
    pub last: u64,
    /// Lines in the text given (a final line without a newline counts).
    pub total: u64,
    /// Lines cut to [`MAX_LINE_CHARS`].
    pub long_lines: u64,
    /// Whether the output budget ended the listing before `limit` lines.
    pub budget_hit: bool,
}

/// Numbers the lines of `text` from line `offset` (1-based), at most
/// `limit` of them and at most `budget` bytes of output.
pub fn number_lines(text: &str, offset: u64, limit: u64, budget: usize) -> Numbered {
    let offset = offset.max(1);
    let mut out = Numbered {
        text: String::new(),
        first: 0,
        last: 0,
        total: 0,
        long_lines: 0,
        budget_hit: false,
    };
    let body = text.strip_suffix('\n').unwrap_or(text);
    if text.is_empty() {
        return out;
    }
    for (i, line) in body.split('\n').enumerate() {
        let n = i as u64 + 1;
        out.total = n;
        if n < offset || n >= offset.saturating_add(limit) || out.budget_hit {
            continue;
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut shown: String = line.chars().take(MAX_LINE_CHARS).collect();
        if shown.len() < line.len() {
            out.long_lines += 1;
            let _ = write!(
                shown,
                " [... line cut: {} more characters]",
                line.chars().count() - MAX_LINE_CHARS
            );
        }
        let entry = format!("{n:>6}\t{shown}\n");
        if out.text.len() + entry.len() > budget && out.first != 0 {
            out.budget_hit = true;
            continue;
        }
        if out.first == 0 {
            out.first = n;
        }
        out.last = n;
        out.text.push_str(&entry);
    }
    out
}

/// Whether `data` looks binary: a NUL byte in its first 8 KiB (as grep and
/// git decide).
pub fn looks_binary(data: &[u8]) -> bool {
    data.iter().take(8 << 10).any(|&b| b == 0)
}

/// `s` cut to at most `max` characters, with `...` when cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn fed(head: usize, tail: usize, chunks: &[&[u8]]) -> HeadTail {
        let mut ht = HeadTail::new(head, tail);
        for c in chunks {
            ht.push(c);
        }
        ht
    }

    #[test]
    fn short_output_is_kept_whole() {
        let ht = fed(8, 8, &[b"hello ", b"world"]);
        assert_eq!(ht.render(), "hello world");
        assert_eq!((ht.total(), ht.cut()), (11, 0));
    }

    #[test]
    fn output_filling_head_and_tail_exactly_is_not_cut() {
        let ht = fed(4, 4, &[b"abcdefgh"]);
        assert_eq!(ht.render(), "abcdefgh");
        assert_eq!(ht.cut(), 0);
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_how_much_was_cut() {
        let data: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        // Fed in awkward chunk sizes, the result is the same.
        for chunk in [1, 3, 7, 64, 100] {
            let mut ht = HeadTail::new(10, 10);
            for c in data.chunks(chunk) {
                ht.push(c);
            }
            let text = ht.render();
            assert!(
                text.starts_with("abcdefghij\n[... 80 bytes cut ...]\n"),
                "{text}"
            );
            let tail = String::from_utf8(data[90..].to_vec()).unwrap();
            assert!(text.ends_with(&tail), "{chunk}: {text}");
            assert_eq!((ht.total(), ht.cut()), (100, 80));
        }
    }

    #[test]
    fn a_huge_chunk_after_the_head_keeps_only_its_end() {
        let mut ht = HeadTail::new(2, 3);
        ht.push(b"ab");
        ht.push(b"xyz");
        ht.push(b"0123456789");
        assert_eq!(ht.render(), "ab\n[... 10 bytes cut ...]\n789");
        assert_eq!(ht.cut(), 10);
    }

    #[test]
    fn lost_bytes_are_reported_and_end_the_head() {
        let mut ht = HeadTail::new(4, 4);
        ht.push(b"ab");
        ht.lose(100);
        ht.push(b"cd");
        assert_eq!(ht.total(), 104);
        let text = ht.render();
        assert!(
            text.starts_with("ab\n[... 100 bytes cut; 100 of them were dropped"),
            "{text}"
        );
        assert!(text.ends_with("cd"), "{text}");
    }

    #[test]
    fn bytes_dropped_before_anything_was_kept_are_shown_first_and_the_head_still_fills() {
        let mut ht = HeadTail::new(4, 4);
        ht.lose(1000);
        ht.push(b"abcdefghijkl");
        assert_eq!(ht.total(), 1012);
        assert_eq!(
            ht.render(),
            "[... the first 1000 bytes were dropped by the sandbox's buffer before they could be read ...]\nabcd\n[... 4 bytes cut ...]\nijkl"
        );
    }

    #[test]
    fn characters_split_by_the_cut_are_dropped_not_mangled() {
        // "é" is two bytes: the head ends inside one, the tail starts inside another.
        let mut ht = HeadTail::new(3, 3);
        ht.push("aaé".as_bytes()); // 4 bytes: head keeps "aa" + first byte of é
        ht.push(b"xxxxxxxx");
        ht.push("é".as_bytes());
        ht.push(b"z");
        let text = ht.render();
        assert!(!text.contains('\u{FFFD}'), "{text:?}");
        assert!(text.starts_with("aa\n[..."), "{text:?}");
        assert!(text.ends_with("éz"), "{text:?}");
    }

    #[test]
    fn edit_replaces_a_unique_match() {
        let (out, n) =
            replace_exact("fn a() {}\nfn b() {}\n", "fn b", "fn c", false, usize::MAX).unwrap();
        assert_eq!((out.as_str(), n), ("fn a() {}\nfn c() {}\n", 1));
    }

    #[test]
    fn edit_refuses_zero_and_several_matches_and_counts_them() {
        assert_eq!(
            replace_exact("x = 1\nx = 1\n", "x = 1", "x = 2", false, usize::MAX),
            Err(EditError::NotUnique(2))
        );
        assert_eq!(
            replace_exact("abc", "abd", "x", false, usize::MAX),
            Err(EditError::NotFound)
        );
        let msg = EditError::NotUnique(2).message("a.txt");
        assert!(msg.contains("matches 2 times in a.txt"), "{msg}");
        assert!(EditError::NotFound.message("a.txt").contains("0 matches"));
    }

    #[test]
    fn edit_replace_all_replaces_every_match() {
        let (out, n) = replace_exact("x = 1\nx = 1\n", "x = 1", "x = 2", true, usize::MAX).unwrap();
        assert_eq!((out.as_str(), n), ("x = 2\nx = 2\n", 2));
        // Matches do not overlap.
        let (out, n) = replace_exact("aaaa", "aa", "b", true, usize::MAX).unwrap();
        assert_eq!((out.as_str(), n), ("bb", 2));
    }

    #[test]
    fn an_edit_that_would_grow_past_the_cap_is_refused_before_it_is_built() {
        // A million one-byte matches, each made a megabyte: a terabyte if
        // built. Refused by arithmetic, without allocating.
        let content = "a".repeat(1 << 20);
        let new = "b".repeat(1 << 20);
        let err = replace_exact(&content, "a", &new, true, 16 << 20).unwrap_err();
        assert_eq!(
            err,
            EditError::TooLarge {
                len: 1 << 40,
                max: 16 << 20
            }
        );
        assert!(err.message("f").contains("nothing was changed"));
        // One replacement counts too; shrinking or exact fits pass.
        assert!(replace_exact("abc", "b", "xyz", false, 4).is_err());
        assert_eq!(
            replace_exact("abc", "b", "xy", false, 4).unwrap(),
            ("axyc".to_string(), 1)
        );
        assert_eq!(
            replace_exact(&content, "a", "", true, 0).unwrap(),
            (String::new(), 1 << 20)
        );
    }

    #[test]
    fn edit_refuses_an_empty_or_unchanged_string() {
        assert_eq!(
            replace_exact("abc", "", "x", false, usize::MAX),
            Err(EditError::EmptyOld)
        );
        assert_eq!(
            replace_exact("abc", "b", "b", false, usize::MAX),
            Err(EditError::NoChange)
        );
    }

    #[test]
    fn lines_are_numbered_like_cat_n() {
        let n = number_lines("one\ntwo\nthree\n", 1, 2000, 1 << 20);
        assert_eq!(n.text, "     1\tone\n     2\ttwo\n     3\tthree\n");
        assert_eq!((n.first, n.last, n.total), (1, 3, 3));
    }

    #[test]
    fn offset_and_limit_pick_a_range_and_the_total_is_still_counted() {
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let n = number_lines(&text, 4, 3, 1 << 20);
        assert_eq!(n.text, "     4\tline 4\n     5\tline 5\n     6\tline 6\n");
        assert_eq!((n.first, n.last, n.total), (4, 6, 10));
        // Offset 0 is read as 1; past the end shows nothing.
        assert_eq!(number_lines(&text, 0, 1, 1 << 20).first, 1);
        let past = number_lines(&text, 11, 5, 1 << 20);
        assert_eq!((past.first, past.total, past.text.as_str()), (0, 10, ""));
    }

    #[test]
    fn a_last_line_without_newline_counts_and_crlf_is_trimmed() {
        let n = number_lines("a\r\nb", 1, 10, 1 << 20);
        assert_eq!(n.text, "     1\ta\n     2\tb\n");
        assert_eq!(n.total, 2);
        assert_eq!(number_lines("", 1, 10, 1 << 20).total, 0);
    }

    #[test]
    fn long_lines_are_cut_and_the_budget_stops_the_listing() {
        let long = "x".repeat(MAX_LINE_CHARS + 5);
        let n = number_lines(&format!("{long}\nshort\n"), 1, 10, 1 << 20);
        assert!(n.text.contains("[... line cut: 5 more characters]"));
        assert_eq!(n.long_lines, 1);
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        let n = number_lines(&text, 1, 100, 50);
        assert!(n.budget_hit);
        assert!(n.text.len() <= 50);
        assert_eq!(n.last, 3);
        assert_eq!(n.total, 100);
    }

    #[test]
    fn binary_is_detected_by_a_nul_byte() {
        assert!(looks_binary(b"ab\0cd"));
        assert!(!looks_binary(b"plain text"));
    }
}
