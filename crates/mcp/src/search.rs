//! `glob` and `grep`: a walk of the workspace that goes through the
//! sandbox's own file fence (`list_dir`, bounded reads), never the host's
//! file system by name.
//!
//! Walking through the fence rather than with `std::fs` means the walk
//! cannot be led outside the workspace: a directory swapped for a symlink
//! to `/` mid-walk is refused by the fence like any other path, and
//! symlinks are never followed (they are listed as symlinks). It also
//! works the same on every backend, whatever the workspace is called
//! inside. `.gitignore` and `.ignore` files are honoured the way git reads
//! them (each applies beneath its directory, deeper files win, `!`
//! re-includes), using the `ignore` crate's matcher; `.git` directories
//! are never entered, and what ignore files may cost is bounded (see
//! [`crate::ignores`]).

use std::path::{Path, PathBuf};

use crate::ignores::{ignored, load_rules, IgnoreBudget, IgnoreSkipped, Rules};
use globset::{GlobBuilder, GlobMatcher};
use hako_core::{FileKind, Sandbox};

use crate::state::ToolError;
use crate::text::{looks_binary, shorten};

/// Most directory entries one walk looks at.
pub const MAX_VISITED: usize = 200_000;
/// Most paths `glob` returns.
pub const MAX_GLOB_RESULTS: usize = 1000;
/// Most bytes of one file `grep` reads.
pub const GREP_FILE_CAP: u64 = 4 << 20;
/// Most bytes of all files `grep` reads in one call.
pub const GREP_TOTAL_CAP: u64 = 512 << 20;
/// Most bytes of directory paths a walk keeps waiting to be listed: a
/// tree of long names, wide at every level of a deep path, would
/// otherwise hold hundreds of megabytes of paths at once.
pub const MAX_PENDING_BYTES: usize = 32 << 20;
/// Longest line `grep` shows, in characters.
pub const GREP_LINE_CHARS: usize = 400;
/// Most bytes of `grep` output.
pub const GREP_OUTPUT_CAP: usize = 64 << 10;

/// A file the walk found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Relative to the workspace root.
    pub path: PathBuf,
    /// Relative to the directory the walk started in.
    pub below: PathBuf,
    /// What it is (never a directory).
    pub kind: FileKind,
}

/// How a walk ended.
#[derive(Debug, Default, Clone)]
pub struct WalkReport {
    /// Whether it stopped early: at [`MAX_VISITED`] entries, or with more
    /// than [`MAX_PENDING_BYTES`] of directory paths waiting.
    pub stopped: bool,
    /// Directories that could not be listed, with why (the first few).
    pub unreadable: Vec<String>,
    /// Directories whose listing was cut at the sandbox's entry limit.
    pub cut_listings: usize,
    /// Ignore patterns honoured.
    pub ignore_patterns: usize,
    /// Ignore files not honoured: too large, past the walk's budget, or
    /// not compiled (files they exclude may be listed). The first few,
    /// with why.
    pub ignore_skipped: Vec<IgnoreSkipped>,
    /// How many ignore files were not honoured in all.
    pub ignore_skipped_count: usize,
}

/// What one walk may spend: the defaults are the constants above; tests
/// use smaller ones.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most directory entries looked at.
    pub visited: usize,
    /// Most bytes of directory paths waiting to be listed.
    pub pending_bytes: usize,
    /// Largest ignore file honoured, bytes.
    pub ignore_file_bytes: u64,
    /// Most bytes of ignore files read.
    pub ignore_bytes: u64,
    /// Most ignore patterns compiled.
    pub ignore_patterns: usize,
}

impl Limits {
    /// The limits every tool call walks with.
    pub const DEFAULT: Limits = Limits {
        visited: MAX_VISITED,
        pending_bytes: MAX_PENDING_BYTES,
        ignore_file_bytes: crate::ignores::IGNORE_FILE_CAP,
        ignore_bytes: crate::ignores::IGNORE_TOTAL_CAP,
        ignore_patterns: crate::ignores::IGNORE_TOTAL_PATTERNS,
    };
}

pub(crate) fn join(dir: &Path, name: &Path) -> PathBuf {
    if dir == Path::new(".") {
        name.to_path_buf()
    } else {
        dir.join(name)
    }
}

