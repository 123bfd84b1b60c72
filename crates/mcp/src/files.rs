//! The file tools, as blocking functions over a sandbox. Every path goes
//! through the sandbox's fence.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hako_audit::{FileOp, FrontEnd, Record};
use hako_core::{FileKind, Sandbox};

use crate::search::{self, GrepQuery};
use crate::state::{Reply, State, ToolError};
use crate::text::{looks_binary, number_lines, replace_exact};

/// Most bytes of a file `read_file` reads.
pub const READ_CAP: u64 = 4 << 20;
/// Most bytes of numbered lines `read_file` returns at once.
pub const READ_OUTPUT_CAP: usize = 256 << 10;
/// Lines `read_file` returns when no limit is given.
pub const DEFAULT_READ_LINES: u64 = 2000;
/// Largest file `edit_file` edits.
pub const EDIT_CAP: u64 = 16 << 20;
/// Most entries `list_dir` shows.
pub const LIST_MAX: usize = 2000;

fn shown(path: &Path) -> String {
    hako_core::path::shown(path).to_string_lossy().into_owned()
}

/// Reads at most `cap` bytes from the start of `path`.
fn read_bounded(
    sandbox: &dyn Sandbox,
    path: &Path,
    cap: u64,
) -> Result<hako_core::ReadOutcome, ToolError> {
    Ok(match sandbox.read_limit() {
        Some(r) => r.read_file_limit(path, cap)?,
        // Without bounded reads, the sandbox's own read limit applies (a
        // larger file is refused with its size).
        None => {
            let mut data = sandbox.read_file(path)?;
            let truncated = data.len() as u64 > cap;
            data.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
            hako_core::ReadOutcome { data, truncated }
        }
    })
}

/// `read_file`.
pub fn read_file(
    state: &State,
    sandbox: &dyn Sandbox,
    path: &Path,
    offset: Option<u64>,
    limit: Option<u64>,
) -> Result<Reply, ToolError> {
    let limit = limit.unwrap_or(DEFAULT_READ_LINES);
    if limit == 0 {
        return Err(ToolError::new("limit must be at least 1"));
    }
    let offset = offset.unwrap_or(1).max(1);
    let outcome = read_bounded(sandbox, path, READ_CAP)?;
    record_file(state, path, FileOp::read(&outcome.data, outcome.truncated));
    let name = shown(path);
    if outcome.data.is_empty() {
        return Ok(format!("(the file {name} is empty)").into());
    }
    if looks_binary(&outcome.data) {
        return Ok(format!(
            "(the file {name} looks binary: it has a NUL byte in its first 8 KiB; {}{} bytes; not shown. Inspect it with run_command, e.g. `file`, `xxd | head`)",
            outcome.data.len(),
            if outcome.truncated { "+" } else { "" }
        )
        .into());
    }
    // A read cut at the cap may end inside a line: show whole lines only.
    let mut data: &[u8] = &outcome.data;
    if outcome.truncated {
        if let Some(end) = data.iter().rposition(|&b| b == b'\n') {
            data = &data[..=end];
        }
    }
    let text = String::from_utf8_lossy(data);
    let numbered = number_lines(&text, offset, limit, READ_OUTPUT_CAP);
    let mut out = numbered.text;
    let total = if outcome.truncated {
        format!("at least {}", numbered.total)
    } else {
        numbered.total.to_string()
    };
    if numbered.first == 0 {
        let _ = write!(
            out,
            "(nothing to show: {name} has {total} lines and offset {offset} is past the end)"
        );
        return Ok(out.into());
    }
    let more = numbered.last < numbered.total;
    if more || numbered.budget_hit || offset > 1 {
        let _ = write!(
            out,
            "[{name}: lines {}-{} of {total} shown",
            numbered.first, numbered.last
        );
        if numbered.budget_hit {
            let _ = write!(out, " (stopped at {READ_OUTPUT_CAP} bytes of output)");
        }
        if more {
            let _ = write!(out, "; continue with offset {}", numbered.last + 1);
        }
        out.push_str("]\n");
    }
    if numbered.long_lines > 0 {
        let _ = writeln!(
            out,
            "[{} long lines were cut to {} characters]",
            numbered.long_lines,
            crate::text::MAX_LINE_CHARS
        );
    }
    if outcome.truncated {
        let _ = writeln!(
            out,
            "[{name} is larger than {READ_CAP} bytes: only its first {READ_CAP} bytes can be read with read_file. Use grep, or run_command with `sed -n 'A,Bp'` or `tail`, for the rest]"
        );
    }
    Ok(out.into())
}

