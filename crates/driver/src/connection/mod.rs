//! The host side of the protocol: starting a sandbox's guest, sending it
//! commands, and collecting their output. Every backend launches through
//! this; a backend only decides how the guest is started and what it builds.
//!
//! One [`Connection`] per sandbox. A reader thread takes every frame the
//! guest sends and hands it to the command it belongs to, so any number of
//! threads can run commands at once; each waits only for its own events.
//! A process that mostly runs one command at a time (the CLI, see
//! [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller))
//! starts no such thread until it needs one: the threads that wait read
//! the frames themselves, taking turns.
//!
//! The parts: `start` (the three ways a guest starts, and the
//! handshake), `guest_process` (the guest's process, killing and reaping
//! it), `wire` (hako's sending end), `reader` (frames in, and who reads
//! them), `exec` and `session` (one command, a shell session), `procs`
//! (long-lived processes) and `close`.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

use hako_core::{Error, Result};

use crate::proto::{self, Frame, ToGuest};

mod close;
mod exec;
mod guest_process;
mod procs;
mod reader;
mod session;
mod start;
mod wire;

pub use exec::{validate, Capture, Exec, ExecCwd};
pub use guest_process::{carries_guest, locate_guest, set_carries_guest, GUEST_NAME};
pub use start::LocalPlan;

use guest_process::GuestProcess;
use reader::{Event, ReadBy, Shared, Table};
use wire::Wire;

fn backend_err(backend: &str, op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: backend.into(),
        op,
        message: message.into(),
    }
}

/// `err` as [`Error::OutOfResources`] when it means the machine or this
/// process ran out of something (processes, descriptors, memory), naming
/// the limit; else `otherwise`.
pub(crate) fn unless_exhausted(
    op: &'static str,
    err: std::io::Error,
    otherwise: impl FnOnce(std::io::Error) -> Error,
) -> Error {
    match hako_sys::exhaust::diagnose(&err) {
        Some(found) => Error::OutOfResources {
            op,
            resource: found.resource,
            message: found.message,
        },
        None => otherwise(err),
    }
}

/// What the guest could not start (a command, a session's shell), with
/// the OS error behind it: [`Error::OutOfResources`] when that error means
/// something ran out (the machine's limit is named; a sandbox's own
/// `--pids` or `--max-open-files` may be the one reached instead), else
/// `otherwise`.
pub(crate) fn guest_could_not(
    op: &'static str,
    errno: Option<i32>,
    otherwise: impl FnOnce() -> Error,
) -> Error {
    let found = errno
        .map(std::io::Error::from_raw_os_error)
        .and_then(|err| hako_sys::exhaust::diagnose(&err));
    match found {
        Some(found) => Error::OutOfResources {
            op,
            resource: found.resource,
            message: format!(
                "{}; or the sandbox's own limit (--pids, --max-open-files), if it has one",
                found.message
            ),
        },
        None => otherwise(),
    }
}

/// The sandbox was lost: its guest ended while it was open (see
/// [`Error::SandboxLost`]).
fn lost(backend: &str, op: &'static str, reason: impl Into<String>) -> Error {
    Error::SandboxLost {
        backend: backend.into(),
        op,
        reason: reason.into(),
    }
}

/// How long a send that found the guest's end closed waits for the
/// reader to say what became of the guest (a container's state, asked of
/// its engine), so that the error names it.
const LOST_REASON_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The id the guest's first reply ([`FromGuest::Ready`] or
/// [`FromGuest::Refused`]) is delivered under.
const HELLO_ID: u64 = 0;

/// The buffer the guest's frames are read through.
const READ_BUF: usize = 64 * 1024;

/// A sandbox's guest, started once and serving every command until
/// [`close`](Connection::close). Dropping it closes it; if this process
/// dies, the guest sees its connection close and kills everything.
pub struct Connection {
    backend: &'static str,
    writer: Mutex<Wire>,
    shared: Arc<Shared>,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Who reads the guest's frames (see [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller)).
    read_by: Mutex<ReadBy>,
    /// Signalled when a waiting thread is done reading a frame.
    turn_over: Condvar,
    child: Mutex<Option<GuestProcess>>,
    next_id: AtomicU64,
    /// The guest's process was waited for and exited with status 0.
    exited_cleanly: AtomicBool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The pid of the guest's process as this process sees it, when it
    /// is a child known by its pid (`linux`, `host`): for `linux`, the
    /// sandbox's pid 1 or the launcher whose child it is.
    pub fn guest_pid(&self) -> Option<i32> {
        match self.child.lock().ok()?.as_ref()? {
            GuestProcess::Forked(pid) => Some(pid.as_raw_nonzero().get()),
            GuestProcess::Piped(_) => None,
        }
    }

    fn send(&self, frame: &Frame<ToGuest>, fd: Option<&OwnedFd>) -> Result<()> {
        let bytes = proto::encode(frame)
            .map_err(|e| backend_err(self.backend, "send to hako-guest", e.to_string()))?;
        let writer = self
            .writer
            .lock()
            .map_err(|_| backend_err(self.backend, "send to hako-guest", "lock poisoned"))?;
        writer.send(&bytes, fd).map_err(|e| match e.kind() {
            // The guest's end is closed: it is gone, and the reader says
            // why in a moment.
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                drop(writer);
                lost(self.backend, "send to hako-guest", self.why_gone(&e))
            }
            _ => backend_err(self.backend, "send to hako-guest", e.to_string()),
        })
    }

    /// Why the guest is gone, once the reader has said so (waiting a
    /// little for it); else what the send that found it gone saw.
    fn why_gone(&self, e: &std::io::Error) -> String {
        let deadline = std::time::Instant::now() + LOST_REASON_WAIT;
        let Ok(mut table) = self.shared.table.lock() else {
            return format!("the connection to the sandbox's guest closed: {e}");
        };
        loop {
            if let Some(why) = &table.gone {
                return why.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            // Only a reader thread says why on its own: where waiting
            // threads read, none may be reading now.
            let reader_runs = self.reader.lock().is_ok_and(|r| r.is_some());
            if left.is_zero() || !reader_runs {
                return format!("the connection to the sandbox's guest closed: {e}");
            }
            table = match self.shared.changed.wait_timeout(table, left) {
                Ok((t, _)) => t,
                Err(_) => return format!("the connection to the sandbox's guest closed: {e}"),
            };
        }
    }

    /// Takes a new id and registers a waiter for what the guest says about
    /// it.
    fn register(&self, op: &'static str) -> Result<(u64, mpsc::Receiver<Event>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let mut table = self.lock(op)?;
        if let Some(why) = &table.gone {
            return Err(lost(self.backend, op, why.clone()));
        }
        table.waiting.insert(id, tx);
        Ok((id, rx))
    }

    fn unregister(&self, id: u64) {
        if let Ok(mut table) = self.shared.table.lock() {
            table.waiting.remove(&id);
        }
    }

    fn lock(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Table>> {
        self.shared
            .table
            .lock()
            .map_err(|_| backend_err(self.backend, op, "lock poisoned"))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}
