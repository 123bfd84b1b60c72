#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A copy-on-write workspace (`spec.cow`) on the docker backend, against
//! the real engines: runc, runsc (gVisor) and Podman (with
//! `HAKO_TEST_PODMAN=1`). The commands see the workspace through the
//! engine's overlay volume, every change lands in the upper layer, the
//! fence reads and writes that same view, and nothing of it outlives the
//! sandbox. Skips without dockerd, the image or a static guest, unless
//! `HAKO_MUST_WORK=1`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use hako_core::{Command, CowLayers, Error, Sandbox};
use hako_docker::{self as docker, DockerConfig, DockerSandbox, DEFAULT_IMAGE};
use hako_layers::state::State;
use hako_layers::{Layers, Status};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Runc,
    Runsc,
    Podman,
}

impl Kind {
    fn engine(self) -> &'static str {
        match self {
            Kind::Podman => "podman",
            Kind::Runc | Kind::Runsc => "docker",
        }
    }

    /// Whether this engine can run here; skips (with the reason) when
    /// not, failing instead under `HAKO_MUST_WORK=1`.
    fn ready(self) -> bool {
        let reason = match self {
            Kind::Podman => {
                if std::env::var_os("HAKO_TEST_PODMAN").is_some_and(|v| v == "1") {
                    return true;
                }
                eprintln!("SKIPPED: podman is tested only with HAKO_TEST_PODMAN=1");
                return false;
            }
            Kind::Runc => docker::ready(DEFAULT_IMAGE, None),
            Kind::Runsc => docker::ready(DEFAULT_IMAGE, Some("runsc")),
        };
        match reason {
            Ok(()) => true,
            Err(reason) => {
                assert!(
                    !hako_conformance::must_work(),
                    "{self:?} is needed: {reason}"
                );
                eprintln!("SKIPPED: {reason}");
                false
            }
        }
    }
}

/// A sandbox of `kind` on `ws` with `layers`, for the conformance kit's
/// copy-on-write cases; `Unsupported` (the kit's skip) where the engine
/// cannot run here.
fn open_for_kit(kind: Kind, ws: &Path, layers: CowLayers) -> Result<DockerSandbox, Error> {
    if !kind.ready() {
        return Err(Error::Unsupported {
            backend: "docker".into(),
            capability: "running on this host (see the reason printed above)",
        });
    }
    let mut config = DockerConfig::new(ws);
    config.spec.cow = Some(layers);
    match kind {
        Kind::Runc => {}
        Kind::Runsc => config.spec.runtime = Some("runsc".into()),
        Kind::Podman => config.engine = hako_container::Engine::from_words("podman"),
    }
    DockerSandbox::new(config)
}

hako_conformance::cow_tests!(kit_runc, |ws: &Path, layers: CowLayers| {
    Ok(Box::new(open_for_kit(Kind::Runc, ws, layers)?))
});

hako_conformance::cow_tests!(kit_runsc, |ws: &Path, layers: CowLayers| {
    Ok(Box::new(open_for_kit(Kind::Runsc, ws, layers)?))
});

hako_conformance::cow_tests!(kit_podman, |ws: &Path, layers: CowLayers| {
    Ok(Box::new(open_for_kit(Kind::Podman, ws, layers)?))
});

/// A workspace and a named sandbox's state beside it (outside it).
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

fn config(kind: Kind, c: &Cow) -> DockerConfig {
    let mut config = DockerConfig::new(&c.ws);
    config.spec.cow = Some(CowLayers {
        upper: c.state.upper(),
        work: c.state.work(),
    });
    match kind {
        Kind::Runc => {}
        Kind::Runsc => config.spec.runtime = Some("runsc".into()),
        Kind::Podman => config.engine = hako_container::Engine::from_words("podman"),
    }
    config
}

fn open(kind: Kind, c: &Cow) -> DockerSandbox {
    DockerSandbox::new(config(kind, c)).unwrap()
}

