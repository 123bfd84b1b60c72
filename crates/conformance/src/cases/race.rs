//! Symlinks swapped in while operations run: the check-then-use window.
//!
//! A thread exchanges a real directory (or file) with a symlink to outside
//! using `renameat2(RENAME_EXCHANGE)` in a tight loop, while the case runs
//! file operations through the name. Refusals are expected (that is the
//! swapped state being caught); following the symlink even once is not.
//! The cases count the refusals and fail if there were none, since a race
//! that never happened proves nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, FileKind};
use hako_sys::rustix::fs::{self as rfs, Mode, OFlags, RenameFlags};

use crate::check::{fence_kind, host_kind, show, Ctx, Res};
use crate::Harness;

const INSIDE: &[u8] = b"INSIDE";
const OUTSIDE_F: &[u8] = b"OUTSIDE-SECRET";

/// Iterations from `HAKO_RACE_ITERATIONS` (default 10 000); CI must run at
/// least 10 000.
fn iterations() -> Res<u64> {
    let n = match std::env::var("HAKO_RACE_ITERATIONS") {
        Ok(v) => v.parse().map_err(|_| {
            crate::Outcome::Failed(format!("HAKO_RACE_ITERATIONS={v:?} is not a number"))
        })?,
        Err(_) => 10_000,
    };
    if crate::must_work() && n < 10_000 {
        fail!("HAKO_RACE_ITERATIONS={n}: HAKO_MUST_WORK=1 needs at least 10000");
    }
    Ok(n)
}

/// What the operations saw.
#[derive(Default)]
struct Tally {
    succeeded: u64,
    refused: BTreeMap<String, u64>,
    /// Anything that shows the outside was reached; the case fails on one.
    escapes: Vec<String>,
}

impl Tally {
    fn err(&mut self, op: &str, e: &Error) {
        let key = match fence_kind(e) {
            Some(k) => format!("{op}: {k:?}"),
            None => format!("{op}: {e}"),
        };
        *self.refused.entry(key).or_default() += 1;
    }

    fn refusals(&self) -> u64 {
        self.refused.values().sum()
    }

    fn escape(&mut self, what: String) {
        if self.escapes.len() < 10 {
            self.escapes.push(what);
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} operations succeeded, {} refused ({:?})",
            self.succeeded,
            self.refusals(),
            self.refused
        )
    }
}

/// Whether `data` is `prefix` followed only by `+`s (appends).
fn is_inside(data: &[u8], prefix: &[u8]) -> bool {
    data.starts_with(prefix) && data[prefix.len()..].iter().all(|&b| b == b'+')
}

/// Runs `swap` in a loop on a thread while `body` runs; returns the number
/// of swaps made and what `body` returned.
fn while_swapping<T: Send>(
    swap: impl Fn(u64) -> bool + Send + Sync,
    body: impl FnOnce() -> T,
) -> (u64, T) {
    let stop = AtomicBool::new(false);
    let swaps = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if swap(swaps.load(Ordering::Relaxed)) {
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let result = body();
        stop.store(true, Ordering::Relaxed);
        (swaps.load(Ordering::Relaxed), result)
    })
}

