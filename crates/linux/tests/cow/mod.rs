//! A copy-on-write workspace (`spec.cow`): the commands see the workspace
//! through overlayfs in the sandbox's own user and mount namespaces,
//! every change lands in the upper layer, and the real workspace is
//! never touched until the review engine commits.

use std::path::{Path, PathBuf};

use hako_core::{Command, CowLayers, Sandbox};
use hako_layers::state::State;
use hako_layers::{Layers, Status};
use hako_linux::{LinuxConfig, LinuxSandbox};

use crate::workspace;

/// Every entry beneath `root` with its content or target.
fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                stack.push(p.clone());
                "dir".into()
            } else {
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
            };
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), what));
        }
    }
    out.sort();
    out
}

struct Cow {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    _state_dir: tempfile::TempDir,
    state: State,
}

fn cow(fill: impl FnOnce(&Path)) -> Cow {
    let (dir, ws) = workspace();
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

fn open(c: &Cow) -> LinuxSandbox {
    let mut config = LinuxConfig::new(&c.ws);
    config.spec.cow = Some(CowLayers {
        upper: c.state.upper(),
        work: c.state.work(),
    });
    LinuxSandbox::new(config).unwrap()
}

fn sh(sb: &LinuxSandbox, script: &str) -> (i32, String, String) {
    let out = sb.exec(&Command::shell(script)).unwrap();
    (
        out.status.shell_code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_cow_sandbox_changes_only_its_upper_layer_and_the_review_sees_every_change() {
    let c = cow(|ws| {
        std::fs::write(ws.join("a"), "a\n").unwrap();
        std::fs::write(ws.join("gone"), "bye\n").unwrap();
        std::fs::create_dir(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/x"), "x\n").unwrap();
    });
    let before = tree(&c.ws);
    let sb = open(&c);
    let (code, out, err) = sh(
        &sb,
        "echo b >> a && rm gone && rm -r d && mkdir new && echo n > new/n && ln -s a link && cat a",
    );
    assert_eq!((code, out.as_str()), (0, "a\nb\n"), "{err}");
    // A second command sees the first's changes.
    let (_, seen, _) = sh(&sb, "ls -A | sort | tr '\\n' ' '");
    assert_eq!(seen, "a link new ");
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
        ("gone", Status::Deleted),
        ("link", Status::Added),
        ("new", Status::Added),
        ("new/n", Status::Added),
    ]
    .into_iter()
    .map(|(p, s)| (PathBuf::from(p), s))
    .collect();
    assert_eq!(changes, want);
    let mut base = c.state.base().unwrap();
    hako_layers::commit(&layers, &mut base, &[], None).unwrap();
    assert_eq!(std::fs::read_to_string(c.ws.join("a")).unwrap(), "a\nb\n");
    assert!(!c.ws.join("gone").exists() && !c.ws.join("d").exists());
    assert_eq!(
        std::fs::read_link(c.ws.join("link")).unwrap(),
        Path::new("a")
    );
}

#[test]
fn a_second_cow_sandbox_on_the_same_layers_continues_on_them() {
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let sb = open(&c);
    assert_eq!(sh(&sb, "echo more >> a").0, 0);
    sb.close().unwrap();
    let sb = open(&c);
    assert_eq!(sh(&sb, "cat a").1, "a\nmore\n");
    sb.close().unwrap();
    assert_eq!(std::fs::read_to_string(c.ws.join("a")).unwrap(), "a\n");
}

#[test]
fn the_file_api_of_a_cow_sandbox_reads_and_writes_its_layered_view_never_the_workspace() {
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let sb = open(&c);
    // What a command wrote, the fence reads; what the fence writes, a
    // command sees; a directory only the view has is a working directory.
    assert_eq!(sh(&sb, "mkdir made && echo cmd > made/c").0, 0);
    assert_eq!(sb.read_file(Path::new("made/c")).unwrap(), b"cmd\n");
    sb.write_file(Path::new("a"), b"through the fence\n")
        .unwrap();
    sb.write_file(&c.ws.join("made/f"), b"absolute\n").unwrap();
    assert_eq!(sh(&sb, "cat a").1, "through the fence\n");
    let mut in_made = Command::shell("cat f");
    in_made.cwd = Some(PathBuf::from("made"));
    let out = sb.exec(&in_made).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "absolute\n");
    // A symlink inside the view is followed inside it (the fence maps
    // the view's directories back to the workspace's paths).
    assert_eq!(sh(&sb, "ln -s made/c link").0, 0);
    sb.write_file(Path::new("link"), b"via link\n").unwrap();
    assert_eq!(sh(&sb, "cat made/c").1, "via link\n");
    // Still beneath the root: an escape through the view is refused.
    assert!(sb.read_file(Path::new("../../../etc/hostname")).is_err());
    sb.close().unwrap();
    assert_eq!(std::fs::read_to_string(c.ws.join("a")).unwrap(), "a\n");
    assert!(!c.ws.join("made").exists());
    assert_eq!(
        std::fs::read_to_string(c.state.upper().join("a")).unwrap(),
        "through the fence\n"
    );
}

#[test]
fn a_file_of_an_owner_not_mapped_cannot_be_changed_in_a_cow_sandbox_and_says_why() {
    const NAME: &str =
        "a_file_of_an_owner_not_mapped_cannot_be_changed_in_a_cow_sandbox_and_says_why";
    if !hako_sys::rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("HAKO_MUST_WORK").is_err(),
            "{NAME} needs root to plant a file of another owner"
        );
        eprintln!("SKIPPED {NAME}: needs root to plant a file of another owner");
        return;
    }
    let c = cow(|ws| {
        let f = ws.join("theirs");
        std::fs::write(&f, "theirs\n").unwrap();
        std::os::unix::fs::chown(&f, Some(12345), Some(12345)).unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        std::fs::write(ws.join("mine"), "mine\n").unwrap();
    });
    let sb = open(&c);
    // overlayfs cannot copy up a file whose owner has no id in the
    // sandbox's user namespace: the write fails with EOVERFLOW ("Value
    // too large for defined data type"), the file is unchanged, and
    // everything else still works.
    let (code, _, err) = sh(&sb, "echo x >> theirs");
    assert_ne!(code, 0);
    assert!(err.contains("Value too large"), "{err}");
    assert_eq!(sh(&sb, "cat theirs").1, "theirs\n");
    assert_eq!(sh(&sb, "echo y >> mine && cat mine").1, "mine\ny\n");
    sb.close().unwrap();
    assert_eq!(
        std::fs::read_to_string(c.ws.join("theirs")).unwrap(),
        "theirs\n"
    );
    assert_eq!(
        std::fs::read_to_string(c.ws.join("mine")).unwrap(),
        "mine\n"
    );
}

#[test]
fn the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view() {
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
    // but through the layer.
    let (code, _, _) = sh(
        &sb,
        &format!("echo x > '{}/base.json'", c.state.dir().display()),
    );
    assert_ne!(code, 0);
    sb.close().unwrap();
    assert!(c.state.base().is_ok());
}