fn sh(sb: &dyn Sandbox, script: &str) -> (i32, String, String) {
    let out = sb.exec(&Command::shell(script)).unwrap();
    (
        out.status.shell_code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every entry beneath `root`: its path, permission bits, and content or
/// target.
fn tree(root: &Path) -> Vec<(PathBuf, u32, String)> {
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
            let mode = if meta.file_type().is_symlink() {
                0
            } else {
                meta.permissions().mode() & 0o7777
            };
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), mode, what));
        }
    }
    out.sort();
    out
}

/// What the engine answers about the volume `name`: its mount point, or
/// `None` once it is gone.
fn volume(kind: Kind, name: &str) -> Option<PathBuf> {
    let out = Process::new(kind.engine())
        .args(["volume", "inspect", "--format", "{{.Mountpoint}}", name])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn mounted(path: &Path) -> bool {
    let needle = format!(" {} ", path.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(&needle))
}

fn changes(c: &Cow) -> Vec<(PathBuf, Status)> {
    Layers::open(&c.ws, &c.state.upper())
        .unwrap()
        .changes()
        .unwrap()
        .into_iter()
        .map(|ch| (ch.path.clone(), ch.status()))
        .collect()
}

fn want(list: &[(&str, Status)]) -> Vec<(PathBuf, Status)> {
    list.iter().map(|(p, s)| (PathBuf::from(p), *s)).collect()
}

fn every_change_lands_in_the_upper_layer_is_reviewed_and_commits_to_what_the_sandbox_saw(
    kind: Kind,
) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| {
        std::fs::write(ws.join("a"), "a\n").unwrap();
        std::fs::write(ws.join("gone"), "bye\n").unwrap();
        std::fs::write(ws.join("old-name"), "moved\n").unwrap();
        std::fs::write(ws.join("mode"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/x"), "x\n").unwrap();
    });
    let before = tree(&c.ws);
    let sb = open(kind, &c);
    let (code, out, err) = sh(
        &sb,
        "echo b >> a && rm gone && rm -r d && mkdir new && echo n > new/n \
         && mv old-name new-name && chmod 755 mode && ln -s a link && cat a",
    );
    assert_eq!((code, out.as_str()), (0, "a\nb\n"), "{err}");
    // A second command sees the first's changes.
    let (_, seen, _) = sh(&sb, "ls -A | sort | tr '\\n' ' '");
    assert_eq!(seen, "a link mode new new-name ");
    // What the sandbox sees, read on the host through the same mount.
    let view = volume(kind, sb.container()).unwrap();
    let saw = tree(&view);
    sb.close().unwrap();
    assert_eq!(tree(&c.ws), before, "the real workspace changed");
    assert_eq!(
        changes(&c),
        want(&[
            ("a", Status::Modified),
            ("d", Status::Deleted),
            ("d/x", Status::Deleted),
            ("gone", Status::Deleted),
            ("link", Status::Added),
            ("mode", Status::ModeChanged),
            ("new", Status::Added),
            ("new/n", Status::Added),
            ("new-name", Status::Added),
            ("old-name", Status::Deleted),
        ])
    );
    // What the container wrote in the upper layer is the invoking user's
    // (the container runs as that user): the review below needs nothing
    // more.
    let me = hako_sys::rustix::process::geteuid().as_raw();
    for entry in ["a", "new", "new/n", "new-name", "mode", "link"] {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(c.state.upper().join(entry)).unwrap();
        assert_eq!(meta.uid(), me, "{entry} in the upper layer");
    }
    // The host user reviews and commits what the container wrote.
    let layers = Layers::open(&c.ws, &c.state.upper()).unwrap();
    let mut base = c.state.base().unwrap();
    hako_layers::commit(&layers, &mut base, &[], None).unwrap();
    assert_eq!(
        tree(&c.ws),
        saw,
        "the workspace is not what the sandbox saw"
    );
}

fn a_second_sandbox_continues_on_the_same_layers_and_discard_leaves_nothing(kind: Kind) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let before = tree(&c.ws);
    let sb = open(kind, &c);
    assert_eq!(sh(&sb, "echo more >> a && rm a && echo again > a").0, 0);
    sb.close().unwrap();
    let sb = open(kind, &c);
    assert_eq!(sh(&sb, "cat a && echo new > b").1, "again\n");
    sb.close().unwrap();
    assert_eq!(
        changes(&c),
        want(&[("a", Status::Modified), ("b", Status::Added)])
    );
    hako_layers::discard(&c.state.upper(), &c.ws, &[]).unwrap();
    assert_eq!(changes(&c), want(&[]));
    assert_eq!(tree(&c.ws), before);
    // And the next sandbox sees the workspace as it is.
    let sb = open(kind, &c);
    assert_eq!(sh(&sb, "ls -A; cat a").1, "a\na\n");
    sb.close().unwrap();
}

