#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A copy-on-write workspace on the gvisor backend (`spec.cow`): the host
//! view mounts an overlayfs over the workspace's path in its own mount
//! namespace before it becomes `runsc`, so gVisor's gofer serves the
//! layered view; every change lands in the upper layer and the real
//! workspace is never touched until the review engine commits. Needs
//! runsc and a static guest in `HAKO_GUEST_STATIC`; without them every
//! case skips, unless `HAKO_MUST_WORK=1`.

use std::path::{Path, PathBuf};

use hako_core::{Command, CowLayers, Sandbox};
use hako_gvisor::{GvisorConfig, GvisorSandbox};
use hako_layers::state::State;
use hako_layers::{Layers, Status};

/// Whether gVisor runs here; prints why not (a failure under
/// `HAKO_MUST_WORK`).
fn ready() -> bool {
    match hako_gvisor::ready() {
        Ok(()) => true,
        Err(reason) => {
            assert!(!hako_conformance::must_work(), "{reason}");
            eprintln!("SKIPPED: {reason}");
            false
        }
    }
}

hako_conformance::cow_tests!(kit, |ws: &Path, layers: CowLayers| {
    if !ready() {
        return Err(hako_core::Error::Unsupported {
            backend: "gvisor".into(),
            capability: "running on this host (see the reason printed above)",
        });
    }
    let mut config = GvisorConfig::new(ws);
    config.spec.cow = Some(layers);
    Ok(Box::new(GvisorSandbox::new(config)?))
});

/// Every entry beneath `root` with its kind, permission bits and content
/// or target: what "byte-for-byte unchanged" compares.
fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                format!(
                    "{mode:o} {}",
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap())
                )
            };
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), what));
        }
    }
    out.sort();
    out
}

/// A workspace, and a named sandbox's state (upper and work directories)
/// outside it.
struct Cow {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    _state_dir: tempfile::TempDir,
    state: State,
}

fn cow(fill: impl FnOnce(&Path)) -> Cow {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    fill(&ws);
    let state_dir = tempfile::tempdir().unwrap();
    let state = State::create(&state_dir.path().join("hako"), "n", &ws, &[]).unwrap();
    Cow {
        _dir: dir,
        ws,
        _state_dir: state_dir,
        state,
    }
}

fn config(c: &Cow) -> GvisorConfig {
    let mut config = GvisorConfig::new(&c.ws);
    config.spec.cow = Some(CowLayers {
        upper: c.state.upper(),
        work: c.state.work(),
    });
    config
}

fn open(c: &Cow) -> GvisorSandbox {
    GvisorSandbox::new(config(c)).unwrap()
}

