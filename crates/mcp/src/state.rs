//! The server's one sandbox (opened on first use, closed at disconnect),
//! the audit log, and the error every tool failure becomes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use hako_audit::AuditLog;
use hako_core::{FenceError, ProcessId, Sandbox};
use serde_json::{json, Value};

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
}

impl ToolError {
    /// A failure that is not a policy refusal (bad input, not found, ...).
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            refused: false,
        }
    }
}

impl From<hako_core::Error> for ToolError {
    fn from(err: hako_core::Error) -> Self {
        let refused = match &err {
            hako_core::Error::Fence(f) => f.is_refusal(),
            hako_core::Error::IsolationTooWeak { .. } => true,
            _ => false,
        };
        let mut message = err.to_string();
        if let Some(hint) = hint(&err) {
            message.push_str("; ");
            message.push_str(hint);
        }
        ToolError { message, refused }
    }
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
        _ => None,
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

/// Most process handles remembered for `list_processes`.
const MAX_HANDED_OUT: usize = 4096;

enum Slot {
    /// Not opened yet (or opening it failed: the next call tries again).
    Idle,
    Open(Arc<dyn Sandbox>),
    /// The client went away; no call may open it again.
    Closed,
}

/// What every tool call shares.
pub struct State {
    make: Box<MakeSandbox>,
    slot: Mutex<Slot>,
    audit: Option<Arc<AuditLog>>,
    /// Processes whose handle a tool gave the client: `list_processes`
    /// shows these and the ones still running, not every finished command.
    handed_out: Mutex<BTreeSet<u64>>,
}

impl State {
    /// A state that opens its sandbox with `make` on first use.
    pub fn new(make: Box<MakeSandbox>, audit: Option<Arc<AuditLog>>) -> Self {
        State {
            make,
            slot: Mutex::new(Slot::Idle),
            audit,
            handed_out: Mutex::new(BTreeSet::new()),
        }
    }

    /// The sandbox, opened now if this is the first call. Blocking: call it
    /// from a blocking thread. Concurrent first calls open it once (the
    /// lock is held while it opens).
    pub fn sandbox(&self) -> Result<Arc<dyn Sandbox>, ToolError> {
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| ToolError::new("internal error: the sandbox's lock is poisoned"))?;
        match &*slot {
            Slot::Open(sandbox) => Ok(sandbox.clone()),
            Slot::Closed => Err(ToolError::new(
                "the server is shutting down; the sandbox is closed",
            )),
            Slot::Idle => {
                let sandbox: Arc<dyn Sandbox> = match (self.make)() {
                    Ok(sandbox) => Arc::from(sandbox),
                    Err(err) => {
                        let refused = matches!(err, hako_core::Error::IsolationTooWeak { .. });
                        return Err(ToolError {
                            message: format!("cannot open the sandbox: {err}"),
                            refused,
                        });
                    }
                };
                let caps = sandbox.capabilities();
                tracing::info!(backend = %caps.backend, isolation = %caps.isolation, "sandbox opened");
                self.record(
                    "sandbox",
                    json!({
                        "op": "open",
                        "backend": caps.backend,
                        "isolation": caps.isolation,
                        "network": caps.network,
                        "workdir": sandbox.workdir().map(|w| w.workdir().to_string_lossy().into_owned()),
                    }),
                );
                *slot = Slot::Open(sandbox.clone());
                Ok(sandbox)
            }
        }
    }

    /// Appends one audit record, if there is a log. A record that cannot
    /// be written is logged: the effect has already happened.
    pub fn record(&self, kind: &str, fields: Value) {
        if let Some(audit) = &self.audit {
            if let Err(err) = audit.record(kind, fields) {
                tracing::error!("cannot write the audit log: {err}");
            }
        }
    }

    /// Records a tool failure: kind `refusal` for a policy refusal, `error`
    /// otherwise.
    pub fn record_failure(&self, tool: &str, err: &ToolError) {
        let kind = if err.refused { "refusal" } else { "error" };
        self.record(kind, json!({ "tool": tool, "error": err.message }));
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
            match serde_json::to_value(&event) {
                Ok(value) => self.record("net", value),
                Err(err) => tracing::error!("cannot encode a network event: {err}"),
            }
        }
        if dropped > 0 {
            self.record("net", json!({ "dropped": dropped }));
        }
        refused
    }

    /// Remembers that the client holds this process's handle.
    pub fn hand_out(&self, id: ProcessId) {
        if let Ok(mut set) = self.handed_out.lock() {
            set.insert(id.0);
            // Bounded: the oldest handles go first (the sandbox forgets
            // old processes too).
            while set.len() > MAX_HANDED_OUT {
                set.pop_first();
            }
        }
    }

    /// Whether the client was given this process's handle.
    pub fn was_handed_out(&self, id: ProcessId) -> bool {
        self.handed_out
            .lock()
            .map(|set| set.contains(&id.0))
            .unwrap_or(false)
    }

    /// The client went away: closes the sandbox (everything started in it
    /// is killed), records what the egress proxy decided, and closes the
    /// audit log. Idempotent.
    pub fn shutdown(&self) {
        let previous = match self.slot.lock() {
            Ok(mut slot) => std::mem::replace(&mut *slot, Slot::Closed),
            Err(_) => Slot::Closed,
        };
        if let Slot::Open(sandbox) = previous {
            // What is still running dies with the sandbox: say which.
            if let Some(Ok(list)) = sandbox.processes().map(|p| p.list()) {
                for st in list.iter().filter(|st| !st.finished()) {
                    self.record(
                        "process",
                        json!({ "op": "killed_at_close", "process": st.id.0, "argv": st.argv }),
                    );
                }
            }
            if let Err(err) = sandbox.close() {
                tracing::warn!("closing the sandbox: {err}");
            }
            // Closing ends every connection from inside, so each is recorded.
            self.drain_network(sandbox.as_ref());
            self.record("sandbox", json!({ "op": "close" }));
            tracing::info!("sandbox closed");
        }
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
