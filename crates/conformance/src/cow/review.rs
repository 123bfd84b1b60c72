//! What `--cow` promises: the workspace untouched while the diff shows
//! every change, commit, discard, continuing, checkpoints, and the file
//! API on the layered view.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use hako_core::{FileKind, Sandbox};
use hako_layers::{diff_hash, render, Layers, Status};

use super::world::{ok, same_view, statuses, usable, view, World};
use super::CowFactory;
use crate::check::{Ctx, Res};

fn put(ws: &Path, rel: &str, data: &[u8], mode: u32) -> io::Result<()> {
    let path = ws.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, data)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
}

/// A workspace with something for every kind of change.
fn every_kind(ws: &Path) -> io::Result<()> {
    put(ws, "edit.txt", b"one\ntwo\n", 0o644)?;
    put(ws, "rm.txt", b"bye\n", 0o644)?;
    put(ws, "dir/a", b"a\n", 0o644)?;
    put(ws, "dir/sub/b", b"b\n", 0o644)?;
    put(ws, "mvfile", b"m\n", 0o644)?;
    put(ws, "mvdir/x", b"x\n", 0o644)?;
    put(ws, "mvdir/y/z", b"z\n", 0o644)?;
    put(ws, "run.sh", b"#!/bin/sh\necho run\n", 0o644)?;
    put(ws, "private", b"p\n", 0o644)?;
    put(ws, "shared/s", b"s\n", 0o644)?;
    put(ws, "tolink", b"t\n", 0o644)?;
    put(ws, "todir", b"f\n", 0o644)?;
    put(ws, "bin.dat", b"old\0binary", 0o644)?;
    put(ws, "replace/old", b"o\n", 0o644)?;
    put(ws, "replace/sub/x", b"x\n", 0o644)?;
    std::fs::set_permissions(ws.join("replace"), std::fs::Permissions::from_mode(0o755))?;
    put(ws, "keep.txt", b"kept\n", 0o644)
}

/// Changes, creates, deletes, renames, changes modes, makes symlinks and
/// replaces a directory by a new one of the same name (an opaque one).
const EVERY_KIND: &str = "set -e
echo three >> edit.txt
rm rm.txt
rm -r dir
mv mvfile moved-file
mv mvdir moved-dir
chmod 755 run.sh
chmod 600 private
chmod 700 shared
rm tolink && ln -s keep.txt tolink
rm todir && mkdir todir && echo inside > todir/f
printf 'new\\000bin' > bin.dat
mkdir -p new/deep && echo n > new/deep/n
echo created > created.txt
ln -s new/deep link
rm -r replace && mkdir -m 755 replace && echo fresh > replace/new";

/// What [`EVERY_KIND`] changes.
const EVERY_KIND_CHANGES: &[(&str, Status)] = &[
    ("bin.dat", Status::Modified),
    ("created.txt", Status::Added),
    ("dir", Status::Deleted),
    ("dir/a", Status::Deleted),
    ("dir/sub", Status::Deleted),
    ("dir/sub/b", Status::Deleted),
    ("edit.txt", Status::Modified),
    ("link", Status::Added),
    ("moved-dir", Status::Added),
    ("moved-dir/x", Status::Added),
    ("moved-dir/y", Status::Added),
    ("moved-dir/y/z", Status::Added),
    ("moved-file", Status::Added),
    ("mvdir", Status::Deleted),
    ("mvdir/x", Status::Deleted),
    ("mvdir/y", Status::Deleted),
    ("mvdir/y/z", Status::Deleted),
    ("mvfile", Status::Deleted),
    ("new", Status::Added),
    ("new/deep", Status::Added),
    ("new/deep/n", Status::Added),
    ("private", Status::ModeChanged),
    ("replace/new", Status::Added),
    ("replace/old", Status::Deleted),
    ("replace/sub", Status::Deleted),
    ("replace/sub/x", Status::Deleted),
    ("rm.txt", Status::Deleted),
    ("run.sh", Status::ModeChanged),
    ("shared", Status::ModeChanged),
    ("todir", Status::TypeChanged),
    ("todir/f", Status::Added),
    ("tolink", Status::TypeChanged),
];

fn expected(list: &[(&str, Status)]) -> Vec<(String, Status)> {
    list.iter().map(|(p, s)| (p.to_string(), *s)).collect()
}