/// Walks the files under `base` (relative to the workspace), skipping what
/// the ignore files exclude, depth first in name order, and calls `visit`
/// with each entry that is not a directory until it returns `false`.
pub fn walk(
    sandbox: &dyn Sandbox,
    base: &Path,
    visit: &mut dyn FnMut(Found) -> bool,
) -> Result<WalkReport, ToolError> {
    walk_within(sandbox, base, &Limits::DEFAULT, visit)
}

/// [`walk`] within `limits`. Whatever the tree (deep, wide, long names,
/// huge ignore files), it holds at most about `pending_bytes` of paths
/// and `ignore_bytes` of ignore rules, and looks at `visited` entries.
pub fn walk_within(
    sandbox: &dyn Sandbox,
    base: &Path,
    limits: &Limits,
    visit: &mut dyn FnMut(Found) -> bool,
) -> Result<WalkReport, ToolError> {
    let base = normalise(sandbox, base)?;
    let mut report = WalkReport::default();
    let mut budget = IgnoreBudget::new(limits);
    // The rules of the directories above `base` apply too (none above
    // the root: its own are read with its listing below, once).
    let mut stack: Vec<Rules> = Vec::new();
    let mut dir = PathBuf::from(".");
    let above = base
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)));
    for part in above {
        if let Ok(listing) = sandbox.list_dir(&dir) {
            stack.extend(load_rules(sandbox, &dir, &listing.entries, &mut budget));
        }
        dir = join(&dir, Path::new(part.as_os_str()));
    }
    // Listing `base` first gives its error (not found, outside) as is.
    let listing = sandbox.list_dir(&base)?;
    let mut visited = 0usize;
    // Each directory to expand, its listing if already read, and how many
    // rules (those of the directories above it) apply to it; and the bytes
    // of the paths waiting.
    let mut todo: Vec<(PathBuf, Option<hako_core::DirListing>, usize)> =
        vec![(base.clone(), Some(listing), stack.len())];
    let mut pending = 0usize;
    while let Some((dir, listing, depth)) = todo.pop() {
        pending = pending.saturating_sub(dir.as_os_str().len());
        stack.truncate(depth);
        let listing = match listing {
            Some(l) => l,
            None => match sandbox.list_dir(&dir) {
                Ok(l) => l,
                Err(err) => {
                    if report.unreadable.len() < 5 {
                        report.unreadable.push(format!("{}: {err}", dir.display()));
                    }
                    continue;
                }
            },
        };
        if listing.truncated {
            report.cut_listings += 1;
        }
        stack.extend(load_rules(sandbox, &dir, &listing.entries, &mut budget));
        let mut subdirs = Vec::new();
        for entry in listing.entries {
            visited += 1;
            if visited > limits.visited {
                report.stopped = true;
                budget.report(&mut report);
                return Ok(report);
            }
            let rel = join(&dir, Path::new(&entry.name));
            let is_dir = entry.kind == FileKind::Dir;
            if is_dir && entry.name == ".git" {
                continue;
            }
            if ignored(&stack, &rel, is_dir) {
                continue;
            }
            if is_dir {
                // Counted as each is found: one listing alone can hold a
                // hundred thousand long paths.
                pending += rel.as_os_str().len();
                if pending > limits.pending_bytes {
                    report.stopped = true;
                    budget.report(&mut report);
                    return Ok(report);
                }
                subdirs.push(rel);
                continue;
            }
            let below = if base == Path::new(".") {
                rel.clone()
            } else {
                rel.strip_prefix(&base)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|_| rel.clone())
            };
            if !visit(Found {
                path: rel,
                below,
                kind: entry.kind,
            }) {
                budget.report(&mut report);
                return Ok(report);
            }
        }
        // Pushed in reverse so that they are expanded in name order.
        for sub in subdirs.into_iter().rev() {
            todo.push((sub, None, stack.len()));
        }
    }
    budget.report(&mut report);
    Ok(report)
}