/// `write_file`.
pub fn write_file(
    state: &State,
    sandbox: &dyn Sandbox,
    path: &Path,
    content: &str,
) -> Result<Reply, ToolError> {
    let made = hako_core::write_file_creating_parents(sandbox, path, content.as_bytes())?;
    // As the HTTP API records them: the directory made, then the write.
    if let Some(parent) = &made {
        record_file(state, parent, FileOp::MakeDir);
    }
    let created_dirs = made.is_some();
    record_file(state, path, FileOp::write(content.as_bytes()));
    Ok(format!(
        "wrote {} bytes ({} lines) to {}{}",
        content.len(),
        content.lines().count(),
        shown(path),
        if created_dirs {
            " (its missing parent directories were created)"
        } else {
            ""
        }
    )
    .into())
}

/// `edit_file`.
pub fn edit_file(
    state: &State,
    sandbox: &dyn Sandbox,
    path: &Path,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<Reply, ToolError> {
    let name = shown(path);
    let outcome = read_bounded(sandbox, path, EDIT_CAP)?;
    if outcome.truncated {
        return Err(ToolError::new(format!(
            "{name} is larger than {EDIT_CAP} bytes; edit_file edits smaller files only (use run_command with sed, or write_file)"
        )));
    }
    let before = std::str::from_utf8(&outcome.data).map_err(|_| {
        ToolError::new(format!(
            "{name} is not UTF-8 text; edit_file edits text files only (use write_file, or run_command)"
        ))
    })?;
    let cap = usize::try_from(EDIT_CAP).unwrap_or(usize::MAX);
    let (after, count) = replace_exact(before, old, new, replace_all, cap)
        .map_err(|e| ToolError::new(e.message(&name)))?;
    // Written only if the file still holds what the edit was made from:
    // a change the sandbox made meanwhile is never undone.
    hako_core::replace_if_unchanged(sandbox, path, after.as_bytes(), &outcome.data)?;
    record_file(
        state,
        path,
        FileOp::edit(&outcome.data, after.as_bytes(), count as u64),
    );
    // Show the first edited place, with a few lines around it.
    let mut out = format!(
        "replaced {count} occurrence{} in {name}\n",
        if count == 1 { "" } else { "s" }
    );
    if let Some(at) = before.find(old) {
        let line = before[..at].matches('\n').count() as u64 + 1;
        let span = new.matches('\n').count() as u64 + 1;
        let from = line.saturating_sub(3).max(1);
        let snippet = number_lines(&after, from, span + 6, 8 << 10);
        out.push_str(&snippet.text);
    }
    Ok(out.into())
}

/// `list_dir`.
pub fn list_dir(state: &State, sandbox: &dyn Sandbox, path: &Path) -> Result<Reply, ToolError> {
    let listing = sandbox.list_dir(path)?;
    record_file(
        state,
        path,
        FileOp::List {
            entries: listing.entries.len() as u64,
        },
    );
    let name = shown(path);
    if listing.entries.is_empty() {
        return Ok(format!("(the directory {name} is empty)").into());
    }
    let mut out = String::new();
    for entry in listing.entries.iter().take(LIST_MAX) {
        let kind = match entry.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "chardev",
            FileKind::BlockDevice => "blockdev",
            FileKind::Unknown => "other",
        };
        let size = if entry.kind == FileKind::Dir {
            "-".to_string()
        } else {
            entry.size.to_string()
        };
        let slash = if entry.kind == FileKind::Dir { "/" } else { "" };
        let _ = writeln!(
            out,
            "{kind:<8} {size:>12}  {}{slash}",
            entry.name.to_string_lossy()
        );
    }
    if listing.entries.len() > LIST_MAX {
        let _ = writeln!(
            out,
            "[{} more entries not shown; use glob to find files by name]",
            listing.entries.len() - LIST_MAX
        );
    }
    if listing.truncated {
        let _ = writeln!(
            out,
            "[the directory has more entries than the sandbox lists at once; use glob to find files by name]"
        );
    }
    Ok(out.into())
}

