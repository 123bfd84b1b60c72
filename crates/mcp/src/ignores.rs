//! The `.gitignore` and `.ignore` files a walk honours, and what they may
//! cost.
//!
//! What ignore files may cost is bounded, since the workspace, and so its
//! ignore files, may be written by whatever runs in the sandbox: each
//! compiled pattern costs about 2 to 20 KB of memory and tens of
//! microseconds (a hundred thousand patterns in four nested files took
//! 450 MB and seconds per call). A walk honours an ignore file whole or
//! not at all: at most [`IGNORE_FILE_CAP`] bytes each, at most
//! [`IGNORE_TOTAL_CAP`] bytes and [`IGNORE_TOTAL_PATTERNS`] patterns for
//! all of them together; a file that does not fit in what is left is not
//! honoured (a part of one could drop a later `!` and hide files it
//! re-includes), the walk goes on without it, and the result says which
//! files were passed over. Listing a few files too many, and saying so,
//! serves better than refusing: ignore rules only trim the noise of a
//! search, they guard nothing.

use std::path::{Path, PathBuf};

use hako_core::{FileKind, Sandbox};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use crate::search::{join, Limits, WalkReport};

/// Largest ignore file honoured, bytes (a typical `.gitignore` is a few
/// KiB).
pub const IGNORE_FILE_CAP: u64 = 256 << 10;
/// Most bytes of ignore files one walk reads, all directories together.
pub const IGNORE_TOTAL_CAP: u64 = 1 << 20;
/// Most ignore patterns one walk compiles, all directories together
/// (comments and blank lines are not patterns). Each costs up to about
/// 20 KB of memory while the walk is below its directory, and tens of
/// microseconds to compile: this keeps the worst case near 100 MB and half
/// a second, where a typical repository's ignore files hold tens to a few
/// hundred.
pub const IGNORE_TOTAL_PATTERNS: usize = 5000;
/// Most ignore files not honoured that a walk names (it counts them all).
const IGNORE_SKIPPED_NAMED: usize = 5;

/// An ignore file a walk did not honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoreSkipped {
    /// Relative to the workspace root.
    pub path: PathBuf,
    /// Why.
    pub why: String,
}

/// What one walk may still spend on ignore files, and what it passed over.
pub(crate) struct IgnoreBudget {
    file_bytes: u64,
    bytes: u64,
    bytes_limit: u64,
    pattern_limit: usize,
    patterns: usize,
    honoured: usize,
    skipped: Vec<IgnoreSkipped>,
    skipped_count: usize,
}

impl IgnoreBudget {
    pub(crate) fn new(limits: &Limits) -> Self {
        IgnoreBudget {
            file_bytes: limits.ignore_file_bytes,
            bytes: limits.ignore_bytes,
            bytes_limit: limits.ignore_bytes,
            pattern_limit: limits.ignore_patterns,
            patterns: limits.ignore_patterns,
            honoured: 0,
            skipped: Vec::new(),
            skipped_count: 0,
        }
    }

    fn skip(&mut self, path: PathBuf, why: String) {
        self.skipped_count += 1;
        if self.skipped.len() < IGNORE_SKIPPED_NAMED {
            self.skipped.push(IgnoreSkipped { path, why });
        }
    }

    /// Puts what was spent and passed over into `report`.
    pub(crate) fn report(&self, report: &mut WalkReport) {
        report.ignore_patterns = self.honoured;
        report.ignore_skipped.clone_from(&self.skipped);
        report.ignore_skipped_count = self.skipped_count;
    }
}

/// The lines of an ignore file that are patterns: not blank, not comments.
fn pattern_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
}

/// The rules of one directory's ignore files.
pub(crate) type Rules = Gitignore;

/// A matcher path: the relative path under a fixed absolute root, so that
/// the `ignore` crate's prefix stripping works the same whatever the
/// workspace is called.
fn anchored(rel: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    out.extend(
        rel.components()
            .filter(|c| matches!(c, std::path::Component::Normal(_))),
    );
    out
}