fn the_file_api_reads_and_writes_the_layered_view_never_the_workspace(kind: Kind) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let sb = open(kind, &c);
    // What a command wrote, the fence reads at once.
    assert_eq!(sh(&sb, "mkdir made && echo cmd > made/c && cat a").1, "a\n");
    assert_eq!(sb.read_file(Path::new("made/c")).unwrap(), b"cmd\n");
    // What the fence writes, the next command sees at once, over a file
    // the command has just read (no cache of the runtime's in between).
    sb.write_file(Path::new("a"), b"through the fence\n")
        .unwrap();
    sb.write_file(&c.ws.join("made/f"), b"absolute\n").unwrap();
    assert_eq!(sh(&sb, "cat a").1, "through the fence\n");
    let mut in_made = Command::shell("cat f");
    in_made.cwd = Some(PathBuf::from("made"));
    let out = sb.exec(&in_made).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "absolute\n");
    sb.remove(Path::new("made/c")).unwrap();
    assert_eq!(sh(&sb, "ls made").1, "f\n");
    assert_eq!(sh(&sb, "echo again > made/c").0, 0);
    assert_eq!(sb.read_file(Path::new("made/c")).unwrap(), b"again\n");
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

fn the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view(
    kind: Kind,
) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    std::fs::write(c.state.upper().join("planted"), "in the layer\n").unwrap();
    let sb = open(kind, &c);
    // The layer's files are seen only where the view puts them.
    assert_eq!(sh(&sb, "cat planted").1, "in the layer\n");
    for dir in [c.state.dir(), &c.state.upper(), &c.state.work()] {
        let (code, _, _) = sh(&sb, &format!("ls -d '{}'", dir.display()));
        assert_ne!(code, 0, "{} is reachable inside", dir.display());
    }
    let (code, _, _) = sh(
        &sb,
        &format!("echo x > '{}/base.json'", c.state.dir().display()),
    );
    assert_ne!(code, 0);
    sb.close().unwrap();
    assert!(c.state.base().is_ok());
}

fn binds_beside_a_cow_workspace_keep_working(kind: Kind) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let ro = tempfile::tempdir().unwrap();
    let rw = tempfile::tempdir().unwrap();
    let (ro, rw) = (
        ro.path().canonicalize().unwrap(),
        rw.path().canonicalize().unwrap(),
    );
    std::fs::write(ro.join("r"), "read only\n").unwrap();
    let mut config = config(kind, &c);
    config.spec.ro = vec![ro.clone()];
    config.spec.rw = vec![rw.clone()];
    let sb = DockerSandbox::new(config).unwrap();
    let script = format!(
        "cat {ro}/r && echo w > {rw}/w && ! echo no > {ro}/r 2>/dev/null && echo b > a",
        ro = ro.display(),
        rw = rw.display()
    );
    let (code, out, err) = sh(&sb, &script);
    assert_eq!((code, out.as_str()), (0, "read only\n"), "{err}");
    sb.close().unwrap();
    assert_eq!(std::fs::read_to_string(rw.join("w")).unwrap(), "w\n");
    assert_eq!(
        std::fs::read_to_string(ro.join("r")).unwrap(),
        "read only\n"
    );
    assert_eq!(std::fs::read_to_string(c.ws.join("a")).unwrap(), "a\n");
    assert_eq!(changes(&c), want(&[("a", Status::Modified)]));
}

