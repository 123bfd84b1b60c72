//! Layers made by a real overlayfs mount, unprivileged (a user and mount
//! namespace of their own, `userxattr`), as `--cow` makes them: what the
//! engine reads from the upper layer is what the sandbox saw, and a
//! commit makes the workspace that.

use std::path::Path;
use std::process::Command;

use hako_layers::diff_hash;

use crate::{put, tree, Fixture};

fn must_work() -> bool {
    std::env::var("HAKO_MUST_WORK").is_ok_and(|v| v == "1")
}

/// Runs `script` in the merged view of `f`'s layers (mounted at `merged`
/// in a namespace of its own), then lists the view: `None` when this
/// host cannot mount an unprivileged overlay (a failure under
/// `HAKO_MUST_WORK=1`).
fn in_overlay(
    f: &Fixture,
    merged: &Path,
    script: &str,
) -> Option<Vec<(std::path::PathBuf, String)>> {
    let listing = tempfile::tempdir().unwrap();
    let copy = listing.path().join("view");
    let mount = format!(
        "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={},userxattr {} || exit 99\n\
         cd {} && ( {script} ) && cp -a {} {}",
        f.ws().display(),
        f.upper().display(),
        f.state().work().display(),
        merged.display(),
        merged.display(),
        merged.display(),
        copy.display(),
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-ec", &mount])
        .output();
    match out {
        Ok(out) if out.status.success() => Some(tree(&copy)),
        Ok(out) if !must_work() && (out.status.code() == Some(99) || !out.status.success()) => {
            eprintln!(
                "skipped: cannot mount an unprivileged overlay here: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
        Ok(out) => panic!(
            "overlay script failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if !must_work() => {
            eprintln!("skipped: no unshare: {e}");
            None
        }
        Err(e) => panic!("unshare: {e}"),
    }
}

#[test]
fn a_real_overlay_upper_layer_is_read_and_committed_as_the_sandbox_saw_it() {
    let f = Fixture::new(|ws| {
        put(&ws.join("edit.txt"), "one\ntwo\n");
        put(&ws.join("rm.txt"), "bye\n");
        put(&ws.join("dir/a"), "a\n");
        put(&ws.join("dir/sub/b"), "b\n");
        put(&ws.join("mv/x"), "x\n");
        put(&ws.join("chmod.sh"), "#!/bin/sh\n");
        put(&ws.join("replace/old"), "old\n");
    });
    let merged = tempfile::tempdir().unwrap();
    let script = "echo three >> edit.txt; rm rm.txt; rm -r dir; mv mv moved; chmod +x chmod.sh; \
                  ln -s edit.txt link; echo new > new.txt; rm -r replace; mkdir replace; \
                  echo fresh > replace/new; touch -c edit.txt";
    let Some(seen) = in_overlay(&f, merged.path(), script) else {
        return;
    };
    let changes = f.changes();
    assert!(!changes.is_empty());
    let hash = diff_hash(&changes);
    f.commit(&[], Some(&hash)).unwrap();
    assert_eq!(tree(f.ws()), seen);
    assert!(f.changes().is_empty(), "{:?}", f.changes());
}

#[test]
fn a_workspace_file_deleted_after_the_sandbox_changed_it_is_refused_at_commit() {
    let f = Fixture::new(|ws| put(&ws.join("notes"), "v1\n"));
    let merged = tempfile::tempdir().unwrap();
    if in_overlay(&f, merged.path(), "echo more >> notes").is_none() {
        return;
    }
    std::fs::remove_file(f.ws().join("notes")).unwrap();
    let err = f.commit(&[], None).unwrap_err();
    assert!(
        matches!(err, hako_layers::CommitError::ChangedInWorkspace { .. }),
        "{err}"
    );
    assert!(!f.ws().join("notes").exists());
}

#[test]
fn a_file_renamed_in_the_sandbox_is_committed_not_refused_as_deleted_since() {
    // overlayfs copies a workspace file up before renaming it, and marks
    // the copy with its origin: listed as added, it was once taken for a
    // workspace file the person deleted since.
    let f = Fixture::new(|ws| {
        put(&ws.join("notes"), "v1\n");
        put(&ws.join("d/inner"), "i\n");
    });
    let merged = tempfile::tempdir().unwrap();
    let script = "mv notes renamed && mv d/inner d/moved && echo more >> d/moved";
    let Some(seen) = in_overlay(&f, merged.path(), script) else {
        return;
    };
    let hash = diff_hash(&f.changes());
    f.commit(&[], Some(&hash)).unwrap();
    assert_eq!(tree(f.ws()), seen);
}

#[test]
fn a_file_beneath_a_workspace_file_the_sandbox_made_a_directory_is_committed() {
    // `todir/f` was judged changed in the workspace since the base: the
    // workspace's `todir` is a file, and looking beneath it failed.
    let f = Fixture::new(|ws| put(&ws.join("todir"), "f\n"));
    let merged = tempfile::tempdir().unwrap();
    let script = "rm todir && mkdir todir && echo inside > todir/f";
    let Some(seen) = in_overlay(&f, merged.path(), script) else {
        return;
    };
    f.commit(&[], None).unwrap();
    assert_eq!(tree(f.ws()), seen);
}

#[test]
fn a_workspace_file_renamed_or_its_directory_deleted_after_the_sandbox_changed_it_is_refused() {
    // The person renames the file the sandbox changed.
    let f = Fixture::new(|ws| put(&ws.join("notes"), "v1\n"));
    let merged = tempfile::tempdir().unwrap();
    if in_overlay(&f, merged.path(), "echo more >> notes").is_none() {
        return;
    }
    std::fs::rename(f.ws().join("notes"), f.ws().join("elsewhere")).unwrap();
    let err = f.commit(&[], None).unwrap_err();
    assert!(
        matches!(err, hako_layers::CommitError::ChangedInWorkspace { .. }),
        "{err}"
    );
    // The person deletes the directory holding it.
    let f = Fixture::new(|ws| put(&ws.join("d/notes"), "v1\n"));
    let merged = tempfile::tempdir().unwrap();
    if in_overlay(&f, merged.path(), "echo more >> d/notes").is_none() {
        return;
    }
    std::fs::remove_dir_all(f.ws().join("d")).unwrap();
    let err = f.commit(&[], None).unwrap_err();
    assert!(
        matches!(err, hako_layers::CommitError::ChangedInWorkspace { .. }),
        "{err}"
    );
    assert!(!f.ws().join("d").exists());
}

#[test]
fn a_workspace_file_the_sandbox_renamed_is_committed_as_a_rename() {
    let f = Fixture::new(|ws| {
        put(&ws.join("old-name"), "moved\n");
        put(&ws.join("d/inner"), "in\n");
        put(&ws.join("kept"), "kept\n");
    });
    let merged = tempfile::tempdir().unwrap();
    // overlayfs copies each file up (recording its origin) before the
    // rename: the added names carry the origin of files the workspace
    // still has, at the names the sandbox deleted or replaced.
    let script = "mv old-name new-name; mv d/inner d/renamed; mv kept kept.bak; echo again > kept";
    let Some(seen) = in_overlay(&f, merged.path(), script) else {
        return;
    };
    f.commit(&[], None).unwrap();
    assert_eq!(tree(f.ws()), seen);
    assert!(f.changes().is_empty(), "{:?}", f.changes());
}

#[test]
fn a_file_the_sandbox_renamed_whose_source_the_person_replaced_since_is_refused() {
    let f = Fixture::new(|ws| put(&ws.join("old-name"), "v1\n"));
    let merged = tempfile::tempdir().unwrap();
    if in_overlay(&f, merged.path(), "mv old-name new-name").is_none() {
        return;
    }
    // Another file at the source's name: not the one the sandbox moved.
    std::fs::remove_file(f.ws().join("old-name")).unwrap();
    put(&f.ws().join("old-name"), "v2\n");
    let err = f.commit(&[], None).unwrap_err();
    assert!(
        matches!(err, hako_layers::CommitError::ChangedInWorkspace { .. }),
        "{err}"
    );
    assert!(!f.ws().join("new-name").exists());
}