fn walk_notes(out: &mut String, report: &search::WalkReport) {
    if report.stopped {
        let _ = writeln!(
            out,
            "[the search stopped early (it looks at most {} entries, and at most {} bytes of directory paths at once); narrow it with path]",
            search::MAX_VISITED,
            search::MAX_PENDING_BYTES
        );
    }
    if report.ignore_skipped_count > 0 {
        let _ = writeln!(
            out,
            "[ignore files not honoured, so files they exclude may be listed: {} (a search honours each ignore file whole or not at all, at most {} bytes each and {} bytes and {} patterns in all; this search honoured {} patterns)]",
            report.ignore_skipped_count,
            crate::ignores::IGNORE_FILE_CAP,
            crate::ignores::IGNORE_TOTAL_CAP,
            crate::ignores::IGNORE_TOTAL_PATTERNS,
            report.ignore_patterns
        );
        for skipped in &report.ignore_skipped {
            let _ = writeln!(out, "[  {}: {}]", skipped.path.display(), skipped.why);
        }
        if report.ignore_skipped_count > report.ignore_skipped.len() {
            let _ = writeln!(
                out,
                "[  and {} more]",
                report.ignore_skipped_count - report.ignore_skipped.len()
            );
        }
    }
    if report.cut_listings > 0 {
        let _ = writeln!(
            out,
            "[{} directories have more entries than the sandbox lists at once; some files were not seen]",
            report.cut_listings
        );
    }
    for dir in &report.unreadable {
        let _ = writeln!(out, "[could not list {dir}]");
    }
}

/// `glob`.
pub fn glob(
    state: &State,
    sandbox: &dyn Sandbox,
    pattern: &str,
    base: Option<&Path>,
) -> Result<Reply, ToolError> {
    let base = base.unwrap_or(Path::new("."));
    let found = search::glob(sandbox, pattern, base)?;
    record_file(
        state,
        base,
        FileOp::Glob {
            pattern: pattern.to_string(),
            matches: found.paths.len() as u64,
        },
    );
    let mut out = String::new();
    if found.paths.is_empty() {
        let _ = writeln!(
            out,
            "no files match {pattern:?} under {} (files ignored by .gitignore or .ignore are skipped)",
            shown(base)
        );
    }
    for path in &found.paths {
        let _ = writeln!(out, "{}", path.to_string_lossy());
    }
    if found.more {
        let _ = writeln!(
            out,
            "[more than {} files match; only the first {} found are shown: narrow the pattern or the path]",
            search::MAX_GLOB_RESULTS,
            search::MAX_GLOB_RESULTS
        );
    }
    walk_notes(&mut out, &found.report);
    Ok(out.into())
}

/// What `grep` was asked, as the tool takes it.
pub struct GrepArgs {
    /// The regular expression.
    pub pattern: String,
    /// File or directory.
    pub path: Option<PathBuf>,
    /// File filter.
    pub glob: Option<String>,
    /// Ignore case.
    pub case_insensitive: bool,
    /// Most matching lines.
    pub max_results: usize,
}

