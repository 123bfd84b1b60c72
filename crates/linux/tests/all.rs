#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The linux backend's integration tests: the conformance kit, unchanged,
//! and escape tests, each named after its attack.
//!
//! The tests start `hako-guest`: run `cargo build --workspace --bins` first
//! (or set `HAKO_GUEST`). They run as root and, in CI, again as an
//! unprivileged user.

use std::path::Path;

use hako_linux::{LinuxConfig, LinuxSandbox};

hako_conformance::conformance_tests!(linux, |ws: &Path| {
    Ok(Box::new(LinuxSandbox::new(LinuxConfig::new(ws))?))
});

mod cow;
mod escapes;
mod forwarded;
mod identity;

/// A fresh workspace: directory `ws` in a temporary directory, which the
/// caller keeps for as long as the test runs.
fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    (dir, ws)
}
