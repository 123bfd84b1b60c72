//! The guest's process: finding and executing `hako-guest`, forking this
//! process to run a linked guest, and killing and reaping it (off the
//! caller's path once the sandbox is gone).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hako_core::{Error, Result};
use hako_sys::vfork::{spawn, ChildStack, SpawnCwd, SpawnSpec};

use super::{backend_err, unless_exhausted};
use crate::InProcessGuest;

/// How long closing waits for a container runtime's client to exit after
/// its guest has ended.
pub(super) const PIPED_EXIT_GRACE: Duration = Duration::from_secs(30);

/// The name the guest is started under (its `argv[0]`), whichever file
/// it is: `hako-guest`, or an executable that carries the guest and runs
/// it when started under this name (see [`set_carries_guest`]).
pub const GUEST_NAME: &str = "hako-guest";

/// Whether the running executable carries the guest (see [`set_carries_guest`]).
static CARRIES_GUEST: AtomicBool = AtomicBool::new(false);

/// Says that the running executable is the guest when started with
/// `argv[0]` [`GUEST_NAME`] (the `hako` CLI is): [`locate_guest`] then
/// falls back to it when no `hako-guest` is found, so that `hako`
/// installed alone still has its guest.
pub fn set_carries_guest() {
    CARRIES_GUEST.store(true, Ordering::Release);
}

/// Whether [`set_carries_guest`] was called in this process.
pub fn carries_guest() -> bool {
    CARRIES_GUEST.load(Ordering::Acquire)
}

/// Finds the guest: `$HAKO_GUEST`, else `hako-guest` beside the running
/// executable, else one directory up (where Cargo puts binaries relative
/// to tests), else the running executable itself when it carries the
/// guest ([`set_carries_guest`]). Whichever file it is, it is started with
/// `argv[0]` [`GUEST_NAME`].
pub fn locate_guest() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("HAKO_GUEST") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        op: "find the running executable",
        source,
    })?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(GUEST_NAME);
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    if carries_guest() {
        return Ok(exe);
    }
    Err(backend_err(
        "any",
        "find hako-guest",
        format!(
            "no hako-guest binary beside {}; hint: install hako-guest next to hako, set HAKO_GUEST, or run `cargo build --workspace` first",
            exe.display()
        ),
    ))
}

/// Starts the guest file `guest` (with `argv[0]` [`GUEST_NAME`]) in `cwd`
/// with an empty environment, stdio on
/// `/dev/null`, the control socket at fd 3 and nothing else open, in a
/// session (and so a process group) of its own (Ctrl-C at the terminal goes
/// to hako's group; the guest learns of hako's end through its control
/// socket instead).
///
/// Started with `clone(CLONE_VM | CLONE_VFORK)` ([`hako_sys::vfork`]), not
/// `fork`: a server holding many sandboxes is a large process (a thread and
/// its stack per sandbox, thousands of mappings and descriptors), and a
/// fork copies its page tables only for `exec` to throw them away, which
/// made each sandbox opened slower than the last.
pub(super) fn spawn_guest(
    backend: &'static str,
    guest: &Path,
    cwd: OwnedFd,
    ctl_guest: UnixStream,
) -> Result<hako_sys::rustix::process::Pid> {
    use std::os::fd::AsFd;
    let fail = |what: String| {
        backend_err(
            backend,
            "start hako-guest",
            format!(
                "{}: {what}; hint: set HAKO_GUEST to the hako-guest binary",
                guest.display()
            ),
        )
    };
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| {
            unless_exhausted("start hako-guest", e, |e| {
                fail(format!("cannot open /dev/null: {e}"))
            })
        })?;
    let mut stack = ChildStack::new().map_err(|e| {
        unless_exhausted("start hako-guest", e, |e| {
            fail(format!("cannot map a stack: {e}"))
        })
    })?;
    // Always named `hako-guest`: a multi-call `hako` is the guest only
    // under that name.
    let argv = [GUEST_NAME.to_string()];
    let pid = spawn(
        SpawnSpec {
            argv: &argv,
            program: Some(guest),
            env: &[],
            stdio: [null.as_fd(), null.as_fd(), null.as_fd()],
            cwd: Some(SpawnCwd::Fd(cwd.as_fd())),
            fd3: Some(ctl_guest.as_fd()),
            new_session: true,
            parent_death_kill: false,
            foreground_group: false,
            rlimits: &[],
        },
        &mut stack,
    )
    .map_err(|e| {
        let text = e.to_string();
        unless_exhausted("start hako-guest", e.error, |_| fail(text))
    })?;
    // The parent's copies of the guest's ends (cwd, ctl_guest) close here.
    hako_sys::rustix::process::Pid::from_raw(pid).ok_or_else(|| fail("spawned pid 0".into()))
}