/// `grep`.
pub fn grep(state: &State, sandbox: &dyn Sandbox, args: &GrepArgs) -> Result<Reply, ToolError> {
    let base = args.path.as_deref().unwrap_or(Path::new("."));
    let found = search::grep(
        sandbox,
        &GrepQuery {
            pattern: &args.pattern,
            base,
            glob: args.glob.as_deref(),
            case_insensitive: args.case_insensitive,
            max_results: args.max_results,
        },
    )?;
    record_file(
        state,
        base,
        FileOp::Grep {
            pattern: args.pattern.clone(),
            glob: args.glob.clone(),
            files: found.files as u64,
            matches: found.lines.len() as u64,
        },
    );
    let mut out = String::new();
    if found.lines.is_empty() {
        let _ = writeln!(
            out,
            "no matches for {:?} in {} files under {}",
            args.pattern,
            found.files,
            shown(base)
        );
    }
    for line in &found.lines {
        out.push_str(line);
        out.push('\n');
    }
    if found.more {
        let _ = writeln!(
            out,
            "[stopped at {} matching lines (max_results or {} bytes of output); narrow the pattern, path or glob]",
            found.lines.len(),
            search::GREP_OUTPUT_CAP
        );
    }
    if found.binary > 0 {
        let _ = writeln!(out, "[{} binary files were skipped]", found.binary);
    }
    if !found.partial.is_empty() {
        let _ = writeln!(
            out,
            "[{} files are larger than {} bytes and were searched only in their first {} bytes, e.g. {}]",
            found.partial.len(),
            search::GREP_FILE_CAP,
            search::GREP_FILE_CAP,
            found.partial[0].to_string_lossy()
        );
    }
    if found.read_cap_hit {
        let _ = writeln!(
            out,
            "[the search stopped after reading {} bytes; narrow it with path or glob]",
            search::GREP_TOTAL_CAP
        );
    }
    for file in &found.unreadable {
        let _ = writeln!(out, "[could not read {file}]");
    }
    walk_notes(&mut out, &found.report);
    Ok(out.into())
}

