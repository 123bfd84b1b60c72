//! Listing, showing, committing and discarding changes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hako_layers::{diff_hash, render, CommitError, Status};

use crate::{opaque, put, tree, whiteout, Fixture};

fn workspace(ws: &Path) {
    put(
        &ws.join("src/main.rs"),
        "fn main() {\n    println!(\"hi\");\n}\n",
    );
    put(&ws.join("README"), "hello\n");
    put(&ws.join("run.sh"), "#!/bin/sh\n");
    put(&ws.join("gone/a"), "a\n");
    put(&ws.join("gone/b/c"), "c\n");
    put(&ws.join("keep"), "keep\n");
    put(&ws.join("opq/old"), "old\n");
    put(&ws.join("opq/both"), "same\n");
}

/// The upper layer a sandbox would leave after: editing main.rs, adding
/// new.txt and a binary, deleting README and `gone/`, chmod +x run.sh, a
/// symlink, and `rm -rf opq; mkdir opq; echo same > opq/both`.
fn sandbox(f: &Fixture) {
    let up = f.upper();
    put(
        &up.join("src/main.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    );
    put(&up.join("new.txt"), "new\n");
    put(&up.join("bin.dat"), "\0\x01\x02");
    whiteout(&up.join("README"));
    whiteout(&up.join("gone"));
    std::fs::copy(f.ws().join("run.sh"), up.join("run.sh")).unwrap();
    std::fs::set_permissions(up.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/main.rs", up.join("link")).unwrap();
    put(&up.join("opq/both"), "same\n");
    opaque(&up.join("opq"));
    // Copied up and unchanged: no change.
    std::fs::copy(f.ws().join("keep"), up.join("keep")).unwrap();
}

#[test]
fn every_kind_of_change_is_listed_from_the_upper_layer() {
    let f = Fixture::new(workspace);
    sandbox(&f);
    let got: Vec<(PathBuf, Status)> = f
        .changes()
        .iter()
        .map(|c| (c.path.clone(), c.status()))
        .collect();
    let want: Vec<(PathBuf, Status)> = [
        ("README", Status::Deleted),
        ("bin.dat", Status::Added),
        ("gone", Status::Deleted),
        ("gone/a", Status::Deleted),
        ("gone/b", Status::Deleted),
        ("gone/b/c", Status::Deleted),
        ("link", Status::Added),
        ("new.txt", Status::Added),
        ("opq/old", Status::Deleted),
        ("run.sh", Status::ModeChanged),
        ("src/main.rs", Status::Modified),
    ]
    .into_iter()
    .map(|(p, s)| (PathBuf::from(p), s))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn the_unified_diff_reads_as_git_diff() {
    let f = Fixture::new(workspace);
    sandbox(&f);
    let layers = f.layers();
    let changes = layers.changes().unwrap();
    let text = render::unified(&layers, &changes);
    for want in [
        "diff --git a/src/main.rs b/src/main.rs\n--- a/src/main.rs\n+++ b/src/main.rs\n@@ -1,3 +1,3 @@\n fn main() {\n-    println!(\"hi\");\n+    println!(\"hello\");\n }\n",
        "diff --git a/README b/README\ndeleted file mode 100644\n--- a/README\n+++ /dev/null\n@@ -1 +0,0 @@\n-hello\n",
        "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n",
        "diff --git a/bin.dat b/bin.dat\nnew file mode 100644\nBinary files /dev/null and b/bin.dat differ\n",
        "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
        "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+src/main.rs\n\\ No newline at end of file\n",
        "# dir deleted: gone (mode 0755)\n",
    ] {
        assert!(text.contains(want), "missing\n{want}\nin\n{text}");
    }
    let stat = render::stat(&layers, &changes);
    assert!(stat.contains(" src/main.rs | 2 +-\n"), "{stat}");
    assert!(stat.contains("Bin 0 -> 3 bytes"), "{stat}");
    let json = render::json(&layers, &changes);
    assert_eq!(json["hash"], diff_hash(&changes));
    assert_eq!(json["changes"].as_array().unwrap().len(), changes.len());
    assert_eq!(json["changes"][0]["path"], "README");
    assert_eq!(json["changes"][0]["status"], "deleted");
}

#[test]
fn a_commit_makes_the_workspace_what_the_sandbox_saw_and_leaves_no_change() {
    let f = Fixture::new(workspace);
    sandbox(&f);
    let hash = diff_hash(&f.changes());
    let report = f.commit(&[], Some(&hash)).unwrap();
    assert_eq!(report.hash, hash);
    let ws = f.ws();
    assert_eq!(
        std::fs::read_to_string(ws.join("src/main.rs")).unwrap(),
        "fn main() {\n    println!(\"hello\");\n}\n"
    );
    assert!(
        !ws.join("README").exists() && !ws.join("gone").exists() && !ws.join("opq/old").exists()
    );
    assert_eq!(
        std::fs::read_link(ws.join("link")).unwrap(),
        Path::new("src/main.rs")
    );
    assert_eq!(
        std::fs::metadata(ws.join("run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(std::fs::read(ws.join("bin.dat")).unwrap(), b"\0\x01\x02");
    assert!(f.changes().is_empty(), "{:?}", f.changes());
    // The sandbox goes on, and changes a committed file again: that is
    // judged by what the commit left, not refused.
    put(&f.upper().join("new.txt"), "newer\n");
    f.commit(&["new.txt"], None).unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("new.txt")).unwrap(),
        "newer\n"
    );
}

#[test]
fn a_commit_of_named_paths_applies_only_those_and_the_new_directories_above() {
    let f = Fixture::new(workspace);
    put(&f.upper().join("a/b/c.txt"), "c\n");
    put(&f.upper().join("a/d.txt"), "d\n");
    put(&f.upper().join("e.txt"), "e\n");
    let report = f.commit(&["a/b/c.txt"], None).unwrap();
    let applied: Vec<&str> = report.applied.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(applied, ["a", "a/b", "a/b/c.txt"]);
    assert!(f.ws().join("a/b/c.txt").exists());
    assert!(!f.ws().join("a/d.txt").exists() && !f.ws().join("e.txt").exists());
    let err = f.commit(&["nothing/here"], None).unwrap_err();
    assert!(matches!(err, CommitError::NoSuchChange { .. }), "{err}");
}

#[test]
fn a_workspace_file_changed_since_the_sandbox_began_is_refused_naming_it() {
    let f = Fixture::new(workspace);
    put(&f.upper().join("README"), "agent's\n");
    put(&f.upper().join("keep"), "agent's\n");
    put(&f.upper().join("fresh"), "agent's\n");
    // The person edits README and makes `fresh` meanwhile.
    std::fs::write(f.ws().join("README"), "person's\n").unwrap();
    std::fs::write(f.ws().join("fresh"), "person's\n").unwrap();
    let err = f.commit(&[], None).unwrap_err();
    match &err {
        CommitError::ChangedInWorkspace { paths } => {
            assert_eq!(paths, &[PathBuf::from("README"), PathBuf::from("fresh")])
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("README"));
    // Nothing was written, and the other path can still be committed.
    assert_eq!(
        std::fs::read_to_string(f.ws().join("keep")).unwrap(),
        "keep\n"
    );
    f.commit(&["keep"], None).unwrap();
    assert_eq!(
        std::fs::read_to_string(f.ws().join("keep")).unwrap(),
        "agent's\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.ws().join("README")).unwrap(),
        "person's\n"
    );
}

#[test]
fn a_stale_expect_hash_commits_nothing() {
    let f = Fixture::new(workspace);
    put(&f.upper().join("new.txt"), "new\n");
    let reviewed = diff_hash(&f.changes());
    put(&f.upper().join("sneaked.txt"), "in\n");
    let err = f.commit(&[], Some(&reviewed)).unwrap_err();
    assert!(matches!(err, CommitError::ExpectMismatch { .. }), "{err}");
    assert!(!f.ws().join("new.txt").exists() && !f.ws().join("sneaked.txt").exists());
}

#[test]
fn discard_removes_named_changes_or_all() {
    let f = Fixture::new(workspace);
    sandbox(&f);
    let err = hako_layers::discard(&f.upper(), f.ws(), &[PathBuf::from("gone/a")]).unwrap_err();
    match err {
        CommitError::PartOfLarger { above, .. } => assert_eq!(above, Path::new("gone")),
        other => panic!("{other}"),
    }
    hako_layers::discard(
        &f.upper(),
        f.ws(),
        &[PathBuf::from("src/main.rs"), PathBuf::from("gone")],
    )
    .unwrap();
    let paths: Vec<PathBuf> = f.changes().into_iter().map(|c| c.path).collect();
    assert!(
        !paths.contains(&PathBuf::from("src/main.rs")) && !paths.contains(&PathBuf::from("gone/a"))
    );
    assert!(paths.contains(&PathBuf::from("new.txt")));
    hako_layers::discard(&f.upper(), f.ws(), &[]).unwrap();
    assert!(f.changes().is_empty());
    assert!(f.upper().is_dir());
}

#[test]
fn a_file_named_with_odd_bytes_is_hashed_and_committed_losslessly() {
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new(|_| {});
    let name = std::ffi::OsStr::from_bytes(b"odd\xff name\n%");
    std::fs::write(f.upper().join(name), "x").unwrap();
    f.commit(&[], None).unwrap();
    assert_eq!(std::fs::read(f.ws().join(name)).unwrap(), b"x");
    assert_eq!(tree(f.ws()).len(), 1);
}

#[test]
fn a_file_name_holding_a_newline_cannot_forge_a_line_of_the_review() {
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new(|ws| put(&ws.join("safe"), "safe\n"));
    // A path that, shown as it is, would end the header and start a
    // forged file part of its
    // own (a directory's name and its file's).
    let forged = std::ffi::OsStr::from_bytes(b"x\n+++ b/safe\n@@ -1 +1 @@\n-safe\n+evil");
    std::fs::create_dir(f.upper().join("x\n+++ b")).unwrap();
    std::fs::write(f.upper().join(forged), "x\n").unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9 \"q\"\\");
    std::fs::write(f.upper().join(odd), "y\n").unwrap();
    let layers = f.layers();
    let changes = f.changes();
    let diff = render::unified(&layers, &changes);
    assert!(
        diff.lines().all(|l| l != "+++ b/safe" && l != "+evil"),
        "a name forged a line:\n{diff}"
    );
    assert!(
        diff.contains("diff --git \"a/x\\n+++ b/safe\\n@@ -1 +1 @@\\n-safe\\n+evil\" "),
        "{diff}"
    );
    assert!(
        diff.contains("+++ \"b/caf\\351 \\\"q\\\"\\\\\"\n"),
        "{diff}"
    );
    let stat = render::stat(&layers, &changes);
    assert_eq!(stat.lines().count(), 4, "{stat}");
    // JSON keeps each name exactly: as text where it is UTF-8, else
    // beside its lossy text as hex.
    let json = render::json(&layers, &changes);
    let entries = json["changes"].as_array().unwrap();
    let odd_entry = entries
        .iter()
        .find(|e| e.get("path_hex").is_some())
        .unwrap();
    assert_eq!(
        odd_entry["path_hex"],
        hako_layers::hex(odd.as_bytes()).as_str()
    );
    assert!(entries
        .iter()
        .any(|e| e["path"] == "x\n+++ b/safe\n@@ -1 +1 @@\n-safe\n+evil"
            && e.get("path_hex").is_none()));
}

#[test]
fn a_diff_walks_only_what_changed_not_the_workspace() {
    let f = Fixture::new(|ws| {
        for i in 0..2_000 {
            put(&ws.join(format!("tree/d{}/f{i}", i % 20)), "x\n");
        }
        put(&ws.join("tree/d3/edit"), "old\n");
    });
    // Three changes deep in the tree: an edit, an addition, a deletion.
    put(&f.upper().join("tree/d3/edit"), "new\n");
    put(&f.upper().join("tree/d3/added"), "new\n");
    whiteout(&f.upper().join("tree/d3/f3"));
    let (changes, visited) = f.layers().changes_counted().unwrap();
    assert_eq!(changes.len(), 3);
    // tree, tree/d3 and the three names in it: five upper entries, the
    // same five looked up in the workspace, and no workspace directory
    // listed.
    assert_eq!(
        visited,
        hako_layers::scan::Visited {
            upper_entries: 5,
            lower_entries: 5,
            lower_dirs_listed: 0,
        }
    );
}

#[test]
fn a_set_group_id_directory_is_committed_as_it_is_and_leaves_no_change() {
    let f = Fixture::new(|_| {});
    std::fs::create_dir(f.upper().join("shared")).unwrap();
    std::fs::set_permissions(
        f.upper().join("shared"),
        std::fs::Permissions::from_mode(0o2775),
    )
    .unwrap();
    put(&f.upper().join("shared/f"), "x");
    f.commit(&[], None).unwrap();
    let mode = std::fs::metadata(f.ws().join("shared"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o2775);
    assert!(f.changes().is_empty(), "{:?}", f.changes());
}

#[test]
fn a_file_the_sandbox_changed_and_the_person_deleted_since_is_refused_not_recreated() {
    let f = Fixture::new(|ws| put(&ws.join("notes"), "v1\n"));
    // The sandbox changed `notes` (overlayfs copied it up and recorded
    // its origin); the person then deleted it from the workspace.
    put(&f.upper().join("notes"), "v1 and more\n");
    hako_sys::rustix::fs::setxattr(
        f.upper().join("notes"),
        "user.overlay.origin",
        b"\x00\xfb",
        hako_sys::rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    std::fs::remove_file(f.ws().join("notes")).unwrap();
    // A checkpoint and a rollback keep what the layer knows.
    f.state().checkpoint(None).unwrap();
    f.state().rollback("1").unwrap();
    put(&f.upper().join("fresh"), "new\n");
    let err = f.commit(&[], None).unwrap_err();
    match &err {
        CommitError::ChangedInWorkspace { paths } => assert_eq!(paths, &[PathBuf::from("notes")]),
        other => panic!("{other}"),
    }
    assert!(!f.ws().join("notes").exists() && !f.ws().join("fresh").exists());
    f.commit(&["fresh"], None).unwrap();
}
