//! Attacks on the review (issue 23, item 6), each named after itself.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hako_layers::{diff_hash, CommitError, Status};

use crate::{opaque, put, tree, whiteout, Fixture};

mod naive;

/// How a case commits: the engine, or the naive twin.
type Committer = dyn Fn(&Fixture, &[&str]);

fn engine(f: &Fixture, paths: &[&str]) {
    f.commit(paths, None).unwrap();
}

/// The symlink attack against `commit`: what it did wrong, if anything.
fn symlink_case(commit: &Committer) -> Vec<String> {
    let mut wrong = Vec::new();
    let outside = tempfile::tempdir().unwrap();
    put(&outside.path().join("secret"), "secret\n");
    let target = outside.path().join("secret");
    let f = Fixture::new(|ws| put(&ws.join("f"), "f\n"));
    // A new symlink out, and a file of the workspace replaced by one.
    std::os::unix::fs::symlink(&target, f.upper().join("out")).unwrap();
    std::os::unix::fs::symlink(&target, f.upper().join("f")).unwrap();
    std::os::unix::fs::symlink(outside.path(), f.upper().join("dirlink")).unwrap();
    commit(&f, &[]);
    for name in ["out", "f"] {
        if std::fs::read_link(f.ws().join(name)).ok().as_deref() != Some(target.as_path()) {
            wrong.push(format!("{name} is not the symlink"));
        }
    }
    // A later change to the file "through" the committed symlink, made
    // in the layer as a file of that name, must replace the symlink.
    std::fs::remove_file(f.upper().join("out")).unwrap();
    put(&f.upper().join("out"), "mine\n");
    commit(&f, &["out"]);
    if std::fs::read_to_string(&target).unwrap() != "secret\n" {
        wrong.push("wrote through the symlink, outside the workspace".into());
    }
    if tree(outside.path()).len() != 1 {
        wrong.push("made something outside the workspace".into());
    }
    wrong
}

