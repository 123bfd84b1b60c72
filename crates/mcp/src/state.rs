//! The server's one sandbox (opened on first use, closed at disconnect),
//! the audit log, and the error every tool failure becomes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use hako_audit::{
    AuditLog, Failure, FrontEnd, Process, ProcessOp, Record, SandboxClosed, SandboxLost,
    SandboxOpened,
};
use hako_core::{FenceError, ProcessId, Sandbox, SessionId};
use hako_runtime::CowHold;

use crate::MakeSandbox;

/// A tool call that failed: returned to the client as a tool result with
/// `isError` set, never as a protocol error.
#[derive(Debug, Clone)]
pub struct ToolError {
    /// What the model reads.
    pub message: String,
    /// Whether a policy refused it (a path outside the workspace, a
    /// boundary too weak) rather than an ordinary failure.
    pub refused: bool,
    /// The sandbox was lost (its guest ended while it was open): what
    /// the audit log records of it.
    pub lost: Option<Box<SandboxLost>>,
}

impl ToolError {
    /// A failure that is not a policy refusal (bad input, not found, ...).
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            refused: false,
            lost: None,
        }
    }
}

impl From<hako_core::Error> for ToolError {
    fn from(err: hako_core::Error) -> Self {
        let refused = hako_audit::is_refusal(&err);
        let mut message = err.to_string();
        if let Some(hint) = hint(&err) {
            message.push_str("; ");
            message.push_str(hint);
        }
        let lost = SandboxLost::from_error(FrontEnd::Mcp, None, &err).map(Box::new);
        ToolError {
            message,
            refused,
            lost,
        }
    }
}

/// The answer of a review tool on a server whose sandbox is not
/// copy-on-write.
pub fn not_cow() -> ToolError {
    ToolError::new(
        "this server's sandbox is not copy-on-write: its changes land in the workspace as they are made, so there is nothing to review, checkpoint or roll back; start hako mcp with --cow (and --name NAME to keep the layers)",
    )
}

/// A hint for the model where the error alone does not say what to do.
fn hint(err: &hako_core::Error) -> Option<&'static str> {
    match err {
        hako_core::Error::Fence(
            FenceError::DotDotEscape { .. }
            | FenceError::AbsoluteOutside { .. }
            | FenceError::SymlinkEscape { .. },
        ) => Some(
            "every path must stay inside the workspace: give it relative to the workspace root",
        ),
        hako_core::Error::Fence(FenceError::NotFound { .. }) => {
            Some("list_dir or glob show what exists")
        }
        hako_core::Error::Closed => Some("the server is shutting down"),
        hako_core::Error::SandboxLost { .. } => Some(
            "this server's sandbox is closed for good and every later call fails; the files in the workspace are kept: restart the server to go on",
        ),
        _ => None,
    }
}

/// What one client (one MCP session) started: its processes and shell
/// sessions.
///
/// Handles are the sandbox's, numbered in one sequence for every client
/// of it, and over HTTP several sessions share one sandbox: a handle
/// mistyped, guessed or remembered from another conversation must not
/// read, feed, kill or run in what another client started. Each tool that
/// takes a handle checks it here first.
///
/// When the sandbox is closed and another opened on its layers (a
/// rollback, commit or discard of a copy-on-write sandbox), every handle
/// of the old one is void: the new one numbers its own from the start, so
/// each set is forgotten once the state's generation has moved.
#[derive(Debug, Default)]
pub struct Owner {
    owned: Mutex<Owned>,
    /// The state's generation (see [`State::generation`]).
    generation: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct Owned {
    /// The generation these handles belong to.
    generation: u64,
    processes: BTreeSet<u64>,
    /// Of `processes`, those whose handle a tool gave the client:
    /// `list_processes` shows these and the ones still running, not every
    /// finished command.
    handed_out: BTreeSet<u64>,
    sessions: BTreeSet<u64>,
}

/// Adds `id` to `set`, forgetting the oldest past [`MAX_OWNED`].
fn remember(set: &mut BTreeSet<u64>, id: u64) {
    set.insert(id);
    while set.len() > MAX_OWNED {
        set.pop_first();
    }
}

impl Owner {
    /// An owner of no handles yet, of the sandbox whose generation
    /// `generation` counts.
    pub fn new(generation: Arc<AtomicU64>) -> Self {
        Owner {
            owned: Mutex::default(),
            generation,
        }
    }

