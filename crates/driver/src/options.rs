//! What the caller of the driver decides, handed over as values when a
//! sandbox opens (no process-wide switch changes the driver's behaviour).

use std::error::Error;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hako_proto::LinuxSpec;
use hako_sys::ns::SingleThreaded;

/// How the driver reads and closes the sandboxes it opens with these
/// options.
#[derive(Clone, Debug, Default)]
pub struct DriverOptions {
    /// This process mostly runs one command at a time (the `hako` CLI):
    /// for a guest reached through a socket, the guest's frames are read
    /// by the threads that wait for them, taking turns a frame at a time,
    /// and a reader thread starts only once frames may come with nobody
    /// waiting (a long-lived process, a session) or while hako writes a
    /// command's input. That spares a thread's start while the sandbox is
    /// built, and a hand-off between two threads for every reply.
    pub read_on_caller: bool,
    /// Set once this process exits right after closing the sandbox (see
    /// [`ExitFollowsClose`]).
    pub exit_follows_close: ExitFollowsClose,
}

impl DriverOptions {
    /// The options of a process that runs one command and exits (`hako
    /// run`): frames read on the calling thread, and `exit_follows` to be
    /// set once the process knows it exits after closing.
    pub fn one_shot(exit_follows: &ExitFollowsClose) -> Self {
        DriverOptions {
            read_on_caller: true,
            exit_follows_close: exit_follows.clone(),
        }
    }
}

/// Tells closing sandboxes that this process exits right after (a
/// one-command `hako run`): see
/// [`Connection::close_before_exit`](crate::connection::Connection::close_before_exit).
/// Shared between the caller, which [`set`](Self::set)s it, and the
/// sandboxes opened with it. A long-lived process must not set it: each
/// sandbox it closed would leave its guest's process unreaped until it
/// exits.
#[derive(Clone, Debug, Default)]
pub struct ExitFollowsClose(Arc<AtomicBool>);

impl ExitFollowsClose {
    /// This process exits right after closing the sandboxes opened with
    /// this value.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`set`](Self::set) was called.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The error [`InProcessGuest::spawn_linux_pid1`] returns.
pub type SpawnError = Box<dyn Error + Send + Sync>;

/// A guest linked into this program, which the driver may start in a fork
/// of this (single-threaded) process instead of executing `hako-guest`:
/// the guest's entry points, handed over by whoever links both (the
/// `linux` and `host` backends, from `hako_guest::in_process`).
#[derive(Clone, Copy)]
pub struct InProcessGuest {
    /// Called in the child of a fork of this process: becomes the guest,
    /// in the directory `cwd`, serving the control socket `ctl`; returns
    /// the child's exit code.
    pub serve_forked: fn(cwd: OwnedFd, ctl: UnixStream) -> u8,
    /// Creates pid 1 of a new `linux` sandbox as a child of this process
    /// (which stays outside, as its launcher), serving `ctl`; returns pid
    /// 1's pid.
    pub spawn_linux_pid1:
        fn(spec: &LinuxSpec, ctl: &UnixStream, proof: &SingleThreaded) -> Result<i32, SpawnError>,
}

impl std::fmt::Debug for InProcessGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessGuest").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn exit_follows_close_is_shared_by_its_clones_and_unset_by_default() {
        let mine = ExitFollowsClose::default();
        let options = DriverOptions::one_shot(&mine);
        assert!(options.read_on_caller);
        assert!(!options.exit_follows_close.is_set());
        mine.set();
        assert!(options.exit_follows_close.is_set());
        assert!(!DriverOptions::default().exit_follows_close.is_set());
    }
}

/// How this process launches a sandbox, beside what the sandbox is (its
/// [`SandboxSpec`](hako_core::SandboxSpec)): the same knobs for every
/// backend, none of them a sandbox flag.
#[derive(Clone, Debug, Default)]
pub struct LaunchOptions {
    /// The fence's settings (resolver, read and listing limits).
    pub fence: hako_fence::FenceOptions,
    /// The `hako-guest` binary; `None` chooses (see
    /// [`Connection::start`](crate::connection::Connection::start), and
    /// each container backend for its static guest).
    pub guest: Option<std::path::PathBuf>,
    /// Close the sandbox after this long with no call in progress and no
    /// long-lived process running.
    pub idle_timeout: Option<std::time::Duration>,
    /// How the driver reads and closes the sandbox.
    pub driver: DriverOptions,
}