#[test]
fn a_symlink_in_the_layer_pointing_outside_is_committed_as_a_symlink_and_never_followed() {
    let f = Fixture::new(|ws| put(&ws.join("f"), "f\n"));
    std::os::unix::fs::symlink("/etc/passwd", f.upper().join("out")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", f.upper().join("f")).unwrap();
    let statuses: Vec<Status> = f.changes().iter().map(|c| c.status()).collect();
    assert_eq!(statuses, [Status::TypeChanged, Status::Added]);
    assert_eq!(symlink_case(&engine), Vec::<String>::new());
    // The naive twin, which follows what it finds, is caught.
    assert!(!symlink_case(&naive::commit).is_empty());
}

fn refused(f: &Fixture, path: &str) {
    let err = f.commit(&[], None).unwrap_err();
    match &err {
        CommitError::Refused { path: p, .. } => assert_eq!(p, Path::new(path)),
        other => panic!("{path}: {other}"),
    }
    assert!(err.to_string().contains(path), "{err}");
    // Nothing was applied, not even the ordinary change beside it.
    assert!(!f.ws().join("ordinary").exists(), "{path}");
}

#[test]
fn a_device_fifo_socket_setuid_or_setgid_file_in_the_layer_is_refused_at_commit() {
    // A FIFO.
    let f = Fixture::new(|_| {});
    put(&f.upper().join("ordinary"), "x");
    hako_sys::rustix::fs::mknodat(
        hako_sys::rustix::fs::CWD,
        f.upper().join("fifo"),
        hako_sys::rustix::fs::FileType::Fifo,
        hako_sys::rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    refused(&f, "fifo");
    // A socket.
    let f = Fixture::new(|_| {});
    put(&f.upper().join("ordinary"), "x");
    let _listener = std::os::unix::net::UnixListener::bind(f.upper().join("sock")).unwrap();
    refused(&f, "sock");
    // A device other than a whiteout (only where this process may make one).
    let f = Fixture::new(|_| {});
    put(&f.upper().join("ordinary"), "x");
    let made = hako_sys::rustix::fs::mknodat(
        hako_sys::rustix::fs::CWD,
        f.upper().join("null"),
        hako_sys::rustix::fs::FileType::CharacterDevice,
        hako_sys::rustix::fs::Mode::from_raw_mode(0o666),
        hako_sys::rustix::fs::makedev(1, 3),
    );
    match made {
        Ok(()) => refused(&f, "null"),
        Err(e) => eprintln!("skipped the device case: cannot make one here: {e}"),
    }
    // Set-user-ID and set-group-ID files.
    for (name, mode) in [("suid", 0o4755), ("sgid", 0o2755)] {
        let f = Fixture::new(|_| {});
        put(&f.upper().join("ordinary"), "x");
        put(&f.upper().join(name), "#!/bin/sh\n");
        std::fs::set_permissions(f.upper().join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
        refused(&f, name);
        // Discarding it leaves a commit that goes through.
        hako_layers::discard(&f.upper(), f.ws(), &[PathBuf::from(name)]).unwrap();
        f.commit(&[], None).unwrap();
        assert!(f.ws().join("ordinary").exists());
    }
}

/// The whiteout and opaque attack against `commit`: what it did wrong.
fn whiteout_case(commit: &Committer) -> Vec<String> {
    let mut wrong = Vec::new();
    let outside = tempfile::tempdir().unwrap();
    put(&outside.path().join("secret"), "secret\n");
    put(&outside.path().join("sub/deep"), "deep\n");
    let before = tree(outside.path());
    let out = outside.path().to_path_buf();
    let f = Fixture::new(|ws| {
        std::os::unix::fs::symlink(&out, ws.join("link")).unwrap();
        std::os::unix::fs::symlink(&out, ws.join("link2")).unwrap();
        std::os::unix::fs::symlink(&out, ws.join("link3")).unwrap();
        put(&ws.join("inside"), "x");
    });
    let up = f.upper();
    // A whiteout of the symlink itself, a whiteout "beneath" a symlink
    // the layer made a directory, and an opaque directory over one.
    whiteout(&up.join("link"));
    std::fs::create_dir(up.join("link2")).unwrap();
    whiteout(&up.join("link2/secret"));
    std::fs::create_dir(up.join("link3")).unwrap();
    opaque(&up.join("link3"));
    commit(&f, &[]);
    if tree(outside.path()) != before {
        wrong.push("deleted outside the workspace".into());
    }
    let real_dir =
        |name: &str| std::fs::symlink_metadata(f.ws().join(name)).is_ok_and(|m| m.is_dir());
    if f.ws().join("link").exists()
        || !f.ws().join("inside").exists()
        || !real_dir("link2")
        || !real_dir("link3")
    {
        wrong.push("the workspace is not what the sandbox saw".into());
    }
    wrong
}

#[test]
fn a_whiteout_or_opaque_dir_cannot_delete_outside_the_workspace() {
    assert_eq!(whiteout_case(&engine), Vec::<String>::new());
    assert!(!whiteout_case(&naive::commit).is_empty());
}

#[test]
fn a_file_swapped_for_a_symlink_between_diff_and_commit_is_refused() {
    let f = Fixture::new(|ws| put(&ws.join("f"), "old\n"));
    put(&f.upper().join("f"), "reviewed\n");
    put(&f.upper().join("g"), "reviewed\n");
    let reviewed = diff_hash(&f.changes());
    // After the review, the sandbox swaps a file for a symlink out.
    std::fs::remove_file(f.upper().join("g")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", f.upper().join("g")).unwrap();
    let err = f.commit(&[], Some(&reviewed)).unwrap_err();
    assert!(matches!(err, CommitError::ExpectMismatch { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(f.ws().join("f")).unwrap(), "old\n");
    assert!(!f.ws().join("g").exists());
}

#[test]
fn a_rename_of_a_directory_of_10000_files_is_reviewed_and_committed() {
    const N: usize = 10_000;
    // Every hundredth file has content, the rest are empty: on a file
    // system that discards blocks as files are removed, removing 20,000
    // files with data takes a minute; the names tell the empty ones apart.
    let content = |i: usize| {
        if i % 100 == 0 {
            format!("{i}\n")
        } else {
            String::new()
        }
    };
    let f = Fixture::new(|ws| {
        for i in 0..N {
            put(&ws.join(format!("old/d{}/f{i}", i % 10)), &content(i));
        }
    });
    // overlayfs without redirect_dir makes `mv old new` a copy and a
    // whiteout (rename(2) fails with EXDEV and mv copies).
    whiteout(&f.upper().join("old"));
    for i in 0..N {
        put(
            &f.upper().join(format!("new/d{}/f{i}", i % 10)),
            &content(i),
        );
    }
    let changes = f.changes();
    let count = |s: Status| changes.iter().filter(|c| c.status() == s).count();
    assert_eq!(count(Status::Deleted), N + 11);
    assert_eq!(count(Status::Added), N + 11);
    let hash = diff_hash(&changes);
    f.commit(&[], Some(&hash)).unwrap();
    assert!(!f.ws().join("old").exists());
    let committed = tree(&f.ws().join("new"));
    assert_eq!(committed.len(), N + 10);
    assert_eq!(tree(&f.upper().join("new")), committed);
    assert!(f.changes().is_empty());
}