fn open_workspace(h: &Harness) -> Res<std::os::fd::OwnedFd> {
    rfs::open(
        h.workspace(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx("open the workspace")
}

fn exchange(dir: &std::os::fd::OwnedFd, a: &str, b: &str) -> bool {
    rfs::renameat_with(dir, a, dir, b, RenameFlags::EXCHANGE).is_ok()
}

case! {
    /// `d/` (a real directory holding `f` = INSIDE) and `s` (a symlink to the
    /// outside directory, which holds its own `f`) are swapped with
    /// `RENAME_EXCHANGE` in a tight loop while write, read, bounded read,
    /// append, list, stat and exec-in-cwd go through `d`. Refusals are
    /// fine; the outside content is never returned, listed or changed.
    fn symlink_swapped_during_write_and_read_is_refused(h) {
        let n = iterations()?;
        h.plant_outside("f", OUTSIDE_F, 0o600)?;
        h.plant_file("d/f", INSIDE)?;
        std::fs::set_permissions(h.host_path("d/f"), std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .ctx("chmod d/f")?;
        h.plant_symlink("s", h.outside())?;
        let ws = open_workspace(h)?;
        if !exchange(&ws, "d", "s") || !exchange(&ws, "d", "s") {
            skip!("renameat2(RENAME_EXCHANGE) does not work on this file system");
        }
        let sb = h.sandbox();
        let (swaps, tally) = while_swapping(
            |_| exchange(&ws, "d", "s"),
            || {
                let mut t = Tally::default();
                let path = Path::new("d/f");
                for i in 0..n {
                    match sb.write_file(path, INSIDE) {
                        Ok(()) => t.succeeded += 1,
                        Err(e) => t.err("write", &e),
                    }
                    match sb.read_file(path) {
                        Ok(data) if is_inside(&data, INSIDE) => t.succeeded += 1,
                        Ok(data) => t.escape(format!("read_file returned {}", show(&data))),
                        Err(e) => t.err("read", &e),
                    }
                    if let Some(limited) = sb.read_limit() {
                        match limited.read_file_limit(path, 64) {
                            Ok(r) if is_inside(&r.data, INSIDE) => t.succeeded += 1,
                            Ok(r) => t.escape(format!("read_file_limit returned {}", show(&r.data))),
                            Err(e) => t.err("read_limit", &e),
                        }
                    }
                    if let Some(append) = sb.append() {
                        match append.append_file(path, b"+") {
                            Ok(()) => t.succeeded += 1,
                            Err(e) => t.err("append", &e),
                        }
                    }
                    match sb.list_dir(Path::new("d")) {
                        Ok(l) => {
                            let names: Vec<_> = l.entries.iter().map(|e| e.name.clone()).collect();
                            if names == ["f"] {
                                t.succeeded += 1;
                            } else {
                                t.escape(format!("list_dir d returned {names:?}"));
                            }
                        }
                        Err(e) => t.err("list", &e),
                    }
                    if let Some(stat) = sb.stat() {
                        match stat.stat(path) {
                            Ok(m) if m.kind == FileKind::File && m.mode == 0o644 => t.succeeded += 1,
                            Ok(m) => t.escape(format!("stat d/f returned {m:?} (the outside f is 0600)")),
                            Err(e) => t.err("stat", &e),
                        }
                    }
                    if i % 500 == 0 {
                        let cat = Command::new(["cat", "f"]).cwd("d").timeout(Duration::from_secs(60));
                        match sb.exec(&cat) {
                            Ok(out) if out.status == ExitStatus::Code(0) && is_inside(&out.stdout, INSIDE) => {
                                t.succeeded += 1
                            }
                            Ok(out) => t.escape(format!(
                                "cat f in cwd d: {:?} {}",
                                out.status,
                                show(&out.stdout)
                            )),
                            Err(e) => t.err("exec cwd", &e),
                        }
                    }
                }
                t
            },
        );
        eprintln!(
            "{}: {n} iterations, {swaps} swaps, {}",
            h.case(),
            tally.summary()
        );
        ensure!(
            tally.escapes.is_empty(),
            "the swapped symlink was followed: {:?} ({})",
            tally.escapes,
            tally.summary()
        );
        ensure!(swaps > 0, "no swap happened");
        ensure!(
            tally.refusals() > 0,
            "no operation ever met the swapped state in {n} iterations ({swaps} swaps), so the race proves nothing"
        );
        h.check_outside()?;
        let real = if host_kind(&h.host_path("d")) == Some(FileKind::Dir) { "d" } else { "s" };
        let mut left: Vec<String> = std::fs::read_dir(h.host_path(real))
            .ctx("list the real directory")?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        ensure_eq!(left, ["f"], "the real directory after the race (temporary files left?)");
        Ok(())
    }
}

case! {
    /// A regular file `x` and a symlink `y` to an outside file are swapped in
    /// a tight loop while write, read, bounded read, append and stat go
    /// through `x`: a final component that turns into a symlink is never
    /// followed out, and the outside file never changes.
    fn final_component_swapped_for_a_symlink_is_never_followed(h) {
        let n = iterations()?;
        let secret = h.outside().join("secret");
        h.plant_file("x", b"INSIDE-X")?;
        h.plant_symlink("y", &secret)?;
        let ws = open_workspace(h)?;
        if !exchange(&ws, "x", "y") || !exchange(&ws, "x", "y") {
            skip!("renameat2(RENAME_EXCHANGE) does not work on this file system");
        }
        let x_host = h.host_path("x");
        let y_host = h.host_path("y");
        let relink = h.host_path(".relink");
        let sb = h.sandbox();
        let (swaps, tally) = while_swapping(
            |count| {
                // A write may replace the symlink with a file: put one back.
                if count % 16 == 0
                    && host_kind(&x_host) != Some(FileKind::Symlink)
                    && host_kind(&y_host) != Some(FileKind::Symlink)
                {
                    let _ = std::fs::remove_file(&relink);
                    let _ = std::os::unix::fs::symlink(&secret, &relink);
                    let _ = std::fs::rename(&relink, &y_host);
                }
                exchange(&ws, "x", "y")
            },
            || {
                let mut t = Tally::default();
                let path = Path::new("x");
                for _ in 0..n {
                    match sb.write_file(path, b"INSIDE-X") {
                        Ok(()) => t.succeeded += 1,
                        Err(e) => t.err("write", &e),
                    }
                    match sb.read_file(path) {
                        Ok(data) if is_inside(&data, b"INSIDE-X") => t.succeeded += 1,
                        Ok(data) => t.escape(format!("read_file returned {}", show(&data))),
                        Err(e) => t.err("read", &e),
                    }
                    if let Some(limited) = sb.read_limit() {
                        match limited.read_file_limit(path, 64) {
                            Ok(r) if is_inside(&r.data, b"INSIDE-X") => t.succeeded += 1,
                            Ok(r) => t.escape(format!("read_file_limit returned {}", show(&r.data))),
                            Err(e) => t.err("read_limit", &e),
                        }
                    }
                    if let Some(append) = sb.append() {
                        match append.append_file(path, b"+") {
                            Ok(()) => t.succeeded += 1,
                            Err(e) => t.err("append", &e),
                        }
                    }
                    if let Some(stat) = sb.stat() {
                        match stat.stat(path) {
                            Ok(m) if m.kind == FileKind::File || m.kind == FileKind::Symlink => {
                                t.succeeded += 1
                            }
                            Ok(m) => t.escape(format!("stat x returned {m:?}")),
                            Err(e) => t.err("stat", &e),
                        }
                    }
                }
                t
            },
        );
        eprintln!(
            "{}: {n} iterations, {swaps} swaps, {}",
            h.case(),
            tally.summary()
        );
        ensure!(
            tally.escapes.is_empty(),
            "the swapped symlink was followed: {:?} ({})",
            tally.escapes,
            tally.summary()
        );
        ensure!(swaps > 0, "no swap happened");
        ensure!(
            tally.refusals() > 0,
            "no operation ever met the swapped state in {n} iterations ({swaps} swaps), so the race proves nothing"
        );
        h.check_outside()
    }
}
