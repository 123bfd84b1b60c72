//! What every request shares: the configuration, the table of open
//! sandboxes, the bounded pools of slots, and the audit log.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hako_audit::{Failure, FrontEnd, Record, SandboxClosed, SandboxLost};
use hako_core::Sandbox;
use hako_runtime::token::Digested;

use crate::reply::{error, Reply};
use crate::ServeConfig;

pub(crate) struct State {
    pub(crate) config: ServeConfig,
    /// SHA-256 of the token: requests are compared digest to digest, so
    /// the comparison takes the same time whatever the length of what a
    /// client sends.
    pub(crate) token: Digested,
    /// The address listened on, when it is loopback: the `Host` and
    /// `Origin` of every request are then checked against it.
    pub(crate) local: Option<std::net::SocketAddr>,
    pub(crate) sandboxes: Mutex<Table>,
    pub(crate) next: AtomicU64,
    pub(crate) requests: Arc<Slots>,
    pub(crate) execs: Arc<Slots>,
    /// Commands start in turn (see [`crate::gate`]).
    pub(crate) starts: crate::gate::StartGate,
    pub(crate) transfers: Arc<Slots>,
    /// Requests waiting on a long-lived process.
    pub(crate) waits: Arc<Slots>,
    pub(crate) connections: Arc<Slots>,
    /// In SWE-ReX mode: its sandbox and named sessions.
    pub(crate) swerex: crate::swerex::Rex,
    /// In E2B mode: its sandboxes.
    pub(crate) e2b: crate::e2b::E2b,
}

/// The open sandboxes, and how many are being opened (they count against
/// [`ServeConfig::max_sandboxes`] already, so that concurrent creates cannot pass it).
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) open: HashMap<u64, Arc<dyn Sandbox>>,
    pub(crate) opening: usize,
    /// Open sandboxes found lost (see [`note_lost`]): recorded once each.
    pub(crate) lost: std::collections::HashSet<u64>,
    /// The copy-on-write layers of each open sandbox that has them
    /// (`--cow`): held while it is open (a name locked, a temporary
    /// layer removed once its sandbox is closed and dropped).
    pub(crate) layers: HashMap<u64, Arc<hako_runtime::CowHold>>,
}

/// A counted resource: at most `max` taken at once, each given back when
/// its [`Slot`] drops (also when a handler panics).
pub(crate) struct Slots {
    pub(crate) used: AtomicUsize,
    pub(crate) max: usize,
}

/// One taken slot.
pub(crate) struct Slot(Arc<Slots>);

impl Slots {
    pub(crate) const fn new(max: usize) -> Self {
        Slots {
            used: AtomicUsize::new(0),
            max,
        }
    }

    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(self)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The table of sandboxes, even if a thread panicked holding its lock
/// (every change to it is a single map operation, never left half done).
pub(crate) fn table(state: &State) -> MutexGuard<'_, Table> {
    state
        .sandboxes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The open sandbox `id`, if there is one.
pub(crate) fn lookup(state: &State, id: u64) -> Option<Arc<dyn Sandbox>> {
    table(state).open.get(&id).cloned()
}

/// Runs `f` on the open sandbox `id`, or answers `404`.
pub(crate) fn with_sandbox(
    state: &State,
    id: Option<u64>,
    f: impl FnOnce(u64, &dyn Sandbox) -> Reply,
) -> Reply {
    match id.and_then(|n| lookup(state, n).map(|sb| (n, sb))) {
        Some((n, sb)) => f(n, sb.as_ref()),
        None => error(404, "no_such_sandbox", "no such sandbox"),
    }
}

/// Closes every sandbox a server opened (at shutdown).
pub(crate) fn close_all(state: &State) {
    let (all, layers): (Vec<_>, Vec<_>) = {
        let mut t = table(state);
        (t.open.drain().collect(), t.layers.drain().collect())
    };
    for (id, sb) in all {
        crate::processes::record_killed_at_close(state, id, sb.as_ref());
        let _ = sb.close();
        audit(state, closed(id));
    }
    // Let go of the layers once their sandboxes are closed.
    drop(layers);
}

/// The record of sandbox `id` closed.
pub(crate) fn closed(id: u64) -> Record {
    Record::SandboxClosed(SandboxClosed {
        front_end: FrontEnd::Serve,
        sandbox: Some(id),
    })
}

/// Appends `record` to the audit log, if there is one. A record that
/// cannot be written is logged: the effect has already happened.
pub(crate) fn audit(state: &State, record: Record) {
    if let Some(log) = &state.config.audit {
        if let Err(e) = log.write(&record) {
            tracing::warn!("hako serve: {e}");
        }
    }
}

/// Records a sandbox call that failed on sandbox `id` (a `refusal` when a
/// policy refused it, an `error` otherwise), with what it was about.
pub(crate) fn audit_failure(
    state: &State,
    id: u64,
    sb: &dyn Sandbox,
    err: &hako_core::Error,
    about: impl FnOnce(&mut Failure),
) {
    note_lost(state, id, err);
    let mut failure = Failure::new(FrontEnd::Serve, &err.to_string());
    failure.backend = Some(sb.capabilities().backend.clone());
    failure.sandbox = Some(id);
    about(&mut failure);
    audit(state, failure.record(hako_audit::is_refusal(err)));
}

/// Records that sandbox `id` was lost, the first time a call finds it so
/// (`err` is [`hako_core::Error::SandboxLost`]; any other error is not
/// recorded here). The sandbox stays in the table, every call on it
/// answering `502` `sandbox_lost`, until it is closed (`DELETE`, which
/// removes what is left of it, and records the close).
pub(crate) fn note_lost(state: &State, id: u64, err: &hako_core::Error) {
    let Some(lost) = SandboxLost::from_error(FrontEnd::Serve, Some(id), err) else {
        return;
    };
    let first = {
        let mut table = table(state);
        table.open.contains_key(&id) && table.lost.insert(id)
    };
    if first {
        tracing::warn!(sandbox = id, reason = %lost.reason, "a sandbox was lost");
        audit(state, Record::SandboxLost(lost));
    }
}

impl Drop for State {
    fn drop(&mut self) {
        close_all(self);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn slots_are_bounded_and_given_back_even_when_their_holder_panics() {
        let slots = Arc::new(Slots::new(2));
        let a = slots.try_take();
        let b = slots.try_take();
        assert!(a.is_some() && b.is_some());
        assert!(slots.try_take().is_none());
        drop(a);
        assert!(slots.try_take().is_some());
        drop(b);
        let s = slots.clone();
        let panicked = std::thread::spawn(move || {
            let _slot = s.try_take();
            panic!("a handler failed");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(slots.used.load(Ordering::SeqCst), 0);
    }
}
