//! The world one copy-on-write case runs in: a workspace, sentinels
//! outside it, a named sandbox's state, and what the cases share (running
//! a script, listing what a sandbox sees, comparing that with the
//! workspace).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hako_core::{Command, CowLayers, Error, Sandbox};
use hako_layers::state::State;
use hako_layers::{Change, CommitError, CommitReport, Layers, Status};
use sha2::{Digest, Sha256};

use super::CowFactory;
use crate::check::{Ctx, Res};
use crate::harness::{diff, snapshot, Snapshot};

/// A hang guard for one command, never a performance assertion.
const GUARD: Duration = Duration::from_secs(300);

/// What a sandbox sees, or the workspace holds: by path relative to the
/// root (`a/b`), the entry's `st_mode` in hexadecimal (type and mode
/// bits) and, for a file, its SHA-256, for a symlink, its target.
pub(crate) type View = BTreeMap<String, String>;

/// A sandbox, closed when dropped (a failing case leaves nothing
/// running).
pub(crate) struct Open(Option<Box<dyn Sandbox>>);

impl Open {
    /// The sandbox.
    pub(crate) fn sb(&self) -> &dyn Sandbox {
        match &self.0 {
            Some(sb) => sb.as_ref(),
            None => unreachable!("an Open always holds its sandbox until closed"),
        }
    }

    /// Closes it, failing the case if that fails.
    pub(crate) fn close(mut self) -> Res {
        match self.0.take() {
            Some(sb) => sb.close().ctx("close the sandbox"),
            None => Ok(()),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(sb) = self.0.take() {
            let _ = sb.close();
        }
    }
}

/// What `outside/secret` holds.
pub(crate) const SECRET: &[u8] = b"OUTSIDE-SECRET\n";

/// A case's world. The temporary directory holds `ws/` (the workspace),
/// `outside/` (`secret`, `dir/inner`, `sub/deep`: sentinels that must
/// never change) and `state/` (the state root, with the sandbox `cow`).
pub(crate) struct World<'a> {
    make: &'a CowFactory,
    pub(crate) ws: PathBuf,
    pub(crate) outside: PathBuf,
    state: Option<State>,
    outside_before: Snapshot,
    // Last: removed after the state.
    _tmp: tempfile::TempDir,
}

