//! The copy-on-write figures (`hako bench --cow`), on the `linux`
//! backend:
//!
//! - **Write**: a write-heavy job (unpack a tar of `files` small files,
//!   made once beforehand, then rewrite a tenth of them) in a `--cow`
//!   sandbox against the same job in a plain one. Each round has a fresh
//!   workspace holding the tar (and, under `--cow`, a fresh layer); only
//!   the job's exec in the open sandbox is timed, and the file system is
//!   synced before and after it, untimed, so that neither side pays for
//!   the other's writeback.
//! - **Copy-up**: rewriting a tenth of a tree of `files` files already in
//!   the workspace: under `--cow` each rewrite first copies the file up
//!   into the layer.
//! - **Diff**: `hako diff` of 100 changes (edits, additions, deletions)
//!   made in a `--cow` sandbox over a workspace of `diff_files` files:
//!   the review engine's scan, hash and unified render of the layer,
//!   in-process, and the whole `hako diff NAME` process, each against
//!   `git status --porcelain` of a git repository of the same tree
//!   (committed once, the same 100 changes made in its working tree; git
//!   with its default configuration). The scan's count of what it looked
//!   at ([`hako_layers::scan::Visited`]) is reported: it walks only what
//!   changed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hako_core::{Command, CowLayers, Sandbox};
use hako_layers::state::State;
use hako_layers::{diff_hash, render, Layers};
use hako_runtime::{BackendKind, SandboxSpec};
use serde::Serialize;

use crate::measure::{alternate, measure_pair};
use crate::reference::status_ok;
use crate::report::{compare, Comparison};
use crate::trees::{file_path, write_tar, write_tree};

/// The goal for the write job: `--cow` at most this many times the plain
/// sandbox's time.
pub const WRITE_GOAL: f64 = 1.15;

/// Changes made for the diff figure.
pub const DIFF_CHANGES: usize = 100;

/// What the copy-on-write benchmark measures.
#[derive(Debug, Clone)]
pub struct CowOptions {
    /// Files in the write job's tar and the copy-up tree (20,000).
    pub files: usize,
    /// Files in the diff figure's workspace (100,000).
    pub diff_files: usize,
    /// Rounds per measurement (at least one is made).
    pub iterations: usize,
    /// The `hako` executable whose `hako diff` is timed as a process;
    /// `None`: this process's own executable.
    pub hako: Option<PathBuf>,
}

/// How much of each layer the diff figure's scan looked at (what
/// [`hako_layers::scan::Visited`] counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Walked {
    /// Upper-layer entries looked at.
    pub upper_entries: usize,
    /// Workspace entries looked at.
    pub lower_entries: usize,
    /// Workspace directories listed.
    pub lower_dirs_listed: usize,
}

/// The copy-on-write findings beside the ratios (which are in
/// [`crate::Report::comparisons`]).
#[derive(Debug, Clone, Serialize)]
pub struct CowFindings {
    /// Files unpacked by the write job (and in the copy-up tree).
    pub files: usize,
    /// Files the write and copy-up jobs rewrite (a tenth).
    pub rewritten: usize,
    /// The write job's goal: `--cow` / plain at most this.
    pub write_goal: f64,
    /// The write job's ratio, when it was measured.
    pub write_ratio: Option<f64>,
    /// Whether that ratio meets the goal.
    pub write_meets_goal: Option<bool>,
    /// Files in the diff figure's workspace.
    pub diff_files: usize,
    /// Changes made for the diff figure.
    pub diff_changes: usize,
    /// Changes the review engine found (it must be `diff_changes`).
    pub changes_found: usize,
    /// Lines `git status --porcelain` printed (it must be `diff_changes`).
    pub git_status_lines: usize,
    /// What the scan looked at.
    pub visited: Walked,
    /// Seconds spent making the trees, the tar and the git repository.
    pub setup_s: f64,
}