fn the_volume_is_gone_after_close_and_after_the_container_is_killed(kind: Kind) {
    if !kind.ready() {
        return;
    }
    let c = cow(|ws| std::fs::write(ws.join("a"), "a\n").unwrap());
    let sb = open(kind, &c);
    let name = sb.container().to_string();
    let view = volume(kind, &name).unwrap();
    assert!(mounted(&view), "{} is not mounted", view.display());
    sb.close().unwrap();
    assert_eq!(volume(kind, &name), None, "{name} outlived its sandbox");
    assert!(!mounted(&view));

    let sb = open(kind, &c);
    let name = sb.container().to_string();
    let view = volume(kind, &name).unwrap();
    let out = Process::new(kind.engine())
        .args(["kill", &name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = sb.exec(&Command::shell("echo hi")).unwrap_err();
    assert!(matches!(err, Error::SandboxLost { .. }), "{err}");
    drop(sb);
    assert_eq!(
        volume(kind, &name),
        None,
        "{name} outlived its lost sandbox"
    );
    assert!(!mounted(&view));
    // The layers are intact, and a new sandbox goes on with them.
    let sb = open(kind, &c);
    assert_eq!(sh(&sb, "echo b >> a && cat a").1, "a\nb\n");
    sb.close().unwrap();
    assert_eq!(std::fs::read_to_string(c.ws.join("a")).unwrap(), "a\n");
}

macro_rules! each_engine {
    ($($case:ident),* $(,)?) => {
        mod runc {
            $(#[test] fn $case() { super::$case(super::Kind::Runc) })*
        }
        mod runsc {
            $(#[test] fn $case() { super::$case(super::Kind::Runsc) })*
        }
        mod podman {
            $(#[test] fn $case() { super::$case(super::Kind::Podman) })*
        }
    };
}

each_engine!(
    every_change_lands_in_the_upper_layer_is_reviewed_and_commits_to_what_the_sandbox_saw,
    a_second_sandbox_continues_on_the_same_layers_and_discard_leaves_nothing,
    the_file_api_reads_and_writes_the_layered_view_never_the_workspace,
    the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view,
    binds_beside_a_cow_workspace_keep_working,
    the_volume_is_gone_after_close_and_after_the_container_is_killed,
);

#[test]
fn volumes_of_a_dead_owner_are_collected_and_a_live_owners_are_not() {
    if !Kind::Runc.ready() {
        return;
    }
    let mut gone = Process::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let me = hako_container::Owner::current();
    let create = |name: &str, pid: u32, start: u64| {
        let out = Process::new("docker")
            .args(["volume", "create", "--label"])
            .arg(format!("hako.owner.pid={pid}"))
            .arg("--label")
            .arg(format!("hako.owner.start={start}"))
            .arg(name)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let stale = format!("hako-test-stale-volume-{}", std::process::id());
    let live = format!("hako-test-live-volume-{}", std::process::id());
    create(&stale, dead_pid, 1);
    create(&live, me.pid, me.start);
    let engine = hako_container::Engine {
        argv: vec!["docker".into()],
        kind: hako_container::EngineKind::Docker,
    };
    let removed = hako_docker::gc::collect_volumes(&engine, &hako_container::runner::CliRunner);
    let live_left = volume(Kind::Runc, &live).is_some();
    let _ = Process::new("docker")
        .args(["volume", "rm", &live])
        .output();
    let removed = removed.unwrap();
    assert!(removed.contains(&stale), "{removed:?}");
    assert!(!removed.contains(&live), "{removed:?}");
    assert_eq!(volume(Kind::Runc, &stale), None);
    assert!(live_left);
}
