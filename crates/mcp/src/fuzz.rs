//! Fuzzing the MCP tools' arguments with a fixed budget (run by plain
//! `cargo test`): random JSON arguments, built from each tool's fields and
//! hostile values (`..`, absolute paths, NUL, huge numbers, regex and glob
//! syntax), are parsed as rmcp parses them and handed to the file tools
//! over the real fence in a temporary workspace. Every call must answer (a
//! result or a tool error), never panic, and nothing outside the workspace
//! may change. `HAKO_FUZZ_CASES` sets the cases per target and
//! `HAKO_FUZZ_SEED` the first seed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::files::{self, GrepArgs};
use crate::server::{
    EditFileArgs, GlobArgs, GrepToolArgs, ListDirArgs, ReadFileArgs, WriteFileArgs,
};
use crate::state::State;
use crate::testbox::FenceBox;
use crate::text;

const CASES: u64 = 600;

fn cases() -> u64 {
    std::env::var("HAKO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn first_seed() -> u64 {
    std::env::var("HAKO_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x006d_6370)
}

const PIECES: &[&str] = &[
    "a",
    "a.txt",
    "dir",
    "dir/",
    "/",
    "..",
    "../",
    "../secret",
    "/etc/passwd",
    ".",
    "./",
    "\0",
    "*",
    "**",
    "?",
    "{a,b}",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "\\",
    "^",
    "$",
    "|",
    "+",
    ".*",
    "a{99}",
    "(?i)",
    "\n",
    "\r\n",
    "é",
    "\u{202e}",
    " ",
    "~",
    "$HOME",
    "/proc/self/fd/0",
    "dir/../..",
    "link",
    "link/secret",
];

fn text(rng: &mut fastrand::Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.usize(0..12) {
        match rng.u8(0..10) {
            0..=6 => s.push_str(PIECES[rng.usize(0..PIECES.len())]),
            7 => s.push(rng.char(..)),
            8 => s.push_str(&"x".repeat(rng.usize(0..5000))),
            _ => s.push_str(&rng.u64(..).to_string()),
        }
    }
    s
}

/// A value for a field: usually of the right type, sometimes not.
fn value(rng: &mut fastrand::Rng, kind: &str) -> Value {
    match (kind, rng.u8(0..10)) {
        (_, 0) => Value::Null,
        (_, 1) => json!(rng.i64(..)),
        (_, 2) => json!([text(rng)]),
        (_, 3) => json!({"x": 1}),
        ("u64", _) => json!(if rng.bool() {
            rng.u64(..)
        } else {
            rng.u64(0..20)
        }),
        ("bool", _) => json!(rng.bool()),
        _ => json!(text(rng)),
    }
}

/// A JSON object with some of `fields` (and now and then one not asked for).
fn args(rng: &mut fastrand::Rng, fields: &[(&str, &str)]) -> Value {
    let mut map = Map::new();
    for (name, kind) in fields {
        if rng.u8(0..10) < 8 {
            map.insert((*name).to_string(), value(rng, kind));
        }
    }
    if rng.u8(0..20) == 0 {
        map.insert(text(rng), value(rng, "str"));
    }
    Value::Object(map)
}

/// A workspace with a few files, a directory, a symlink out of it, and a
/// secret beside it that no call may change.
struct Fixture {
    tmp: tempfile::TempDir,
    state: State,
    sb: FenceBox,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("dir")).unwrap();
    std::fs::write(ws.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(ws.join("dir/b.rs"), "fn main() {}\n").unwrap();
    std::fs::write(tmp.path().join("secret"), "OUTSIDE").unwrap();
    std::os::unix::fs::symlink(tmp.path(), ws.join("link")).unwrap();
    let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), None);
    let sb = FenceBox::new(&ws);
    Fixture { tmp, state, sb }
}

impl Fixture {
    fn outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names.len(),
            2,
            "something was made outside the workspace: {names:?}"
        );
        assert_eq!(
            std::fs::read_to_string(self.tmp.path().join("secret")).unwrap(),
            "OUTSIDE"
        );
    }
}