impl<'a> World<'a> {
    /// A world whose workspace `fill` makes before the sandbox's state
    /// is (and so before it is based on the workspace).
    pub(crate) fn new(
        make: &'a CowFactory,
        fill: impl FnOnce(&Path) -> io::Result<()>,
    ) -> Res<World<'a>> {
        let tmp = tempfile::Builder::new()
            .prefix("hako-cow-")
            .tempdir()
            .ctx("make a temporary directory")?;
        let root = std::fs::canonicalize(tmp.path()).ctx("canonicalize")?;
        let ws = root.join("ws");
        let outside = root.join("outside");
        let setup = || -> io::Result<()> {
            std::fs::create_dir(&ws)?;
            std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755))?;
            std::fs::create_dir_all(outside.join("dir"))?;
            std::fs::create_dir_all(outside.join("sub"))?;
            std::fs::write(outside.join("secret"), SECRET)?;
            std::fs::write(outside.join("dir/inner"), b"inner\n")?;
            std::fs::write(outside.join("sub/deep"), b"deep\n")?;
            fill(&ws)
        };
        setup().ctx("make the workspace")?;
        let state = State::create(&root.join("state"), "cow", &ws, &[]).ctx("make the state")?;
        let outside_before = snapshot(&outside, None).ctx("snapshot the outside")?;
        Ok(World {
            make,
            ws,
            outside,
            state: Some(state),
            outside_before,
            _tmp: tmp,
        })
    }

    /// The sandbox's state.
    pub(crate) fn state(&self) -> &State {
        match &self.state {
            Some(state) => state,
            None => unreachable!("the state is held until the world is dropped"),
        }
    }

    /// Opens a sandbox of the backend under test on the layers; a backend
    /// that cannot run here (or has no `--cow`) skips the case.
    pub(crate) fn open(&self) -> Res<Open> {
        let layers = CowLayers {
            upper: self.state().upper(),
            work: self.state().work(),
        };
        match (self.make)(&self.ws, layers) {
            Ok(sb) => Ok(Open(Some(sb))),
            Err(e @ Error::Unsupported { .. }) => skip!("{e}"),
            Err(e) => fail!("open a cow sandbox on {}: {e}", self.ws.display()),
        }
    }

    /// The review engine on the workspace and the upper layer.
    pub(crate) fn layers(&self) -> Res<Layers> {
        Layers::open(&self.ws, &self.state().upper()).ctx("open the layers")
    }

    /// Every change (`hako diff`).
    pub(crate) fn changes(&self) -> Res<Vec<Change>> {
        self.layers()?.changes().ctx("list the changes")
    }

    /// Commits `paths` (all when empty), with `--expect` if given, saving
    /// the base record as `hako commit` does.
    pub(crate) fn commit(
        &self,
        paths: &[&str],
        expect: Option<&str>,
    ) -> Res<Result<CommitReport, CommitError>> {
        let layers = self.layers()?;
        let mut base = self.state().base().ctx("read the base record")?;
        let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        let result = hako_layers::commit(&layers, &mut base, &paths, expect);
        self.state().save_base(&base).ctx("save the base record")?;
        Ok(result)
    }

    /// Discards `paths` (all when empty).
    pub(crate) fn discard(&self, paths: &[&str]) -> Res {
        let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        hako_layers::discard(&self.state().upper(), &self.ws, &paths)
            .map(|_| ())
            .ctx(format!("discard {paths:?}"))
    }

    /// The workspace, byte for byte.
    pub(crate) fn snapshot_ws(&self) -> Res<Snapshot> {
        snapshot(&self.ws, None).ctx("snapshot the workspace")
    }

    /// Fails unless the workspace is `before`.
    pub(crate) fn ws_unchanged(&self, before: &Snapshot, when: &str) -> Res {
        let now = self.snapshot_ws()?;
        if let Some(d) = diff(before, &now) {
            fail!("the real workspace changed {when}: {d}");
        }
        Ok(())
    }

    /// The workspace as a [`View`].
    pub(crate) fn ws_view(&self) -> Res<View> {
        host_view(&self.ws).ctx("list the workspace")
    }

    /// Fails if anything outside the workspace changed.
    pub(crate) fn outside_unchanged(&self) -> Res {
        let now = match snapshot(&self.outside, None) {
            Ok(now) => now,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fail!("the directory beside the workspace, `outside`, was deleted")
            }
            Err(e) => fail!("snapshot the outside: {e}"),
        };
        if let Some(d) = diff(&self.outside_before, &now) {
            fail!("something outside the workspace changed: {d}");
        }
        Ok(())
    }

    /// Ends the case: the sandbox given (or a fresh one on the same
    /// layers) still works, closing it works, and nothing outside the
    /// workspace changed.
    pub(crate) fn finish(self, open: Option<Open>) -> Res {
        let open = match open {
            Some(open) => open,
            None => self.open()?,
        };
        usable(open.sb())?;
        open.close()?;
        self.outside_unchanged()
    }
}

impl Drop for World<'_> {
    fn drop(&mut self) {
        // overlayfs leaves `work/work` unreadable: `remove` opens it up.
        if let Some(state) = self.state.take() {
            let _ = state.remove();
        }
    }
}

/// Runs `script` with `sh -c`: its exit code, stdout and stderr.
pub(crate) fn run(sb: &dyn Sandbox, script: &str) -> Res<(i32, String, String)> {
    run_with(sb, Command::shell(script))
}

