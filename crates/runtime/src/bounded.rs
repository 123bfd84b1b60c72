//! The bounds on what a client can make one sandbox hold at once: shell
//! sessions open and long-lived processes running. Every sandbox the
//! runtime opens is wrapped in [`Bounded`], so `hako mcp`, `hako serve`
//! and library users get the same bounds and the same typed refusal
//! ([`Error::LimitReached`]); past the bound nothing is started.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hako_core::{
    AppendFile, Capabilities, Command, DirListing, Error, ExecStream, MakeDirAll, NetworkEvents,
    Output, OutputSink, OutputSlice, ProcessId, ProcessState, Processes, ReadLimit,
    ReplaceUnchanged, Result, Sandbox, SessionId, SessionOptions, Sessions, SpawnOptions, StatPath,
    Stream, TermSize, Workdir,
};

/// A sandbox with at most `max_sessions` shell sessions open and at most
/// `max_processes` long-lived processes running at once.
pub(crate) struct Bounded {
    inner: Box<dyn Sandbox>,
    max_sessions: usize,
    max_processes: usize,
    /// The sessions opened and not yet known to have ended (closed, or
    /// found not open by a command).
    sessions: Mutex<BTreeSet<u64>>,
    /// Held while a process is counted and started, so that concurrent
    /// spawns cannot pass the bound between the count and the start.
    spawning: Mutex<()>,
    /// The copy-on-write layers the sandbox is on: dropped after `inner`
    /// (fields drop in order), so a temporary layer outlives its mount.
    _layers: Option<std::sync::Arc<crate::cow::CowHold>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change is one set operation: a panic cannot leave it torn.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Bounded {
    pub(crate) fn new(inner: Box<dyn Sandbox>, max_sessions: usize, max_processes: usize) -> Self {
        Bounded {
            inner,
            max_sessions,
            max_processes,
            sessions: Mutex::new(BTreeSet::new()),
            spawning: Mutex::new(()),
            _layers: None,
        }
    }

    /// The same, holding `layers` until it is dropped.
    pub(crate) fn holding(mut self, layers: Option<std::sync::Arc<crate::cow::CowHold>>) -> Self {
        self._layers = layers;
        self
    }

    fn inner_sessions(&self) -> Result<&dyn Sessions> {
        self.inner.sessions().ok_or_else(|| Error::Unsupported {
            backend: self.inner.capabilities().backend.clone(),
            capability: "sessions",
        })
    }

    fn inner_processes(&self) -> Result<&dyn Processes> {
        self.inner.processes().ok_or_else(|| Error::Unsupported {
            backend: self.inner.capabilities().backend.clone(),
            capability: "processes",
        })
    }
}

impl Sandbox for Bounded {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn exec(&self, command: &Command) -> Result<Output> {
        self.inner.exec(command)
    }
    fn read_file(&self, path: &Path) -> Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        self.inner.write_file(path, data)
    }
    fn remove(&self, path: &Path) -> Result<()> {
        self.inner.remove(path)
    }
    fn list_dir(&self, path: &Path) -> Result<DirListing> {
        self.inner.list_dir(path)
    }
    fn close(&self) -> Result<()> {
        lock(&self.sessions).clear();
        self.inner.close()
    }
    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        self.inner.read_limit()
    }
    fn replace_unchanged(&self) -> Option<&dyn ReplaceUnchanged> {
        self.inner.replace_unchanged()
    }
    fn append(&self) -> Option<&dyn AppendFile> {
        self.inner.append()
    }
    fn make_dir_all(&self) -> Option<&dyn MakeDirAll> {
        self.inner.make_dir_all()
    }
    fn workdir(&self) -> Option<&dyn Workdir> {
        self.inner.workdir()
    }
    fn stat(&self) -> Option<&dyn StatPath> {
        self.inner.stat()
    }
    fn exec_stream(&self) -> Option<&dyn ExecStream> {
        self.inner.exec_stream()
    }
    fn sessions(&self) -> Option<&dyn Sessions> {
        self.inner.sessions().map(|_| self as &dyn Sessions)
    }
    fn processes(&self) -> Option<&dyn Processes> {
        self.inner.processes().map(|_| self as &dyn Processes)
    }
    fn network_events(&self) -> Option<&dyn NetworkEvents> {
        self.inner.network_events()
    }
}