/// Records `op` on `path`.
fn record_file(state: &State, path: &Path, op: FileOp) {
    state.record(Record::File(hako_audit::File::new(
        FrontEnd::Mcp,
        None,
        path,
        op,
    )));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::testbox::FenceBox;
    use std::sync::Arc;

    struct Fixture {
        _tmp: tempfile::TempDir,
        ws: PathBuf,
        audit: PathBuf,
        state: State,
        sb: FenceBox,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(tmp.path().join("secret"), "OUTSIDE").unwrap();
        let audit = tmp.path().join("audit.log");
        let log = Arc::new(hako_audit::AuditLog::open(&audit, &[]).unwrap());
        let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), Some(log));
        let sb = FenceBox::new(&ws);
        Fixture {
            _tmp: tmp,
            ws,
            audit,
            state,
            sb,
        }
    }

    #[test]
    fn read_file_numbers_lines_and_says_how_to_continue() {
        let f = fixture();
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        std::fs::write(f.ws.join("a.txt"), &text).unwrap();
        let all = read_file(&f.state, &f.sb, Path::new("a.txt"), None, None).unwrap();
        assert!(all.text.starts_with("     1\tline 1\n"), "{}", all.text);
        assert!(all.text.ends_with("    10\tline 10\n"), "{}", all.text);
        let part = read_file(&f.state, &f.sb, Path::new("a.txt"), Some(3), Some(2)).unwrap();
        assert!(
            part.text.starts_with("     3\tline 3\n     4\tline 4\n"),
            "{}",
            part.text
        );
        assert!(part.text.contains("lines 3-4 of 10"), "{}", part.text);
        assert!(
            part.text.contains("continue with offset 5"),
            "{}",
            part.text
        );
        let past = read_file(&f.state, &f.sb, Path::new("a.txt"), Some(20), None).unwrap();
        assert!(past.text.contains("past the end"), "{}", past.text);
    }

    #[test]
    fn read_file_of_a_large_file_reads_only_the_cap_and_says_so() {
        let f = fixture();
        let line = "x".repeat(99) + "\n";
        let text = line.repeat((READ_CAP as usize / 100) + 50);
        std::fs::write(f.ws.join("big.txt"), &text).unwrap();
        let out = read_file(&f.state, &f.sb, Path::new("big.txt"), Some(41900), Some(5)).unwrap();
        assert!(
            out.text.contains(&format!("larger than {READ_CAP} bytes")),
            "{}",
            out.text
        );
        assert!(out.text.contains("of at least"), "{}", out.text);
    }

    #[test]
    fn paths_outside_the_workspace_are_refused() {
        let f = fixture();
        for path in ["../secret", "/etc/passwd"] {
            let err = read_file(&f.state, &f.sb, Path::new(path), None, None).unwrap_err();
            assert!(err.refused, "{path}: {}", err.message);
            assert!(
                err.message.contains("inside the workspace"),
                "{}",
                err.message
            );
            let err = write_file(&f.state, &f.sb, Path::new(path), "x").unwrap_err();
            assert!(err.refused, "{path}: {}", err.message);
        }
        assert_eq!(
            std::fs::read_to_string(f.ws.parent().unwrap().join("secret")).unwrap(),
            "OUTSIDE"
        );
    }

    #[test]
    fn glob_names_the_ignore_files_it_did_not_honour() {
        let f = fixture();
        let rules: String = (0..20_000).map(|i| format!("dir{i}/*.tmp\n")).collect();
        std::fs::write(f.ws.join(".gitignore"), format!("{rules}a.txt\n")).unwrap();
        std::fs::create_dir(f.ws.join("src")).unwrap();
        std::fs::write(f.ws.join("src/.gitignore"), "b.txt\n").unwrap();
        for name in ["a.txt", "src/b.txt", "src/c.txt"] {
            std::fs::write(f.ws.join(name), "x").unwrap();
        }
        let out = glob(&f.state, &f.sb, "*.txt", None).unwrap();
        // The large file is not honoured (a.txt is listed), the small one is.
        assert!(out.text.starts_with("a.txt\nsrc/c.txt\n"), "{}", out.text);
        assert!(
            out.text.contains(&format!(
                "ignore files not honoured, so files they exclude may be listed: 1 (a search honours each ignore file whole or not at all, at most {} bytes each",
                crate::ignores::IGNORE_FILE_CAP
            )),
            "{}",
            out.text
        );
        assert!(
            out.text.contains("this search honoured 1 patterns"),
            "{}",
            out.text
        );
        assert!(
            out.text.contains(&format!(
                "[  .gitignore: larger than {} bytes]",
                crate::ignores::IGNORE_FILE_CAP
            )),
            "{}",
            out.text
        );
    }

    #[test]
    fn write_file_creates_parent_directories() {
        let f = fixture();
        let out = write_file(&f.state, &f.sb, Path::new("new/dir/a.txt"), "hi\n").unwrap();
        assert!(out.text.contains("wrote 3 bytes"), "{}", out.text);
        assert_eq!(
            std::fs::read_to_string(f.ws.join("new/dir/a.txt")).unwrap(),
            "hi\n"
        );
    }

    #[test]
    fn edit_file_needs_exactly_one_match_and_shows_the_edit() {
        let f = fixture();
        std::fs::write(f.ws.join("c.py"), "x = 1\ny = 2\nx = 1\n").unwrap();
        let err =
            edit_file(&f.state, &f.sb, Path::new("c.py"), "x = 1", "x = 3", false).unwrap_err();
        assert!(err.message.contains("matches 2 times"), "{}", err.message);
        let err = edit_file(&f.state, &f.sb, Path::new("c.py"), "z", "w", false).unwrap_err();
        assert!(err.message.contains("0 matches"), "{}", err.message);
        // Nothing changed by the refusals.
        assert_eq!(
            std::fs::read_to_string(f.ws.join("c.py")).unwrap(),
            "x = 1\ny = 2\nx = 1\n"
        );
        let out = edit_file(&f.state, &f.sb, Path::new("c.py"), "y = 2", "y = 5", false).unwrap();
        assert!(out.text.contains("     2\ty = 5"), "{}", out.text);
        let out = edit_file(&f.state, &f.sb, Path::new("c.py"), "x = 1", "x = 3", true).unwrap();
        assert!(
            out.text.starts_with("replaced 2 occurrences"),
            "{}",
            out.text
        );
        assert_eq!(
            std::fs::read_to_string(f.ws.join("c.py")).unwrap(),
            "x = 3\ny = 5\nx = 3\n"
        );
    }

    #[test]
    fn an_edit_of_a_file_the_sandbox_changed_meanwhile_is_refused_naming_the_file_and_nothing_is_lost(
    ) {
        let f = fixture();
        let file = f.ws.join("c.py");
        std::fs::write(&file, "x = 1\ny = 2\n").unwrap();
        // Between the edit's read and its write, the sandbox writes the
        // file (a formatter, another agent's command).
        let meddled = file.clone();
        *f.sb.meanwhile.lock().unwrap() = Some(Box::new(move || {
            std::fs::write(&meddled, "x = 1\ny = 2\nz = 3\n").unwrap();
        }));
        let err =
            edit_file(&f.state, &f.sb, Path::new("c.py"), "y = 2", "y = 5", false).unwrap_err();
        assert!(
            err.message.contains("\"c.py\"") && err.message.contains("changed since it was read"),
            "{}",
            err.message
        );
        // The sandbox's change is kept, and the edit can be redone on it.
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "x = 1\ny = 2\nz = 3\n"
        );
        edit_file(&f.state, &f.sb, Path::new("c.py"), "y = 2", "y = 5", false).unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "x = 1\ny = 5\nz = 3\n"
        );
    }

    #[test]
    fn edit_file_refuses_an_edit_that_would_grow_the_file_past_the_cap() {
        let f = fixture();
        let text = "a".repeat(1 << 20);
        std::fs::write(f.ws.join("a.txt"), &text).unwrap();
        // A million matches, each made 32 bytes: 32 MiB, past the 16 MiB cap.
        let new = "b".repeat(32);
        let err = edit_file(&f.state, &f.sb, Path::new("a.txt"), "a", &new, true).unwrap_err();
        assert!(
            err.message.contains("nothing was changed"),
            "{}",
            err.message
        );
        assert_eq!(std::fs::read_to_string(f.ws.join("a.txt")).unwrap(), text);
    }

    #[test]
    fn read_file_offsets_and_limits_at_their_extremes_answer_without_panicking() {
        let f = fixture();
        std::fs::write(f.ws.join("a.txt"), "one\ntwo\n").unwrap();
        for (offset, limit) in [
            (Some(u64::MAX), Some(u64::MAX)),
            (Some(0), Some(u64::MAX)),
            (Some(2), Some(u64::MAX)),
            (Some(u64::MAX - 1), Some(1)),
            (None, Some(1)),
        ] {
            let out = read_file(&f.state, &f.sb, Path::new("a.txt"), offset, limit).unwrap();
            assert!(!out.text.is_empty(), "{offset:?} {limit:?}");
        }
        let err = read_file(&f.state, &f.sb, Path::new("a.txt"), None, Some(0)).unwrap_err();
        assert!(err.message.contains("limit"), "{}", err.message);
    }

    #[test]
    fn every_effect_is_audited_with_its_hash() {
        let f = fixture();
        write_file(&f.state, &f.sb, Path::new("a.txt"), "hello").unwrap();
        read_file(&f.state, &f.sb, Path::new("a.txt"), None, None).unwrap();
        let err = read_file(&f.state, &f.sb, Path::new("../secret"), None, None).unwrap_err();
        f.state.record_failure("read_file", &err);
        f.state.close_audit();
        hako_audit::verify(&f.audit).unwrap();
        let records = hako_audit::records(&f.audit).unwrap();
        let kinds: Vec<_> = records
            .iter()
            .map(|r| {
                format!(
                    "{}:{}",
                    r["kind"].as_str().unwrap(),
                    r.get("op").and_then(|o| o.as_str()).unwrap_or("")
                )
            })
            .collect();
        assert_eq!(kinds, ["file:write", "file:read", "refusal:", "end:"]);
        assert_eq!(records[0]["sha256"], hako_audit::sha256_hex(b"hello"));
        assert_eq!(records[1]["sha256"], hako_audit::sha256_hex(b"hello"));
        assert_eq!(records[2]["tool"], "read_file");
    }

    #[test]
    fn list_dir_shows_kind_size_and_name() {
        let f = fixture();
        std::fs::create_dir(f.ws.join("sub")).unwrap();
        std::fs::write(f.ws.join("a.txt"), "12345").unwrap();
        let out = list_dir(&f.state, &f.sb, Path::new(".")).unwrap();
        assert!(
            out.text.contains("file                5  a.txt\n"),
            "{}",
            out.text
        );
        assert!(
            out.text.contains("dir                 -  sub/\n"),
            "{}",
            out.text
        );
    }
}