/// Runs [`EVERY_KIND`] in a sandbox and returns what it saw, checking
/// that the workspace did not change.
fn change_every_kind(w: &World<'_>) -> Res<super::world::View> {
    let before = w.snapshot_ws()?;
    let sb = w.open()?;
    ok(sb.sb(), EVERY_KIND)?;
    let seen = view(sb.sb())?;
    // A second command sees the first's changes.
    ensure_eq!(
        ok(sb.sb(), "cat edit.txt; readlink tolink; cat moved-dir/y/z")?,
        "one\ntwo\nthree\nkeep.txt\nz\n",
        "what a later command sees"
    );
    w.ws_unchanged(&before, "while the sandbox ran")?;
    sb.close()?;
    w.ws_unchanged(&before, "after the sandbox closed")?;
    Ok(seen)
}

pub(crate) fn a_cow_sandbox_leaves_the_workspace_unchanged_and_the_diff_shows_every_change(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, every_kind)?;
    change_every_kind(&w)?;
    let layers = w.layers()?;
    let changes = layers.changes().ctx("list the changes")?;
    ensure_eq!(
        statuses(&changes),
        expected(EVERY_KIND_CHANGES),
        "the changes listed"
    );
    let text = render::unified(&layers, &changes);
    for change in &changes {
        let path = change.path.to_string_lossy();
        ensure!(
            text.contains(&format!(" {path}")) || text.contains(&format!("/{path}")),
            "the diff does not show {path}:\n{text}"
        );
    }
    for shown in [
        "diff --git a/edit.txt b/edit.txt\n--- a/edit.txt\n+++ b/edit.txt\n@@ -1,2 +1,3 @@\n one\n two\n+three\n",
        "diff --git a/rm.txt b/rm.txt\ndeleted file mode 100644\n--- a/rm.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n",
        "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
        "diff --git a/private b/private\nold mode 100644\nnew mode 100600\n",
        "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+new/deep\n",
        "diff --git a/tolink b/tolink\nnew file mode 120000\n",
        "Binary files a/bin.dat and b/bin.dat differ\n",
        "# dir mode changed: shared (mode 0700)\n",
        "# dir deleted: dir (mode ",
        "# dir added: moved-dir (mode ",
        "# dir in its place: todir (mode ",
        "diff --git a/created.txt b/created.txt\nnew file mode 100644\n",
    ] {
        ensure!(text.contains(shown), "the diff lacks {shown:?}:\n{text}");
    }
    let stat = render::stat(&layers, &changes);
    ensure!(
        stat.lines().count() == changes.len() + 1
            && stat.contains(&format!(" {} changes,", changes.len())),
        "--stat does not list every change:\n{stat}"
    );
    let json = render::json(&layers, &changes);
    ensure_eq!(
        json["changes"].as_array().map(Vec::len),
        Some(changes.len()),
        "--json entries"
    );
    ensure_eq!(
        json["hash"].as_str(),
        Some(diff_hash(&changes).as_str()),
        "--json hash"
    );
    // Listing the changes is read-only: listed again, they are the same.
    ensure_eq!(
        diff_hash(&w.changes()?),
        diff_hash(&changes),
        "the hash of a second listing"
    );
    w.finish(None)
}

pub(crate) fn a_commit_makes_the_workspace_exactly_what_the_cow_sandbox_saw(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, every_kind)?;
    let seen = change_every_kind(&w)?;
    let changes = w.changes()?;
    let hash = diff_hash(&changes);
    let report = w
        .commit(&[], Some(&hash))?
        .ctx("commit the reviewed changes")?;
    ensure_eq!(report.hash, hash, "the committed hash");
    ensure!(
        report.applied.len() == changes.len(),
        "{} of {} changes applied: {:?}",
        report.applied.len(),
        changes.len(),
        report.applied
    );
    same_view(
        &w.ws_view()?,
        &seen,
        "the workspace after the commit, against what the sandbox saw",
    )?;
    ensure!(
        w.changes()?.is_empty(),
        "changes are left after committing them all: {:?}",
        statuses(&w.changes()?)
    );
    // The next sandbox on the same layers sees the same.
    let sb = w.open()?;
    same_view(
        &view(sb.sb())?,
        &seen,
        "a new sandbox after the commit, against the first",
    )?;
    w.finish(Some(sb))
}