impl Sessions for Bounded {
    fn open_session(&self, options: &SessionOptions) -> Result<SessionId> {
        let inner = self.inner_sessions()?;
        let mut open = lock(&self.sessions);
        if open.len() >= self.max_sessions {
            return Err(Error::LimitReached {
                what: "shell sessions",
                limit: self.max_sessions,
                flag: "--max-sessions",
                hint: "close one first",
            });
        }
        let id = inner.open_session(options)?;
        open.insert(id.0);
        Ok(id)
    }

    fn session_exec(
        &self,
        session: SessionId,
        command: &Command,
        sink: Option<&mut OutputSink<'_>>,
    ) -> Result<Output> {
        let result = self.inner_sessions()?.session_exec(session, command, sink);
        if let Err(Error::SessionNotOpen { .. }) = &result {
            // Its shell ended: it no longer counts.
            lock(&self.sessions).remove(&session.0);
        }
        result
    }

    fn close_session(&self, session: SessionId) -> Result<()> {
        let result = self.inner_sessions()?.close_session(session);
        lock(&self.sessions).remove(&session.0);
        result
    }
}

impl Processes for Bounded {
    fn spawn(&self, command: &Command, options: &SpawnOptions) -> Result<ProcessId> {
        let inner = self.inner_processes()?;
        let _counting = lock(&self.spawning);
        let running = inner.list()?.iter().filter(|p| !p.finished()).count();
        if running >= self.max_processes {
            return Err(Error::LimitReached {
                what: "processes",
                limit: self.max_processes,
                flag: "--max-processes",
                hint: "wait for one to end or kill one first",
            });
        }
        inner.spawn(command, options)
    }
    fn read_output(
        &self,
        id: ProcessId,
        stream: Stream,
        offset: u64,
        max: usize,
        wait: Option<Duration>,
    ) -> Result<OutputSlice> {
        self.inner_processes()?
            .read_output(id, stream, offset, max, wait)
    }
    fn write_stdin(&self, id: ProcessId, data: &[u8]) -> Result<()> {
        self.inner_processes()?.write_stdin(id, data)
    }
    fn close_stdin(&self, id: ProcessId) -> Result<()> {
        self.inner_processes()?.close_stdin(id)
    }
    fn resize(&self, id: ProcessId, size: TermSize) -> Result<()> {
        self.inner_processes()?.resize(id, size)
    }
    fn wait(&self, id: ProcessId, wait: Option<Duration>) -> Result<ProcessState> {
        self.inner_processes()?.wait(id, wait)
    }
    fn kill(&self, id: ProcessId) -> Result<()> {
        self.inner_processes()?.kill(id)
    }
    fn list(&self) -> Result<Vec<ProcessState>> {
        self.inner_processes()?.list()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A sandbox whose sessions and processes are only counted.
    struct Counting {
        caps: Capabilities,
        next: AtomicU64,
        running: Mutex<BTreeSet<u64>>,
    }

    impl Counting {
        fn new() -> Self {
            Counting {
                caps: Capabilities {
                    backend: "test".into(),
                    isolation: hako_core::Isolation::None,
                    network: hako_core::NetworkAccess::None,
                    fence: hako_core::FenceResolver::ComponentWalk,
                    limits: Vec::new(),
                    env_sanitised: true,
                    fds_closed: true,
                    landlock_abi: None,
                    accelerator: None,
                    seccomp: false,
                    shared: Vec::new(),
                    defects: Vec::new(),
                    optional: hako_core::Optional::default(),
                },
                next: AtomicU64::new(1),
                running: Mutex::new(BTreeSet::new()),
            }
        }
    }

    fn unsupported<T>() -> Result<T> {
        Err(Error::Unsupported {
            backend: "test".into(),
            capability: "this",
        })
    }

    impl Sandbox for Counting {
        fn capabilities(&self) -> &Capabilities {
            &self.caps
        }
        fn exec(&self, _: &Command) -> Result<Output> {
            unsupported()
        }
        fn read_file(&self, _: &Path) -> Result<Vec<u8>> {
            unsupported()
        }
        fn write_file(&self, _: &Path, _: &[u8]) -> Result<()> {
            unsupported()
        }
        fn remove(&self, _: &Path) -> Result<()> {
            unsupported()
        }
        fn list_dir(&self, _: &Path) -> Result<DirListing> {
            unsupported()
        }
        fn close(&self) -> Result<()> {
            Ok(())
        }
        fn sessions(&self) -> Option<&dyn Sessions> {
            Some(self)
        }
        fn processes(&self) -> Option<&dyn Processes> {
            Some(self)
        }
    }

    impl Sessions for Counting {
        fn open_session(&self, _: &SessionOptions) -> Result<SessionId> {
            Ok(SessionId(self.next.fetch_add(1, Ordering::SeqCst)))
        }
        fn session_exec(
            &self,
            session: SessionId,
            _: &Command,
            _: Option<&mut OutputSink<'_>>,
        ) -> Result<Output> {
            Err(Error::SessionNotOpen {
                session: session.0,
                reason: "its shell exited".into(),
            })
        }
        fn close_session(&self, _: SessionId) -> Result<()> {
            Ok(())
        }
    }

    impl Processes for Counting {
        fn spawn(&self, _: &Command, _: &SpawnOptions) -> Result<ProcessId> {
            let id = self.next.fetch_add(1, Ordering::SeqCst);
            lock(&self.running).insert(id);
            Ok(ProcessId(id))
        }
        fn read_output(
            &self,
            _: ProcessId,
            _: Stream,
            _: u64,
            _: usize,
            _: Option<Duration>,
        ) -> Result<OutputSlice> {
            unsupported()
        }
        fn write_stdin(&self, _: ProcessId, _: &[u8]) -> Result<()> {
            unsupported()
        }
        fn close_stdin(&self, _: ProcessId) -> Result<()> {
            unsupported()
        }
        fn resize(&self, _: ProcessId, _: TermSize) -> Result<()> {
            unsupported()
        }
        fn wait(&self, _: ProcessId, _: Option<Duration>) -> Result<ProcessState> {
            unsupported()
        }
        fn kill(&self, id: ProcessId) -> Result<()> {
            lock(&self.running).remove(&id.0);
            Ok(())
        }
        fn list(&self) -> Result<Vec<ProcessState>> {
            Ok(lock(&self.running)
                .iter()
                .map(|id| ProcessState {
                    id: ProcessId(*id),
                    argv: vec![],
                    tags: vec![],
                    status: None,
                    error: None,
                    timed_out: false,
                    oom_killed: false,
                    stdout_total: 0,
                    stderr_total: 0,
                })
                .collect())
        }
    }

    #[test]
    fn one_session_past_the_bound_is_refused_typed_and_closing_one_makes_room() {
        let sb = Bounded::new(Box::new(Counting::new()), 2, 8);
        let s = sb.sessions().unwrap();
        let a = s.open_session(&SessionOptions::default()).unwrap();
        let b = s.open_session(&SessionOptions::default()).unwrap();
        let err = s.open_session(&SessionOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::LimitReached {
                    what: "shell sessions",
                    limit: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--max-sessions"), "{err}");
        s.close_session(a).unwrap();
        let c = s.open_session(&SessionOptions::default()).unwrap();
        // A session whose shell ended no longer counts once that is seen.
        assert!(s.session_exec(b, &Command::new(["true"]), None).is_err());
        s.open_session(&SessionOptions::default()).unwrap();
        s.close_session(c).unwrap();
    }

    #[test]
    fn one_process_past_the_bound_is_refused_typed_and_one_ending_makes_room() {
        let sb = Bounded::new(Box::new(Counting::new()), 2, 2);
        let p = sb.processes().unwrap();
        let cmd = Command::new(["sleep", "9"]);
        let a = p.spawn(&cmd, &SpawnOptions::default()).unwrap();
        p.spawn(&cmd, &SpawnOptions::default()).unwrap();
        let err = p.spawn(&cmd, &SpawnOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::LimitReached {
                    what: "processes",
                    limit: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--max-processes"), "{err}");
        p.kill(a).unwrap();
        p.spawn(&cmd, &SpawnOptions::default()).unwrap();
    }
}