/// Runs `case` on `cases()` argument sets; a panic fails with its seed.
fn fuzz(name: &str, case: impl Fn(&Fixture, &mut fastrand::Rng)) {
    let f = fixture();
    let first = first_seed();
    for seed in first..first + cases() {
        let mut rng = fastrand::Rng::with_seed(seed);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&f, &mut rng)));
        assert!(caught.is_ok(), "{name}: panicked on seed {seed}");
    }
    f.outside_untouched();
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Option<T> {
    serde_json::from_value(v).ok()
}

#[test]
fn fuzz_mcp_file_tool_arguments_never_panic_nor_reach_outside() {
    fuzz("read/write/edit/list", |f, rng| {
        let st = &f.state;
        match rng.u8(0..4) {
            0 => {
                let a = args(rng, &[("path", "str"), ("offset", "u64"), ("limit", "u64")]);
                if let Some(a) = parse::<ReadFileArgs>(a) {
                    let _ = files::read_file(st, &f.sb, &PathBuf::from(a.path), a.offset, a.limit);
                }
            }
            1 => {
                let a = args(rng, &[("path", "str"), ("content", "str")]);
                if let Some(a) = parse::<WriteFileArgs>(a) {
                    let _ = files::write_file(st, &f.sb, &PathBuf::from(a.path), &a.content);
                }
            }
            2 => {
                let a = args(
                    rng,
                    &[
                        ("path", "str"),
                        ("old_string", "str"),
                        ("new_string", "str"),
                        ("replace_all", "bool"),
                    ],
                );
                if let Some(a) = parse::<EditFileArgs>(a) {
                    let _ = files::edit_file(
                        st,
                        &f.sb,
                        &PathBuf::from(a.path),
                        &a.old_string,
                        &a.new_string,
                        a.replace_all,
                    );
                }
            }
            _ => {
                if let Some(a) = parse::<ListDirArgs>(args(rng, &[("path", "str")])) {
                    let path = PathBuf::from(a.path.unwrap_or_else(|| ".".into()));
                    let _ = files::list_dir(st, &f.sb, &path);
                }
            }
        }
    });
}

#[test]
fn fuzz_mcp_search_tool_arguments_never_panic() {
    fuzz("glob/grep", |f, rng| {
        if rng.bool() {
            if let Some(a) = parse::<GlobArgs>(args(rng, &[("pattern", "str"), ("path", "str")])) {
                let base = a.path.map(PathBuf::from);
                let _ = files::glob(&f.state, &f.sb, &a.pattern, base.as_deref());
            }
        } else {
            let a = args(
                rng,
                &[
                    ("pattern", "str"),
                    ("path", "str"),
                    ("glob", "str"),
                    ("case_insensitive", "bool"),
                    ("max_results", "u64"),
                ],
            );
            if let Some(a) = parse::<GrepToolArgs>(a) {
                let max_results = a.max_results.unwrap_or(100).clamp(1, 1000) as usize;
                let _ = files::grep(
                    &f.state,
                    &f.sb,
                    &GrepArgs {
                        pattern: a.pattern,
                        path: a.path.map(PathBuf::from),
                        glob: a.glob,
                        case_insensitive: a.case_insensitive,
                        max_results,
                    },
                );
            }
        }
    });
}

#[test]
fn fuzz_mcp_text_helpers_never_panic() {
    fuzz("text", |_, rng| {
        let (content, old, new) = (text(rng), text(rng), text(rng));
        let _ = text::replace_exact(&content, &old, &new, rng.bool(), rng.usize(0..1 << 16));
        let _ = text::number_lines(&content, rng.u64(..), rng.u64(..), rng.usize(0..4096));
        let _ = text::shorten(&content, rng.usize(0..64));
        let _ = text::looks_binary(content.as_bytes());
        let _ = Path::new(&old);
    });
}