/// The figure names, within the `linux` backend's.
pub mod figure {
    /// The write job, `--cow` against plain.
    pub const WRITE: &str = "cow_write.ratio_vs_plain";
    /// Rewriting existing files (copy-up), `--cow` against plain.
    pub const COPY_UP: &str = "cow_copy_up.ratio_vs_plain";
    /// The review engine's scan, hash and render against `git status`.
    pub const DIFF: &str = "cow_diff.ratio_vs_git_status";
    /// The whole `hako diff` process against `git status`.
    pub const DIFF_PROCESS: &str = "cow_diff_process.ratio_vs_git_status";
}

/// One sandbox's worth of the benchmark's scratch space: a counter for
/// fresh names, and where state directories live.
struct Scratch {
    root: PathBuf,
    rounds: std::cell::Cell<usize>,
}

impl Scratch {
    fn state_root(&self) -> PathBuf {
        self.root.join("state")
    }

    /// A fresh, empty workspace directory.
    fn fresh(&self) -> Result<PathBuf, String> {
        self.rounds.set(self.rounds.get() + 1);
        let ws = self.root.join(format!("ws-{}", self.rounds.get()));
        std::fs::create_dir(&ws).map_err(|e| format!("create {}: {e}", ws.display()))?;
        Ok(ws)
    }

    /// Flushes the file system the scratch space is on.
    fn sync(&self) -> Result<(), String> {
        let dir = std::fs::File::open(&self.root).map_err(|e| e.to_string())?;
        hako_sys::rustix::fs::syncfs(&dir).map_err(|e| format!("syncfs: {e}"))
    }
}

/// A `linux` sandbox on `ws`, under `--cow` when `state` is given.
fn open(ws: &Path, state: Option<&State>) -> Result<Box<dyn Sandbox>, String> {
    let mut spec = SandboxSpec::new(ws.to_path_buf());
    spec.cow = state.map(|s| CowLayers {
        upper: s.upper(),
        work: s.work(),
    });
    hako_runtime::open(BackendKind::Linux, &spec).map_err(|e| e.to_string())
}

