#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A thousand commands one after another, then fifty sessions of twenty
//! commands at once, through one sandbox: no error, no zombie, no descriptor
//! or process left. Alone in its test binary so that no other test opens
//! descriptors meanwhile.

use std::path::Path;

use hako_linux::{LinuxConfig, LinuxSandbox};

#[test]
fn a_thousand_sequential_execs_and_fifty_concurrent_sessions_leak_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let factory = hako_conformance::factory(|ws: &Path| {
        Ok(Box::new(LinuxSandbox::new(LinuxConfig::new(ws))?))
    });
    let report = hako_conformance::soak(factory, &ws, 1000, 50, 20).unwrap();
    assert!(report.zombies.is_empty(), "zombies: {:?}", report.zombies);
    assert!(
        report.left.is_empty(),
        "left after close: {:?}",
        report.left
    );
    assert_eq!(
        report.fds_before, report.fds_after,
        "descriptors before and after"
    );
}
