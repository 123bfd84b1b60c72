//! Showing changes: a unified diff as `git diff` prints it, the
//! `--stat` summary, and JSON with one entry per change.
//!
//! Files are shown as git shows them (`new file mode`, `deleted file
//! mode`, `old mode`/`new mode`, `Binary files ... differ`, a symlink as
//! its target without a final newline, a change of kind as a deletion
//! and an addition). Git does not show directories or special files;
//! here each such change is a line starting with `# ` between the file
//! diffs, which `git apply` skips, so that nothing committed goes unseen.

use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use similar::TextDiff;

use crate::{diff_hash, hex, Change, Layers, Node, Side, Status};

/// The most bytes of one file shown as text; a larger file is shown by
/// size and hash only.
pub const MAX_SHOWN: u64 = 8 << 20;

/// Lines of context around each hunk, as git's default.
const CONTEXT: usize = 3;

/// The text of one side, for the diff: a file's content (when it is text
/// and not too large) or a symlink's target.
enum Text {
    None,
    Lines(Vec<u8>),
    Binary,
    TooLarge(u64),
    /// Changed since it was scanned.
    Changed,
}

fn text(layers: &Layers, change: &Change, side: Side) -> Text {
    let node = match side {
        Side::Old => &change.old,
        Side::New => &change.new,
    };
    match node {
        Some(Node::File { binary: true, .. }) => Text::Binary,
        Some(Node::File { size, .. }) if *size > MAX_SHOWN => Text::TooLarge(*size),
        Some(Node::File { .. }) => match layers.content(change, side) {
            Ok(Some(data)) => Text::Lines(data),
            _ => Text::Changed,
        },
        Some(Node::Symlink { target }) => Text::Lines(target.as_bytes().to_vec()),
        _ => Text::None,
    }
}

