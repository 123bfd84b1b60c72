#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The conformance kit, unchanged, on `linux` sandboxes whose guest is read
//! by the thread that waits for it (as `hako run` has it, see
//! `hako_guest::client::read_on_calling_thread`) rather than by a reader
//! thread: every case that starts a long-lived process or a session also
//! covers the hand-over to a reader thread. Alone in its test binary, since
//! the setting is the whole process's.

use std::path::Path;

use hako_linux::{LinuxConfig, LinuxSandbox};

hako_conformance::conformance_tests!(linux_read_on_caller, |ws: &Path| {
    hako_guest::client::read_on_calling_thread();
    Ok(Box::new(LinuxSandbox::new(LinuxConfig::new(ws))?))
});