pub(crate) fn a_discard_leaves_nothing_and_the_next_sandbox_sees_the_workspace(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, every_kind)?;
    let before = w.snapshot_ws()?;
    change_every_kind(&w)?;
    // One path: the rest stays.
    w.discard(&["edit.txt"])?;
    let left = statuses(&w.changes()?);
    ensure!(
        !left.iter().any(|(p, _)| p == "edit.txt") && left.len() == EVERY_KIND_CHANGES.len() - 1,
        "after discarding edit.txt: {left:?}"
    );
    let sb = w.open()?;
    ensure_eq!(
        ok(sb.sb(), "cat edit.txt; cat created.txt")?,
        "one\ntwo\ncreated\n",
        "edit.txt discarded, created.txt kept"
    );
    sb.close()?;
    // Everything.
    w.discard(&[])?;
    ensure!(
        w.changes()?.is_empty(),
        "changes left after a discard: {:?}",
        statuses(&w.changes()?)
    );
    let upper: Vec<_> = std::fs::read_dir(w.state().upper())
        .ctx("list the upper layer")?
        .collect();
    ensure!(upper.is_empty(), "the upper layer is not empty: {upper:?}");
    w.ws_unchanged(&before, "after the discard")?;
    let sb = w.open()?;
    same_view(
        &view(sb.sb())?,
        &w.ws_view()?,
        "a new sandbox after the discard, against the workspace",
    )?;
    w.finish(Some(sb))
}

pub(crate) fn a_second_cow_sandbox_on_the_same_layers_continues_on_them(make: &CowFactory) -> Res {
    let w = World::new(make, |ws| put(ws, "a", b"a\n", 0o644))?;
    let before = w.snapshot_ws()?;
    let sb = w.open()?;
    ok(sb.sb(), "echo more >> a && mkdir d && echo x > d/x")?;
    sb.close()?;
    let sb = w.open()?;
    ensure_eq!(
        ok(sb.sb(), "cat a d/x")?,
        "a\nmore\nx\n",
        "the second sandbox's view"
    );
    ok(sb.sb(), "echo again >> a && rm -r d")?;
    sb.close()?;
    w.ws_unchanged(&before, "after two sandboxes")?;
    ensure_eq!(
        statuses(&w.changes()?),
        vec![("a".to_string(), Status::Modified)],
        "the changes of both"
    );
    let sb = w.open()?;
    ensure_eq!(ok(sb.sb(), "cat a")?, "a\nmore\nagain\n", "the third view");
    w.finish(Some(sb))
}

pub(crate) fn checkpoints_roll_the_view_back_and_compare_two_points(make: &CowFactory) -> Res {
    let w = World::new(make, |ws| {
        put(ws, "a", b"a\n", 0o644)?;
        put(ws, "b", b"b\n", 0o644)
    })?;
    let before = w.snapshot_ws()?;
    // Turn 1.
    let sb = w.open()?;
    ok(sb.sb(), "echo one >> a && echo 1 > n1 && mkdir d1")?;
    let view1 = view(sb.sb())?;
    sb.close()?;
    let changes1 = w.changes()?;
    let cp1 = w.state().checkpoint(Some("one")).ctx("checkpoint one")?;
    // Turn 2.
    let sb = w.open()?;
    ok(sb.sb(), "rm a && echo 2 > n2 && chmod 600 b && rmdir d1")?;
    let view2 = view(sb.sb())?;
    sb.close()?;
    let cp2 = w.state().checkpoint(None).ctx("checkpoint two")?;
    ensure!(cp2.id > cp1.id, "checkpoint ids {} then {}", cp1.id, cp2.id);
    // The diff from one to two.
    let (_, up1) = w
        .state()
        .checkpoint_upper("one")
        .ctx("find checkpoint one")?;
    let (_, up2) = w
        .state()
        .checkpoint_upper(&cp2.id.to_string())
        .ctx("find checkpoint two")?;
    let between = Layers::open_between(&w.ws, &up1, &up2)
        .ctx("open two checkpoints")?
        .changes_between()
        .ctx("compare two checkpoints")?;
    ensure_eq!(
        statuses(&between),
        vec![
            ("a".to_string(), Status::Deleted),
            ("b".to_string(), Status::ModeChanged),
            ("d1".to_string(), Status::Deleted),
            ("n2".to_string(), Status::Added),
        ],
        "the changes from checkpoint one to two"
    );
    // Turn 3, then back to one: the next sandbox sees what turn 1 left.
    let sb = w.open()?;
    ok(sb.sb(), "echo 3 > n3 && rm -f b")?;
    sb.close()?;
    w.state().rollback("one").ctx("roll back to one")?;
    ensure_eq!(
        diff_hash(&w.changes()?),
        diff_hash(&changes1),
        "the changes after rolling back to one, against those of one"
    );
    let sb = w.open()?;
    same_view(
        &view(sb.sb())?,
        &view1,
        "the view after rolling back to one",
    )?;
    // A change after a rollback, then forward to two.
    ok(sb.sb(), "echo 4 > n4")?;
    sb.close()?;
    w.state()
        .rollback(&cp2.id.to_string())
        .ctx("roll back to two")?;
    let sb = w.open()?;
    same_view(
        &view(sb.sb())?,
        &view2,
        "the view after rolling back to two",
    )?;
    w.ws_unchanged(&before, "through checkpoints and rollbacks")?;
    w.finish(Some(sb))
}