fn sh(sb: &GvisorSandbox, script: &str) -> (i32, String, String) {
    let out = sb.exec(&Command::shell(script)).unwrap();
    (
        out.status.shell_code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a tree looks like to `find` and `sha256sum`: the same text inside
/// the sandbox (the host's programs, on gVisor's kernel) and on the host.
const LISTING: &str = "find . -mindepth 1 -printf '%P %y %m %l\\n' | sort; \
                       find . -type f -exec sha256sum {} + | sort";

fn listing_on_host(dir: &Path) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", LISTING])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_cow_gvisor_sandbox_changes_only_its_upper_layer_and_the_review_and_commit_see_every_change() {
    if !ready() {
        return;
    }
    let c = cow(|ws| {
        std::fs::write(ws.join("a"), "a\n").unwrap();
        std::fs::write(ws.join("gone"), "bye\n").unwrap();
        std::fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/x"), "x\n").unwrap();
        std::fs::create_dir(ws.join("dir")).unwrap();
        std::fs::write(ws.join("dir/y"), "y\n").unwrap();
    });
    let before = tree(&c.ws);
    let sb = open(&c);
    // Renamed: a workspace directory (overlayfs answers EXDEV without
    // redirects, and mv copies it) and a file the sandbox made.
    let (code, out, err) = sh(
        &sb,
        "echo b >> a && rm gone && rm -r d && mv dir moved && echo t > tmp && mv tmp renamed \
         && chmod 755 run.sh && mkdir -p new/deep && echo n > new/deep/n && ln -s a link && cat a",
    );
    assert_eq!((code, out.as_str()), (0, "a\nb\n"), "{err}");
    // A second command sees the first's changes.
    // (Not `stat`: this gVisor refuses coreutils 9's statx with EINVAL.)
    let (_, seen, err) = sh(
        &sb,
        "ls -A | sort | tr '\\n' ' '; find run.sh -printf '%m\\n'",
    );
    assert_eq!(seen, "a link moved new renamed run.sh 755\n", "{err}");
    let (code, inside, err) = sh(&sb, LISTING);
    assert_eq!(code, 0, "{err}");
    sb.close().unwrap();
    assert_eq!(tree(&c.ws), before, "the real workspace changed");
    let layers = Layers::open(&c.ws, &c.state.upper()).unwrap();
    let changes: Vec<(PathBuf, Status)> = layers
        .changes()
        .unwrap()
        .into_iter()
        .map(|ch| (ch.path.clone(), ch.status()))
        .collect();
    let want: Vec<(PathBuf, Status)> = [
        ("a", Status::Modified),
        ("d", Status::Deleted),
        ("d/x", Status::Deleted),
        ("dir", Status::Deleted),
        ("dir/y", Status::Deleted),
        ("gone", Status::Deleted),
        ("link", Status::Added),
        ("moved", Status::Added),
        ("moved/y", Status::Added),
        ("new", Status::Added),
        ("new/deep", Status::Added),
        ("new/deep/n", Status::Added),
        ("renamed", Status::Added),
        ("run.sh", Status::ModeChanged),
    ]
    .into_iter()
    .map(|(p, s)| (PathBuf::from(p), s))
    .collect();
    assert_eq!(changes, want);
    let mut base = c.state.base().unwrap();
    hako_layers::commit(&layers, &mut base, &[], None).unwrap();
    // The workspace is now what the sandbox saw: every name, kind, mode,
    // target and content.
    assert_eq!(listing_on_host(&c.ws), inside);
    assert_eq!(
        std::fs::read_link(c.ws.join("link")).unwrap(),
        Path::new("a")
    );
}

#[test]
fn a_second_cow_gvisor_sandbox_continues_on_the_layers_and_discard_leaves_nothing() {
    if !ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let before = tree(&c.ws);
    let sb = open(&c);
    assert_eq!(sh(&sb, "echo more >> a && echo x > extra").0, 0);
    sb.close().unwrap();
    drop(sb);
    let sb = open(&c);
    assert_eq!(sh(&sb, "cat a extra").1, "a\nmore\nx\n");
    assert_eq!(sh(&sb, "rm extra").0, 0);
    sb.close().unwrap();
    drop(sb);
    let layers = Layers::open(&c.ws, &c.state.upper()).unwrap();
    let paths: Vec<PathBuf> = layers
        .changes()
        .unwrap()
        .into_iter()
        .map(|ch| ch.path)
        .collect();
    assert_eq!(paths, [PathBuf::from("a")]);
    hako_layers::discard(&c.state.upper(), &c.ws, &[]).unwrap();
    assert!(layers.changes().unwrap().is_empty());
    assert_eq!(
        std::fs::read_dir(c.state.upper()).unwrap().count(),
        0,
        "the upper layer is empty"
    );
    assert_eq!(tree(&c.ws), before);
    // The next sandbox on the layers sees the workspace as it is; on an
    // image's root (`HAKO_IMAGE_DIR`) too, where one is given: the overlay
    // is the host view's, whatever the root.
    let mut config = config(&c);
    config.spec.image = std::env::var("HAKO_IMAGE_DIR").ok();
    let sb = GvisorSandbox::new(config).unwrap();
    assert_eq!(sh(&sb, "cat a; ls").1, "a\na\n");
    assert_eq!(sh(&sb, "echo i > on-image").0, 0);
    assert_eq!(
        std::fs::read_to_string(c.state.upper().join("on-image")).unwrap(),
        "i\n"
    );
    assert!(!c.ws.join("on-image").exists());
    sb.close().unwrap();
}

#[test]
fn the_file_api_of_a_cow_gvisor_sandbox_reads_and_writes_its_layered_view_at_once() {
    if !ready() {
        return;
    }
    let c = cow(|ws| {
        std::fs::write(ws.join("a"), "a\n").unwrap();
        std::fs::write(ws.join("lower"), "lower\n").unwrap();
    });
    let before = tree(&c.ws);
    let rw = tempfile::tempdir().unwrap();
    let ro = tempfile::tempdir().unwrap();
    std::fs::write(ro.path().join("r"), "read only\n").unwrap();
    let (rw_dir, ro_dir) = (
        rw.path().canonicalize().unwrap(),
        ro.path().canonicalize().unwrap(),
    );
    let mut config = config(&c);
    config.spec.rw = vec![rw_dir.clone()];
    config.spec.ro = vec![ro_dir.clone()];
    let sb = GvisorSandbox::new(config).unwrap();
    // What a command wrote, the fence reads at once; what the fence
    // writes, the next command sees: both ways, on one file, again and
    // again (same size each time: gVisor revalidates, it does not go by
    // the size).
    assert_eq!(sh(&sb, "mkdir made && echo cmd > made/c").0, 0);
    assert_eq!(sb.read_file(Path::new("made/c")).unwrap(), b"cmd\n");
    for round in 0..3 {
        let fence = format!("fence{round}\n");
        sb.write_file(Path::new("a"), fence.as_bytes()).unwrap();
        assert_eq!(sh(&sb, "cat a").1, fence);
        let cmd = format!("inner{round}\n");
        assert_eq!(sh(&sb, &format!("echo inner{round} > a")).0, 0);
        assert_eq!(sb.read_file(Path::new("a")).unwrap(), cmd.as_bytes());
    }
    // An absolute path maps to the view too; a directory only the view
    // has is a working directory.
    sb.write_file(&c.ws.join("made/f"), b"absolute\n").unwrap();
    let mut in_made = Command::shell("cat f");
    in_made.cwd = Some(PathBuf::from("made"));
    let out = sb.exec(&in_made).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "absolute\n");
    // Removing a workspace file through the fence hides it inside (a
    // whiteout), and the workspace keeps it.
    sb.remove(Path::new("lower")).unwrap();
    assert_ne!(sh(&sb, "cat lower").0, 0);
    let names: Vec<String> = sb
        .list_dir(Path::new("."))
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"made".to_string()), "{names:?}");
    assert!(!names.contains(&"lower".to_string()), "{names:?}");
    // Still beneath the root: an escape through the view is refused.
    assert!(sb.read_file(Path::new("../../../etc/hostname")).is_err());
    // --rw and --ro binds are not layered: written and read for real.
    let (code, _, err) = sh(
        &sb,
        &format!(
            "echo rw > '{}/f' && cat '{}/r' && ! touch '{}/x' 2>/dev/null",
            rw_dir.display(),
            ro_dir.display(),
            ro_dir.display()
        ),
    );
    assert_eq!(code, 0, "{err}");
    sb.close().unwrap();
    assert_eq!(std::fs::read_to_string(rw_dir.join("f")).unwrap(), "rw\n");
    assert!(!ro_dir.join("x").exists());
    assert_eq!(tree(&c.ws), before, "the real workspace changed");
    assert_eq!(
        std::fs::read_to_string(c.state.upper().join("a")).unwrap(),
        "inner2\n"
    );
    assert_eq!(
        std::fs::read_to_string(c.state.upper().join("made/f")).unwrap(),
        "absolute\n"
    );
}