    fn owned(&self) -> MutexGuard<'_, Owned> {
        // Every change is one set operation: a panic cannot leave it torn.
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.generation.load(Ordering::SeqCst);
        if owned.generation != now {
            *owned = Owned {
                generation: now,
                ..Owned::default()
            };
        }
        owned
    }

    /// This client started the process.
    pub fn started(&self, id: ProcessId) {
        remember(&mut self.owned().processes, id.0);
    }

    /// This client was given the process's handle.
    pub fn hand_out(&self, id: ProcessId) {
        let mut owned = self.owned();
        remember(&mut owned.processes, id.0);
        remember(&mut owned.handed_out, id.0);
    }

    /// Whether this client started the process.
    pub fn owns(&self, id: ProcessId) -> bool {
        self.owned().processes.contains(&id.0)
    }

    /// Whether this client was given the process's handle.
    pub fn was_handed_out(&self, id: ProcessId) -> bool {
        self.owned().handed_out.contains(&id.0)
    }

    /// The process, if this client started it; otherwise the error the
    /// model reads (the same whether or not another client has one).
    pub fn check_process(&self, id: u64) -> Result<ProcessId, ToolError> {
        if self.owned().processes.contains(&id) {
            return Ok(ProcessId(id));
        }
        Err(ToolError::new(format!(
            "no process {id} was started in this session; list_processes shows the handles run_command gave you"
        )))
    }

    /// This client opened the shell session.
    pub fn opened_session(&self, id: SessionId) {
        remember(&mut self.owned().sessions, id.0);
    }

    /// The shell session, if this client opened it.
    pub fn check_session(&self, id: u64) -> Result<SessionId, ToolError> {
        if self.owned().sessions.contains(&id) {
            return Ok(SessionId(id));
        }
        Err(ToolError::new(format!(
            "no shell session {id} was opened in this session; open_session opens one"
        )))
    }
}

/// The result of a tool that ran: its text, and whether it counts as an
/// error (a command that timed out).
#[derive(Debug, Clone)]
pub struct Reply {
    /// What the model reads.
    pub text: String,
    /// Set `isError` on the result.
    pub is_error: bool,
}

impl From<String> for Reply {
    fn from(text: String) -> Self {
        Reply {
            text,
            is_error: false,
        }
    }
}

/// Most process and shell-session handles one client is remembered to
/// own (the oldest are forgotten first; the sandbox forgets old ended
/// processes too).
const MAX_OWNED: usize = 1 << 16;

enum Slot {
    /// Not opened yet (or opening it failed: the next call tries again).
    Idle,
    Open(Arc<dyn Sandbox>),
    /// The client went away; no call may open it again.
    Closed,
    /// The sandbox was lost (its guest ended while it was open) and was
    /// closed: every later call fails, saying so. It is not opened again
    /// on its own: the handles of the lost one's processes and sessions,
    /// which clients may still hold, would name another's in a new one.
    Lost(String),
}

/// What every tool call shares.
pub struct State {
    make: Box<MakeSandbox>,
    slot: Mutex<Slot>,
    /// The backend, set when the sandbox is first opened: what a failure's
    /// record names without waiting for the slot's lock.
    backend: OnceLock<String>,
    audit: Option<Arc<AuditLog>>,
    /// Tool calls running now, of every client.
    calls: Arc<std::sync::atomic::AtomicUsize>,
    /// The most tool calls running at once.
    max_calls: usize,
    /// The copy-on-write layers the sandbox is opened on (`--cow`), held
    /// for the server's life.
    cow: Option<Arc<CowHold>>,
    /// `--allow-agent-commit`: the `commit` and `discard` tools exist.
    allow_commit: bool,
    /// Moves each time the sandbox is closed to change its layers and
    /// another is to be opened on them: handles of the old one are void.
    generation: Arc<AtomicU64>,
}

