//! Closing: ending the sandbox and waiting for (or reaping later) the
//! guest's process; or, for a process that exits next, leaving it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::guest_process::{reap_later, GuestProcess, PIPED_EXIT_GRACE};
use super::reader::{read_events, ReadBy};
use super::Connection;

impl Connection {
    /// Ends the sandbox: the guest kills every command (each still gets its
    /// result, killed), then exits; with it, a `linux` sandbox's pid 1 and
    /// so everything in its namespaces. Idempotent.
    pub fn close(&self) {
        if let Ok(mut writer) = self.writer.lock() {
            writer.close_write();
        }
        // Read by waiting threads until now: this one takes the guest's
        // last words, to its end (after the turn of any reading now).
        if let Some(end) = self.take_end() {
            read_events(end, &self.shared, None);
        }
        let reader = self.reader.lock().ok().and_then(|mut r| r.take());
        if let Some(reader) = reader {
            // A container's guest ends within moments of its stdin closing;
            // one that does not (a wedged runtime) is cut off by killing
            // its client, whose end of the pipe then closes.
            let piped = self
                .child
                .lock()
                .is_ok_and(|c| matches!(*c, Some(GuestProcess::Piped(_))));
            if piped {
                let start = Instant::now();
                while !reader.is_finished() && start.elapsed() < PIPED_EXIT_GRACE {
                    std::thread::sleep(Duration::from_millis(2));
                }
                if !reader.is_finished() {
                    if let Some(child) = self.child.lock().ok().as_mut().and_then(|c| c.as_mut()) {
                        child.kill();
                    }
                }
            }
            let _ = reader.join();
        }
        let child = self.child.lock().ok().and_then(|mut c| c.take());
        if let Some(mut child) = child {
            if self.said_bye() && !matches!(child, GuestProcess::Piped(_)) {
                // Everything of the sandbox is gone but the guest's own
                // exit (and, for linux, the kernel's teardown of the
                // namespaces): reap it off the caller's path.
                if !child.try_reap() {
                    reap_later(child);
                }
            } else if child.wait() {
                self.exited_cleanly.store(true, Ordering::Release);
            }
        }
    }

    /// Ends the sandbox as [`close`](Self::close) does, for a process that
    /// exits next (see [`ExitFollowsClose`](crate::ExitFollowsClose)) and has nothing to tear down
    /// after the guest: tells the guest to end the sandbox and returns at
    /// once, leaving the guest's goodbye unread and its process to be
    /// adopted when this process exits. Every command this connection ran
    /// has been reported, and a command is reported only once its
    /// supervisor has killed and reaped its whole tree, so what is left
    /// runs no command's code: the guest itself and its idle helpers, which
    /// end on the closed connection (and a `linux` sandbox's pid 1 also
    /// when this process, its parent, exits). A guest reached through a
    /// runtime's client (a container) is closed and waited for as usual,
    /// unless `piped_too`: what the client leaves is removed by a process
    /// of its own (see `Launcher::cleans_up_after_itself`), and the closed
    /// stdin ends the container. Returns whether it left the guest so
    /// (`false`: it was closed and waited for).
    pub fn close_before_exit(&self, piped_too: bool) -> bool {
        let piped = self
            .child
            .lock()
            .is_ok_and(|c| matches!(*c, Some(GuestProcess::Piped(_))));
        let quiet = self.shared.table.lock().is_ok_and(|t| {
            t.waiting.is_empty() && !t.procs.any_running() && t.sessions_opened == 0
        });
        if (piped && !piped_too) || !quiet {
            self.close();
            return false;
        }
        if let Ok(mut writer) = self.writer.lock() {
            writer.shut();
        }
        // Not joined, not reaped: a later `close` has nothing to wait for.
        drop(self.reader.lock().ok().and_then(|mut r| r.take()));
        if let Ok(mut read_by) = self.read_by.lock() {
            *read_by = ReadBy::Thread;
        }
        drop(self.child.lock().ok().and_then(|mut c| c.take()));
        true
    }

    /// Whether the guest's process has been waited for (by `close`) and
    /// exited with status 0.
    pub fn exited_cleanly(&self) -> bool {
        self.exited_cleanly.load(Ordering::Acquire)
    }

    pub(super) fn said_bye(&self) -> bool {
        self.shared.table.lock().is_ok_and(|t| t.bye)
    }
}
