//! A copy-on-write workspace (`spec.cow`) on linux: the conformance
//! kit's copy-on-write cases (`hako_conformance::cow`), and what only
//! linux has (overlayfs in the sandbox's own user namespace, where a file
//! of an owner not mapped cannot be copied up).

use std::path::{Path, PathBuf};

use hako_core::{Command, CowLayers, Sandbox};
use hako_layers::state::State;
use hako_linux::{LinuxConfig, LinuxSandbox};

use crate::workspace;

hako_conformance::cow_tests!(linux_cow, |ws: &Path, cow: CowLayers| {
    let mut config = LinuxConfig::new(ws);
    config.spec.cow = Some(cow);
    Ok(Box::new(LinuxSandbox::new(config)?))
});

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
