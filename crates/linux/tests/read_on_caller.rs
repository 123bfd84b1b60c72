#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The conformance kit, unchanged, on `linux` sandboxes whose guest is read
//! by the thread that waits for it (as `hako run` has it, see
//! `hako_driver::DriverOptions::read_on_caller`) rather than by a reader
//! thread: every case that starts a long-lived process or a session also
//! covers the hand-over to a reader thread.

use std::path::Path;

use hako_driver::DriverOptions;
use hako_linux::{LinuxConfig, LinuxSandbox};

hako_conformance::conformance_tests!(linux_read_on_caller, |ws: &Path| {
    let mut config = LinuxConfig::new(ws);
    config.launch.driver = DriverOptions {
        read_on_caller: true,
        ..DriverOptions::default()
    };
    Ok(Box::new(LinuxSandbox::new(config)?))
});
