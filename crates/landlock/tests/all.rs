#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The landlock backend's integration tests: the conformance kit, and the
//! attacks its confinement answers (what a command may read, write, reach
//! and signal with no namespace of its own).
//!
//! The tests start `hako-guest`: run `cargo build --workspace --bins` first
//! (or set `HAKO_GUEST`).

use std::path::Path;

use hako_landlock::{LandlockConfig, LandlockSandbox};

hako_conformance::conformance_tests!(landlock, |ws: &Path| {
    Ok(Box::new(LandlockSandbox::new(LandlockConfig::new(ws))?))
});

mod escapes;