/// A caller's path, relative to the workspace and lexically clean (`.`
/// for the root). An absolute path is accepted only under the workspace;
/// `..` that climbs out is refused (as the fence would refuse it).
pub fn normalise(sandbox: &dyn Sandbox, path: &Path) -> Result<PathBuf, ToolError> {
    let workdir = sandbox
        .workdir()
        .map(|w| w.workdir().to_path_buf())
        .unwrap_or_default();
    let rel = hako_core::path::relative(path, &workdir).map_err(hako_core::Error::from)?;
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            // `relative` has checked that it does not climb out.
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// A glob as the tools read it: `*` stays within one path component, `**`
/// crosses them, `{a,b}` alternates; a pattern without `/` matches a file
/// name anywhere below the base.
pub struct Pattern {
    matcher: GlobMatcher,
    name_only: bool,
}

impl Pattern {
    /// Compiles `glob`.
    pub fn new(glob: &str) -> Result<Self, ToolError> {
        let trimmed = glob.trim_start_matches("./");
        let matcher = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| ToolError::new(format!("invalid glob {glob:?}: {e}")))?
            .compile_matcher();
        Ok(Pattern {
            matcher,
            name_only: !trimmed.contains('/'),
        })
    }

    /// Whether `below` (relative to the walk's base) matches.
    pub fn matches(&self, below: &Path) -> bool {
        if self.name_only {
            below
                .file_name()
                .is_some_and(|name| self.matcher.is_match(Path::new(name)))
        } else {
            self.matcher.is_match(below)
        }
    }
}

/// What `glob` found.
pub struct GlobResult {
    /// Matching paths, relative to the workspace, sorted.
    pub paths: Vec<PathBuf>,
    /// Whether more matched than [`MAX_GLOB_RESULTS`].
    pub more: bool,
    /// How the walk ended.
    pub report: WalkReport,
}

/// Files under `base` whose path below it matches `pattern`.
pub fn glob(sandbox: &dyn Sandbox, pattern: &str, base: &Path) -> Result<GlobResult, ToolError> {
    let pattern = Pattern::new(pattern)?;
    let mut paths = Vec::new();
    let mut more = false;
    let report = walk(sandbox, base, &mut |found| {
        if pattern.matches(&found.below) {
            if paths.len() >= MAX_GLOB_RESULTS {
                more = true;
                return false;
            }
            paths.push(found.path);
        }
        true
    })?;
    paths.sort();
    Ok(GlobResult {
        paths,
        more,
        report,
    })
}

/// What `grep` was asked.
pub struct GrepQuery<'a> {
    /// A regular expression (Rust `regex` syntax).
    pub pattern: &'a str,
    /// File or directory, relative to the workspace.
    pub base: &'a Path,
    /// Only files whose path below `base` matches this glob.
    pub glob: Option<&'a str>,
    /// Match case-insensitively.
    pub case_insensitive: bool,
    /// Most matching lines to return.
    pub max_results: usize,
}

/// What `grep` found.
#[derive(Default)]
pub struct GrepResult {
    /// `path:line:text` lines.
    pub lines: Vec<String>,
    /// Whether it stopped at `max_results` (or the output cap).
    pub more: bool,
    /// Files searched.
    pub files: usize,
    /// Files with a match.
    pub files_matched: usize,
    /// Files skipped as binary.
    pub binary: usize,
    /// Files searched only in their first [`GREP_FILE_CAP`] bytes.
    pub partial: Vec<PathBuf>,
    /// Files that could not be read, with why (the first few).
    pub unreadable: Vec<String>,
    /// Whether it stopped at [`GREP_TOTAL_CAP`] bytes read.
    pub read_cap_hit: bool,
    /// How the walk ended.
    pub report: WalkReport,
}

