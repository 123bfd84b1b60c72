//! Shell sessions: opening one, running a script in it, closing it.

use std::sync::mpsc;
use std::time::Instant;

use hako_core::{Command, Error, Output, OutputSink, Result};

use super::exec::{timeout_ms, ExecCwd};
use super::{backend_err, guest_could_not, Connection};
use crate::proto::{Frame, FromGuest, SessionExecRequest, SessionRequest, ToGuest};

impl Connection {
    /// Starts a shell session in `cwd` with the complete environment `env`;
    /// returns its id.
    pub fn open_session(&self, env: Vec<(String, String)>, cwd: ExecCwd) -> Result<u64> {
        // A session may end on its own, with nobody waiting.
        self.start_reader_thread();
        let (id, rx) = self.register("open a session")?;
        if let Ok(mut table) = self.shared.table.lock() {
            table.sessions_opened += 1;
        }
        let (cwd, fd) = cwd.split();
        let request = SessionRequest {
            id,
            shell: None,
            env,
            cwd,
        };
        if let Err(err) = self.send(&Frame::Message(ToGuest::OpenSession(request)), fd.as_ref()) {
            self.unregister(id);
            return Err(err);
        }
        drop(fd);
        match self.reply(&rx, "open a session")? {
            FromGuest::SessionOpened { .. } => Ok(id),
            FromGuest::Failed { message, errno, .. } => {
                Err(guest_could_not("open a session", errno, || {
                    backend_err(self.backend, "open a session", message)
                }))
            }
            other => Err(backend_err(
                self.backend,
                "open a session",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }

    /// Runs `script` in session `session`.
    pub fn session_exec(
        &self,
        session: u64,
        script: String,
        command: &Command,
        max_output: usize,
        sink: Option<&mut OutputSink<'_>>,
    ) -> Result<Output> {
        let (id, rx) = self.register("run command")?;
        let start = Instant::now();
        let request = SessionExecRequest {
            id,
            session,
            script,
            timeout_ms: timeout_ms(command),
            max_output: max_output as u64,
        };
        if let Err(err) = self.send(&Frame::Message(ToGuest::SessionExec(request)), None) {
            self.unregister(id);
            return Err(err);
        }
        self.output(&rx, command, max_output, sink, start)
            .map_err(|err| session_error(session, err))
    }

    /// Ends session `session`; fine for one that has ended.
    pub fn close_session(&self, session: u64) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        {
            let mut table = self.lock("close a session")?;
            if table.gone.is_some() {
                // The guest, and every session with it, is gone.
                return Ok(());
            }
            table.waiting.insert(session, tx);
        }
        if let Err(err) = self.send(&Frame::Message(ToGuest::CloseSession { id: session }), None) {
            self.unregister(session);
            return Err(err);
        }
        match self.reply(&rx, "close a session")? {
            FromGuest::SessionEnded { .. } => Ok(()),
            other => Err(backend_err(
                self.backend,
                "close a session",
                format!("unexpected reply from hako-guest: {other:?}"),
            )),
        }
    }
}

/// The guest's refusals of a session request as typed errors.
fn session_error(session: u64, err: Error) -> Error {
    if let Error::Backend { message, .. } = &err {
        if let Some(reason) = message
            .strip_prefix(&format!("session {session} is not open: "))
            .map(str::to_string)
        {
            return Error::SessionNotOpen { session, reason };
        }
        if message.starts_with(&format!("session {session} is busy")) {
            return Error::SessionBusy { session };
        }
    }
    err
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_guests_session_refusals_become_typed_errors() {
        let not_open = session_error(
            3,
            backend_err(
                "linux",
                "run command",
                "session 3 is not open: its shell ended",
            ),
        );
        assert!(matches!(
            not_open,
            Error::SessionNotOpen { session: 3, reason } if reason == "its shell ended"
        ));
        let busy = session_error(3, backend_err("linux", "run command", "session 3 is busy"));
        assert!(matches!(busy, Error::SessionBusy { session: 3 }));
        // Another session's refusal, or another failure, stays as it was.
        let other = session_error(4, backend_err("linux", "run command", "session 3 is busy"));
        assert!(matches!(other, Error::Backend { .. }));
    }
}