/// A path as `git diff` shows it (its `core.quotePath` default): as it
/// is when every byte is printable ASCII other than `"` and `\`, else
/// the whole token (with its `a/` or `b/` prefix) in double quotes, a
/// control as `\n`, `\t` and the like, `"` and `\` escaped, and every
/// other byte (a control, DEL, any byte of a non-ASCII name) as three
/// octal digits. So no file name can start a line of the review of its
/// own (a name holding a newline and `+++ b/...` would otherwise forge
/// one), and two names never show alike.
fn quoted(prefix: &str, path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if bytes.iter().all(|&b| plain(b)) {
        return format!("{prefix}{}", path.to_string_lossy());
    }
    let mut out = String::from("\"");
    out.push_str(prefix);
    for &b in bytes {
        match b {
            b'\x07' => out.push_str("\\a"),
            b'\x08' => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\x0b' => out.push_str("\\v"),
            b'\x0c' => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b if plain(b) => out.push(char::from(b)),
            b => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// A path as the text forms show it (see [`quoted`]).
fn shown(path: &Path) -> String {
    quoted("", path)
}

/// Lines added and removed between two texts.
fn counts(old: &[u8], new: &[u8]) -> (usize, usize) {
    let diff = TextDiff::from_lines(old, new);
    let (mut added, mut removed) = (0, 0);
    for op in diff.ops() {
        for change in diff.iter_changes(op) {
            match change.tag() {
                similar::ChangeTag::Insert => added += 1,
                similar::ChangeTag::Delete => removed += 1,
                similar::ChangeTag::Equal => {}
            }
        }
    }
    (added, removed)
}

fn lines_of(t: &Text) -> &[u8] {
    match t {
        Text::Lines(data) => data,
        _ => &[],
    }
}

fn is_text(node: &Option<Node>) -> bool {
    matches!(node, Some(Node::File { .. }) | Some(Node::Symlink { .. }))
}

/// The hunks between two texts, as `git diff` prints them.
fn hunks(out: &mut String, old: &[u8], new: &[u8]) {
    let diff = TextDiff::from_lines(old, new);
    let mut unified = diff.unified_diff();
    unified.context_radius(CONTEXT).missing_newline_hint(true);
    for hunk in unified.iter_hunks() {
        let _ = write!(out, "{hunk}");
    }
}

/// One file's part of the diff (one side of a change of kind).
fn file_part(
    out: &mut String,
    path: &Path,
    old: Option<(&Node, &Text)>,
    new: Option<(&Node, &Text)>,
) {
    let _ = writeln!(
        out,
        "diff --git {} {}",
        quoted("a/", path),
        quoted("b/", path)
    );
    match (old, new) {
        (None, Some((n, _))) => {
            let _ = writeln!(out, "new file mode {:06o}", n.git_mode());
        }
        (Some((o, _)), None) => {
            let _ = writeln!(out, "deleted file mode {:06o}", o.git_mode());
        }
        (Some((o, _)), Some((n, _))) if o.git_mode() != n.git_mode() => {
            let _ = writeln!(out, "old mode {:06o}", o.git_mode());
            let _ = writeln!(out, "new mode {:06o}", n.git_mode());
        }
        _ => {}
    }
    let none = Text::None;
    let (old_text, new_text) = (old.map_or(&none, |o| o.1), new.map_or(&none, |n| n.1));
    for t in [old_text, new_text] {
        match t {
            Text::Binary => {
                let a = if old.is_some() {
                    quoted("a/", path)
                } else {
                    "/dev/null".into()
                };
                let b = if new.is_some() {
                    quoted("b/", path)
                } else {
                    "/dev/null".into()
                };
                let _ = writeln!(out, "Binary files {a} and {b} differ");
                return;
            }
            Text::TooLarge(size) => {
                let _ = writeln!(
                    out,
                    "# {}: {size} bytes, too large to show as text",
                    shown(path)
                );
                return;
            }
            Text::Changed => {
                let _ = writeln!(
                    out,
                    "# {}: changed since it was listed; list it again",
                    shown(path)
                );
                return;
            }
            _ => {}
        }
    }
    let (a, b) = (lines_of(old_text), lines_of(new_text));
    if a == b {
        return;
    }
    let from = if old.is_some() {
        quoted("a/", path)
    } else {
        "/dev/null".into()
    };
    let to = if new.is_some() {
        quoted("b/", path)
    } else {
        "/dev/null".into()
    };
    let _ = writeln!(out, "--- {from}");
    let _ = writeln!(out, "+++ {to}");
    hunks(out, a, b);
}

/// The unified diff of `changes`.
pub fn unified(layers: &Layers, changes: &[Change]) -> String {
    let mut out = String::new();
    for change in changes {
        let path = shown(&change.path);
        if let Some(why) = change.refusal() {
            let kind = change.new.as_ref().map_or("", |n| n.kind());
            let _ = writeln!(out, "# {path}: {kind} in the sandbox; {why}");
            if !matches!(change.new, Some(Node::File { .. })) {
                continue;
            }
        }
        let (old_text, new_text) = (
            text(layers, change, Side::Old),
            text(layers, change, Side::New),
        );
        let old = change.old.as_ref().filter(|_| is_text(&change.old));
        let new = change.new.as_ref().filter(|_| is_text(&change.new));
        match change.status() {
            Status::TypeChanged => {
                if let Some(o) = old {
                    file_part(&mut out, &change.path, Some((o, &old_text)), None);
                }
                if let Some(n) = new {
                    file_part(&mut out, &change.path, None, Some((n, &new_text)));
                }
            }
            _ if old.is_some() || new.is_some() => file_part(
                &mut out,
                &change.path,
                old.map(|o| (o, &old_text)),
                new.map(|n| (n, &new_text)),
            ),
            _ => {}
        }
        // What git would not show: directories and special files.
        for (side, node) in [("workspace", &change.old), ("sandbox", &change.new)] {
            if let Some(node @ (Node::Dir { .. } | Node::Special { .. })) = node {
                let what = match (change.status(), side) {
                    (Status::Added, _) => "added",
                    (Status::Deleted, _) => "deleted",
                    (Status::ModeChanged, "workspace") => continue,
                    (Status::ModeChanged, _) => "mode changed",
                    (_, "workspace") => "replaced",
                    _ => "in its place",
                };
                let _ = writeln!(
                    out,
                    "# {} {what}: {path} (mode {:04o})",
                    node.kind(),
                    node.git_mode() & 0o7777
                );
            }
        }
    }
    out
}

/// Lines added and removed by one change (0, 0 for a binary file, a
/// directory or a special file).
fn change_counts(layers: &Layers, change: &Change) -> (usize, usize) {
    let (old, new) = (
        text(layers, change, Side::Old),
        text(layers, change, Side::New),
    );
    let text_only = |t: &Text| matches!(t, Text::Lines(_) | Text::None);
    if !text_only(&old) || !text_only(&new) {
        return (0, 0);
    }
    counts(lines_of(&old), lines_of(&new))
}

/// `--stat`: one line per change, then the totals, as `git diff --stat`.
pub fn stat(layers: &Layers, changes: &[Change]) -> String {
    let rows: Vec<(String, String)> = changes
        .iter()
        .map(|change| {
            let path = shown(&change.path);
            let binary = |n: &Option<Node>| matches!(n, Some(Node::File { binary: true, .. }));
            let what = if binary(&change.old) || binary(&change.new) {
                let size = |n: &Option<Node>| match n {
                    Some(Node::File { size, .. }) => *size,
                    _ => 0,
                };
                format!("Bin {} -> {} bytes", size(&change.old), size(&change.new))
            } else if is_text(&change.old) || is_text(&change.new) {
                let (added, removed) = change_counts(layers, change);
                format!(
                    "{} {}{}",
                    added + removed,
                    "+".repeat(added.min(40)),
                    "-".repeat(removed.min(40))
                )
            } else {
                let node = change.new.as_ref().or(change.old.as_ref());
                format!("{} {:?}", node.map_or("", |n| n.kind()), change.status())
            };
            (path, what)
        })
        .collect();
    let width = rows
        .iter()
        .map(|(p, _)| p.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    let (mut added, mut removed) = (0, 0);
    for change in changes {
        let (a, r) = change_counts(layers, change);
        added += a;
        removed += r;
    }
    for (path, what) in rows {
        let _ = writeln!(out, " {path:<width$} | {what}");
    }
    let _ = writeln!(
        out,
        " {} change{}, {added} insertion{}(+), {removed} deletion{}(-)",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" },
        if added == 1 { "" } else { "s" },
        if removed == 1 { "" } else { "s" },
    );
    out
}

/// A name that is not UTF-8 is shown in JSON as its text with each
/// invalid sequence replaced, which two names may share: beside it,
/// `KEY_hex` then holds its bytes, in hex, exactly.
fn with_hex(value: &mut serde_json::Value, key: &str, name: &std::ffi::OsStr) {
    if name.to_str().is_none() {
        if let Some(map) = value.as_object_mut() {
            map.insert(
                format!("{key}_hex"),
                serde_json::Value::String(hex(name.as_bytes())),
            );
        }
    }
}

fn node_json(node: &Option<Node>) -> serde_json::Value {
    match node {
        None => serde_json::Value::Null,
        Some(Node::File {
            mode,
            size,
            sha256,
            binary,
        }) => serde_json::json!({
            "kind": "file", "mode": format!("{mode:04o}"), "size": size,
            "sha256": hex(sha256), "binary": binary,
        }),
        Some(Node::Symlink { target }) => {
            let mut node = serde_json::json!({
                "kind": "symlink", "target": target.to_string_lossy(),
            });
            with_hex(&mut node, "target", target.as_os_str());
            node
        }
        Some(Node::Dir { mode }) => serde_json::json!({
            "kind": "dir", "mode": format!("{mode:04o}"),
        }),
        Some(Node::Special { kind, mode }) => serde_json::json!({
            "kind": kind.name(), "mode": format!("{mode:04o}"),
        }),
    }
}

/// `--json`: the hash and one entry per change (path, status, both
/// sides, lines added and removed, and why committing it is refused, if
/// it is).
pub fn json(layers: &Layers, changes: &[Change]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = changes
        .iter()
        .map(|change| {
            let (added, removed) = change_counts(layers, change);
            let raw = change.path.as_os_str();
            let mut entry = serde_json::json!({
                "path": raw.to_string_lossy(),
                "status": change.status(),
                "old": node_json(&change.old),
                "new": node_json(&change.new),
                "insertions": added,
                "deletions": removed,
                "refused": change.refusal(),
            });
            with_hex(&mut entry, "path", raw);
            entry
        })
        .collect();
    serde_json::json!({ "hash": diff_hash(changes), "changes": entries })
}