fn run_with(sb: &dyn Sandbox, command: Command) -> Res<(i32, String, String)> {
    let out = sb
        .exec(&command.timeout(GUARD).max_output(64 << 20))
        .ctx("run a command in the cow sandbox")?;
    if out.timed_out {
        fail!("a command ran past the hang guard: {out:?}");
    }
    Ok((
        out.status.shell_code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Runs `script`, which must succeed: its stdout.
pub(crate) fn ok(sb: &dyn Sandbox, script: &str) -> Res<String> {
    let (code, out, err) = run(sb, script)?;
    ensure!(
        code == 0,
        "`{script}` failed in the cow sandbox with {code}: {err}"
    );
    Ok(out)
}

/// Runs `script` with `stdin`, which must succeed.
pub(crate) fn ok_with_stdin(sb: &dyn Sandbox, script: &str, stdin: Vec<u8>) -> Res<String> {
    let (code, out, err) = run_with(sb, Command::shell(script).stdin(stdin))?;
    ensure!(
        code == 0,
        "`{script}` failed in the cow sandbox with {code}: {err}"
    );
    Ok(out)
}

/// Lists, by a command inside, every entry the sandbox sees in its
/// workspace, as a [`View`]. An entry listed that cannot be looked at
/// (a crafted layer's whiteout in a directory overlayfs does not merge,
/// which it lists but finds no file at, and which busybox's `find`
/// complains of, where GNU's does not) is not seen. busybox's `stat`
/// where there is one: GNU coreutils' asks `statx` with a flag that some
/// gVisor releases refuse (EINVAL), busybox's `lstat` works everywhere.
const LIST: &str = "set -e
if command -v busybox >/dev/null; then STAT='busybox stat'; else STAT=stat; fi
find . -mindepth 1 -exec $STAT -c '%f %n' {} + 2>/dev/null || true
echo '::files'
find . -mindepth 1 -type f -exec sha256sum {} + 2>/dev/null || true
echo '::links'
find . -mindepth 1 -type l -exec sh -c 'for l; do printf \"%s\\n%s\\n\" \"$l\" \"$(readlink \"$l\")\"; done' sh {} + 2>/dev/null || true";

/// What the sandbox sees in its workspace (see [`View`]).
pub(crate) fn view(sb: &dyn Sandbox) -> Res<View> {
    let out = ok(sb, LIST)?;
    let strip = |p: &str| p.strip_prefix("./").unwrap_or(p).to_owned();
    let mut view = View::new();
    let (modes, rest) = out
        .split_once("::files\n")
        .ctx("the listing's files section")?;
    let (files, links) = rest
        .split_once("::links\n")
        .ctx("the listing's links section")?;
    for line in modes.lines() {
        let (mode, path) = line
            .split_once(' ')
            .ctx(format!("a listing line {line:?}"))?;
        view.insert(strip(path), mode.to_owned());
    }
    for line in files.lines() {
        let (hash, path) = line
            .split_once("  ")
            .ctx(format!("a sha256sum line {line:?}"))?;
        let entry = view
            .get_mut(&strip(path))
            .ctx(format!("{path} hashed but not listed"))?;
        entry.push(' ');
        entry.push_str(hash);
    }
    let mut lines = links.lines();
    while let Some(path) = lines.next() {
        let target = lines.next().ctx(format!("the target of {path}"))?;
        let entry = view
            .get_mut(&strip(path))
            .ctx(format!("{path} read as a link but not listed"))?;
        entry.push_str(" -> ");
        entry.push_str(target);
    }
    Ok(view)
}

/// The same [`View`] of a host directory.
pub(crate) fn host_view(root: &Path) -> io::Result<View> {
    let mut view = View::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            let meta = entry.path().symlink_metadata()?;
            let mut line = format!("{:x}", meta.mode());
            let kind = meta.file_type();
            if kind.is_dir() {
                stack.push(rel.clone());
            } else if kind.is_file() {
                let data = std::fs::read(entry.path())?;
                line.push(' ');
                line.push_str(&hex(&Sha256::digest(&data)));
            } else if kind.is_symlink() {
                line.push_str(" -> ");
                line.push_str(&std::fs::read_link(entry.path())?.to_string_lossy());
            }
            view.insert(rel.to_string_lossy().into_owned(), line);
        }
    }
    Ok(view)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fails unless two views are equal, naming what differs.
pub(crate) fn same_view(got: &View, want: &View, what: &str) -> Res {
    let keys: std::collections::BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| got.get(*k) != want.get(*k))
        .map(|k| format!("{k}: {:?}, expected {:?}", got.get(k), want.get(k)))
        .collect();
    if !differ.is_empty() {
        let shown = differ[..differ.len().min(8)].join("; ");
        fail!(
            "{what}: {} entries differ: {shown}{}",
            differ.len(),
            if differ.len() > 8 { "; ..." } else { "" }
        );
    }
    Ok(())
}

/// Each change's path and status.
pub(crate) fn statuses(changes: &[Change]) -> Vec<(String, Status)> {
    changes
        .iter()
        .map(|c| (c.path.to_string_lossy().into_owned(), c.status()))
        .collect()
}

/// The sandbox still works: a command writes, reads back and removes a
/// file (leaving no change), and the file API lists the workspace.
pub(crate) fn usable(sb: &dyn Sandbox) -> Res {
    let out = ok(
        sb,
        "echo usable > .hako-usable && cat .hako-usable && rm .hako-usable",
    )?;
    ensure_eq!(out, "usable\n", "a command after the case");
    sb.list_dir(Path::new("."))
        .ctx("list the workspace through the file API after the case")?;
    Ok(())
}