/// Searches the files under `query.base` (or that one file) for lines
/// matching `query.pattern`.
pub fn grep(sandbox: &dyn Sandbox, query: &GrepQuery<'_>) -> Result<GrepResult, ToolError> {
    let regex = regex::bytes::RegexBuilder::new(query.pattern)
        .case_insensitive(query.case_insensitive)
        .size_limit(16 << 20)
        .dfa_size_limit(16 << 20)
        .build()
        .map_err(|e| ToolError::new(format!("invalid regular expression: {e}")))?;
    let filter = query.glob.map(Pattern::new).transpose()?;
    let mut result = GrepResult::default();
    let mut read_total = 0u64;
    let mut output_bytes = 0usize;
    let base = normalise(sandbox, query.base)?;
    // One file named directly is searched whatever the filter says.
    let single = match sandbox.stat() {
        Some(stat) => {
            let meta = stat.stat(&base)?;
            meta.kind != FileKind::Dir
        }
        None => matches!(
            sandbox.list_dir(&base),
            Err(hako_core::Error::Fence(
                hako_core::FenceError::NotADirectory { .. }
            ))
        ),
    };
    let mut search = |path: &Path, result: &mut GrepResult| -> bool {
        let remaining = GREP_TOTAL_CAP.saturating_sub(read_total);
        if remaining == 0 {
            result.read_cap_hit = true;
            return false;
        }
        let outcome = match sandbox.read_limit() {
            Some(r) => r.read_file_limit(path, GREP_FILE_CAP.min(remaining)),
            None => sandbox.read_file(path).map(|data| {
                let truncated = data.len() as u64 > GREP_FILE_CAP;
                let mut data = data;
                data.truncate(GREP_FILE_CAP as usize);
                hako_core::ReadOutcome { data, truncated }
            }),
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(err) => {
                if result.unreadable.len() < 5 {
                    result.unreadable.push(format!("{}: {err}", path.display()));
                }
                return true;
            }
        };
        read_total += outcome.data.len() as u64;
        result.files += 1;
        if looks_binary(&outcome.data) {
            result.binary += 1;
            return true;
        }
        if outcome.truncated {
            result.partial.push(path.to_path_buf());
        }
        let mut matched = false;
        let shown = path.to_string_lossy();
        for (i, line) in outcome.data.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !regex.is_match(line) {
                continue;
            }
            matched = true;
            if result.lines.len() >= query.max_results || output_bytes >= GREP_OUTPUT_CAP {
                result.more = true;
                result.files_matched += 1;
                return false;
            }
            let text = shorten(&String::from_utf8_lossy(line), GREP_LINE_CHARS);
            let entry = format!("{shown}:{}:{text}", i + 1);
            output_bytes += entry.len() + 1;
            result.lines.push(entry);
        }
        if matched {
            result.files_matched += 1;
        }
        true
    };
    if single {
        search(&base, &mut result);
        return Ok(result);
    }
    // Each file is searched as the walk finds it: nothing but the current
    // file is held, however many the walk sees.
    let report = walk(sandbox, &base, &mut |found| {
        // Symlinks are not followed; FIFOs and devices are not read.
        if found.kind != FileKind::File {
            return true;
        }
        if filter.as_ref().is_some_and(|f| !f.matches(&found.below)) {
            return true;
        }
        search(&found.path, &mut result)
    })?;
    result.report = report;
    Ok(result)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    use crate::testbox::FenceBox;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        for d in ["src/deep", "target/debug", ".git/objects", "docs", "keep"] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.rs"), "fn secret() {} // OUTSIDE\n").unwrap();
        let files = [
            ("src/main.rs", "fn main() {\n    println!(\"hello\");\n}\n"),
            ("src/deep/lib.rs", "pub fn hello() {}\n// TODO later\n"),
            ("src/notes.log", "hello from a log\n"),
            ("target/debug/build.rs", "fn hello() {}\n"),
            (".git/objects/x.rs", "fn hello() {}\n"),
            ("docs/guide.md", "Hello, world\n"),
            ("keep/important.log", "hello kept\n"),
            (".gitignore", "target/\n*.log\n!keep/important.log\n"),
            ("src/.ignore", "deep/\n"),
        ];
        for (path, text) in files {
            std::fs::write(ws.join(path), text).unwrap();
        }
        std::fs::write(ws.join("blob.bin"), b"hello\0binary").unwrap();
        symlink(&outside, ws.join("link-out")).unwrap();
        symlink(outside.join("secret.rs"), ws.join("secret-link.rs")).unwrap();
        (tmp, ws)
    }

    #[test]
    fn glob_honours_ignore_files_and_skips_git() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        let found = glob(&sb, "*.rs", Path::new(".")).unwrap();
        let paths: Vec<_> = found
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // target/ by .gitignore, src/deep/ by src/.ignore, .git always.
        assert_eq!(paths, ["secret-link.rs", "src/main.rs"]);
        let logs = glob(&sb, "**/*.log", Path::new(".")).unwrap();
        let logs: Vec<_> = logs
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // `!keep/important.log` re-includes one.
        assert_eq!(logs, ["keep/important.log"]);
    }

    #[test]
    fn glob_does_not_follow_a_symlink_out_of_the_workspace() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        let found = glob(&sb, "**/secret.rs", Path::new(".")).unwrap();
        assert!(found.paths.is_empty(), "{:?}", found.paths);
        // Starting the walk at the symlink is refused by the fence.
        let err = glob(&sb, "*", Path::new("link-out")).err().unwrap();
        assert!(err.refused, "{}", err.message);
    }

    #[test]
    fn glob_below_a_subdirectory_matches_relative_to_it_and_returns_workspace_paths() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        let found = glob(&sb, "*.rs", Path::new("src")).unwrap();
        assert_eq!(found.paths, [PathBuf::from("src/main.rs")]);
        let abs = ws.canonicalize().unwrap().join("docs");
        let found = glob(&sb, "guide.*", &abs).unwrap();
        assert_eq!(found.paths, [PathBuf::from("docs/guide.md")]);
    }

    #[test]
    fn paths_outside_the_workspace_are_refused() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        for base in ["../outside", "/etc", "src/../../outside"] {
            let err = glob(&sb, "*", Path::new(base)).err().unwrap();
            assert!(err.refused, "{base}: {}", err.message);
        }
    }

    fn grep_lines(
        sb: &FenceBox,
        pattern: &str,
        base: &str,
        glob: Option<&str>,
        ci: bool,
    ) -> Vec<String> {
        grep(
            sb,
            &GrepQuery {
                pattern,
                base: Path::new(base),
                glob,
                case_insensitive: ci,
                max_results: 100,
            },
        )
        .unwrap()
        .lines
    }

    #[test]
    fn grep_reports_path_line_and_text_and_skips_ignored_binary_and_symlinked_files() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        let lines = grep_lines(&sb, "hello", ".", None, false);
        assert_eq!(
            lines,
            [
                "keep/important.log:1:hello kept",
                "src/main.rs:2:    println!(\"hello\");"
            ]
        );
        let lines = grep_lines(&sb, "hello", ".", None, true);
        assert!(
            lines.contains(&"docs/guide.md:1:Hello, world".to_string()),
            "{lines:?}"
        );
        let result = grep(
            &sb,
            &GrepQuery {
                pattern: "hello",
                base: Path::new("."),
                glob: None,
                case_insensitive: false,
                max_results: 100,
            },
        )
        .unwrap();
        assert_eq!(result.binary, 1);
    }

    #[test]
    fn grep_filters_by_glob_searches_one_file_and_stops_at_max_results() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        assert_eq!(
            grep_lines(&sb, "hello", ".", Some("*.md"), true),
            ["docs/guide.md:1:Hello, world"]
        );
        // A file named directly is searched even where an ignore file would skip it.
        assert_eq!(
            grep_lines(&sb, "TODO", "src/deep/lib.rs", None, false),
            ["src/deep/lib.rs:2:// TODO later"]
        );
        let many: String = (0..50).map(|i| format!("match {i}\n")).collect();
        std::fs::write(ws.join("many.txt"), many).unwrap();
        let result = grep(
            &sb,
            &GrepQuery {
                pattern: "match",
                base: Path::new("many.txt"),
                glob: None,
                case_insensitive: false,
                max_results: 5,
            },
        )
        .unwrap();
        assert_eq!(result.lines.len(), 5);
        assert!(result.more);
    }

    #[test]
    fn grep_refuses_a_bad_regex_with_a_message() {
        let (_tmp, ws) = tree();
        let sb = FenceBox::new(&ws);
        let err = grep(
            &sb,
            &GrepQuery {
                pattern: "(",
                base: Path::new("."),
                glob: None,
                case_insensitive: false,
                max_results: 5,
            },
        )
        .err()
        .unwrap();
        assert!(
            err.message.contains("invalid regular expression"),
            "{}",
            err.message
        );
    }

    pub(crate) fn small(limits: impl FnOnce(&mut Limits)) -> Limits {
        let mut l = Limits::DEFAULT;
        limits(&mut l);
        l
    }

    #[test]
    fn a_wide_tree_of_long_names_stops_the_walk_instead_of_holding_all_its_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let long = "d".repeat(200);
        for i in 0..40 {
            std::fs::create_dir_all(tmp.path().join(format!("{long}{i:02}/{long}"))).unwrap();
        }
        let sb = FenceBox::new(tmp.path());
        let mut seen = 0;
        let report = walk_within(
            &sb,
            Path::new("."),
            &small(|l| l.pending_bytes = 20 * 202),
            &mut |_| {
                seen += 1;
                true
            },
        )
        .unwrap();
        assert!(report.stopped);
        // Within the default limits the same tree is walked whole.
        let report = walk(&sb, Path::new("."), &mut |_| true).unwrap();
        assert!(!report.stopped);
    }

    /// The fence over a directory, counting the directories listed.
    struct Counting {
        inner: FenceBox,
        listed: std::sync::atomic::AtomicUsize,
    }

    impl Sandbox for Counting {
        fn capabilities(&self) -> &hako_core::Capabilities {
            self.inner.capabilities()
        }
        fn exec(&self, c: &hako_core::Command) -> hako_core::Result<hako_core::Output> {
            self.inner.exec(c)
        }
        fn read_file(&self, p: &Path) -> hako_core::Result<Vec<u8>> {
            self.inner.read_file(p)
        }
        fn write_file(&self, p: &Path, d: &[u8]) -> hako_core::Result<()> {
            self.inner.write_file(p, d)
        }
        fn remove(&self, p: &Path) -> hako_core::Result<()> {
            self.inner.remove(p)
        }
        fn list_dir(&self, p: &Path) -> hako_core::Result<hako_core::DirListing> {
            self.listed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.list_dir(p)
        }
        fn close(&self) -> hako_core::Result<()> {
            Ok(())
        }
        fn stat(&self) -> Option<&dyn hako_core::StatPath> {
            self.inner.stat()
        }
        fn workdir(&self) -> Option<&dyn hako_core::Workdir> {
            self.inner.workdir()
        }
    }

    #[test]
    fn grep_searches_as_it_walks_and_stops_walking_once_it_has_enough() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.txt"), "needle\n").unwrap();
        for i in 0..100 {
            std::fs::create_dir(tmp.path().join(format!("z{i:03}"))).unwrap();
            std::fs::write(tmp.path().join(format!("z{i:03}/f.txt")), "needle\n").unwrap();
        }
        let sb = Counting {
            inner: FenceBox::new(tmp.path()),
            listed: Default::default(),
        };
        let result = grep(
            &sb,
            &GrepQuery {
                pattern: "needle",
                base: Path::new("."),
                glob: None,
                case_insensitive: false,
                max_results: 3,
            },
        )
        .unwrap();
        assert!(result.more);
        assert_eq!(result.lines.len(), 3);
        // It did not list the whole tree (collecting every path) first.
        let listed = sb.listed.load(std::sync::atomic::Ordering::SeqCst);
        assert!(listed < 10, "{listed} directories listed");
    }

    #[test]
    fn a_pattern_without_a_slash_matches_file_names_anywhere() {
        let p = Pattern::new("*.rs").unwrap();
        assert!(p.matches(Path::new("main.rs")));
        assert!(p.matches(Path::new("src/deep/lib.rs")));
        assert!(!p.matches(Path::new("src/lib.rs.bak")));
    }

    #[test]
    fn a_pattern_with_a_slash_matches_the_path_and_star_stays_in_one_component() {
        let p = Pattern::new("src/*.rs").unwrap();
        assert!(p.matches(Path::new("src/lib.rs")));
        assert!(!p.matches(Path::new("src/deep/lib.rs")));
        let p = Pattern::new("**/*.rs").unwrap();
        assert!(p.matches(Path::new("src/deep/lib.rs")));
        assert!(p.matches(Path::new("lib.rs")));
        let p = Pattern::new("./src/{a,b}.txt").unwrap();
        assert!(p.matches(Path::new("src/b.txt")));
    }
}