/// Forks this (single-threaded) process; the child becomes the guest: in
/// `cwd`, in a process group of its own, with the control socket at fd 3,
/// stdio on `/dev/null` and no other descriptor.
pub(super) fn fork_guest(
    backend: &'static str,
    guest: &InProcessGuest,
    proof: &hako_sys::ns::SingleThreaded,
    cwd: OwnedFd,
    ctl_guest: UnixStream,
) -> Result<GuestProcess> {
    use hako_sys::ns::Forked;
    match hako_sys::ns::fork_single_threaded(proof) {
        Err(e) => Err(backend_err(
            backend,
            "start the guest",
            format!("fork: {e}"),
        )),
        Ok(Forked::Child) => {
            let code = (guest.serve_forked)(cwd, ctl_guest);
            hako_sys::spawn::exit_now(code.into())
        }
        Ok(Forked::Parent(pid)) => hako_sys::rustix::process::Pid::from_raw(pid)
            .map(GuestProcess::Forked)
            .ok_or_else(|| backend_err(backend, "start the guest", "fork returned pid 0")),
    }
}

/// The guest's process (for `linux`, the launcher outside the namespaces).
pub(super) enum GuestProcess {
    /// A child known by its pid: a fork of this process running the
    /// guest's code, or `hako-guest` started by [`spawn_guest`].
    Forked(hako_sys::rustix::process::Pid),
    /// A container runtime's client attached to the guest's stdio: it
    /// exits once the container is gone, so closing waits for it.
    Piped(std::process::Child),
}

impl GuestProcess {
    pub(super) fn kill(&mut self) {
        match self {
            GuestProcess::Piped(child) => {
                let _ = child.kill();
            }
            GuestProcess::Forked(pid) => {
                let _ = hako_sys::rustix::process::kill_process(
                    *pid,
                    hako_sys::rustix::process::Signal::KILL,
                );
            }
        }
    }

    /// Reaps the process if it has ended; whether it had.
    pub(super) fn try_reap(&mut self) -> bool {
        match self {
            GuestProcess::Piped(child) => {
                matches!(child.try_wait(), Ok(Some(_)))
            }
            GuestProcess::Forked(pid) => matches!(
                hako_sys::rustix::process::waitpid(
                    Some(*pid),
                    hako_sys::rustix::process::WaitOptions::NOHANG,
                ),
                Ok(Some(_))
            ),
        }
    }

    /// Waits for the process; whether it exited with status 0.
    pub(super) fn wait(&mut self) -> bool {
        match self {
            GuestProcess::Piped(child) => {
                // A runtime's client waits on its daemon, which may be
                // wedged: bounded, then killed (the launcher then removes
                // the container itself).
                let start = Instant::now();
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break status.success(),
                        Ok(None) if start.elapsed() < PIPED_EXIT_GRACE => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break false;
                        }
                    }
                }
            }
            GuestProcess::Forked(pid) => loop {
                match hako_sys::rustix::process::waitpid(
                    Some(*pid),
                    hako_sys::rustix::process::WaitOptions::empty(),
                ) {
                    Err(hako_sys::rustix::io::Errno::INTR) => {}
                    Ok(Some((_, status))) => break status.exit_status() == Some(0),
                    _ => break false,
                }
            },
        }
    }
}

/// Threads reaping the guests of closed sandboxes.
static REAPERS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Reaps `child` on a thread of its own, off the caller's path.
pub(super) fn reap_later(child: GuestProcess) {
    let spawned = std::thread::Builder::new()
        .name("hako-reap".into())
        .spawn(move || {
            let mut child = child;
            child.wait();
        });
    if let (Ok(handle), Ok(mut reapers)) = (spawned, REAPERS.lock()) {
        reapers.push(handle);
    }
}

/// Waits for every reaping thread (each waits only for a guest that is
/// already exiting).
pub(super) fn join_reapers() {
    let handles: Vec<_> = REAPERS
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    for handle in handles {
        let _ = handle.join();
    }
}