/// Reads the `.gitignore` and `.ignore` of `dir` (relative), if any, and
/// honours each whole if it fits in what the walk may still spend on
/// them, else not at all.
pub(crate) fn load_rules(
    sandbox: &dyn Sandbox,
    dir: &Path,
    entries: &[hako_core::DirEntry],
    budget: &mut IgnoreBudget,
) -> Option<Rules> {
    let mut builder = GitignoreBuilder::new(anchored(dir));
    let mut honoured = Vec::new();
    let mut patterns_here = 0;
    for file in [".gitignore", ".ignore"] {
        let Some(entry) = entries.iter().find(|e| e.name == file) else {
            continue;
        };
        let path = join(dir, Path::new(file));
        // The listing's size tells a file that is too large without
        // reading it (and the bounded read below, one that grew since).
        if entry.kind == FileKind::File && entry.size > budget.file_bytes {
            budget.skip(path, format!("larger than {} bytes", budget.file_bytes));
            continue;
        }
        let cap = budget.file_bytes.min(budget.bytes);
        // One byte past the cap tells a file that is larger.
        let read = match sandbox.read_limit() {
            Some(r) => r
                .read_file_limit(&path, cap.saturating_add(1))
                .map(|o| o.data)
                .ok(),
            // Without bounded reads, the sandbox's own read limit applies.
            None => sandbox.read_file(&path).ok(),
        };
        let Some(data) = read else { continue };
        budget.bytes = budget.bytes.saturating_sub(data.len() as u64);
        if data.len() as u64 > cap {
            let why = if cap == budget.file_bytes {
                format!("larger than {} bytes", budget.file_bytes)
            } else {
                format!(
                    "past the {} bytes of ignore files one search reads",
                    budget.bytes_limit
                )
            };
            budget.skip(path, why);
            continue;
        }
        let text = String::from_utf8_lossy(&data);
        let count = pattern_lines(&text).count();
        if count > budget.patterns {
            budget.skip(
                path,
                format!(
                    "its {count} patterns are more than the {} left of the {} one search honours",
                    budget.patterns, budget.pattern_limit
                ),
            );
            continue;
        }
        budget.patterns -= count;
        for line in pattern_lines(&text) {
            // A line that is not a valid pattern is skipped, as git does.
            if builder.add_line(Some(path.clone()), line).is_ok() {
                patterns_here += 1;
            }
        }
        honoured.push(path);
    }
    if honoured.is_empty() {
        return None;
    }
    match builder.build() {
        Ok(rules) => {
            budget.honoured += patterns_here;
            Some(rules)
        }
        Err(e) => {
            for path in honoured {
                budget.skip(path, format!("its patterns could not be compiled: {e}"));
            }
            None
        }
    }
}

