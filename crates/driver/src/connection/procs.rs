//! Long-lived processes: starting one, its input, terminal size, output
//! and end (kept in [`crate::processes`]), waiting for and killing it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hako_core::{Error, OutputSlice, ProcessState, Result, SpawnOptions, Stream, TermSize};

use super::exec::{timeout_ms, Exec};
use super::{backend_err, lost, Connection};
use crate::processes::Proc;
use crate::proto::{ExecRequest, Frame, ToGuest, MAX_CHUNK};

impl Connection {
    /// Starts a long-lived process and returns its id at once; its output
    /// and end are kept (see `crate::processes`).
    pub fn spawn(&self, exec: Exec<'_>, options: &SpawnOptions) -> Result<u64> {
        let Exec {
            argv,
            env,
            cwd,
            command,
            ..
        } = exec;
        // Its output and end come while nobody waits.
        self.start_reader_thread();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut table = self.lock("start a process")?;
            if let Some(why) = &table.gone {
                return Err(lost(self.backend, "start a process", why.clone()));
            }
            table.procs.map.insert(
                id,
                Proc::new(
                    argv.clone(),
                    options.tags.clone(),
                    options.ring_bytes,
                    options.live_stdin || options.pty.is_some(),
                    options.pty.is_some(),
                ),
            );
        }
        let (cwd, fd) = cwd.split();
        let request = ExecRequest {
            id,
            argv,
            env,
            cwd,
            timeout_ms: timeout_ms(command),
            stdin: command.stdin.is_some() || options.live_stdin || options.pty.is_some(),
            // Everything is forwarded; the rings bound what is kept.
            max_output: u64::MAX,
            pty: options.pty.map(|size| (size.rows, size.cols)),
        };
        let sent = self
            .send(&Frame::Message(ToGuest::Exec(request)), fd.as_ref())
            .and_then(|()| {
                if let Some(data) = command.stdin.as_deref() {
                    self.send_stdin(id, data)?;
                }
                if command.stdin.is_some() && !options.live_stdin && options.pty.is_none() {
                    self.send(&Frame::Message(ToGuest::CloseStdin { id }), None)?;
                }
                Ok(())
            });
        if let Err(err) = sent {
            if let Ok(mut table) = self.shared.table.lock() {
                table.procs.map.remove(&id);
            }
            return Err(err);
        }
        Ok(id)
    }

    pub(super) fn send_stdin(&self, id: u64, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            self.send(
                &Frame::Stdin {
                    id,
                    data: chunk.to_vec(),
                },
                None,
            )?;
        }
        Ok(())
    }

    /// Waits, up to `deadline`, until `ready` holds for process `id`, and
    /// returns what `then` makes of it.
    pub(super) fn with_proc<T>(
        &self,
        id: u64,
        op: &'static str,
        deadline: Option<Instant>,
        ready: impl Fn(&Proc) -> bool,
        then: impl FnOnce(&mut Proc) -> T,
    ) -> Result<T> {
        let mut table = self.lock(op)?;
        loop {
            let proc = table
                .procs
                .map
                .get_mut(&id)
                .ok_or(Error::NoSuchProcess { process: id })?;
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if ready(proc) || timed_out {
                return Ok(then(proc));
            }
            table = match deadline {
                None => self
                    .shared
                    .changed
                    .wait(table)
                    .map_err(|_| backend_err(self.backend, op, "lock poisoned"))?,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    self.shared
                        .changed
                        .wait_timeout(table, left)
                        .map_err(|_| backend_err(self.backend, op, "lock poisoned"))?
                        .0
                }
            };
        }
    }

    /// Up to `max` bytes of a process's stream from `offset`, waiting up to
    /// `wait` for bytes past `offset` or the end.
    pub fn read_output(
        &self,
        id: u64,
        stream: Stream,
        offset: u64,
        max: usize,
        wait: Option<Duration>,
    ) -> Result<OutputSlice> {
        let s = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        let deadline = Some(Instant::now() + wait.unwrap_or(Duration::ZERO));
        self.with_proc(
            id,
            "read process output",
            deadline,
            |p| p.rings[s].end() > offset || p.finished(),
            |p| p.slice(s, offset, max),
        )
    }

    /// Writes to a process's live stdin.
    pub fn write_stdin(&self, id: u64, data: &[u8]) -> Result<()> {
        let open = self.with_proc(id, "write stdin", None, |_| true, |p| p.stdin_open)?;
        if !open {
            return Err(backend_err(
                self.backend,
                "write stdin",
                format!("process {id} has no open stdin (it ended, its stdin was closed, or it was not started with a live stdin)"),
            ));
        }
        self.send_stdin(id, data)
    }

    /// Ends a process's stdin.
    pub fn close_stdin(&self, id: u64) -> Result<()> {
        let was_open = self.with_proc(
            id,
            "close stdin",
            None,
            |_| true,
            |p| std::mem::replace(&mut p.stdin_open, false),
        )?;
        if was_open {
            self.send(&Frame::Message(ToGuest::CloseStdin { id }), None)?;
        }
        Ok(())
    }

    /// Sets the size of a process's terminal.
    pub fn resize(&self, id: u64, size: TermSize) -> Result<()> {
        let tty = self.with_proc(id, "resize a terminal", None, |_| true, |p| p.tty)?;
        if !tty {
            return Err(backend_err(
                self.backend,
                "resize a terminal",
                format!("process {id} has no terminal"),
            ));
        }
        self.send(
            &Frame::Message(ToGuest::Resize {
                id,
                rows: size.rows,
                cols: size.cols,
            }),
            None,
        )
    }

    /// Waits up to `wait` (forever with `None`) for a process to end. A
    /// process still running when the sandbox was lost is
    /// [`Error::SandboxLost`] (its output stays readable).
    pub fn wait(&self, id: u64, wait: Option<Duration>) -> Result<ProcessState> {
        let deadline = wait.map(|w| Instant::now() + w);
        let (state, lost_with) =
            self.with_proc(id, "wait for a process", deadline, Proc::finished, |p| {
                (
                    p.state(id),
                    p.lost.then(|| p.error.clone().unwrap_or_default()),
                )
            })?;
        match lost_with {
            Some(why) => Err(lost(self.backend, "wait for a process", why)),
            None => Ok(state),
        }
    }

    /// Kills a process's tree; nothing for one that has ended.
    pub fn kill(&self, id: u64) -> Result<()> {
        let running = self.with_proc(id, "kill a process", None, |_| true, |p| !p.finished())?;
        if running {
            self.send(&Frame::Message(ToGuest::Kill { id }), None)?;
        }
        Ok(())
    }

    /// Every process remembered, oldest first.
    pub fn list(&self) -> Result<Vec<ProcessState>> {
        let table = self.lock("list processes")?;
        Ok(table.procs.map.iter().map(|(id, p)| p.state(*id)).collect())
    }

    /// Whether a process of this sandbox is still running.
    pub fn any_process_running(&self) -> bool {
        self.shared
            .table
            .lock()
            .map(|t| t.procs.any_running())
            .unwrap_or(false)
    }
}
