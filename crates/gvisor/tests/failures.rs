#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The gvisor backend when things go wrong, against the real `runsc`:
//! nothing is left behind. Skips (unless `HAKO_MUST_WORK=1`) without
//! `runsc` or a static guest.

use hako_core::{Command, Sandbox};
use hako_gvisor::{GvisorConfig, GvisorSandbox};

fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    (dir, ws)
}

#[test]
fn a_gvisor_sandbox_leaves_no_bundle_or_container_when_closed() {
    if let Err(reason) = hako_gvisor::ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (_d, ws) = workspace();
    let bundles = || {
        std::fs::read_dir(hako_container::private::private_dir().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("hako-gvisor-{}-", std::process::id()))
            })
            .count()
    };
    let before = bundles();
    let sandbox = GvisorSandbox::new(GvisorConfig::new(&ws)).unwrap();
    assert_eq!(bundles(), before + 1);
    // What `hako gc` would act on once its owners are gone: the user's own
    // directories, with no access for group or others.
    let private = hako_container::private::private_dir().unwrap();
    let bundle = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("hako-gvisor-{}-", std::process::id()))
        })
        .unwrap()
        .path();
    for dir in [bundle.clone(), bundle.join("state")] {
        let unfit = hako_container::private::check_dir(&dir).unwrap();
        assert_eq!(unfit, None, "{}", dir.display());
    }
    let out = sandbox.exec(&Command::new(["true"])).unwrap();
    assert!(out.status.success());
    sandbox.close().unwrap();
    assert_eq!(bundles(), before, "the bundle is removed at close");
}