#[test]
fn the_upper_layer_and_state_directory_are_not_reachable_from_inside_a_gvisor_sandbox_but_through_the_view(
) {
    if !ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    std::fs::write(c.state.upper().join("planted"), "in the layer\n").unwrap();
    let sb = open(&c);
    // The layer's files are seen only where the view puts them.
    assert_eq!(sh(&sb, "cat planted").1, "in the layer\n");
    for dir in [c.state.dir(), &c.state.upper(), &c.state.work()] {
        let (code, _, _) = sh(&sb, &format!("ls -d '{}'", dir.display()));
        assert_ne!(code, 0, "{} is reachable inside", dir.display());
    }
    // Nor by a write: nothing a command does changes the state directory
    // but through the layer; nor does the overlay's mount show inside.
    let (code, _, _) = sh(
        &sb,
        &format!("echo x > '{}/base.json'", c.state.dir().display()),
    );
    assert_ne!(code, 0);
    let (_, mounts, _) = sh(&sb, "cat /proc/self/mountinfo");
    assert!(
        !mounts.contains(&c.state.dir().display().to_string()),
        "{mounts}"
    );
    sb.close().unwrap();
    assert!(c.state.base().is_ok());
}

#[test]
fn a_cow_gvisor_sandbox_whose_overlay_cannot_be_mounted_is_refused_and_never_binds_the_workspace() {
    if !ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let before = tree(&c.ws);
    // overlayfs refuses a work directory inside the upper layer.
    let mut bad = config(&c);
    let inner = c.state.upper().join("work");
    std::fs::create_dir(&inner).unwrap();
    bad.spec.cow = Some(CowLayers {
        upper: c.state.upper(),
        work: inner.clone(),
    });
    let err = GvisorSandbox::new(bad).unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("cannot mount the copy-on-write workspace"),
        "{said}"
    );
    assert_eq!(tree(&c.ws), before);
    std::fs::remove_dir(&inner).unwrap();
    // Contained: the layers are as they were, and a sandbox on them opens.
    let sb = open(&c);
    assert_eq!(sh(&sb, "echo b >> a && cat a").1, "a\nb\n");
    sb.close().unwrap();
    assert_eq!(tree(&c.ws), before);
}