pub(crate) fn the_file_api_reads_and_writes_the_layered_view_and_agrees_with_commands(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |ws| {
        put(ws, "a", b"a\n", 0o644)?;
        put(ws, "keep", b"kept\n", 0o644)?;
        put(ws, "gone", b"gone\n", 0o644)
    })?;
    let before = w.snapshot_ws()?;
    let sb = w.open()?;
    let s: &dyn Sandbox = sb.sb();
    // What a command wrote, the file API reads.
    ok(
        s,
        "mkdir made && echo cmd > made/c && rm gone && chmod 755 keep",
    )?;
    ensure_eq!(
        s.read_file(Path::new("made/c")).ctx("read made/c")?,
        b"cmd\n".to_vec(),
        "the file API reading a command's file"
    );
    ensure_eq!(
        s.read_file(Path::new("keep")).ctx("read keep")?,
        b"kept\n".to_vec(),
        "the file API reading an untouched workspace file"
    );
    ensure!(
        s.read_file(Path::new("gone")).is_err(),
        "the file API reads a file a command deleted"
    );
    let names: Vec<String> = s
        .list_dir(Path::new("."))
        .ctx("list the view")?
        .entries
        .iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect();
    ensure_eq!(
        names,
        vec!["a".to_string(), "keep".into(), "made".into()],
        "the file API's listing"
    );
    if let Some(stat) = s.stat() {
        let meta = stat.stat(Path::new("keep")).ctx("stat keep")?;
        ensure_eq!(
            meta.mode,
            0o755,
            "the mode a command set, as the file API sees it"
        );
        let meta = stat.stat(Path::new("made")).ctx("stat made")?;
        ensure_eq!(meta.kind, FileKind::Dir, "a directory a command made");
    }
    // What the file API writes, a command sees.
    s.write_file(Path::new("a"), b"through the file API\n")
        .ctx("write a")?;
    s.write_file(&w.ws.join("made/f"), b"absolute\n")
        .ctx("write made/f by its absolute path")?;
    s.write_file(Path::new("new"), b"new\n").ctx("write new")?;
    s.remove(Path::new("made/c")).ctx("remove made/c")?;
    if let Some(dirs) = s.make_dir_all() {
        dirs.make_dir_all(Path::new("x/y/z")).ctx("make x/y/z")?;
    }
    if let Some(append) = s.append() {
        append
            .append_file(Path::new("new"), b"appended\n")
            .ctx("append to new")?;
    }
    let mut want = String::from("through the file API\nabsolute\nnew\n");
    if s.append().is_some() {
        want.push_str("appended\n");
    }
    ensure_eq!(
        ok(s, "cat a made/f new && test ! -e made/c")?,
        want,
        "what commands see of the file API's writes"
    );
    if s.make_dir_all().is_some() {
        ok(s, "test -d x/y/z")?;
    }
    // A symlink the view has is followed inside the view.
    ok(s, "ln -s made/f link")?;
    s.write_file(Path::new("link"), b"via the link\n")
        .ctx("write through a symlink inside the view")?;
    ensure_eq!(
        ok(s, "cat made/f; test -L link && echo still a link")?,
        "via the link\nstill a link\n",
        "a write through a symlink inside the view"
    );
    // Still fenced: `..` out of the view is refused.
    ensure!(
        s.read_file(Path::new("../outside/secret")).is_err(),
        "the file API read ../outside/secret"
    );
    ensure!(
        s.write_file(Path::new("../outside/secret"), b"x").is_err(),
        "the file API wrote ../outside/secret"
    );
    let seen = view(s)?;
    w.ws_unchanged(&before, "by the file API")?;
    usable(s)?;
    sb.close()?;
    w.ws_unchanged(&before, "after the sandbox closed")?;
    // The review shows the file API's writes, and the commit applies them.
    let changes = statuses(&w.changes()?);
    for path in ["a", "made/f", "new", "link"] {
        ensure!(
            changes.iter().any(|(p, _)| p == path),
            "the diff does not show {path}: {changes:?}"
        );
    }
    w.commit(&[], None)?.ctx("commit")?;
    same_view(
        &w.ws_view()?,
        &seen,
        "the workspace after the commit, against what the sandbox saw",
    )?;
    w.finish(None)
}