/// Runs `script` in `sandbox`; an error unless it succeeded.
fn run_script(sandbox: &dyn Sandbox, script: &str) -> Result<(), String> {
    let out = sandbox
        .exec(&Command::shell(script))
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the job failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One round: a fresh workspace filled by `fill`, a fresh layer when
/// `cow`, a sandbox opened on it, `script` run and timed, and everything
/// removed. Returns the script's time.
fn round(
    scratch: &Scratch,
    cow: bool,
    fill: &dyn Fn(&Path) -> std::io::Result<()>,
    script: &str,
) -> Result<Duration, String> {
    let ws = scratch.fresh()?;
    fill(&ws).map_err(|e| format!("fill {}: {e}", ws.display()))?;
    let state = if cow {
        let name = format!("round-{}", scratch.rounds.get());
        Some(State::create(&scratch.state_root(), &name, &ws, &[]).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let sandbox = open(&ws, state.as_ref())?;
    // What setting up wrote is on disk before the clock starts.
    scratch.sync()?;
    let start = Instant::now();
    let ran = run_script(sandbox.as_ref(), script);
    let took = start.elapsed();
    let closed = sandbox.close().map_err(|e| e.to_string());
    ran?;
    closed?;
    if let Some(state) = state {
        state.remove().map_err(|e| e.to_string())?;
    }
    std::fs::remove_dir_all(&ws).map_err(|e| format!("remove {}: {e}", ws.display()))?;
    scratch.sync()?;
    Ok(took)
}

/// The shell loop that rewrites every tenth file of a tree at `dir`
/// (file names ending in `0`).
fn rewrite_tenth(dir: &str) -> String {
    format!("for f in {dir}/*/*/*0.txt; do printf 'rewritten: %s\\n' \"$f\" > \"$f\"; done")
}

/// Measures the copy-on-write figures on `linux`, adding the ratios to
/// `out` and returning the findings; a part that fails is named in
/// `errors` and the others are still measured.
pub(crate) fn bench_cow(
    options: &CowOptions,
    root: &Path,
    out: &mut Vec<Comparison>,
    errors: &mut Vec<String>,
) -> CowFindings {
    let n = options.iterations;
    let files = options.files.max(10);
    let mut findings = CowFindings {
        files,
        rewritten: files.div_ceil(10),
        write_goal: WRITE_GOAL,
        write_ratio: None,
        write_meets_goal: None,
        diff_files: options.diff_files,
        diff_changes: DIFF_CHANGES,
        changes_found: 0,
        git_status_lines: 0,
        visited: Walked::default(),
        setup_s: 0.0,
    };
    let scratch = Scratch {
        root: root.to_path_buf(),
        rounds: std::cell::Cell::new(0),
    };
    // Small files: 3 to 40 lines of 50 bytes, about 1 KiB on average.
    let (min_lines, spread) = (3, 38);

    // The write job: the tar is made once, and linked into each round's
    // workspace.
    let setup = Instant::now();
    let tar = root.join("tree.tar");
    let write = write_tar(&tar, files, min_lines, spread)
        .map_err(|e| format!("write the tar: {e}"))
        .and_then(|()| {
            findings.setup_s += setup.elapsed().as_secs_f64();
            let fill = |ws: &Path| std::fs::hard_link(&tar, ws.join("tree.tar"));
            let script = format!(
                "set -e; mkdir out; tar --no-same-owner -xf tree.tar -C out; {}",
                rewrite_tenth("out")
            );
            alternate(
                n,
                || round(&scratch, true, &fill, &script),
                || round(&scratch, false, &fill, &script),
            )
        });
    match write {
        Ok((cow, plain)) => {
            let c = compare(
                figure::WRITE.into(),
                format!("linux --cow: untar {files} small files, rewrite a tenth (exec)"),
                Some("linux"),
                cow,
                "the same in a plain linux sandbox",
                plain,
            );
            findings.write_ratio = Some(c.ratio);
            findings.write_meets_goal = Some(c.ratio <= WRITE_GOAL);
            out.push(c);
        }
        Err(e) => errors.push(format!("linux --cow write job: {e}")),
    }
    let _ = std::fs::remove_file(&tar);

    // Copy-up: the tree is in the workspace, and a tenth of it rewritten.
    let fill = |ws: &Path| write_tree(&ws.join("tree"), files, min_lines, spread);
    let script = format!("set -e; {}", rewrite_tenth("tree"));
    let copy_up = alternate(
        n,
        || round(&scratch, true, &fill, &script),
        || round(&scratch, false, &fill, &script),
    );
    match copy_up {
        Ok((cow, plain)) => out.push(compare(
            figure::COPY_UP.into(),
            format!(
                "linux --cow: rewrite a tenth of {files} files in the workspace (copy-up, exec)"
            ),
            Some("linux"),
            cow,
            "the same in a plain linux sandbox",
            plain,
        )),
        Err(e) => errors.push(format!("linux --cow copy-up job: {e}")),
    }

    if let Err(e) = bench_diff(options, &scratch, out, &mut findings) {
        errors.push(format!("linux --cow diff: {e}"));
    }
    findings
}

/// Removes the scratch directory, layers left by a failed round and all
/// (overlayfs leaves a work directory of mode 000 in each).
pub(crate) fn remove_scratch(root: &Path) -> std::io::Result<()> {
    if std::fs::remove_dir_all(root).is_ok() {
        return Ok(());
    }
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }
    std::fs::remove_dir_all(root)
}

/// One of the diff figure's changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    /// A line appended to file `i`.
    Modify(usize),
    /// File `i` deleted.
    Delete(usize),
    /// A new file `j` beside file `i`.
    Add(usize, usize),
}

/// The diff figure's changes to a tree of `n` files: spread over the
/// whole tree, 70 edits, 15 deletions and 15 additions.
fn edits(n: usize) -> Vec<Edit> {
    let step = (n / DIFF_CHANGES).max(1);
    (0..DIFF_CHANGES)
        .map(|j| {
            let i = (j * step + (j * 37) % step).min(n.saturating_sub(1));
            match j % 20 {
                0..=13 => Edit::Modify(i),
                14..=16 => Edit::Delete(i),
                _ => Edit::Add(i, j),
            }
        })
        .collect()
}

fn added_path(i: usize, j: usize) -> PathBuf {
    file_path(i).with_file_name(format!("new-{j:03}.txt"))
}

const APPENDED: &str = "a line the sandbox added\n";

/// The edits as a shell script run in the sandbox.
fn edits_script(edits: &[Edit]) -> String {
    let mut script = String::from("set -e\n");
    let mut deleted = String::new();
    for edit in edits {
        let line = match *edit {
            Edit::Modify(i) => format!(
                "printf '{}' >> {}\n",
                APPENDED.replace('\n', "\\n"),
                file_path(i).display()
            ),
            Edit::Delete(i) => {
                deleted.push_str(&format!(" {}", file_path(i).display()));
                continue;
            }
            Edit::Add(i, j) => format!("printf 'added {j}\\n' > {}\n", added_path(i, j).display()),
        };
        script.push_str(&line);
    }
    if !deleted.is_empty() {
        script.push_str(&format!("rm{deleted}\n"));
    }
    script
}

/// The same edits made to the tree at `root` from here.
fn apply_edits(root: &Path, edits: &[Edit]) -> std::io::Result<()> {
    use std::io::Write;
    for edit in edits {
        match *edit {
            Edit::Modify(i) => std::fs::OpenOptions::new()
                .append(true)
                .open(root.join(file_path(i)))?
                .write_all(APPENDED.as_bytes())?,
            Edit::Delete(i) => std::fs::remove_file(root.join(file_path(i)))?,
            Edit::Add(i, j) => std::fs::write(root.join(added_path(i, j)), format!("added {j}\n"))?,
        }
    }
    Ok(())
}

/// `git` with no configuration but its defaults (neither the system's nor
/// this user's), in `dir`.
fn git(dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "hako bench")
        .env("GIT_AUTHOR_EMAIL", "bench@hako.invalid")
        .env("GIT_COMMITTER_NAME", "hako bench")
        .env("GIT_COMMITTER_EMAIL", "bench@hako.invalid");
    cmd
}

