#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A copy-on-write workspace on the vm backend (`spec.cow`): hako mounts
//! an overlay of the workspace and the sandbox's upper layer apart from
//! every mount namespace (`hako_sys::detached`), the workspace's
//! `virtiofsd` serves a clone of it attached in its own namespace, and
//! the fence works on the original; every change lands in the upper
//! layer and the real workspace is untouched until the review engine
//! commits. The copy-on-write kit, unchanged, and what only a VM's
//! overlay must hold: it is never in the host's mount table, and it is
//! let go when the sandbox ends (a second sandbox mounts the same layers
//! cleanly). Without QEMU, the image or virtiofsd every case skips,
//! unless `HAKO_MUST_WORK=1`.

use std::path::Path;

use hako_core::{Command, CowLayers, Error, Sandbox};
use hako_layers::state::State;
use hako_vm::{VmConfig, VmSandbox};

mod support;
use support::ready;

fn open(ws: &Path, layers: CowLayers) -> Result<VmSandbox, Error> {
    support::readiness()?;
    let mut spec = hako_core::SandboxSpec::new(ws.to_path_buf());
    spec.cow = Some(layers);
    VmSandbox::new(VmConfig::from_spec(spec))
}

hako_conformance::cow_tests!(kit, |ws: &Path, layers: CowLayers| {
    Ok(Box::new(open(ws, layers)?))
});

/// The mounts of the host's table (this process's) that name `needle`.
fn mounted(needle: &Path) -> Vec<String> {
    mounted_in("/proc/self/mountinfo", needle)
}

fn mounted_in(table: &str, needle: &Path) -> Vec<String> {
    std::fs::read_to_string(table)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&needle.display().to_string()))
        .map(str::to_string)
        .collect()
}

/// The processes whose mount namespace holds a mount naming `needle`
/// (the overlay's source is its upper layer's path).
fn holders(needle: &Path) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let found = mounted_in(&format!("{}/mountinfo", e.path().display()), needle);
            (!found.is_empty()).then(|| format!("{}: {found:?}", e.path().display()))
        })
        .collect()
}

#[test]
fn the_overlay_is_never_in_the_host_mount_table_and_is_let_go_when_the_sandbox_ends() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::write(ws.join("kept"), "real\n").unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    let state = State::create(&state_dir.path().join("hako"), "n", &ws, &[]).unwrap();
    let layers = || CowLayers {
        upper: state.upper(),
        work: state.work(),
    };
    let sb = open(&ws, layers()).unwrap();
    // Mounted, but only where the workspace's virtiofsd is.
    assert!(!holders(&state.upper()).is_empty());
    let out = sb
        .exec(&Command::shell(
            "echo inside > kept; echo new > made; cat kept",
        ))
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "inside\n");
    // The host's table has neither the workspace nor the layers mounted.
    assert!(mounted(&ws).is_empty(), "{:?}", mounted(&ws));
    assert!(mounted(&state.upper()).is_empty());
    // The fence sees what the commands see; the workspace is untouched.
    assert_eq!(sb.read_file(Path::new("made")).unwrap(), b"new\n");
    assert_eq!(std::fs::read_to_string(ws.join("kept")).unwrap(), "real\n");
    assert!(!ws.join("made").exists());
    sb.close().unwrap();
    drop(sb);
    // No process holds the overlay any more.
    assert_eq!(holders(&state.upper()), Vec::<String>::new());
    // Let go: the next sandbox on the same layers mounts them (a layer in
    // use by another overlay would be refused, or warned of, by the
    // kernel) and continues where the first left off.
    let again = open(&ws, layers()).unwrap();
    let out = again.exec(&Command::shell("cat kept made")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "inside\nnew\n",
        "{out:?}"
    );
    again.close().unwrap();
    drop(again);
    assert_eq!(holders(&state.upper()), Vec::<String>::new());
}

#[test]
fn a_cow_sandbox_on_layers_that_are_symlinks_is_refused_and_the_workspace_untouched() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::write(ws.join("kept"), "real\n").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let links = tempfile::tempdir().unwrap();
    let upper = links.path().join("upper");
    std::os::unix::fs::symlink(elsewhere.path(), &upper).unwrap();
    let work = tempfile::tempdir().unwrap();
    let err = open(
        &ws,
        CowLayers {
            upper: upper.clone(),
            work: work.path().to_path_buf(),
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("upper layer"), "{err}");
    assert_eq!(std::fs::read_to_string(ws.join("kept")).unwrap(), "real\n");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}