/// Whether the deepest rule that has an opinion ignores `rel`. Every rule
/// on the stack belongs to a directory above `rel`.
pub(crate) fn ignored(stack: &[Rules], rel: &Path, is_dir: bool) -> bool {
    for rules in stack.iter().rev() {
        match rules.matched(anchored(rel), is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    use crate::search::tests::small;
    use crate::search::{glob, walk_within};
    use crate::testbox::FenceBox;

    /// The paths a walk from the root finds, and its report.
    fn walk_all(sb: &dyn Sandbox, limits: &Limits) -> (Vec<String>, WalkReport) {
        let mut found = Vec::new();
        let report = walk_within(sb, Path::new("."), limits, &mut |f| {
            found.push(f.path.to_string_lossy().into_owned());
            true
        })
        .unwrap();
        (found, report)
    }

    #[test]
    fn ignore_files_past_the_walk_budget_are_not_honoured_at_all() {
        let tmp = tempfile::tempdir().unwrap();
        // 1000 patterns each, and comments that are none.
        let rules: String = (0..1000)
            .map(|i| format!("# rule {i}\npattern{i}*\n"))
            .collect();
        for i in 0..5 {
            let dir = tmp.path().join(format!("d{i}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join(".gitignore"), &rules).unwrap();
            std::fs::write(dir.join("pattern7.txt"), "x").unwrap();
        }
        let sb = FenceBox::new(tmp.path());
        let (found, report) = walk_all(&sb, &small(|l| l.ignore_patterns = 2500));
        // d0 and d1 fit; d2 does not fit whole in the 500 left, and is not
        // honoured in part either; nor are the next.
        assert_eq!(report.ignore_patterns, 2000);
        assert_eq!(report.ignore_skipped_count, 3);
        assert_eq!(
            report.ignore_skipped[0],
            IgnoreSkipped {
                path: "d2/.gitignore".into(),
                why: "its 1000 patterns are more than the 500 left of the 2500 one search honours"
                    .into()
            }
        );
        assert_eq!(
            found,
            [
                "d0/.gitignore",
                "d1/.gitignore",
                "d2/.gitignore",
                "d2/pattern7.txt",
                "d3/.gitignore",
                "d3/pattern7.txt",
                "d4/.gitignore",
                "d4/pattern7.txt"
            ]
        );
        let (_, report) = walk_all(&sb, &small(|l| l.ignore_bytes = 10));
        assert_eq!(
            (report.ignore_patterns, report.ignore_skipped_count),
            (0, 5)
        );
        let (_, report) = walk_all(&sb, &small(|l| l.ignore_file_bytes = 10));
        assert_eq!(
            (report.ignore_patterns, report.ignore_skipped_count),
            (0, 5)
        );
        assert!(
            report.ignore_skipped[0]
                .why
                .contains("larger than 10 bytes"),
            "{:?}",
            report.ignore_skipped
        );
        let (_, report) = walk_all(&sb, &Limits::DEFAULT);
        assert_eq!(
            (report.ignore_patterns, report.ignore_skipped_count),
            (5000, 0)
        );
    }

    /// Ignore rules as a generator of hostile workspaces writes them:
    /// `count` patterns that each need a regular expression, then one line
    /// that ignores `hidden`.
    fn hostile_rules(count: usize, depth: usize, hidden: &str) -> String {
        let mut rules: String = (0..count)
            .map(|i| format!("generated/depth{depth}/part-*/file{i:06}.tmp\n"))
            .collect();
        rules.push_str(hidden);
        rules.push('\n');
        rules
    }

    /// Four nested directories, each with an ignore file of `per_file`
    /// patterns that also ignores the `hidden.txt` beside it (and no
    /// other), and a `kept.txt`.
    fn nested_hostile_tree(per_file: usize) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = tmp.path().to_path_buf();
        for depth in 0..4 {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join(".gitignore"),
                hostile_rules(per_file, depth, "/hidden.txt"),
            )
            .unwrap();
            std::fs::write(dir.join("hidden.txt"), "x").unwrap();
            std::fs::write(dir.join("kept.txt"), "x").unwrap();
            dir = dir.join("sub");
        }
        tmp
    }

    #[test]
    fn a_gitignore_with_a_hundred_thousand_patterns_is_bounded() {
        // 25 000 patterns in each of four nested files: 100 000 patterns,
        // about 4 MiB of text.
        let tmp = nested_hostile_tree(25_000);
        let sb = FenceBox::new(tmp.path());
        let found = glob(&sb, "*.txt", Path::new(".")).unwrap();
        let paths: Vec<_> = found
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // Each file is over the size one ignore file may have: none is
        // honoured, not even in part, and the glob still answers, with
        // every file it would have hidden.
        let report = &found.report;
        assert_eq!(report.ignore_patterns, 0);
        assert_eq!(report.ignore_skipped_count, 4);
        assert_eq!(
            report.ignore_skipped[3],
            IgnoreSkipped {
                path: "sub/sub/sub/.gitignore".into(),
                why: format!("larger than {IGNORE_FILE_CAP} bytes"),
            }
        );
        let mut want = Vec::new();
        for depth in 0..4 {
            let dir = "sub/".repeat(depth);
            want.extend([format!("{dir}hidden.txt"), format!("{dir}kept.txt")]);
        }
        want.sort();
        assert_eq!(paths, want);
        // Files small enough, but together past the patterns one search
        // honours: the first two are, whole, and the next two not at all.
        let tmp = nested_hostile_tree(IGNORE_TOTAL_PATTERNS / 2 - 1);
        let sb = FenceBox::new(tmp.path());
        let found = glob(&sb, "*.txt", Path::new(".")).unwrap();
        let report = &found.report;
        assert_eq!(report.ignore_patterns, 2 * (IGNORE_TOTAL_PATTERNS / 2));
        assert_eq!(report.ignore_skipped_count, 2);
        let skipped: Vec<_> = report.ignore_skipped.iter().map(|s| &s.path).collect();
        assert_eq!(
            skipped,
            [
                Path::new("sub/sub/.gitignore"),
                Path::new("sub/sub/sub/.gitignore")
            ]
        );
        let paths: Vec<_> = found
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            paths,
            [
                "kept.txt",
                "sub/kept.txt",
                "sub/sub/hidden.txt",
                "sub/sub/kept.txt",
                "sub/sub/sub/hidden.txt",
                "sub/sub/sub/kept.txt"
            ]
        );
    }

    #[test]
    fn a_typical_repositorys_nested_gitignores_are_honoured_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        for dir in [
            "target/debug",
            "src/gen",
            "web/node_modules/x",
            "web/dist",
            "logs",
        ] {
            std::fs::create_dir_all(ws.join(dir)).unwrap();
        }
        let root = "# Rust\n/target\n**/*.rs.bk\n\n# Editors\n.idea/\n*.swp\n*~\n\n# Logs\n*.log\n!logs/keep.log\n";
        let web = "node_modules/\n/dist\n.env\n";
        let src = "gen/*\n!gen/keep.rs\n";
        for (path, text) in [
            (".gitignore", root),
            ("web/.gitignore", web),
            ("src/.ignore", src),
            ("src/main.rs", ""),
            ("src/main.rs.bk", ""),
            ("src/gen/a.rs", ""),
            ("src/gen/keep.rs", ""),
            ("target/debug/out.rs", ""),
            ("web/index.js", ""),
            ("web/.env", ""),
            ("web/node_modules/x/i.js", ""),
            ("web/dist/app.js", ""),
            ("logs/a.log", ""),
            ("logs/keep.log", ""),
            ("notes.txt~", ""),
        ] {
            std::fs::write(ws.join(path), text).unwrap();
        }
        let sb = FenceBox::new(ws);
        let (mut found, report) = walk_all(&sb, &Limits::DEFAULT);
        found.sort();
        assert_eq!(
            found,
            [
                ".gitignore",
                "logs/keep.log",
                "src/.ignore",
                "src/gen/keep.rs",
                "src/main.rs",
                "web/.gitignore",
                "web/index.js"
            ]
        );
        // Every pattern, and no comment or blank line, counted.
        assert_eq!(report.ignore_patterns, 7 + 3 + 2);
        assert_eq!(report.ignore_skipped_count, 0);
        assert!(report.ignore_skipped.is_empty());
    }
}