/// The diff figure: the trees, the changes, and the timings.
fn bench_diff(
    options: &CowOptions,
    scratch: &Scratch,
    out: &mut Vec<Comparison>,
    findings: &mut CowFindings,
) -> Result<(), String> {
    let n = options.iterations;
    let files = options.diff_files.max(DIFF_CHANGES);
    findings.diff_files = files;
    let setup = Instant::now();
    let ws = scratch.fresh()?;
    let repo = scratch.fresh()?;
    let (min_lines, spread) = (1, 10);
    write_tree(&ws, files, min_lines, spread).map_err(|e| format!("write the tree: {e}"))?;
    write_tree(&repo, files, min_lines, spread).map_err(|e| format!("write the tree: {e}"))?;
    // Made without syncing each object (setting up, not measured).
    status_ok(git(&repo).args(["init", "--quiet"]))?;
    status_ok(git(&repo).args(["-c", "core.fsync=none", "add", "--all"]))?;
    status_ok(git(&repo).args([
        "-c",
        "core.fsync=none",
        "-c",
        "maintenance.auto=false",
        "commit",
        "--quiet",
        "--message",
        "the tree",
    ]))?;
    let edits = edits(files);
    apply_edits(&repo, &edits).map_err(|e| format!("change the git tree: {e}"))?;
    let name = "diff";
    let state = State::create(&scratch.state_root(), name, &ws, &[]).map_err(|e| e.to_string())?;
    let sandbox = open(&ws, Some(&state))?;
    let ran = run_script(sandbox.as_ref(), &edits_script(&edits));
    sandbox.close().map_err(|e| e.to_string())?;
    ran?;
    findings.setup_s += setup.elapsed().as_secs_f64();

    // What each side sees: the same 100 changes.
    let layers = Layers::open(&ws, &state.upper()).map_err(|e| e.to_string())?;
    let (changes, visited) = layers.changes_counted().map_err(|e| e.to_string())?;
    findings.changes_found = changes.len();
    findings.visited = Walked {
        upper_entries: visited.upper_entries,
        lower_entries: visited.lower_entries,
        lower_dirs_listed: visited.lower_dirs_listed,
    };
    let status = git(&repo)
        .args(["status", "--porcelain"])
        .output()
        .map_err(|e| format!("git status: {e}"))?;
    findings.git_status_lines = status
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    if findings.changes_found != DIFF_CHANGES || findings.git_status_lines != DIFF_CHANGES {
        return Err(format!(
            "expected {DIFF_CHANGES} changes on each side: the review engine found {}, git status {}",
            findings.changes_found, findings.git_status_lines
        ));
    }

    let git_status = || status_ok(git(&repo).args(["status", "--porcelain"]));
    let review = || -> Result<(), String> {
        let layers = Layers::open(&ws, &state.upper()).map_err(|e| e.to_string())?;
        let changes = layers.changes().map_err(|e| e.to_string())?;
        let hash = diff_hash(&changes);
        let text = render::unified(&layers, &changes);
        std::hint::black_box((hash, text));
        Ok(())
    };
    let (hako, reference) = measure_pair(n, review, git_status)?;
    out.push(compare(
        figure::DIFF.into(),
        format!(
            "hako diff of {DIFF_CHANGES} changes in {files} files: scan, hash, render (library)"
        ),
        Some("linux"),
        hako,
        "git status --porcelain (the same tree and changes)",
        reference,
    ));
    let hako_bin = match &options.hako {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let state_root = scratch.state_root();
    let hako_diff = || {
        status_ok(
            std::process::Command::new(&hako_bin)
                .args(["diff", name, "--state"])
                .arg(&state_root),
        )
    };
    let (process, reference) = measure_pair(n, hako_diff, git_status)?;
    out.push(compare(
        figure::DIFF_PROCESS.into(),
        format!("hako diff NAME of {DIFF_CHANGES} changes in {files} files (whole process)"),
        Some("linux"),
        process,
        "git status --porcelain (the same tree and changes)",
        reference,
    ));
    drop(layers);
    let _ = state.remove();
    let _ = std::fs::remove_dir_all(&ws);
    let _ = std::fs::remove_dir_all(&repo);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trees::file_content;

    #[test]
    fn the_diff_changes_are_a_hundred_spread_over_the_tree_and_distinct() {
        for n in [100, 1_000, 100_000] {
            let e = edits(n);
            assert_eq!(e.len(), DIFF_CHANGES);
            let count = |f: fn(&Edit) -> bool| e.iter().filter(|x| f(x)).count();
            assert_eq!(count(|x| matches!(x, Edit::Modify(_))), 70);
            assert_eq!(count(|x| matches!(x, Edit::Delete(_))), 15);
            assert_eq!(count(|x| matches!(x, Edit::Add(..))), 15);
            let mut paths: Vec<PathBuf> = e
                .iter()
                .map(|x| match *x {
                    Edit::Modify(i) | Edit::Delete(i) => file_path(i),
                    Edit::Add(i, j) => added_path(i, j),
                })
                .collect();
            paths.sort();
            paths.dedup();
            assert_eq!(paths.len(), DIFF_CHANGES, "{n}");
            // The last change is in the last hundredth of the tree.
            let last = match e[DIFF_CHANGES - 1] {
                Edit::Modify(i) | Edit::Delete(i) | Edit::Add(i, _) => i,
            };
            assert!(last >= n - n / DIFF_CHANGES - 1 && last < n, "{n}: {last}");
        }
    }

    #[test]
    fn the_script_and_the_host_make_the_same_changes() {
        let dir = std::env::temp_dir().join(format!("hako-bench-edits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (a, b) = (dir.join("a"), dir.join("b"));
        for t in [&a, &b] {
            write_tree(t, 1_000, 1, 3).unwrap_or_else(|e| panic!("{e}"));
        }
        let e = edits(1_000);
        apply_edits(&a, &e).unwrap_or_else(|e| panic!("{e}"));
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(edits_script(&e))
            .current_dir(&b)
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ok.success());
        let diff = std::process::Command::new("diff")
            .arg("-r")
            .arg(&a)
            .arg(&b)
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(diff.success(), "the two ways differ");
        assert_eq!(
            std::fs::read(a.join(file_path(0))).ok(),
            Some([file_content(0, 1, 3), APPENDED.as_bytes().to_vec()].concat())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
