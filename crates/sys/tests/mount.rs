//! `hako_sys::mount`: a read-only bind must not leave a host mount below it
//! writable.
//!
//! The case runs in a child re-executed through `unshare --user
//! --map-root-user --mount`, so its mounts stay in a namespace of its own;
//! the child prints one `hako-mount: key=value` line per probe and the
//! parent asserts on them. Where a user namespace cannot be made the case is
//! skipped with the reason, or fails when `HAKO_MUST_WORK=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use hako_sys::mount::{self as m, Reach};

mod support;
use support::{skip, TempDir};

const DIR: &str = "HAKO_MOUNT_TEST_DIR";
const PREFIX: &str = "hako-mount: ";

fn emit(key: &str, value: impl std::fmt::Display) {
    support::emit(PREFIX, key, value);
}

/// "ok", or the error's errno name for the two the probes expect.
fn write_outcome(path: &Path) -> String {
    match std::fs::write(path, b"x") {
        Ok(()) => "ok".into(),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => "EROFS".into(),
        Err(e) => format!("error {e}"),
    }
}

fn tmpfs(at: &Path) {
    std::fs::create_dir_all(at).unwrap();
    m::mount(Some(Path::new("tmpfs")), at, Some("tmpfs"), 0, None).unwrap();
}

/// The child: a "host" directory with a mount below it, bound twice, once
/// made read-only with each reach.
fn child(dir: &Path) {
    let host = dir.join("host");
    tmpfs(&host);
    tmpfs(&host.join("sub"));
    for (name, reach) in [("subtree", Reach::Subtree), ("mount", Reach::Mount)] {
        let view = dir.join(name);
        std::fs::create_dir_all(&view).unwrap();
        m::mount(Some(&host), &view, None, m::MS_BIND | m::MS_REC, None).unwrap();
        m::remount_readonly(&view, m::MS_NOSUID | m::MS_NODEV, reach).unwrap();
        emit(&format!("{name}.top"), write_outcome(&view.join("x")));
        emit(&format!("{name}.below"), write_outcome(&view.join("sub/x")));
    }
    // The host's own mounts are untouched.
    emit("host.below", write_outcome(&host.join("sub/y")));
}

#[test]
fn writing_through_a_host_mount_below_a_read_only_bind_is_refused() {
    const TEST: &str = "writing_through_a_host_mount_below_a_read_only_bind_is_refused";
    if let Some(dir) = std::env::var_os(DIR) {
        child(Path::new(&dir));
        return;
    }
    let dir = TempDir::new("mount");
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(DIR, &dir.0)
        .output();
    drop(dir);
    let out = match out {
        Ok(out) => out,
        Err(e) => return skip(&format!("cannot run unshare(1): {e}")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("unshare failed") {
        return skip(&format!("cannot create a user namespace: {stderr}"));
    }
    let r = support::results(PREFIX, &out);
    let get = |k: &str| r.get(k).map_or("missing", String::as_str);
    assert_eq!(get("subtree.top"), "EROFS", "{r:?}");
    // The attack: a write through the mount below the bound directory.
    assert_eq!(get("subtree.below"), "EROFS", "{r:?}");
    // What `Reach::Mount` is for (`/dev`, whose own mounts stay writable),
    // and proof that the probe tells the two apart.
    assert_eq!(get("mount.top"), "EROFS", "{r:?}");
    assert_eq!(get("mount.below"), "ok", "{r:?}");
    assert_eq!(get("host.below"), "ok", "{r:?}");
}