/// One running tool call: given back when dropped (a panic included).
pub struct CallSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for CallSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl State {
    /// A state that opens its sandbox with `make` on first use.
    pub fn new(make: Box<MakeSandbox>, audit: Option<Arc<AuditLog>>) -> Self {
        State {
            make,
            slot: Mutex::new(Slot::Idle),
            backend: OnceLock::new(),
            audit,
            calls: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_calls: crate::MAX_TOOL_CALLS,
            cow: None,
            allow_commit: false,
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The sandbox is opened on `cow` (a copy-on-write workspace, whose
    /// review tools are offered); `allow_commit` offers `commit` and
    /// `discard` too.
    pub fn with_cow(mut self, cow: Option<Arc<CowHold>>, allow_commit: bool) -> Self {
        self.cow = cow;
        self.allow_commit = allow_commit;
        self
    }

    /// The copy-on-write layers, if the sandbox has them.
    pub fn cow(&self) -> Option<&Arc<CowHold>> {
        self.cow.as_ref()
    }

    /// Whether an agent may commit and discard (`--allow-agent-commit`).
    pub fn allow_commit(&self) -> bool {
        self.allow_commit
    }

    /// The generation of the sandbox, for [`Owner::new`].
    pub fn generation(&self) -> Arc<AtomicU64> {
        self.generation.clone()
    }

    /// Runs `f` on the copy-on-write layers with no sandbox on them: the
    /// open sandbox is closed first (every process and session in it
    /// ends, and their handles are void), and the next tool call opens
    /// another on the layers as `f` left them. No sandbox is opened
    /// meanwhile (the slot's lock is held throughout). Blocking.
    pub fn with_sandbox_closed<T>(&self, f: impl FnOnce(&CowHold) -> T) -> Result<T, ToolError> {
        let cow = self.cow.clone().ok_or_else(not_cow)?;
        let _alone = cow.exclusive();
        let mut slot = self.slot();
        match std::mem::replace(&mut *slot, Slot::Idle) {
            Slot::Open(sandbox) => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.close_sandbox(&sandbox);
            }
            Slot::Closed => {
                *slot = Slot::Closed;
                return Err(ToolError::new(
                    "the server is shutting down; the sandbox is closed",
                ));
            }
            // A lost sandbox stays lost (see `Slot::Lost`); its layers
            // may still be reviewed.
            Slot::Lost(message) => *slot = Slot::Lost(message),
            Slot::Idle => {}
        }
        Ok(f(&cow))
    }
    /// At most `max` tool calls running at once (of every client).
    pub fn with_max_calls(mut self, max: usize) -> Self {
        self.max_calls = max;
        self
    }

    /// A place for one more tool call, or the refusal the client reads
    /// when `max_calls` run already.
    pub fn begin_call(&self) -> Result<CallSlot, ToolError> {
        use std::sync::atomic::Ordering;
        let max = self.max_calls;
        self.calls
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .map(|_| CallSlot(self.calls.clone()))
            .map_err(|_| {
                ToolError::new(format!(
                    "refused: {max} tool calls are already running at once, the most this server allows; wait for one to finish (a long command can be left running: run_command returns a process handle after wait_secs) and call again"
                ))
            })
    }

    /// The sandbox, opened now if this is the first call. Blocking: call it
    /// from a blocking thread. Concurrent first calls open it once (the
    /// lock is held while it opens).
    pub fn sandbox(&self) -> Result<Arc<dyn Sandbox>, ToolError> {
        let mut slot = self.slot();
        match &*slot {
            Slot::Open(sandbox) => Ok(sandbox.clone()),
            Slot::Closed => Err(ToolError::new(
                "the server is shutting down; the sandbox is closed",
            )),
            Slot::Lost(message) => Err(ToolError::new(message.clone())),
            Slot::Idle => {
                let sandbox: Arc<dyn Sandbox> = match (self.make)() {
                    Ok(sandbox) => Arc::from(sandbox),
                    Err(err) => {
                        let refused = matches!(err, hako_core::Error::IsolationTooWeak { .. });
                        return Err(ToolError {
                            message: format!("cannot open the sandbox: {err}"),
                            refused,
                            lost: None,
                        });
                    }
                };
                let caps = sandbox.capabilities();
                tracing::info!(backend = %caps.backend, isolation = %caps.isolation, "sandbox opened");
                let _ = self.backend.set(caps.backend.clone());
                let mut opened = SandboxOpened::new(FrontEnd::Mcp, None, caps);
                opened.workdir = sandbox.workdir().map(|w| w.workdir().to_path_buf());
                self.record(Record::SandboxOpened(opened));
                *slot = Slot::Open(sandbox.clone());
                Ok(sandbox)
            }
        }
    }

    /// The slot, even if a call panicked holding its lock (opening the
    /// sandbox runs a factory that might): the slot is only ever replaced
    /// whole, so what it holds is always one of its states, and one panic
    /// must not make every later call fail.
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one audit record, if there is a log. A record that cannot
    /// be written is logged: the effect has already happened.
    pub fn record(&self, record: Record) {
        if let Some(audit) = &self.audit {
            if let Err(err) = audit.write(&record) {
                tracing::error!("cannot write the audit log: {err}");
            }
        }
    }

    /// Records a tool failure: kind `refusal` for a policy refusal, `error`
    /// otherwise (the message cut to [`hako_audit::MAX_MESSAGE_CHARS`]).
    pub fn record_failure(&self, tool: &str, err: &ToolError) {
        let mut failure = Failure::new(FrontEnd::Mcp, &err.message);
        failure.tool = Some(tool.to_string());
        failure.backend = self.backend();
        self.record(failure.record(err.refused));
    }

    /// A call on `sandbox` found it lost (`err.lost`): records it, closes
    /// it (removing what is left of it) and records that, once, by the
    /// first call to find it so; every later call fails with `err`'s
    /// message.
    pub fn sandbox_lost(&self, sandbox: &Arc<dyn Sandbox>, err: &ToolError) {
        let Some(lost) = &err.lost else {
            return;
        };
        {
            let mut slot = self.slot();
            match &*slot {
                Slot::Open(open) if Arc::ptr_eq(open, sandbox) => {}
                _ => return,
            }
            *slot = Slot::Lost(err.message.clone());
        }
        tracing::warn!(reason = %lost.reason, "the sandbox was lost");
        self.record(Record::SandboxLost(SandboxLost::clone(lost)));
        if let Err(err) = sandbox.close() {
            tracing::warn!("closing the lost sandbox: {err}");
        }
        self.drain_network(sandbox.as_ref());
        self.record(Record::SandboxClosed(SandboxClosed {
            front_end: FrontEnd::Mcp,
            sandbox: None,
        }));
    }

    /// The sandbox's backend, once it has been opened.
    fn backend(&self) -> Option<String> {
        self.backend.get().cloned()
    }

    /// Records the egress proxy's decisions since the last call (kind
    /// `net`, the event's own fields) and returns the refused ones as
    /// lines for the model.
    pub fn drain_network(&self, sandbox: &dyn Sandbox) -> Vec<String> {
        let Some(net) = sandbox.network_events() else {
            return Vec::new();
        };
        let (events, dropped) = net.take_network_events();
        let mut refused = Vec::new();
        for event in events {
            if event.decision == hako_core::NetDecision::Refused {
                refused.push(format!(
                    "the egress proxy refused {}:{} (rule {}){}",
                    event.host,
                    event.port,
                    event.rule,
                    event
                        .message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ));
            }
            self.record(Record::Net(event));
        }
        if dropped > 0 {
            self.record(Record::NetDropped { dropped });
        }
        refused
    }

    /// The client went away: closes the sandbox (everything started in it
    /// is killed), records what the egress proxy decided, and closes the
    /// audit log. Idempotent.
    pub fn shutdown(&self) {
        let previous = std::mem::replace(&mut *self.slot(), Slot::Closed);
        if let Slot::Open(sandbox) = previous {
            self.close_sandbox(&sandbox);
        }
    }

    /// Closes `sandbox` (everything started in it is killed, each process
    /// recorded), records what the egress proxy decided and the close.
    fn close_sandbox(&self, sandbox: &Arc<dyn Sandbox>) {
        // What is still running dies with the sandbox: say which.
        if let Some(Ok(list)) = sandbox.processes().map(|p| p.list()) {
            for st in list.iter().filter(|st| !st.finished()) {
                self.record(Record::Process(Process {
                    process: st.id.0,
                    sandbox: None,
                    op: ProcessOp::KilledAtClose {
                        argv: st.argv.clone(),
                    },
                }));
            }
        }
        if let Err(err) = sandbox.close() {
            tracing::warn!("closing the sandbox: {err}");
        }
        // Closing ends every connection from inside, so each is recorded.
        self.drain_network(sandbox.as_ref());
        self.record(Record::SandboxClosed(SandboxClosed {
            front_end: FrontEnd::Mcp,
            sandbox: None,
        }));
        tracing::info!("sandbox closed");
    }

    /// Writes the audit log's closing record.
    pub fn close_audit(&self) {
        if let Some(audit) = &self.audit {
            if let Err(err) = audit.close() {
                tracing::error!("cannot close the audit log: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::testbox::FenceBox;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_panic_while_opening_the_sandbox_leaves_the_server_usable() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let first = Arc::new(AtomicBool::new(true));
        let state = State::new(
            Box::new(move || {
                if first.swap(false, Ordering::SeqCst) {
                    panic!("the factory failed");
                }
                Ok(Box::new(FenceBox::new(&root)) as Box<dyn Sandbox>)
            }),
            None,
        );
        let state = Arc::new(state);
        let s = state.clone();
        assert!(std::thread::spawn(move || s.sandbox().map(|_| ()))
            .join()
            .is_err());
        // The lock was poisoned by the panic; the next call opens it.
        assert!(state.sandbox().is_ok());
        state.shutdown();
        assert!(state.sandbox().is_err());
    }

    #[test]
    fn a_lost_sandbox_is_recorded_lost_and_closed_once_and_every_later_call_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let path = tmp.path().join("audit.log");
        let log = Arc::new(AuditLog::open(&path, &[]).unwrap());
        let state = State::new(
            Box::new(move || Ok(Box::new(FenceBox::new(&root)) as Box<dyn Sandbox>)),
            Some(log),
        );
        let sandbox = state.sandbox().unwrap();
        let err = ToolError::from(hako_core::Error::SandboxLost {
            backend: "docker".into(),
            op: "run command",
            reason: "the sandbox's guest ended: container hako-1 was killed".into(),
        });
        assert!(
            err.message.contains("restart the server"),
            "{}",
            err.message
        );
        // Two calls find it lost: it is recorded once.
        state.sandbox_lost(&sandbox, &err);
        state.sandbox_lost(&sandbox, &err);
        let later = state.sandbox().err().unwrap();
        assert!(
            later.message.contains("the sandbox was lost"),
            "{}",
            later.message
        );
        state.shutdown();
        state.close_audit();
        let records = hako_audit::records(&path).unwrap();
        let ops: Vec<_> = records
            .iter()
            .filter(|r| r["kind"] == "sandbox")
            .map(|r| r["op"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ops, ["open", "lost", "close"], "{records:?}");
        let lost = records.iter().find(|r| r["op"] == "lost").unwrap();
        assert_eq!(lost["front_end"], "mcp");
        assert_eq!(lost["during"], "run command");
    }

    #[test]
    fn an_audited_failure_never_carries_more_than_a_short_message() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.log");
        let log = Arc::new(AuditLog::open(&path, &[]).unwrap());
        let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), Some(log));
        let content = "SECRET ".repeat(100_000);
        state.record_failure(
            "edit_file",
            &ToolError::new(format!(
                "invalid type: string {content:?}, expected a boolean"
            )),
        );
        state.close_audit();
        let records = hako_audit::records(&path).unwrap();
        let message = records[0]["error"].as_str().unwrap();
        assert!(
            message.chars().count() <= hako_audit::MAX_MESSAGE_CHARS + 3,
            "{}",
            message.len()
        );
    }

    #[test]
    fn handles_of_a_sandbox_closed_to_change_its_layers_are_void_after() {
        let state = State::new(Box::new(|| Err(hako_core::Error::Closed)), None);
        let owner = Owner::new(state.generation());
        owner.started(ProcessId(1));
        owner.opened_session(SessionId(2));
        assert!(owner.owns(ProcessId(1)) && owner.check_session(2).is_ok());
        // A review tool on a server without --cow says so and closes nothing.
        let err = state.with_sandbox_closed(|_| ()).err().unwrap();
        assert!(err.message.contains("--cow"), "{}", err.message);
        assert!(owner.owns(ProcessId(1)));
        // The sandbox closed for a rollback: the next one numbers its own.
        state.generation.fetch_add(1, Ordering::SeqCst);
        assert!(!owner.owns(ProcessId(1)));
        assert!(owner.check_session(2).is_err());
        owner.started(ProcessId(1));
        assert!(owner.owns(ProcessId(1)));
    }

    #[test]
    fn concurrent_tool_calls_past_the_bound_are_refused_and_one_ending_makes_room() {
        let state = Arc::new(
            State::new(Box::new(|| Err(hako_core::Error::Closed)), None).with_max_calls(2),
        );
        let a = state.begin_call().unwrap();
        let b = state.begin_call().unwrap();
        let err = state.begin_call().err().unwrap();
        assert!(
            err.message
                .starts_with("refused: 2 tool calls are already running"),
            "{}",
            err.message
        );
        drop(a);
        let c = state.begin_call().unwrap();
        // Given back by a call that panicked too.
        drop(b);
        let d = std::thread::spawn({
            let state = state.clone();
            move || {
                let _slot = state.begin_call().unwrap();
                panic!("a tool failed");
            }
        })
        .join();
        assert!(d.is_err());
        drop(c);
        assert_eq!(state.calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
