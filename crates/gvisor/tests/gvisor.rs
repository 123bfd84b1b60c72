#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The gvisor backend (`runsc run` of a bundle hako writes, no daemon):
//! the conformance kit, unchanged, on the image directory `hako image
//! build` makes (`HAKO_IMAGE_DIR`); and the default root, a read-only view
//! of the host's system directories. Needs runsc and a static guest in
//! `HAKO_GUEST_STATIC`; without them every case skips, unless
//! `HAKO_MUST_WORK=1`.

use std::path::{Path, PathBuf};

use hako_core::{Command, Error, Sandbox};
use hako_gvisor::ready;
use hako_gvisor::{GvisorConfig, GvisorSandbox};

fn skip(reason: &str) -> Error {
    eprintln!("gvisor backend unavailable: {reason}");
    Error::Unsupported {
        backend: "gvisor".into(),
        capability: "running on this host (see the reason printed above)",
    }
}

hako_conformance::conformance_tests!(gvisor, |ws: &Path| {
    ready().map_err(|reason| skip(&reason))?;
    let rootfs = std::env::var_os("HAKO_IMAGE_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| skip("HAKO_IMAGE_DIR is not set (hako image build --dir DIR)"))?;
    let mut config = GvisorConfig::new(ws);
    config.spec.image = Some(rootfs.to_string_lossy().into_owned());
    Ok(Box::new(GvisorSandbox::new(config)?))
});

/// A sandbox on the default root (the host view) in a new workspace, kept
/// alive by the directory returned with it; `None`, with the reason
/// printed, where gVisor cannot run (a failure under `HAKO_MUST_WORK`).
fn host_view() -> Option<(tempfile::TempDir, PathBuf, GvisorSandbox)> {
    if let Err(reason) = ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let sandbox = GvisorSandbox::new(GvisorConfig::new(&ws)).unwrap();
    Some((dir, ws, sandbox))
}

/// The host view: the host's own programs run on gVisor's kernel, and the
/// secrets of `/etc` are masked.
#[test]
fn the_host_view_runs_host_programs_and_masks_secrets() {
    let Some((_dir, ws, sandbox)) = host_view() else {
        return;
    };
    let out = sandbox
        .exec(&Command::shell(
            "cat /etc/os-release >/dev/null && echo os; wc -c < /etc/shadow; ls /home | wc -l; uname -r; pwd; \
             for f in /etc/shadow- /etc/gshadow /etc/gshadow- /etc/security/opasswd; do \
               [ -e $f ] && [ \"$(wc -c < $f)\" != 0 ] && echo \"unmasked $f\"; done; \
             ls -A /etc/ssl/private 2>/dev/null | sed 's/^/unmasked private: /'",
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"os"), "{text}");
    assert_eq!(
        lines.get(1).map(|l| l.trim()),
        Some("0"),
        "/etc/shadow is empty: {text}"
    );
    assert_eq!(
        lines.get(2).map(|l| l.trim()),
        Some("0"),
        "no host home: {text}"
    );
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(
        lines.get(3).copied(),
        Some(host_release.trim()),
        "gVisor's own kernel answers"
    );
    assert_eq!(lines.get(4).copied(), ws.to_str(), "{text}");
    // Every other secret is masked too.
    assert_eq!(lines.len(), 5, "{text}");
    sandbox.close().unwrap();
}

/// The host view's system directories are bound into its root on the
/// host side, by the guest's `--host-view` mode in a mount namespace of its
/// own: they are read-only inside, and nothing of them is mounted in the
/// host's namespace (where removing the bundle would descend into them).
#[test]
fn the_host_views_binds_are_read_only_and_never_mounted_in_the_host_namespace() {
    let Some((_dir, _, sandbox)) = host_view() else {
        return;
    };
    let out = sandbox
        .exec(&Command::shell(
            "echo /usr/bin/* | wc -w; for d in /usr /etc /usr/bin; do touch $d/hako-probe 2>/dev/null && echo \"wrote $d\"; done; true",
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let programs: usize = text
        .lines()
        .next()
        .unwrap_or("0")
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(programs > 10, "the host's programs are visible: {text}");
    assert!(!text.contains("wrote"), "{text}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains("hako-gvisor-"),
        "a bundle path is mounted on the host: {mountinfo}"
    );
    // The view's mount points, seen from the host, are empty directories.
    let prefix = format!("hako-gvisor-{}-", std::process::id());
    let bundles: Vec<_> = std::fs::read_dir(hako_container::private::private_dir().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(
        !bundles.is_empty(),
        "this process's bundle is in hako's private directory"
    );
    for bundle in bundles {
        // Other tests' bundles may be going away meanwhile.
        let usr = bundle.path().join("rootfs/usr");
        if let Ok(entries) = std::fs::read_dir(&usr) {
            assert_eq!(entries.count(), 0, "{usr:?}");
        }
    }
    sandbox.close().unwrap();
}

/// The guest installs the seccomp program itself (inside gVisor, where a
/// refusal keeps its errno): `clone3` answers `ENOSYS`, so libc falls back
/// to `clone` and a program that starts a thread works.
#[test]
fn a_host_program_that_starts_a_thread_runs() {
    let Some((_dir, _, sandbox)) = host_view() else {
        return;
    };
    let out = sandbox
        .exec(&Command::new([
            "python3",
            "-c",
            "import threading; t = threading.Thread(target=print, args=('thread-ok',)); t.start(); t.join()",
        ]))
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "thread-ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sandbox.close().unwrap();
}

/// The guest mounts the masks itself, then drops every capability and
/// installs the seccomp policy before it serves: a command cannot take a
/// mask off to read what is under it.
#[test]
fn unmounting_a_secret_mask_to_read_etc_shadow_is_refused() {
    let Some((_dir, _, sandbox)) = host_view() else {
        return;
    };
    let out = sandbox
        .exec(&Command::shell(
            "umount /etc/shadow; echo umount=$?; umount -l /etc/shadow; echo lazy=$?; \
             mount -t tmpfs none /etc/ssl/private; echo mount=$?; wc -c < /etc/shadow",
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for refused in ["umount=", "lazy=", "mount="] {
        let line = text.lines().find(|l| l.starts_with(refused));
        assert!(
            line.is_some_and(|l| !l.ends_with("=0")),
            "{refused} refused: {text}"
        );
    }
    assert_eq!(
        text.lines().last().map(str::trim),
        Some("0"),
        "/etc/shadow stays masked: {text}"
    );
    sandbox.close().unwrap();
}
